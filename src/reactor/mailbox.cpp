#include "reactor/mailbox.hpp"

namespace kvstrand {

const char* to_string(TransferKind k) noexcept { return k == TransferKind::save ? "save" : "load"; }

std::vector<const TransferOutcome*> Finished::failed_loads() const {
  std::vector<const TransferOutcome*> out;
  for (const auto& l : loads)
    if (!l.ok) out.push_back(&l);
  return out;
}

}  // namespace kvstrand

namespace kvstrand::reactor {

void Mailbox::push(TransferOutcome o) {
  std::lock_guard lk(m_);
  (o.kind == TransferKind::save ? pending_.saves : pending_.loads).push_back(std::move(o));
  pending_flag_.store(true, std::memory_order_release);
}
void Mailbox::push(SourceSafe s) {
  std::lock_guard lk(m_);
  pending_.source_safe.push_back(std::move(s));
  pending_flag_.store(true, std::memory_order_release);
}
void Mailbox::push(LookupOutcome l) {
  std::lock_guard lk(m_);
  pending_.lookups.push_back(std::move(l));
  pending_flag_.store(true, std::memory_order_release);
}
void Mailbox::set_fail_stop(std::error_code code, std::string what) {
  std::lock_guard lk(m_);
  if (!fail_) fail_ = FailStopState{code, std::move(what)};
  failed_.store(true, std::memory_order_release);
  pending_flag_.store(true, std::memory_order_release);
}

Finished Mailbox::drain() {
  std::lock_guard lk(m_);
  for (const auto& o : pending_.loads) queued_.erase({o.request, o.registration});
  pending_flag_.store(fail_.has_value(), std::memory_order_release);
  return std::exchange(pending_, Finished{});
}

std::vector<TransferKey> Mailbox::terminal() const {
  std::lock_guard lk(m_);
  std::vector<TransferKey> out;
  for (const auto& o : pending_.saves) out.push_back({o.request, TransferKind::save, o.registration});
  for (const auto& o : pending_.loads) out.push_back({o.request, TransferKind::load, o.registration});
  return out;
}

void Mailbox::push_queued(const std::string& request, std::uint32_t registration,
                          std::shared_ptr<const hip::Event> event) {
  std::lock_guard lk(m_);
  queued_[{request, registration}] = std::move(event);
}

std::shared_ptr<const hip::Event> Mailbox::queued(const std::string& request, std::uint32_t registration) const {
  std::lock_guard lk(m_);
  auto it = queued_.find({request, registration});
  return it == queued_.end() ? nullptr : it->second;
}

std::optional<FailStopState> Mailbox::fail_stop() const {
  std::lock_guard lk(m_);
  return fail_;
}

}  // namespace kvstrand::reactor
