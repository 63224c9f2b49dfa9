#include "data_path/page_store.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <cstring>
#include <latch>
#include <mutex>
#include <stdexcept>

#include <kvstrand/errors.hpp>
#include "index_plane/remote_index.hpp"
#include "tier/object_format.hpp"

namespace kvstrand::data_path {

namespace asio = boost::asio;

namespace {
// A piece smaller than this is not worth a helper's wake-up.
constexpr std::uint64_t kSplitBytes = 1u << 20;
}  // namespace

PageStore::PageStore(kvstrand::PageStoreOptions options) : options_(std::move(options)) {
  if (options_.server_socket.empty())
    throw std::invalid_argument("invalid option 'server_socket': a PageStore needs kvstrand-server's socket");
  if (options_.request_timeout.count() <= 0)
    throw std::invalid_argument("invalid option 'request_timeout': must be > 0 ms");
  if (options_.lease_bound.count() <= 0) throw std::invalid_argument("invalid option 'lease_bound': must be > 0 ms");
  if (options_.copy_threads > 64) throw std::invalid_argument("invalid option 'copy_threads': at most 64");
  if (!options_.reads_tenant.empty())
    if (auto why = kv::tenant_problem(options_.reads_tenant))
      throw std::invalid_argument("invalid option 'reads_tenant': " + *why);
  reactor_ = std::make_unique<reactor::Reactor>(reactor::ReactorOptions{});
  index_ = std::make_unique<index_plane::RemoteIndex>(
      *reactor_, index_plane::RemoteIndexOptions{options_.server_socket, options_.request_timeout, 0,
                                                 options_.server_uid, options_.reads_tenant});
  if (options_.copy_threads > 0) copiers_ = std::make_unique<asio::thread_pool>(options_.copy_threads);
  expiry_ = std::make_unique<asio::steady_timer>(reactor_->strand());
  expiry_done_ = asio::co_spawn(reactor_->strand(), expire_loop(), asio::use_future);
}

asio::awaitable<void> PageStore::expire_loop() {
  const auto tick = std::clamp<std::chrono::milliseconds>(options_.lease_bound / 4, std::chrono::milliseconds(1),
                                                          std::chrono::seconds(1));
  while (!closed_) {
    expiry_->expires_after(tick);
    co_await expiry_->async_wait(asio::as_tuple(asio::use_awaitable));
    if (closed_) break;
    co_await expire(false);
  }
}

PageStore::~PageStore() { close(); }

void PageStore::close() {
  if (closed_.exchange(true)) return;
  reactor_->call([this]() -> asio::awaitable<void> {
    expiry_->cancel();
    co_await expire(true);
    co_await index_->drain();
  });
  expiry_done_.wait();
  if (copiers_) copiers_->join();
  reactor_->stop();
}

std::uint32_t PageStore::register_layout(const Registration& registration) {
  if (closed_) throw TransferRefused(TransferErrc::closed, "register_layout after close()");
  if (auto err = registration.check()) throw TransferRefused(TransferErrc::bad_spec, *err);
  if (registration.layout.block_tokens != registration.layout.chunk_tokens)
    throw TransferRefused(TransferErrc::bad_spec, "a page store's layout is one block per chunk (block_tokens " +
                                                      std::to_string(registration.layout.block_tokens) +
                                                      ", chunk_tokens " +
                                                      std::to_string(registration.layout.chunk_tokens) + ")");
  if (!options_.reads_tenant.empty() && registration.layout.tenant != options_.reads_tenant)
    throw TransferRefused(TransferErrc::bad_spec, "this store reads tenant '" + options_.reads_tenant +
                                                      "' (reads_tenant): its layouts' tenant must be that one, not '" +
                                                      registration.layout.tenant + "'");
  const Registration* reg = nullptr;
  std::uint32_t id = 0;
  {
    std::lock_guard lock(regs_mutex_);
    id = static_cast<std::uint32_t>(regs_.size());
    reg = &regs_.emplace_back(registration);
  }
  index_plane::Failure refused = reactor_->call(
      [this, reg]() -> asio::awaitable<index_plane::Failure> { co_return co_await index_->attach(*reg); });
  if (refused) {
    std::lock_guard lock(regs_mutex_);
    regs_.pop_back();  // the index keeps only what it attached
    throw TransferRefused(refused.ec, "register_layout: registration " + std::to_string(id) + ": " + refused.why);
  }
  return id;
}

bool PageStore::fits(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                     std::span<const std::uint32_t> pages) const {
  if (closed_ || keys.size() != pages.size() || keys.empty()) return false;
  std::lock_guard lock(regs_mutex_);
  if (registration >= regs_.size()) return false;
  for (const PlaneMemory& p : regs_[registration].planes)
    if (std::any_of(pages.begin(), pages.end(), [&](std::uint32_t b) { return b >= p.num_blocks; })) return false;
  return true;
}

kv::TransferSpec PageStore::spec(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                                 std::span<const std::uint32_t> pages) const {
  kv::TransferSpec s;
  s.request = "pages";
  s.registration = registration;
  std::uint32_t ct = 0;
  {
    std::lock_guard lock(regs_mutex_);
    ct = regs_[registration].layout.chunk_tokens;
  }
  s.tokens = kv::TokenRange{0, static_cast<std::uint32_t>(keys.size()) * ct};
  s.keys.assign(keys.begin(), keys.end());
  s.blocks.assign(pages.begin(), pages.end());
  return s;
}

void PageStore::copy(const Registration& reg, const kv::TransferSpec& s, const std::vector<std::byte*>& objects,
                     bool save) {
  struct Piece {
    std::byte* to;
    const std::byte* from;
    std::uint64_t bytes;
  };
  std::vector<Piece> pieces;
  std::uint64_t total = 0;
  const std::vector<bool> no_images(objects.size(), false);
  tier::for_each_piece(reg, s, objects, save, no_images, [&](std::byte* page, std::byte* object, std::uint64_t bytes) {
    pieces.push_back(save ? Piece{object, page, bytes} : Piece{page, object, bytes});
    total += bytes;
  });
  const auto run = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) std::memcpy(pieces[i].to, pieces[i].from, pieces[i].bytes);
  };
  const std::size_t helpers = copiers_ ? std::min<std::size_t>(options_.copy_threads, total / kSplitBytes) : 0;
  if (helpers == 0 || pieces.size() < 2) {
    run(0, pieces.size());
    return;
  }
  // Parts of about equal bytes, one for the caller and one per helper.
  const std::size_t parts = std::min(helpers + 1, pieces.size());
  std::vector<std::size_t> bounds{0};
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < pieces.size() && bounds.size() < parts; ++i) {
    acc += pieces[i].bytes;
    if (acc * parts >= total * bounds.size()) bounds.push_back(i + 1);
  }
  bounds.push_back(pieces.size());
  std::latch done(static_cast<std::ptrdiff_t>(bounds.size() - 2));
  for (std::size_t p = 1; p + 1 < bounds.size(); ++p)
    asio::post(*copiers_, [&, from = bounds[p], to = bounds[p + 1]] {
      run(from, to);
      done.count_down();
    });
  run(bounds[0], bounds[1]);
  done.wait();
}

