#include "reactor/host_tier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "hip/keep_for_process_life.hpp"
#include "reactor/copy_and_wait.hpp"
#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;

namespace {
bool still_wanted(const TierJob& job) { return !job.wanted || job.wanted(); }
Failure unwanted() {
  return {TransferErrc::deadline_exceeded, "the transfer ended (its deadline) before its copy was queued"};
}
Failure not_attached(std::uint32_t registration) {
  return {TransferErrc::bad_spec, "registration " + std::to_string(registration) + " is not attached"};
}
}  // namespace

HostTier::HostTier(Reactor& reactor, std::unique_ptr<IndexPlane> index)
    : reactor_(reactor), index_(std::move(index)) {}

HostTier::~HostTier() {
  // Only a copy never seen to end (a deadline fail-stop, a close that gave
  // up on it) can still be queued here. Waiting for it could be forever and
  // freeing under it would let it write freed memory: the streams and the
  // memory it may touch are kept for the life of the process instead.
  const auto busy = [](std::optional<hip::Stream>& s) { return s && s->query().code() == hip::Errc::not_ready; };
  if (busy(save_stream_) || busy(load_stream_)) kept_.push_back(index_->memory());
  if (kept_.empty()) return;
  spdlog::warn("kvstrand: the {} tier: a copy on its streams never ended; its streams and the memory that copy may "
               "touch are left allocated on purpose",
               index_->kind());
  for (auto& m : kept_) hip::keep_shared_for_process_life(std::move(m));
  if (save_stream_) hip::keep_for_process_life(std::move(*save_stream_));
  if (load_stream_) hip::keep_for_process_life(std::move(*load_stream_));
}

asio::awaitable<Failure> HostTier::attach(const Registration& reg) {
  if (!save_stream_) {
    auto saves = hip::Stream::create();
    auto loads = hip::Stream::create();
    for (const hip::Status& s : {saves.status(), loads.status()})
      if (!s.ok()) co_return Failure{TransferErrc::device_error, std::string("the ") + index_->kind() +
                                                                     " tier's copy streams: " + s.describe()};
    save_stream_.emplace(std::move(saves).value());
    load_stream_.emplace(std::move(loads).value());
  }
  Failure f = co_await index_->attach(reg);
  if (!f) regs_.push_back(&reg);
  co_return f;
}

asio::awaitable<Tier::LookupResult> HostTier::lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  if (registration >= regs_.size()) co_return LookupResult{};
  co_return co_await index_->lookup(registration, std::move(keys));
}

asio::awaitable<void> HostTier::release_lookup(std::uint64_t lease) { co_await index_->release_lookup(lease); }

asio::awaitable<Tier::LookupResult> HostTier::adopt(std::uint32_t registration, std::uint64_t lease,
                                                   std::vector<kv::ChunkKey> keys) {
  if (registration >= regs_.size()) co_return LookupResult{};
  co_return co_await index_->adopt(registration, lease, std::move(keys));
}

asio::awaitable<TierOutcome> HostTier::save(TierJob job) {
  TierOutcome o;
  const kv::TransferSpec& s = job.spec;
  if (s.registration >= regs_.size()) {  // the Connector refuses such a spec before posting it
    o.fail(not_attached(s.registration));
    co_return o;
  }
  if (!index_->stores(s.registration)) co_return o;  // another rank stores the one copy
  const Registration& reg = *regs_[s.registration];
  std::vector<bool> images(s.keys.size(), false);
  for (std::size_t i = 0; i < s.keys.size(); ++i)
    images[i] = s.with_state && s.state_slots[i * reg.state_part_count()] >= 0;
  IndexPlane::Places places = co_await index_->reserve(s.registration, s.keys, images, job.deadline);
  if (places.failure) {
    o.fail(std::move(places.failure));
    co_return o;
  }
  if (std::any_of(places.objects.begin(), places.objects.end(), [](std::byte* p) { return p != nullptr; })) {
    if (!still_wanted(job)) {
      co_await index_->commit(s.registration, s.keys, places, false, job.deadline);
      o.fail(unwanted());
      co_return o;
    }
    for (std::size_t i = 0; i < images.size(); ++i) images[i] = images[i] && places.objects[i] != nullptr;
    CopyEnd copy = co_await copy_and_wait(reactor_, *save_stream_, hip::CopyKind::device_to_host,
                                          segments(reg, s, places.objects, true, images), job.queued);
    if (!copy.seen) {
      kept_.push_back(std::move(places.memory));  // and the places stay held: the copy may still write them
      o.fail(std::move(copy.failure));
      co_return o;
    }
    const bool copied = !copy.failure;
    if (!copied) o.fail(std::move(copy.failure));
    Failure committed = co_await index_->commit(s.registration, s.keys, places, copied, job.deadline);
    if (copied && committed) o.fail({committed.ec, "copied, but not committed: " + committed.why});
  }
  if (!o.error && places.refused > 0)  // the chunks that existed are not rewritten: no error
    o.fail({TransferErrc::tier_full, std::to_string(places.refused) + " of " + std::to_string(s.keys.size()) +
                                         " chunks refused: every object is in use (tier full)"});
  co_return o;
}

asio::awaitable<TierOutcome> HostTier::load(TierJob job) {
  TierOutcome o;
  const kv::TransferSpec& s = job.spec;
  if (s.registration >= regs_.size()) {  // the Connector refuses such a spec before posting it
    o.fail(not_attached(s.registration));
    co_return o;
  }
  const Registration& reg = *regs_[s.registration];
  IndexPlane::Held held = co_await index_->hold(s, job.deadline);
  if (held.failure) {
    o.fail(std::move(held.failure));
    co_return o;
  }
  const bool whole = held.objects.size() == s.keys.size() &&
                     std::none_of(held.objects.begin(), held.objects.end(), [](std::byte* p) { return p == nullptr; });
  if (!whole || (s.with_state && !held.image_at_end)) {
    index_->release(s, held);
    o.fail({TransferErrc::missing_chunk, whole ? "no checkpoint image stored at the load's end"
                                               : "the tier no longer holds every chunk of the load"});
    co_return o;
  }
  if (!still_wanted(job)) {
    index_->release(s, held);
    o.fail(unwanted());
    co_return o;
  }
  std::vector<bool> images(held.objects.size(), false);
  if (s.with_state) images.back() = true;
  CopyEnd copy = co_await copy_and_wait(reactor_, *load_stream_, hip::CopyKind::host_to_device,
                                        segments(reg, s, held.objects, false, images), job.queued);
  if (!copy.seen) {
    kept_.push_back(std::move(held.memory));  // and the hold stays: the copy may still read those objects
    o.fail(std::move(copy.failure));
    co_return o;
  }
  index_->release(s, held);  // the copy is done: nothing else needs the index for its outcome
  if (copy.failure) o.fail(std::move(copy.failure));
  co_return o;
}

asio::awaitable<void> HostTier::drain() { co_await index_->drain(); }

}  // namespace kvstrand::reactor
