#include "index_plane/arena_pinning.hpp"

#include <sys/mman.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log_escaped.hpp"
#include "device/device.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::index_plane {

namespace asio = boost::asio;
using common::LogEscaped;

namespace {
struct PinResult {
  device::Status status;
  std::optional<device::HostRegistration> reg;
};
}  // namespace

void ArenaPinning::start(const ArenaMapping* current) {
  current_ = current;
  want_ = 0;
  next_ = 0;
  running_ = 0;
  pinning_ = false;
  error_.clear();
  progress_.notify();  // the last arena's waiters see it is no longer current
}

void ArenaPinning::close(std::string why) {
  error_ = std::move(why);
  progress_.notify();
}

asio::awaitable<std::error_code> ArenaPinning::up_to(std::shared_ptr<ArenaMapping> m, std::uint64_t end) {
  end = std::min(end, m->bytes());
  while (m->pinned_bytes() < end) {
    if (!current(m)) co_return TransferErrc::tier_unavailable;  // a server since restarted: no more pinning
    if (!error_.empty()) co_return TransferErrc::device_error;
    want_ = std::max(want_, end);
    if (!pinning_) {
      pinning_ = true;
      // A pinning loop ended by an exception fails the transfers waiting on it.
      auto escaped = [this](std::exception_ptr e) {
        if (!e) return;
        LogEscaped{"RemoteIndex pinning"}(e);
        error_ = "the pinning loop ended by an exception";
        pinning_ = false;
        progress_.notify();
      };
      if (!gate_.spawn(loop(m), std::move(escaped))) {
        pinning_ = false;
        co_return TransferErrc::tier_unavailable;  // closing
      }
    }
    co_await progress_.wait();  // notified after every slab
  }
  co_return std::error_code{};
}

// Keeps up to kThreads slabs pinning at once, in order, until the wanted
// prefix is pinned.
asio::awaitable<void> ArenaPinning::loop(std::shared_ptr<ArenaMapping> m) {
  const std::uint64_t slab = m->slab_bytes();
  while (current(m) && error_.empty() && (m->pinned_bytes() < want_ || running_ > 0)) {
    while (running_ < kThreads && next_ < m->slab_count() && static_cast<std::uint64_t>(next_) * slab < want_) {
      if (!gate_.spawn(pin_slab(m, next_), LogEscaped{"RemoteIndex pinning a slab"})) break;  // closing
      ++running_;
      ++next_;
    }
    co_await progress_.wait();  // notified after every slab
  }
  if (current(m)) pinning_ = false;
  progress_.notify();
}

asio::awaitable<void> ArenaPinning::pin_slab(std::shared_ptr<ArenaMapping> m, std::uint32_t slab) {
  std::byte* at = m->base() + static_cast<std::uint64_t>(slab) * m->slab_bytes();
  const std::uint64_t n = m->slab_bytes();
  const int device = device_;
  auto work = [at, n, device]() -> asio::awaitable<PinResult> {
    PinResult r;
    if (device::Status s = device::select_device(device); !s.ok()) {
      r.status = s;
      co_return r;
    }
    constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14): page tables in one call
    (void)::madvise(at, n, kPopulateWrite);
    auto reg = device::HostRegistration::register_range(at, n);
    if (reg.ok()) {
      r.reg.emplace(std::move(reg).value());
    } else {
      r.status = reg.status();
    }
    co_return r;
  };
  PinResult r = co_await asio::co_spawn(pool_.get_executor(), work(), asio::use_awaitable);
  if (r.reg) {
    m->add_pinned(slab, std::move(*r.reg));
  } else if (error_.empty()) {
    error_ = r.status.describe();
    spdlog::error("kvstrand: node tier: cannot pin the arena for device {}: {}", device, error_);
  }
  if (current(m)) --running_;
  progress_.notify();
}

}  // namespace kvstrand::index_plane
