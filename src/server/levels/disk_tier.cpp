#include "server/levels/disk_tier.hpp"
#include "server/levels/write_behind.hpp"
#include "common/await_codes.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>

#include "common/notifier.hpp"
#include "common/parse_bytes.hpp"
#include "tier/object_header.hpp"
#include "server/levels/disk_file.hpp"
#include "server/levels/disk_recovery.hpp"
#include "server/levels/disk_ring.hpp"
#include "server/events/tier_events.hpp"

namespace kvstrand::server {

namespace asio = boost::asio;


struct DiskTier::Impl : std::enable_shared_from_this<DiskTier::Impl> {
  // A promotion's waiter: woken when its last read ended.
  struct Batch {
    explicit Batch(common::Strand s) : done(std::move(s)) {}
    std::size_t left = 0;
    bool expired = false;
    bool refused_value = false;  // a read's header or bytes failed their check
    common::Notifier done;
  };
  // One object read or written: two operations (its header block, its bytes).
  struct Job {
    bool read = false;
    tier::Index* arena_index = nullptr;
    tier::Index* disk_index = nullptr;
    kv::ChunkKey key;
    bool image = false;
    std::uint32_t arena_slot = 0;
    std::uint32_t disk_slot = 0;
    std::shared_ptr<Batch> batch;  // a promotion's
    unsigned block = 0;            // its header block in the pool
    int pending = 0;
    int error = 0;                 // the first failure: -errno, or 1 for a short transfer
    // With --events: a write's item's description (held by the item, given
    // back at its done) and whether its header block took it; a read's, as
    // its header block kept it.
    DescriptionPool::Id item_description = DescriptionPool::kNone;
    bool description_on_disk = false;
    std::string description;
  };

  Impl(common::Strand s, DiskOptions o, std::byte* a, std::uint64_t slab, std::uint32_t slabs, tier::SizeClasses& c)
      : strand(s),
        opt(std::move(o)),
        arena(a),
        arena_slab_bytes(slab),
        arena_slabs(slabs),
        classes(c),
        extent_bytes(slab + 2 * kDiskBlock),
        disk(extent_bytes, nullptr, tier::SlotShape{kDiskBlock, kDiskBlock, kDiskBlock}) {}

  ~Impl() {
    for (DiskFile& f : files)
      if (f.fd >= 0) ::close(f.fd);
  }

  // ---- where things are ---------------------------------------------------------

  std::pair<int, std::uint64_t> place(std::uint64_t disk_offset) const {
    return disk_place(files, extent_bytes, disk_offset);
  }
  std::byte* arena_object(const tier::Index& idx, std::uint32_t slot) const {
    return arena + classes.offset_of(idx, slot);
  }
  int arena_buffer(const std::byte* p) const {
    const auto slab = static_cast<std::uint32_t>((p - arena) / static_cast<std::ptrdiff_t>(arena_slab_bytes));
    return slab < slab_registered.size() && slab_registered[slab] ? static_cast<int>(slab + 1) : -1;
  }
  std::byte* block_at(unsigned b) const { return pool.get() + static_cast<std::size_t>(b) * kDiskBlock; }

  // ---- opening and recovery -----------------------------------------------------

