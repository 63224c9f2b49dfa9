// io_uring driven from the server's strand: reads and writes are submitted
// on it and their completions delivered on it, the ring's eventfd awaited
// like any socket. No thread per request, and no thread at all.
//
// - Registered buffers: a table of `buffers` entries, filled one at a time
//   (set_buffer) as memory becomes ready (the arena slab by slab); an
//   operation naming an entry uses IORING_OP_{READ,WRITE}_FIXED, one naming
//   none the plain ones. A kernel that refuses the table (no sparse
//   registration, a memlock limit) leaves every operation plain, said once.
// - A completion is bytes moved or -errno; fewer bytes than asked is the
//   caller's to treat as an error (O_DIRECT does not return short on a
//   preallocated file but for a fault).
// - Test hook: KVSTRAND_TEST_DISK_FAULT (comma-separated): read-eio and
//   write-eio complete every read or write with -EIO after it ran;
//   write-enospc with -ENOSPC; delay-ms=N delivers each completion N ms
//   late (a slow disk). Read once, when the ring is made.
#pragma once

#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>

#include "common/expected.hpp"
#include "common/strand.hpp"

struct io_uring;

namespace kvstrand::server {

struct DiskFault {
  bool read_eio = false;
  bool write_eio = false;
  bool write_enospc = false;
  std::chrono::milliseconds delay{0};
  bool any() const { return read_eio || write_eio || write_enospc || delay.count() > 0; }
};
// KVSTRAND_TEST_DISK_FAULT as above; an unknown word is refused.
common::Expected<DiskFault> disk_fault_from_env();

class DiskRing {
 public:
  using Done = std::function<void(int result)>;  // bytes moved, or -errno

  // A ring of `entries` submissions with a table of `buffers` registered buffers.
  static common::Expected<std::unique_ptr<DiskRing>> open(common::Strand strand, unsigned entries, unsigned buffers,
                                                          DiskFault fault);
  ~DiskRing();
  DiskRing(const DiskRing&) = delete;
  DiskRing& operator=(const DiskRing&) = delete;

  // Registers `bytes` at `p` as buffer `i`. False (and every later call a
  // no-op) once the kernel refused registered buffers.
  bool set_buffer(unsigned i, void* p, std::size_t bytes);
  bool registered() const noexcept { return registered_; }

  // `buffer`: the registered buffer holding [p, p + bytes), or -1. Queued:
  // flush() submits what was queued since (one system call for several).
  void read(int fd, void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done);
  void write(int fd, const void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done);
  void flush();
  std::size_t in_flight() const noexcept { return ops_.size(); }

  // Starts delivering completions (on the strand).
  void start();
  // Stops delivering: what is still in flight ends in the kernel, unseen.
  // On the strand.
  void close();

  // Before start() only (a restarted server reading its disk, not yet
  // serving): runs one batch and waits for it. Each op: fd, buffer, bytes, offset.
  struct SyncRead {
    int fd;
    void* p;
    std::size_t bytes;
    std::uint64_t offset;
    int result = 0;
  };
  void read_now(std::span<SyncRead> batch);

 private:
  DiskRing(common::Strand strand, DiskFault fault);
  void submit(bool is_read, int fd, void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done);
  void arm();
  void reap();
  void deliver(std::uint64_t id, int result);

  common::Strand strand_;
  DiskFault fault_;
  std::unique_ptr<io_uring> ring_;
  int event_fd_ = -1;
  std::optional<boost::asio::posix::stream_descriptor> events_;
  bool registered_ = false;
  bool closed_ = false;
  struct Op {
    bool is_read;
    Done done;
  };
  std::unordered_map<std::uint64_t, Op> ops_;
  std::uint64_t next_id_ = 1;
};

}  // namespace kvstrand::server
