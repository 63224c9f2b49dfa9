#include "device/sim_stream.hpp"

#include <cstring>

namespace kvstrand::device::simdev {

void SimStream::run() {
  for (;;) {
    Op* op = nullptr;
    std::chrono::microseconds delay{};
    {
      std::unique_lock lk(m_);
      cv_.wait(lk, [&] { return (stop_ && q_.empty()) || (!q_.empty() && !held_); });
      if (q_.empty()) return;
      op = &q_.front();  // stays queued (stream not idle) until executed
      delay = delay_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (op->kind == Op::Kind::record) {
      // The event completes and leaves the queue in one step: a stream
      // whose last record has completed is idle, as on a GPU (a query in
      // between would see the event done and the stream still busy).
      std::shared_ptr<SimEvent> ev = op->ev;
      {
        std::lock_guard lk(m_);
        complete(*op);
        q_.pop_front();
      }
      ev->cv.notify_all();
    } else {
      execute(*op);
      std::lock_guard lk(m_);
      q_.pop_front();
    }
    idle_cv_.notify_all();
  }
}

void SimStream::execute(Op& op) {
  switch (op.kind) {
    case Op::Kind::copy:
      if (op.cost.count() > 0) std::this_thread::sleep_for(op.cost);
      if (op.fail != Errc::success) {
        pending_failure_ = op.fail;
        return;
      }
      for (const Segment& g : op.segs) std::memmove(g.dst, g.src, g.bytes);
      return;
    case Op::Kind::record: return;  // run() completes it with the queue locked
    case Op::Kind::host_func:
      op.fn(op.arg);
      return;
    case Op::Kind::wait: {
      // Until the event reaches the generation recorded when the wait was
      // queued. A stream being destroyed stops waiting (a GPU would let
      // the wait run on; nothing here is left to order after it).
      std::unique_lock lk(op.ev->m);
      while (op.ev->completed < op.gen && !stopping_.load())
        op.ev->cv.wait_for(lk, std::chrono::milliseconds(5));
      return;
    }
  }
}

void SimStream::complete(Op& op) {
  std::lock_guard lk(op.ev->m);
  if (op.gen > op.ev->completed) {
    op.ev->completed = op.gen;
    op.ev->failure = pending_failure_;
  }
  pending_failure_ = Errc::success;
}

}  // namespace kvstrand::device::simdev
