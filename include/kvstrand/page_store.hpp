// The node tier for an engine whose KV pages already live in host memory
// (SGLang's HiCache host pool): pages are copied between that memory and
// kvstrand-server's arena by this process's CPU threads, one chunk per
// page (Layout::chunk_tokens == block_tokens == the engine's page size).
//
// Unlike the Connector, every call is synchronous and may come from any
// thread, several at once (SGLang's prefetch, prefetch-I/O and backup
// threads): the server's requests run as coroutines on one reactor strand,
// the copies on the calling thread and `copy_threads` helpers, and a call
// returns when its copies are done. No call raises for the tier's sake: a
// server that is down, restarting or refusing is a miss or a page not
// stored (counted in stats()), and the store attaches again when one
// answers, as the Connector does.
//
// Leases: exists() leases the hit it reports, so that the get() after it
// reads exactly what was counted; a hit no get() names within
// `lease_bound` is released (SGLang revokes prefetches without a word).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/registration.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

struct PageStoreOptions {
  // kvstrand-server's socket (required).
  std::string server_socket;
  // Bound on connect + hello + register, and on each request.
  std::chrono::milliseconds request_timeout{5'000};
  // A server run by this uid is trusted too (ConnectorOptions::server_uid).
  std::int64_t server_uid = -1;
  // How long a hit exists() leased waits for its get().
  std::chrono::milliseconds lease_bound{30'000};
  // Threads beside the caller's that copy one call's pages (0: the caller alone).
  unsigned copy_threads = 3;
  // A published tenant to read (kvstrand-server --public-tenant): this
  // store's layouts must be that tenant's; it reads the tenant's objects
  // through memory the server hands over read-only, and stores nothing
  // (set() answers false, invalidate() is refused). Empty: a store of
  // this process's own tenant.
  std::string reads_tenant;
};

struct PageStoreStats {
  std::uint64_t pages_read = 0, pages_written = 0, pages_existed = 0;
  std::uint64_t bytes_read = 0, bytes_written = 0;
  std::uint64_t pages_not_stored = 0;  // set(): refused (the tier full) or the server unreachable
  std::uint64_t calls_failed = 0;      // a request the server did not answer or refused
  std::uint64_t leases_expired = 0;    // exists() hits no get() named within lease_bound
};

class PageStore {
 public:
  // Throws std::invalid_argument naming the option it cannot serve.
  explicit PageStore(PageStoreOptions options);
  ~PageStore();  // close()
  PageStore(const PageStore&) = delete;
  PageStore& operator=(const PageStore&) = delete;

  // A pool of pages: its planes are the pieces of one page (block i of
  // plane p is page i's piece p), block_tokens == chunk_tokens. Returns the
  // id the calls below name (0, 1, ...). Throws TransferRefused when the
  // registration does not fit its layout, or an answering server refuses
  // it; with no server answering, it is kept and registered when one does.
  std::uint32_t register_layout(const Registration& registration);

  // How many of `keys`, from the first, the tier holds; with `keep_lease`,
  // those are leased for the get() that follows (bounded by lease_bound).
  // 0 when no server answers.
  std::size_t exists(std::uint32_t registration, std::span<const kv::ChunkKey> keys, bool keep_lease = true);
  // Copies the leading run of `keys` the tier holds into pages[i] (a block
  // of the registration's planes): how many were copied.
  std::size_t get(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                  std::span<const std::uint32_t> pages);
  // Stores pages[i] under keys[i]; out[i]: the tier has it now (copied, or
  // stored already); false where it did not fit or no server answered (and
  // every page of a store that reads_tenant).
  std::vector<bool> set(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                        std::span<const std::uint32_t> pages);
  // Drops every object of the registration's namespace: how many.
  // Throws TransferRefused when no server answers or it refuses.
  std::uint64_t invalidate(std::uint32_t registration);

  PageStoreStats stats() const;
  // Releases leases, ends the session. Idempotent; later calls miss.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstrand
#pragma GCC visibility pop