  void open() {
    const std::uint64_t extents = opt.bytes / extent_bytes;
    if (extents == 0)
      throw std::runtime_error("--disk-bytes: " + common::format_bytes(opt.bytes) + " is less than one extent (" +
                               common::format_bytes(extent_bytes) +
                               ": a --slab-bytes slab and two 4 KiB blocks): give at least that, or a smaller "
                               "--slab-bytes");
    const std::size_t n = opt.paths.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t mine = (extents - i + n - 1) / n;
      if (mine == 0) throw std::runtime_error("--disk-bytes: too small to give each --disk path an extent");
      files.push_back(open_disk_file(opt.paths[i], mine * extent_bytes, extent_bytes));
    }
    total_extents = static_cast<std::uint32_t>(extents);
    disk.set_slab_count(total_extents);
    auto fault = disk_fault_from_env();
    if (!fault) throw std::runtime_error(fault.why());
    const unsigned blocks = opt.depth;  // objects in flight, reads and writes together
    auto r = DiskRing::open(strand, blocks * 2 + 16, 1 + arena_slabs, *fault);
    if (!r) throw std::runtime_error("--disk: " + r.why());
    ring = std::move(*r);
    pool = aligned(static_cast<std::size_t>(blocks) * kDiskBlock);
    for (unsigned b = 0; b < blocks; ++b) free_blocks.push_back(blocks - 1 - b);
    ring->set_buffer(0, pool.get(), static_cast<std::size_t>(blocks) * kDiskBlock);
    slab_registered.assign(arena_slabs, false);
    recover();
    disk.on_slab_assigned([this](std::uint32_t e, std::uint64_t object_bytes) { write_extent_header(e, object_bytes); });
  }

  void recover() {
    DiskRecovery r = recover_disk(*ring, files, extent_bytes, total_extents, disk);
    st.recovered_objects = r.objects;
    st.recovery_dropped = r.dropped;
    st.recovery_seconds = r.seconds;
    recovered_descriptions = std::move(r.descriptions);
  }

  void write_extent_header(std::uint32_t e, std::uint64_t object_bytes) {
    auto block = std::make_shared<Aligned>(aligned(kDiskBlock));
    std::byte* h = block->get();
    server::write_extent_header(
        {static_cast<std::uint32_t>(files.size()), extent_bytes, e, object_bytes, disk.stride(object_bytes)}, h);
    auto [fd, off] = place(std::uint64_t{e} * extent_bytes);
    // Its objects may be written before it lands: a crash then loses them
    // at the restart (a miss), never misreads them.
    ring->write(fd, h, kDiskBlock, off, -1, [self = shared_from_this(), block](int res) {
      if (res != static_cast<int>(kDiskBlock)) self->io_failed(false, res);
    });
    ring->flush();
  }

  // ---- the work -------------------------------------------------------------------

  void io_failed(bool read, int res) {
    ++(read ? st.read_errors : st.write_errors);
    const std::string why = res < 0 ? std::strerror(-res) : "a short transfer";
    if (!(read ? warned_read : warned_write))
      spdlog::warn("kvstrand-server: a disk {} failed ({}); {} (said once; /metrics counts them)",
                   read ? "read" : "write", why, read ? "a miss, the object dropped from the disk" : "not on disk");
    (read ? warned_read : warned_write) = true;
  }

  void committed(tier::Index& idx, std::span<const std::uint32_t> slots) {
    if (closing) return;
    for (std::uint32_t slot : slots) {
      const kv::ChunkKey& key = idx.key_at(slot);
      tier::Index* d = disk.index(idx.object_bytes());
      if (d != nullptr && d->present(key)) continue;  // on disk already
      const DescriptionPool::Id whole = events ? events->hold_whole(idx, slot) : DescriptionPool::kNone;
      if (queue.push(idx, slot, whole) == WriteBehind::Push::full) ++st.write_dropped;
    }
    pump();
  }

  // Starts what the free header blocks allow: promotions' reads first.
  void pump() {
    while (!closing && !free_blocks.empty()) {
      if (!reads.empty()) {
        Job j = std::move(reads.front());
        reads.pop_front();
        if (j.batch->expired) {
          cancel_read(j);
          continue;
        }
        start(std::move(j));
      } else if (!queue.empty()) {
        start_write(queue.take());
      } else {
        break;
      }
    }
    ring->flush();
  }

