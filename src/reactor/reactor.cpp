#include "reactor/reactor.hpp"

#include <spdlog/spdlog.h>

#include "hip/device.hpp"

namespace kvstrand::reactor {

Reactor::Reactor(ReactorOptions options)
    : options_(options), work_(ctx_.get_executor()), strand_(asio::make_strand(ctx_)),
      poller_(std::make_unique<Poller>(strand_, options.poller)) {
  thread_ = std::thread([this] { ctx_.run(); });
  call([this]() -> asio::awaitable<void> {
    // The reactor thread's current device: streams and events it creates
    // belong to it (CUDA and HIP keep the current device per thread).
    if (hip::Status s = hip::select_device(options_.device); !s.ok())
      spdlog::warn("kvstrand: reactor could not select device {}: {}", options_.device, s.describe());
    pool_.emplace(hip::EventPool::Options{.warm = options_.warm_events});
    if (hip::Status s = pool_->warm_up(); !s.ok()) spdlog::warn("kvstrand: event pool warm-up: {}", s.describe());
    co_return;
  });
}

Reactor::~Reactor() { stop(); }

void Reactor::stop() {
  if (stopped_) return;
  stopped_ = true;
  call([this]() -> asio::awaitable<void> {
    poller_->shutdown();
    pool_.reset();  // on its owning thread, after every lease came back
    co_return;
  });
  work_.reset();
  // What is still pending now waits on something that will never matter (a
  // stuck tier operation's own timer, say): do not wait for it.
  ctx_.stop();
  thread_.join();
}

}  // namespace kvstrand::reactor
