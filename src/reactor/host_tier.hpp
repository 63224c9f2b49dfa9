// The one data path of every host-memory tier, over an index plane that
// says where objects are (LocalIndex in this process, RemoteIndex in
// kvstrand-server):
//   save: reserve -> copy_and_wait (device to host) -> commit
//   load: hold -> copy_and_wait (host to device) -> release
// Copies run on this tier's own streams; saves (D2H) and loads (H2D) use
// separate ones, so a load never queues behind saves and the two
// directions overlap on a GPU's separate copy engines.
//
// All on the reactor strand. A copy that was not seen to end leaves what
// its index plane holds for it held, and the memory it may touch mapped,
// for good.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "hip/stream.hpp"
#include "reactor/index_plane.hpp"
#include "reactor/reactor.hpp"
#include "reactor/tier.hpp"

namespace kvstrand::reactor {

class HostTier : public Tier {
 public:
  HostTier(Reactor& reactor, std::unique_ptr<IndexPlane> index);
  ~HostTier() override;

  boost::asio::awaitable<Failure> attach(const Registration& reg) override;
  boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<void> release_lookup(std::uint64_t lease) override;
  boost::asio::awaitable<LookupResult> adopt(std::uint32_t registration, std::uint64_t lease,
                                             std::vector<kv::ChunkKey> keys) override;
  void forget_lease(std::uint64_t lease) override { index_->forget_lease(lease); }
  boost::asio::awaitable<TierOutcome> save(TierJob job) override;
  boost::asio::awaitable<TierOutcome> load(TierJob job) override;
  tier::Index::Stats stats() const override { return index_->stats(); }
  const char* kind() const noexcept override { return index_->kind(); }
  boost::asio::awaitable<void> drain() override;

  // The streams the tier copies on, once a registration is attached (tests
  // hold them with the sim hooks).
  hip::Stream* save_stream() { return save_stream_ ? &*save_stream_ : nullptr; }
  hip::Stream* load_stream() { return load_stream_ ? &*load_stream_ : nullptr; }

 protected:
  IndexPlane& index() { return *index_; }
  const IndexPlane& index() const { return *index_; }

 private:
  Reactor& reactor_;
  std::unique_ptr<IndexPlane> index_;
  std::vector<const Registration*> regs_;  // by registration id
  std::optional<hip::Stream> save_stream_;
  std::optional<hip::Stream> load_stream_;
  std::vector<std::shared_ptr<void>> kept_;  // memory a copy never seen to end may touch
};

}  // namespace kvstrand::reactor