  void start_write(const WriteBehind::Item& q) {
    const kv::ChunkKey key = q.key;
    tier::Index* d = disk.index(q.index->object_bytes());
    if (d == nullptr) {  // cannot be: an arena object fits an extent
      queue.done(q);
      return;
    }
    disk.make_room(*d, 1);
    std::uint32_t dslot = 0;
    // The disk's shares are its own (TenantBook::scaled), by name.
    const tier::TenantId tenant =
        arena_tenants && disk_tenants ? disk_tenants->id_of(arena_tenants->name(q.index->tenant_at(q.slot))).value_or(0) : 0;
    const tier::Index::Reserve r = d->reserve(key, q.image, &dslot, tenant);
    if (r != tier::Index::Reserve::reserved) {
      if (r == tier::Index::Reserve::full) ++st.write_dropped;  // every disk slot of its size is being read
      queue.done(q);
      return;
    }
    if (events) events->describe(*d, dslot, q.description);
    Job j;
    j.read = false;
    j.item_description = q.description;
    j.arena_index = q.index;
    j.disk_index = d;
    j.key = key;
    j.image = q.image;
    j.arena_slot = q.slot;
    j.disk_slot = dslot;
    start(std::move(j));
  }

  void start(Job j) {
    j.block = free_blocks.back();
    free_blocks.pop_back();
    const std::uint64_t object_bytes = j.arena_index->object_bytes();
    std::byte* object = arena_object(*j.arena_index, j.arena_slot);
    if (!j.read) {
      std::memset(block_at(j.block), 0, kDiskBlock);
      // Its tenant kept with it (by tag): a restarted server's quotas hold at once.
      const std::uint64_t tag = disk_tenants ? disk_tenants->tag(j.disk_index->tenant_at(j.disk_slot)) : 0;
      tier::write_object_header(j.key, j.image, {object, object_bytes}, block_at(j.block), tag);
      if (events)
        j.description_on_disk = write_description(events->description(*j.disk_index, j.disk_slot), block_at(j.block));
    }
    const std::uint64_t at = disk.offset_of(*j.disk_index, j.disk_slot);
    auto [fd, off] = place(at);
    auto shared = std::make_shared<Job>(std::move(j));
    shared->pending = 2;
    ++in_flight;
    auto one = [self = shared_from_this(), shared](std::size_t want) {
      return [self, shared, want](int res) { self->op_done(*shared, res, want); };
    };
    const std::size_t body = round_up(object_bytes);
    if (shared->read) {
      ring->read(fd, block_at(shared->block), kDiskBlock, off - kDiskBlock, 0, one(kDiskBlock));
      ring->read(fd, object, body, off, arena_buffer(object), one(body));
    } else {
      ring->write(fd, block_at(shared->block), kDiskBlock, off - kDiskBlock, 0, one(kDiskBlock));
      ring->write(fd, object, body, off, arena_buffer(object), one(body));
    }
  }

  void op_done(Job& j, int res, std::size_t want) {
    if (j.error == 0 && res != static_cast<int>(want)) j.error = res < 0 ? res : 1;
    if (--j.pending != 0) return;
    --in_flight;
    settled.notify();  // drain() and close() look again
    // The header block goes back, and the next transfer out, before this
    // one is checked (a checksum over its object is the longest thing the
    // strand does): the disk is kept busy meanwhile.
    std::array<std::byte, tier::kObjectHeaderBytes> header;
    std::memcpy(header.data(), block_at(j.block), header.size());
    if (j.read && events) j.description = read_description(block_at(j.block));
    free_blocks.push_back(j.block);
    pump();
    if (j.read)
      read_done(j, header);
    else
      write_done(j);
  }

  void write_done(Job& j) {
    const kv::ChunkKey& key = j.key;
    if (j.error == 0) {
      j.disk_index->commit(key);
      // Dropped while it was written (its commit freed it): its header,
      // just written, must not bring it back with a restart.
      if (!j.disk_index->present(key)) {
        clear_header(*j.disk_index, j.disk_slot);
        ring->flush();
      } else if (events && j.description_on_disk) {
        // Its header block keeps the whole description for a promotion.
        events->keep_removal_only(*j.disk_index, {&j.disk_slot, 1});
      }
      ++st.written;
      st.written_bytes += j.arena_index->object_bytes();
    } else {
      j.disk_index->abort(key);
      io_failed(false, j.error);
    }
    queue.done({j.arena_index, key, j.arena_slot, j.image, j.item_description});
  }

