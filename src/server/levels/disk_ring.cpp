#include "server/levels/disk_ring.hpp"

#include <liburing.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace kvstrand::server {

namespace asio = boost::asio;

common::Expected<DiskFault> disk_fault_from_env() {
  DiskFault f;
  const char* env = std::getenv("KVSTRAND_TEST_DISK_FAULT");
  if (env == nullptr) return f;
  std::stringstream words(env);
  std::string w;
  while (std::getline(words, w, ',')) {
    if (w.empty()) continue;
    if (w == "read-eio") {
      f.read_eio = true;
    } else if (w == "write-eio") {
      f.write_eio = true;
    } else if (w == "write-enospc") {
      f.write_enospc = true;
    } else if (w.rfind("delay-ms=", 0) == 0) {
      f.delay = std::chrono::milliseconds(std::atoi(w.c_str() + 9));
    } else {
      return common::unexpected("KVSTRAND_TEST_DISK_FAULT: unknown fault '" + w +
                                "' (read-eio, write-eio, write-enospc, delay-ms=N)");
    }
  }
  return f;
}

DiskRing::DiskRing(common::Strand strand, DiskFault fault)
    : strand_(std::move(strand)), fault_(fault), ring_(std::make_unique<io_uring>()) {}

common::Expected<std::unique_ptr<DiskRing>> DiskRing::open(common::Strand strand, unsigned entries, unsigned buffers,
                                                           DiskFault fault) {
  std::unique_ptr<DiskRing> r(new DiskRing(std::move(strand), fault));
  if (const int e = io_uring_queue_init(entries, r->ring_.get(), 0); e < 0) {
    r->ring_.reset();
    return common::unexpected(std::string("io_uring is not available here (") + std::strerror(-e) +
                              "): the disk tier needs it (Linux 5.6 or later, not blocked by a seccomp filter)");
  }
  r->event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->event_fd_ < 0 || io_uring_register_eventfd(r->ring_.get(), r->event_fd_) < 0)
    return common::unexpected(std::string("cannot wait for io_uring completions: ") + std::strerror(errno));
  // Sparse: entries are filled as the memory they name becomes ready.
  if (buffers > 0) {
    const int e = io_uring_register_buffers_sparse(r->ring_.get(), buffers);
    r->registered_ = e == 0;
    if (e < 0)
      spdlog::info("kvstrand-server: the disk tier's I/O uses no registered buffers (the kernel said: {})",
                   std::strerror(-e));
  }
  r->events_.emplace(r->strand_, r->event_fd_);  // owns the eventfd from here
  return r;
}

DiskRing::~DiskRing() {
  if (events_) {
    boost::system::error_code ignored;
    events_->close(ignored);
  } else if (event_fd_ >= 0) {
    ::close(event_fd_);
  }
  if (ring_) io_uring_queue_exit(ring_.get());
}

bool DiskRing::set_buffer(unsigned i, void* p, std::size_t bytes) {
  if (!registered_) return false;
  iovec v{p, bytes};
  __u64 tag = 0;
  const int e = io_uring_register_buffers_update_tag(ring_.get(), i, &v, &tag, 1);
  if (e < 0) {
    // One refusal (a memlock limit, a buffer over 1 GiB) turns them off
    // for all: one kind of operation is simpler to reason about.
    spdlog::info("kvstrand-server: the disk tier stops using registered buffers (the kernel said: {})",
                 std::strerror(-e));
    registered_ = false;
    return false;
  }
  return true;
}

void DiskRing::read(int fd, void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done) {
  submit(true, fd, p, bytes, offset, buffer, std::move(done));
}

void DiskRing::write(int fd, const void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done) {
  submit(false, fd, const_cast<void*>(p), bytes, offset, buffer, std::move(done));
}

