// A tier hit promised to the scheduler but not yet dispatched as a load.
//
// The request is parked on the promise. If the load is not dispatched within
// `withdraw_after` scheduler steps (default 50) the promise is withdrawn: the
// request recomputes, the lookup's lease is freed directly (the load was
// never submitted), and nothing counts as a transfer failure
// (LoadOutcome::withdrawn).
#pragma once

#include <cstdint>

#include <kvstrand/token_range.hpp>

namespace kvstrand::kv {

class LoadPromise {
 public:
  static constexpr std::uint32_t default_withdraw_after = 50;

  LoadPromise(TokenRange load, std::uint64_t lookup_id, std::uint32_t withdraw_after = default_withdraw_after)
      : load_(load), lookup_id_(lookup_id), withdraw_after_(withdraw_after) {}

  enum class Verdict { waiting, dispatched, withdraw };

  // Once per scheduler step while the request is parked on it.
  Verdict step() noexcept {
    if (dispatched_) return Verdict::dispatched;
    return ++steps_ > withdraw_after_ ? Verdict::withdraw : Verdict::waiting;
  }
  void dispatch() noexcept { dispatched_ = true; }

  TokenRange load() const noexcept { return load_; }
  std::uint64_t lookup_id() const noexcept { return lookup_id_; }
  std::uint32_t steps_waited() const noexcept { return steps_; }

 private:
  TokenRange load_;
  std::uint64_t lookup_id_;
  std::uint32_t withdraw_after_;
  std::uint32_t steps_ = 0;
  bool dispatched_ = false;
};

}  // namespace kvstrand::kv