  void read_done(Job& j, std::span<const std::byte> header) {
    const kv::ChunkKey& key = j.key;
    const std::uint64_t object_bytes = j.arena_index->object_bytes();
    bool good = false;
    if (j.error != 0) {
      io_failed(true, j.error);
    } else {
      auto h = tier::read_object_header(header);
      good = h && h->key == key && h->has_image == j.image &&
             tier::object_matches(*h, {arena_object(*j.arena_index, j.arena_slot), object_bytes});
      if (!good) {
        ++st.checksum_failures;
        j.batch->refused_value = true;
        spdlog::warn("kvstrand-server: a disk object failed its check ({}): a miss, dropped from the disk",
                     h ? "its bytes or its key" : h.why());
      }
    }
    if (good) {
      // Announced with the whole description its header block kept (the
      // disk's slot holds a part only).
      if (events && !j.description.empty()) events->describe(*j.arena_index, j.arena_slot, j.description);
      j.arena_index->commit(key);
      if (events) events->keep_removal_only(*j.arena_index, {&j.arena_slot, 1});
      ++st.promoted;
      st.read_bytes += object_bytes;
    } else {
      j.arena_index->abort(key);
    }
    j.disk_index->read_unlock(key);
    if (!good) j.disk_index->erase(key);
    if (--j.batch->left == 0) j.batch->done.notify();
  }

  // A queued read whose lookup was answered before it started.
  void cancel_read(Job& j) {
    j.arena_index->abort(j.key);
    j.disk_index->read_unlock(j.key);
    if (--j.batch->left == 0) j.batch->done.notify();
  }

  asio::awaitable<Promoted> promote(tier::Index& idx, std::vector<kv::ChunkKey> keys, tier::TenantId tenant) {
    auto keep = shared_from_this();
    tier::Index* d = closing ? nullptr : disk.index(idx.object_bytes());
    if (d == nullptr || keys.empty()) co_return Promoted{idx.present_run(keys)};
    ++st.lookups;
    const std::size_t n = d->present_run(keys);
    if (n == 0) {
      ++st.lookup_misses;
      co_return Promoted{idx.present_run(keys)};
    }
    std::optional<std::vector<std::uint32_t>> dslots = d->read_lock(std::span<const kv::ChunkKey>(keys.data(), n));
    if (!dslots) co_return Promoted{idx.present_run(keys)};
    classes.make_room(idx, n);
    auto batch = std::make_shared<Batch>(strand);
    for (std::size_t i = 0; i < n; ++i) {
      const bool image = d->image_at((*dslots)[i]);
      std::uint32_t aslot = 0;
      const tier::Index::Reserve r = idx.reserve(keys[i], image, &aslot, tenant);
      if (r == tier::Index::Reserve::reserved) {
        if (events) events->copy(*d, (*dslots)[i], idx, aslot);
        Job j;
        j.read = true;
        j.arena_index = &idx;
        j.disk_index = d;
        j.key = keys[i];
        j.image = image;
        j.arena_slot = aslot;
        j.disk_slot = (*dslots)[i];
        j.batch = batch;
        ++batch->left;
        reads.push_back(std::move(j));
        continue;
      }
      // Stored meanwhile or being written by a client: not read; the arena
      // full: neither is the rest.
      const std::size_t last = r == tier::Index::Reserve::full ? n : i + 1;
      d->read_unlock(std::span<const kv::ChunkKey>(keys.data() + i, last - i));
      if (r == tier::Index::Reserve::full) break;
    }
    pump();
    if (batch->left > 0) {
      co_await batch->done.wait_for(opt.timeout);
      if (batch->left > 0) {
        ++st.timeouts;
        batch->expired = true;  // what has not started is dropped; what runs commits later
        std::erase_if(reads, [&](Job& j) {
          if (j.batch != batch) return false;
          cancel_read(j);
          return true;
        });
      }
    }
    co_return Promoted{idx.present_run(keys), batch->expired         ? LevelMiss::timeout
                                              : batch->refused_value ? LevelMiss::refused_value
                                                                     : LevelMiss::none};
  }

