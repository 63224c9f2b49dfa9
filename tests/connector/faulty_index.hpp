// Index plane doubles for the Connector's fault tests.
#pragma once

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <vector>

#include "connector/connector.hpp"
#include "index_plane/local_index.hpp"

namespace kvstrand::test {

// LocalIndex, except that a save whose first key is in `poisoned` never
// gets its places (a server that stopped reading: `Fault::hang`), has its
// reserve throw (a bug in an index: `Fault::raise`), or is given up at its
// deadline before the transfer's own deadline timer has run (RemoteIndex's
// request timer, when the strand runs it first: `Fault::deadline`). The test
// adds the keys before it posts those saves; the ring's hand-off orders the
// two threads.
class FaultyIndex final : public index_plane::LocalIndex {
 public:
  enum class Fault { hang, raise, deadline };
  using Poisoned = std::shared_ptr<std::vector<kv::ChunkKey>>;
  FaultyIndex(reactor::Reactor& r, Fault fault, Poisoned poisoned)
      : LocalIndex(64ull << 20), reactor_(r), fault_(fault), poisoned_(std::move(poisoned)) {}

  boost::asio::awaitable<Places> reserve(std::uint32_t reg, const std::vector<kv::ChunkKey>& keys,
                                         const std::vector<bool>& images, const std::vector<std::string>& events,
                                         Clock::time_point deadline) override {
    if (!keys.empty() && std::find(poisoned_->begin(), poisoned_->end(), keys.front()) != poisoned_->end()) {
      if (fault_ == Fault::raise) throw std::runtime_error("injected: an index bug");
      if (fault_ == Fault::deadline) {
        Places late;
        late.failure = {kvstrand::TransferErrc::deadline_exceeded, "injected: no answer by the deadline"};
        co_return late;
      }
      boost::asio::steady_timer forever(reactor_.strand(), std::chrono::hours(1));
      boost::system::error_code ec;
      co_await forever.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
      Places cut;
      cut.failure = {std::make_error_code(std::errc::operation_canceled), "shut down"};
      co_return cut;
    }
    co_return co_await LocalIndex::reserve(reg, keys, images, events, deadline);
  }
  const char* kind() const noexcept override { return "faulty"; }

 private:
  reactor::Reactor& reactor_;
  Fault fault_;
  Poisoned poisoned_;
};

// LocalIndex that notes its own end: whether close() freed the tier.
class NotedIndex final : public index_plane::LocalIndex {
 public:
  explicit NotedIndex(std::shared_ptr<std::atomic<bool>> freed) : LocalIndex(64ull << 20), freed_(std::move(freed)) {}
  ~NotedIndex() override { freed_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> freed_;
};

inline connector::ConnectorOptions over_faulty_index(connector::ConnectorOptions o, FaultyIndex::Fault fault,
                                                     FaultyIndex::Poisoned poisoned) {
  o.make_index = [fault, poisoned](reactor::Reactor& r) { return std::make_unique<FaultyIndex>(r, fault, poisoned); };
  return o;
}

}  // namespace kvstrand::test
