#include "reactor/reactor.hpp"

#include <pthread.h>

#include <spdlog/spdlog.h>

#include <stdexcept>
#include <string>

#include "device/device.hpp"

namespace kvstrand::reactor {

Reactor::Reactor(ReactorOptions options)
    : options_(options), work_(ctx_.get_executor()), strand_(asio::make_strand(ctx_)),
      poller_(std::make_unique<Poller>(strand_, options.poller)) {
  // spdlog's registry is made on its first use (a function-local static in
  // libspdlog, whose guard ThreadSanitizer cannot see): two reactors'
  // threads logging first at once (two connectors losing their server
  // together) were reported as a race. Made here, before this thread starts.
  (void)spdlog::default_logger_raw();
  thread_ = std::thread([this] {
    // Named for top, perf and gdb: an engine's process has several threads.
    pthread_setname_np(pthread_self(), "kvstrand-reactr");
    ctx_.run();
  });
  // The reactor thread's current device: streams and events it creates
  // belong to it (CUDA and HIP keep the current device per thread). Without
  // it they would be made on another device: refused, not warned about.
  const device::Status selected =
      call([this]() -> asio::awaitable<device::Status> { co_return device::select_device(options_.device); });
  if (!selected.ok()) {
    stop();  // the thread is running: a constructor that throws must end it
    throw std::invalid_argument("device: cannot select device " + std::to_string(options_.device) + ": " +
                                selected.describe());
  }
  call([this]() -> asio::awaitable<void> {
    pool_.emplace(device::EventPool::Options{.warm = options_.warm_events});
    if (device::Status s = pool_->warm_up(); !s.ok()) spdlog::warn("kvstrand: event pool warm-up: {}", s.describe());
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