  void slab_ready(std::uint32_t slab) {
    if (slab >= arena_slabs || closing) return;
    slab_registered[slab] = ring->set_buffer(slab + 1, arena + std::uint64_t{slab} * arena_slab_bytes, arena_slab_bytes);
  }

  // Until `done()` or `bound` has passed: woken by each transfer's end, not
  // polled.
  template <class Done>
  asio::awaitable<void> settle(std::chrono::milliseconds bound, Done done) {
    co_await settled.wait_until(done, std::chrono::steady_clock::now() + bound);
  }

  asio::awaitable<std::size_t> drain(std::chrono::milliseconds bound) {
    auto keep = shared_from_this();
    auto settled_all = [this] { return queue.empty() && in_flight == 0; };  // named: GCC 12
    co_await settle(bound, settled_all);
    co_return queue.size() + in_flight;
  }

  std::size_t drop(const kv::Digest& ns) {
    queue.drop_namespace(ns);
    const std::size_t n =
        disk.drop_namespace(ns, [&](const tier::Index& d, std::uint32_t slot) { clear_header(d, slot); });
    ring->flush();
    return n;
  }

  // Zeroes a slot's header block: a restarted server reads it as never
  // written (a dropped object must not come back with the restart). The
  // ring does not order it against a later write of the slot's next
  // object: that object may then read as never written after a restart (a
  // miss), never as the dropped one.
  void clear_header(const tier::Index& d, std::uint32_t slot) {
    if (!zero_block) {
      zero_block = std::make_shared<Aligned>(aligned(kDiskBlock));
      std::memset(zero_block->get(), 0, kDiskBlock);
    }
    auto [fd, off] = place(disk.offset_of(d, slot));
    ++in_flight;
    ring->write(fd, zero_block->get(), kDiskBlock, off - kDiskBlock, -1,
                [self = shared_from_this(), block = zero_block](int res) {
                  --self->in_flight;
                  self->settled.notify();
                  if (res != static_cast<int>(kDiskBlock)) self->io_failed(false, res);
                });
  }

  asio::awaitable<void> close(std::chrono::milliseconds bound) {
    auto keep = shared_from_this();
    closing = true;
    queue.clear();
    for (Job& j : std::exchange(reads, {})) cancel_read(j);
    auto none_running = [this] { return in_flight == 0; };  // named: GCC 12
    co_await settle(bound, none_running);
    if (in_flight != 0)
      spdlog::warn("kvstrand-server: stopping with {} disk transfer(s) still running", in_flight);
    ring->close();
  }

  DiskStats stats() const {
    DiskStats s = st;
    const tier::Index::Stats d = disk.stats();
    s.used_bytes = d.used_bytes;
    s.objects = d.objects;
    s.evictions = d.evictions;
    s.pinned = d.pinned;
    s.capacity_bytes = std::uint64_t{total_extents} * (extent_bytes - kDiskBlock);
    s.files = files.size();
    s.registered_buffers = ring && ring->registered();
    s.queue = queue.size();
    s.in_flight = in_flight;
    return s;
  }