void DiskRing::submit(bool is_read, int fd, void* p, std::size_t bytes, std::uint64_t offset, int buffer, Done done) {
  if (closed_) return;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe == nullptr) {  // the queue is full of unsubmitted entries: submit them first
    io_uring_submit(ring_.get());
    sqe = io_uring_get_sqe(ring_.get());
  }
  if (sqe == nullptr) {
    const std::uint64_t id = next_id_++;
    ops_.emplace(id, Op{is_read, std::move(done)});
    asio::post(strand_, [this, id] { deliver(id, -EAGAIN); });
    return;
  }
  const auto n = static_cast<unsigned>(bytes);
  if (buffer >= 0 && registered_) {
    if (is_read)
      io_uring_prep_read_fixed(sqe, fd, p, n, offset, buffer);
    else
      io_uring_prep_write_fixed(sqe, fd, p, n, offset, buffer);
  } else if (is_read) {
    io_uring_prep_read(sqe, fd, p, n, offset);
  } else {
    io_uring_prep_write(sqe, fd, p, n, offset);
  }
  const std::uint64_t id = next_id_++;
  io_uring_sqe_set_data64(sqe, id);
  ops_.emplace(id, Op{is_read, std::move(done)});
}

void DiskRing::flush() {
  if (!closed_) io_uring_submit(ring_.get());
}

void DiskRing::start() { arm(); }

void DiskRing::arm() {
  if (closed_) return;
  events_->async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec || closed_) return;
    reap();
    arm();
  });
}

void DiskRing::reap() {
  std::uint64_t count = 0;
  while (::read(event_fd_, &count, sizeof count) > 0) {
  }
  // Collected first, delivered after: a delivery may submit (and so touch
  // the completion queue's head through liburing).
  std::vector<std::pair<std::uint64_t, int>> done;
  io_uring_cqe* cqe = nullptr;
  while (io_uring_peek_cqe(ring_.get(), &cqe) == 0 && cqe != nullptr) {
    done.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
    io_uring_cqe_seen(ring_.get(), cqe);
  }
  for (auto [id, res] : done) {
    if (fault_.delay.count() > 0) {
      auto t = std::make_shared<asio::steady_timer>(strand_, fault_.delay);
      t->async_wait([this, t, id, res](boost::system::error_code) { deliver(id, res); });
    } else {
      deliver(id, res);
    }
  }
}

void DiskRing::deliver(std::uint64_t id, int result) {
  if (closed_) return;
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Op op = std::move(it->second);
  ops_.erase(it);
  if (result >= 0 && op.is_read && fault_.read_eio) result = -EIO;
  if (result >= 0 && !op.is_read && fault_.write_eio) result = -EIO;
  if (result >= 0 && !op.is_read && fault_.write_enospc) result = -ENOSPC;
  op.done(result);
}

void DiskRing::close() {
  closed_ = true;
  boost::system::error_code ignored;
  if (events_) events_->cancel(ignored);
  ops_.clear();
}

void DiskRing::read_now(std::span<SyncRead> batch) {
  // As many at a time as the submission queue holds.
  std::size_t next = 0, in_flight = 0;
  while (next < batch.size() || in_flight > 0) {
    while (next < batch.size()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) break;
      SyncRead& r = batch[next++];
      io_uring_prep_read(sqe, r.fd, r.p, static_cast<unsigned>(r.bytes), r.offset);
      io_uring_sqe_set_data(sqe, &r);
      ++in_flight;
    }
    io_uring_submit(ring_.get());
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(ring_.get(), &cqe) < 0) {
      for (std::size_t i = next - in_flight; i < batch.size(); ++i) batch[i].result = -EIO;
      break;  // the ring failed: nothing more can be read (the caller sees errors)
    }
    auto* r = static_cast<SyncRead*>(io_uring_cqe_get_data(cqe));
    r->result = cqe->res;
    if (r->result >= 0 && fault_.read_eio) r->result = -EIO;
    io_uring_cqe_seen(ring_.get(), cqe);
    --in_flight;
  }
  // The eventfd counted these: not completions for the strand.
  std::uint64_t count = 0;
  while (::read(event_fd_, &count, sizeof count) > 0) {
  }
}

}  // namespace kvstrand::server