asio::awaitable<void> PageStore::expire(bool all) {
  const auto now = Clock::now();
  auto gone = std::partition(leased_.begin(), leased_.end(), [&](const Leased& l) { return !all && l.until > now; });
  std::vector<std::uint64_t> leases;
  for (auto it = gone; it != leased_.end(); ++it) leases.push_back(it->lease);
  leased_.erase(gone, leased_.end());
  if (!all) counters_.leases_expired += leases.size();
  for (std::uint64_t lease : leases) co_await index_->release_lookup(lease);
}

std::size_t PageStore::exists(std::uint32_t registration, std::span<const kv::ChunkKey> keys, bool keep_lease) {
  if (!fits(registration, keys, std::vector<std::uint32_t>(keys.size(), 0))) return 0;
  std::vector<kv::ChunkKey> asked(keys.begin(), keys.end());
  return reactor_->call([&]() -> asio::awaitable<std::size_t> {
    co_await expire(false);
    const index_plane::IndexPlane::LookupResult r = co_await index_->lookup(registration, asked);
    std::uint32_t ct = 0;
    {
      std::lock_guard lock(regs_mutex_);
      ct = regs_[registration].layout.chunk_tokens;
    }
    const std::size_t n = r.hit.tokens / ct;
    if (r.lease != 0) {
      if (n == 0 || !keep_lease) {
        co_await index_->release_lookup(r.lease);
      } else {
        leased_.push_back(Leased{registration, asked[0], r.lease, Clock::now() + options_.lease_bound});
      }
    }
    co_return n;
  });
}