  common::Strand strand;
  DiskOptions opt;
  std::byte* arena;
  std::uint64_t arena_slab_bytes;
  std::uint32_t arena_slabs;
  tier::SizeClasses& classes;
  std::uint64_t extent_bytes;
  tier::SizeClasses disk;  // the disk's slots, one class per object size
  std::vector<DiskFile> files;
  std::uint32_t total_extents = 0;
  std::unique_ptr<DiskRing> ring;
  Aligned pool;  // header blocks, registered buffer 0
  std::vector<unsigned> free_blocks;
  std::vector<bool> slab_registered;  // arena slab s is registered buffer s + 1
  WriteBehind queue{opt.max_queued, opt.max_queued_bytes};  // each read-locked in the arena until its write ended
  std::deque<Job> reads;  // promotions' reads not started yet
  std::size_t in_flight = 0;
  std::shared_ptr<Aligned> zero_block;  // what clear_header writes
  common::Notifier settled{strand};  // notified as each transfer ends
  bool closing = false;
  bool warned_read = false, warned_write = false;
  DiskStats st;
  TierEvents* events = nullptr;
  const tier::TenantBook* arena_tenants = nullptr;  // with the server's tenants
  std::unique_ptr<tier::TenantBook> disk_tenants;
  // Descriptions found in the slot headers at the start, until the server
  // takes them (its first KV event batch).
  std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash> recovered_descriptions;
};

DiskTier::DiskTier(common::Strand strand, DiskOptions options, std::byte* arena, std::uint64_t arena_slab_bytes,
                   std::uint32_t arena_slabs, tier::SizeClasses& classes)
    : impl_(std::make_shared<Impl>(std::move(strand), std::move(options), arena, arena_slab_bytes, arena_slabs,
                                   classes)) {
  impl_->open();
  spdlog::info("kvstrand-server: disk tier of {} over {} file(s){}: {} objects found again in {:.3f} s ({} dropped)",
               common::format_bytes(impl_->opt.bytes), impl_->files.size(),
               impl_->ring->registered() ? ", registered buffers" : "", impl_->st.recovered_objects,
               impl_->st.recovery_seconds, impl_->st.recovery_dropped);
}

DiskTier::~DiskTier() {
  // After the strand stopped (TierServer's destructor): what the ring still
  // holds (completions never delivered, and the references they keep to
  // Impl) goes now.
  impl_->closing = true;
  if (impl_->ring) impl_->ring->close();
}

void DiskTier::start() { impl_->ring->start(); }
void DiskTier::set_tenants(const tier::TenantBook& arena, std::uint64_t arena_bytes) {
  impl_->arena_tenants = &arena;
  const double disk = static_cast<double>(stats().capacity_bytes);
  impl_->disk_tenants = std::make_unique<tier::TenantBook>(arena.scaled(disk / static_cast<double>(arena_bytes)));
  impl_->disk.set_tenants(impl_->disk_tenants.get());
}
const tier::TenantBook* DiskTier::tenants() const { return impl_->disk_tenants.get(); }
void DiskTier::tenant_namespaces(const std::string& name, std::set<kv::Digest>& out) const {
  if (!impl_->disk_tenants) return;
  if (auto t = impl_->disk_tenants->find(name)) out.merge(impl_->disk.namespaces_of(*t));
}
void DiskTier::set_events(TierEvents* events) {
  impl_->events = events;
  if (!events) return;
  events->watch(impl_->disk, events->publisher().options().disk_medium);
  impl_->queue.set_descriptions(events->shared_descriptions());
}
std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash> DiskTier::take_recovered_descriptions() {
  return std::exchange(impl_->recovered_descriptions, {});
}
void DiskTier::slab_ready(std::uint32_t slab) { impl_->slab_ready(slab); }
void DiskTier::committed(tier::Index& index, std::span<const std::uint32_t> slots) { impl_->committed(index, slots); }

std::size_t DiskTier::drop(const kv::Digest& ns) { return impl_->drop(ns); }

asio::awaitable<Promoted> DiskTier::promote(tier::Index& index, std::vector<kv::ChunkKey> keys,
                                            tier::TenantId tenant) {
  co_return co_await impl_->promote(index, std::move(keys), tenant);
}
asio::awaitable<std::size_t> DiskTier::drain(std::chrono::milliseconds bound) {
  co_return co_await impl_->drain(bound);
}
asio::awaitable<void> DiskTier::close(std::chrono::milliseconds bound) { co_await impl_->close(bound); }
DiskStats DiskTier::stats() const { return impl_->stats(); }

}  // namespace kvstrand::server
