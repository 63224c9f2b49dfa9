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

void Mailbox::push(TransferEnd e) {
  std::lock_guard lk(m_);
  pending_.ends.push_back(std::move(e));
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

void Mailbox::drain(Drained& into) {
  std::lock_guard lk(m_);
  for (const TransferEnd& e : pending_.ends) {
    if (e.kind != TransferKind::load) continue;
    auto it = queued_.find(TransferKeyView{e.spec->request, TransferKind::load, e.spec->registration});
    if (it == queued_.end()) continue;
    it->second.reset();
    spare_queued_.erase(queued_, it);
  }
  std::swap(pending_.ends, into.ends);
  std::swap(pending_.lookups, into.lookups);
  pending_flag_.store(fail_.has_value(), std::memory_order_release);
}

std::vector<TransferKey> Mailbox::terminal() const {
  std::lock_guard lk(m_);
  std::vector<TransferKey> out;
  for (const auto& e : pending_.ends) out.push_back({e.spec->request, e.kind, e.spec->registration});
  return out;
}

void Mailbox::push_queued(const std::string& request, std::uint32_t registration,
                          std::shared_ptr<const hip::Event> event) {
  std::lock_guard lk(m_);
  if (auto it = queued_.find(TransferKeyView{request, TransferKind::load, registration}); it != queued_.end()) {
    it->second = std::move(event);
    return;
  }
  spare_queued_.insert(queued_, [&](TransferKey& k, std::shared_ptr<const hip::Event>& e) {
    k.request.assign(request);  // a kept node's string keeps its capacity
    k.kind = TransferKind::load;
    k.registration = registration;
    e = std::move(event);
  });
}

std::shared_ptr<const hip::Event> Mailbox::queued(const std::string& request, std::uint32_t registration) const {
  std::lock_guard lk(m_);
  auto it = queued_.find(TransferKeyView{request, TransferKind::load, registration});
  return it == queued_.end() ? nullptr : it->second;
}

std::optional<FailStopState> Mailbox::fail_stop() const {
  std::lock_guard lk(m_);
  return fail_;
}

}  // namespace kvstrand::reactor
