// The Tier that lives in kvstrand-server: the Connector's client of it.
//
// Same Tier interface as LocalTier, so the reactor's transfer path is the
// same for both. All on the reactor strand:
// - attach() connects, says hello and registers the plane and state memory
//   by IPC handle (the allocation that contains each base, plus the offset);
// - each request is one frame; replies are matched by id by one reader
//   coroutine; lookups and attach are bounded by request_timeout, transfers
//   by their own deadlines (the Connector's);
// - if the connection drops, every request in flight fails at once
//   (tier_unavailable: a load reports its blocks for recompute) and the next
//   request reconnects and registers again;
// - with tp_rank_collapse only rank 0 stores; every rank reads (F34).
#pragma once

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kv/object_store.hpp"
#include "kv/protocol.hpp"
#include "reactor/reactor.hpp"
#include "reactor/tier.hpp"

namespace kvstrand::reactor {

struct RemoteTierOptions {
  std::string socket;
  std::chrono::milliseconds request_timeout{10'000};
};

class RemoteTier final : public Tier {
 public:
  RemoteTier(Reactor& reactor, RemoteTierOptions options);
  ~RemoteTier() override;

  boost::asio::awaitable<std::error_code> attach(const Registration& reg) override;
  boost::asio::awaitable<kv::HitSource> lookup(std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<void> release_lookup(std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<std::error_code> save(Transfer& t) override;
  boost::asio::awaitable<std::error_code> load(Transfer& t) override;
  kv::ObjectStore::Stats stats() const override { return {}; }  // the server's own stats say it
  const char* kind() const noexcept override { return "server"; }
  boost::asio::awaitable<void> drain() override;

  std::uint64_t reconnects() const noexcept { return reconnects_; }

 private:
  struct Pending;
  using Clock = std::chrono::steady_clock;

  boost::asio::awaitable<std::error_code> ensure_connected();
  boost::asio::awaitable<std::error_code> handshake();
  // One request, one reply (or an error: the connection failed, or `until` passed).
  boost::asio::awaitable<std::pair<std::error_code, kv::proto::Reply>> call(kv::proto::Request req,
                                                                            Clock::time_point until);
  // A transfer's request: connect first (reason set if unreachable), then
  // one exchange bounded by the transfer's deadline, the reply's status
  // mapped to a TransferErrc and explained in t.reason.
  boost::asio::awaitable<std::error_code> connect_for(Transfer& t);
  boost::asio::awaitable<std::error_code> exchange(Transfer& t, kv::proto::Request req, kv::proto::Reply* out);
  boost::asio::awaitable<void> read_loop(std::uint64_t generation);
  boost::asio::awaitable<void> write_loop(std::uint64_t generation);
  void drop_connection(const std::string& why);

  Reactor& reactor_;
  RemoteTierOptions opt_;
  const Registration* reg_ = nullptr;
  std::optional<boost::asio::local::stream_protocol::socket> sock_;
  std::uint64_t generation_ = 0;  // bumps on every new connection
  bool connected_ = false;
  bool connecting_ = false;
  std::uint32_t registration_ = 0;
  std::uint64_t next_id_ = 1;
  std::uint64_t reconnects_ = 0;
  std::map<std::uint64_t, std::shared_ptr<Pending>> pending_;
  std::deque<std::vector<std::byte>> outbox_;
  bool writing_ = false;
  std::map<kv::ChunkKey, std::uint64_t, kv::ChunkKeyLess> lock_of_;  // a lookup's lock, by each key it holds
};

}  // namespace kvstrand::reactor
