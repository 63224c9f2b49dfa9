#include "connector/mailbox.hpp"

namespace kvstrand {

const char* to_string(TransferKind k) noexcept { return k == TransferKind::save ? "save" : "load"; }

std::vector<const TransferOutcome*> Finished::failed_loads() const {
  std::vector<const TransferOutcome*> out;
  for (const auto& l : loads)
    if (!l.ok) out.push_back(&l);
  return out;
}

}  // namespace kvstrand

namespace kvstrand::connector {

void Mailbox::push(LookupOutcome l) {
  std::lock_guard lk(m_);
  lookups_.push_back(std::move(l));
  pending_flag_.store(true, std::memory_order_release);
}
void Mailbox::set_fail_stop(std::error_code code, std::string what) {
  std::lock_guard lk(m_);
  if (!fail_) fail_ = FailStopState{code, std::move(what)};
  failed_.store(true, std::memory_order_release);
  pending_flag_.store(true, std::memory_order_release);
}

void Mailbox::drain_locked(Drained& into) {
  if (!pending_flag_.load(std::memory_order_acquire)) return;
  std::lock_guard lk(m_);
  if (!overflow_.empty()) overflow_drains_.fetch_add(1, std::memory_order_release);
  std::swap(overflow_, into.ends);
  std::swap(lookups_, into.lookups);
  pending_flag_.store(fail_.has_value(), std::memory_order_release);
}

std::vector<TransferKey> Mailbox::terminal() const {
  std::vector<TransferKey> out;
  auto key = [&](const TransferEnd& e) { out.push_back({e.spec->request, e.kind, e.spec->registration}); };
  peek_ends(key);
  std::lock_guard lk(m_);
  for (const TransferEnd& e : overflow_) key(e);
  return out;
}

std::optional<FailStopState> Mailbox::fail_stop() const {
  std::lock_guard lk(m_);
  return fail_;
}

}  // namespace kvstrand::connector