std::size_t PageStore::get(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                           std::span<const std::uint32_t> pages) {
  if (!fits(registration, keys, pages)) return 0;
  kv::TransferSpec s = spec(registration, keys, pages);
  index_plane::IndexPlane::Held held = reactor_->call([&]() -> asio::awaitable<index_plane::IndexPlane::Held> {
    co_await expire(false);
    // The lease exists() took from the same first key, if any: its objects
    // cannot have moved. A get of fewer keys ends the whole lease; one of
    // more reads no further than the lease (exists() found no more).
    auto it = std::find_if(leased_.begin(), leased_.end(), [&](const Leased& l) {
      return l.registration == registration && l.first == s.keys[0];
    });
    if (it != leased_.end()) {
      s.tier_lease = it->lease;
      leased_.erase(it);
    }
    co_return co_await index_->hold(s, Clock::now() + options_.request_timeout);
  });
  if (held.failure) {
    ++counters_.calls_failed;
    spdlog::debug("kvstrand: page store: a get of {} pages: {}", keys.size(), held.failure.why);
    return 0;
  }
  // The leading run only: SGLang counts pages up to the first it lacks.
  std::size_t n = 0;
  while (n < held.objects.size() && held.objects[n] != nullptr) ++n;
  std::vector<std::byte*> objects = held.objects;
  std::fill(objects.begin() + static_cast<std::ptrdiff_t>(n), objects.end(), nullptr);
  const Registration* reg = nullptr;
  {
    std::lock_guard lock(regs_mutex_);
    reg = &regs_[registration];
  }
  copy(*reg, s, objects, false);
  reactor_->call([&]() -> asio::awaitable<void> {
    index_->release(s, held);
    co_return;
  });
  counters_.pages_read += n;
  counters_.bytes_read += n * reg->layout.bytes_per_block();
  return n;
}

std::vector<bool> PageStore::set(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                                 std::span<const std::uint32_t> pages) {
  std::vector<bool> out(keys.size(), false);
  if (!options_.reads_tenant.empty() || !fits(registration, keys, pages)) {
    counters_.pages_not_stored += keys.size();
    return out;
  }
  const kv::TransferSpec s = spec(registration, keys, pages);
  const std::vector<bool> no_images(keys.size(), false);
  const auto deadline = Clock::now() + options_.request_timeout;
  index_plane::IndexPlane::Places places = reactor_->call([&]() -> asio::awaitable<index_plane::IndexPlane::Places> {
    co_return co_await index_->reserve(registration, s.keys, no_images, {}, deadline);
  });
  if (places.failure) {
    ++counters_.calls_failed;
    counters_.pages_not_stored += keys.size();
    spdlog::debug("kvstrand: page store: a set of {} pages: {}", keys.size(), places.failure.why);
    return out;
  }
  const Registration* reg = nullptr;
  {
    std::lock_guard lock(regs_mutex_);
    reg = &regs_[registration];
  }
  std::size_t reserved = 0;
  for (std::byte* o : places.objects) reserved += o != nullptr;
  if (reserved != 0) copy(*reg, s, places.objects, true);
  index_plane::Failure committed;
  if (places.hold != 0)
    committed = reactor_->call([&]() -> asio::awaitable<index_plane::Failure> {
      co_return co_await index_->commit(registration, s.keys, places, true, deadline);
    });
  if (committed) {
    ++counters_.calls_failed;
    spdlog::debug("kvstrand: page store: a commit of {} pages: {}", reserved, committed.why);
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const bool full = i < places.full.size() && places.full[i];
    out[i] = places.objects[i] != nullptr ? !committed : !full;
    if (!out[i]) ++counters_.pages_not_stored;
    if (places.objects[i] == nullptr && !full) ++counters_.pages_existed;
  }
  if (!committed) {
    counters_.pages_written += reserved;
    counters_.bytes_written += reserved * reg->layout.bytes_per_block();
  }
  return out;
}

std::uint64_t PageStore::invalidate(std::uint32_t registration) {
  if (closed_) throw TransferRefused(TransferErrc::closed, "invalidate after close()");
  if (!options_.reads_tenant.empty())
    throw TransferRefused(TransferErrc::bad_spec, "invalidate: this store reads tenant '" + options_.reads_tenant +
                                                      "''s published objects (reads_tenant); only that tenant drops them");
  {
    std::lock_guard lock(regs_mutex_);
    if (registration >= regs_.size())
      throw TransferRefused(TransferErrc::not_registered, "invalidate: no registration " + std::to_string(registration));
  }
  index_plane::IndexPlane::Dropped d = reactor_->call(
      [&]() -> asio::awaitable<index_plane::IndexPlane::Dropped> { co_return co_await index_->drop(registration); });
  if (d.failure) throw TransferRefused(d.failure.ec, "invalidate: " + d.failure.why);
  return d.objects;
}

kvstrand::PageStoreStats PageStore::stats() const {
  kvstrand::PageStoreStats s;
  s.pages_read = counters_.pages_read;
  s.pages_written = counters_.pages_written;
  s.pages_existed = counters_.pages_existed;
  s.bytes_read = counters_.bytes_read;
  s.bytes_written = counters_.bytes_written;
  s.pages_not_stored = counters_.pages_not_stored;
  s.calls_failed = counters_.calls_failed;
  s.leases_expired = counters_.leases_expired;
  return s;
}

}  // namespace kvstrand::data_path
