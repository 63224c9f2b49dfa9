#include "server/arena_host.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <cstdlib>
#include <stdexcept>

#include "common/parse_bytes.hpp"
#include "server/levels/disk_file.hpp"

namespace kvstrand::server {

namespace asio = boost::asio;

ArenaHost::ArenaHost(common::Strand strand, const ServerOptions& opt)
    : strand_(strand), opt_(opt), slab_came_(std::move(strand)) {}

ArenaHost::~ArenaHost() {
  stop_filling_ = true;
  join_filler();
}

void ArenaHost::join_filler() {
  stop_filling_ = true;
  if (filler_.joinable()) filler_.join();
}

void ArenaHost::open() {
  const bool named = !opt_.arena_path.empty();
  try {
    arena_.emplace(tier::ArenaOptions{opt_.tier_bytes, opt_.slab_bytes, opt_.huge_pages, opt_.arena_path});
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(named ? "--arena-path" : "--tier-bytes") + ": cannot create the arena: " +
                             e.what());
  }
  pools_.emplace(*arena_, opt_.tenant_segments, opt_.public_tenants, opt_.huge_pages);
  // L2 is one reason the server touches the arena's bytes (it copies
  // committed objects out to Redis and promoted ones in), the disk another,
  // a named arena's object tables the third. Engine memory it never sees.
  if (opt_.l2 || opt_.disk || named) map_ = pools_->map(named ? "--arena-path" : opt_.disk ? "--disk" : "--l2");
  // With a disk tier the arena's slots are 4 KiB-aligned: the disk reads
  // and writes them in place (O_DIRECT).
  const std::uint64_t align = opt_.disk ? kDiskBlock : 1;
  if (!named) {
    classes_.emplace(arena_->slab_bytes(), nullptr, tier::SlotShape{align, 0, 0});
    classes_->set_slab_count(arena_->slab_count());
    if (pools_->pools() > 1) classes_->set_pools(pools_->ends());
    return;
  }
  table_.emplace(map_, arena_->bytes(), arena_->slab_bytes(), align);
  classes_.emplace(arena_->slab_bytes(), &*table_);
  classes_->set_slab_count(arena_->slab_count());
  recovery_.named = true;
  if (!arena_->reopened()) {
    spdlog::info("kvstrand-server: a new arena at {} ({})", arena_->path(), common::format_bytes(arena_->bytes()));
    return;
  }
  recovery_ = recover(*table_, *classes_);
  if (!recovery_.started_empty.empty()) {
    // One line, and nothing of the old file is read: a later format or
    // another geometry is never misread as this one.
    spdlog::warn("kvstrand-server: the arena at {} cannot be read ({}): starting empty", arena_->path(),
                 recovery_.started_empty);
    pools_->unmap();
    arena_->start_empty();
    map_ = pools_->map("--arena-path");
    table_.emplace(map_, arena_->bytes(), arena_->slab_bytes(), align);
    classes_.reset();
    classes_.emplace(arena_->slab_bytes(), &*table_);
    return;
  }
  spdlog::info("kvstrand-server: recovered {} objects from the arena at {} in {:.3f} s ({} never committed and {} "
               "corrupt dropped)",
               recovery_.objects, arena_->path(), recovery_.seconds, recovery_.dropped_uncommitted,
               recovery_.dropped_corrupt);
}

void ArenaHost::start_filling(std::function<void(std::uint32_t)> joined) {
  joined_ = std::move(joined);
  // Fault injection for tests (an arena that becomes ready slowly): a
  // pause before each slab.
  const char* delay = std::getenv("KVSTRAND_TEST_FILL_DELAY_MS");
  const auto pause = std::chrono::milliseconds(delay ? std::atoi(delay) : 0);
  // Where the server reads and writes objects' bytes (L2, the disk), its
  // own mapping is faulted in too, once every slab is ready (serving does
  // not wait for it): a first touch per 4 KiB page on the strand made a
  // checksum 20 times slower in a VM (docs/PERFORMANCE.md, "The disk tier").
  std::byte* mine = (opt_.l2 || opt_.disk) ? map_ : nullptr;
  filler_ = std::thread([this, pause, mine] {
    auto stopping = [this] { return stop_filling_.load(std::memory_order_relaxed); };
    // The arena's slabs, then each segment's: one numbering (the pools').
    for (std::uint32_t i = 0; i < pools_->slab_count() && !stopping(); ++i) {
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
      std::string err = pools_->populate(i);
      asio::post(strand_, [this, i, err] { slab_ready(i, err); });
      if (!err.empty()) return;
    }
    for (std::uint32_t i = 0; mine != nullptr && i < pools_->slab_count() && !stopping(); ++i) {
      tier::Arena::map_in(mine + std::uint64_t{i} * arena_->slab_bytes(), arena_->slab_bytes());
      asio::post(strand_, [this] { ++mapped_slabs_; });
    }
  });
}

void ArenaHost::slab_ready(std::uint32_t slab, const std::string& err) {
  if (!err.empty()) {
    spdlog::error("kvstrand-server: slab {} of the arena could not be populated ({}); the tier stays at {} MiB", slab,
                  err, ready_bytes() >> 20);
    fill_error_ = err;
    slab_came_.notify();
    return;
  }
  ++ready_slabs_;
  classes_->add_slab(slab);
  if (joined_) joined_(slab);
  slab_came_.notify();
  if (ready_slabs_ == pools_->slab_count())
    spdlog::info("kvstrand-server: the arena's {} slabs are ready ({}) after {:.2f} s", ready_slabs_,
                 common::format_bytes(arena_->bytes() + pools_->segment_bytes()),
                 std::chrono::duration<double>(Clock::now() - started_).count());
}

void ArenaHost::stop() {
  stopped_ = true;
  stop_filling_ = true;
  slab_came_.notify();
}

std::uint64_t ArenaHost::ready_bytes() const {
  return static_cast<std::uint64_t>(ready_slabs_) * arena_->slab_bytes();
}

bool ArenaHost::growing() const { return ready_slabs_ < pools_->slab_count() && fill_error_.empty() && !stopped_; }

asio::awaitable<void> ArenaHost::room_for(const tier::Index& idx, std::span<const kv::ChunkKey> keys, const bool& ended) {
  auto served = [&] { return !growing() || ended || classes_->room(idx) >= idx.absent(keys); };
  co_await slab_came_.wait_until(served, Clock::now() + kGrowWait);
}

}  // namespace kvstrand::server
