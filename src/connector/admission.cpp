#include "connector/admission.hpp"

#include <algorithm>

#include "index_plane/transfer_error.hpp"

namespace kvstrand::connector {

void Admission::add(Registration registration) {
  InUse in_use;
  std::uint32_t blocks = 0;
  for (const auto& p : registration.planes) blocks = std::max(blocks, p.num_blocks);
  in_use.reading.assign(blocks, 0);
  in_use.writing.assign(blocks, 0);
  in_use.reading_slots.assign(data_path::state_slot_count(registration), 0);
  in_use.writing_slots.assign(data_path::state_slot_count(registration), 0);
  in_use_.push_back(std::move(in_use));
  registrations_.push_back(std::move(registration));
}

void Admission::check_registered(std::uint32_t registration) const {
  if (registrations_.empty()) throw TransferRefused(TransferErrc::not_registered, "no layout registered");
  if (registration >= registrations_.size())
    throw TransferRefused(TransferErrc::bad_spec, "registration " + std::to_string(registration) +
                                                      " does not exist (" + std::to_string(registrations_.size()) +
                                                      " registered, ids from 0)");
}

void Admission::check(TransferKind kind, const kv::TransferSpec& spec) const {
  check_registered(spec.registration);
  if (live_.contains(TransferKeyView{spec.request, kind, spec.registration}))
    throw TransferRefused(TransferErrc::duplicate_transfer, std::string("a ") + to_string(kind) + " of request '" +
                                                                spec.request + "' (registration " +
                                                                std::to_string(spec.registration) + ") is still live");
  const Registration& reg = registrations_[spec.registration];
  auto err = kind == TransferKind::save ? reg.check_save(spec) : reg.check_load(spec);
  if (err) throw TransferRefused(TransferErrc::bad_spec, std::string(to_string(kind)) + " of request '" +
                                                             spec.request + "': " + *err);
}

void Admission::admit(std::span<const Op> ops, const Mailbox& mailbox) {
  batch_.clear();
  for (const Op& op : ops) {
    check(op.kind, op.spec);
    batch_.emplace_back(op.spec.request, op.kind, op.spec.registration);
  }
  std::sort(batch_.begin(), batch_.end());
  if (auto d = std::adjacent_find(batch_.begin(), batch_.end()); d != batch_.end())
    throw TransferRefused(TransferErrc::duplicate_transfer, std::string("two ") + to_string(d->kind) +
                                                                "s of request '" + std::string(d->request) +
                                                                "' in one batch");
  if (live_.size() + batch_.size() > max_live_)
    throw TransferRefused(TransferErrc::too_many_live,
                          std::to_string(live_.size()) + " transfers live and " + std::to_string(batch_.size()) +
                              " more would pass max_live_transfers (" + std::to_string(max_live_) +
                              "): drain finished() first");
  // Blocks and image slots: checked against the live transfers and the
  // batch's own earlier ops, and counted. A transfer whose outcome waits in
  // the mailbox (terminal, e.g. covered by a fence that returned) uses
  // nothing: on a conflict those are forgotten and the batch tried once more.
  if (const auto refusal = claim(ops)) {
    forget_uses(mailbox.terminal());
    if (claim(ops)) throw TransferRefused(TransferErrc::blocks_in_use, *refusal);
  }
}

LiveTransfer& Admission::add_live(Op& op) {
  // A drained node's string and slot list keep their capacity; the spec
  // itself is the engine's, moved in.
  auto it = spare_.insert(live_, [&](TransferKey& k, LiveTransfer& u) {
    k.request.assign(op.spec.request);
    k.kind = op.kind;
    k.registration = op.spec.registration;
    u.load = op.kind == TransferKind::load;
    u.counting = true;
    u.slots.clear();
    data_path::any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t slot) {
      u.slots.push_back(slot);
      return false;
    });
    u.spec = std::move(op.spec);
    u.queued.event.store(nullptr, std::memory_order_relaxed);  // published with the submission
  });
  return it->second;
}

const LiveTransfer* Admission::find(TransferKeyView key) const {
  auto it = live_.find(key);
  return it == live_.end() ? nullptr : &it->second;
}

// Why `op` cannot use its blocks and slots now: one a live transfer (or an
// earlier op of its batch, counted already) writes, or, for a load, reads.
std::optional<std::string> Admission::conflict(const Op& op) const {
  const InUse& u = in_use_[op.spec.registration];
  const bool load = op.kind == TransferKind::load;
  auto why = [&](const std::string& what, bool written) {
    return std::string(to_string(op.kind)) + " of request '" + op.spec.request + "': " + what + " of registration " +
           std::to_string(op.spec.registration) + " is " + (written ? "being loaded into" : "being saved from") +
           " by a live transfer";
  };
  for (kv::BlockId b : op.spec.blocks) {
    const bool written = u.writing[b] > 0;
    if (written || (load && u.reading[b] > 0)) return why("block " + std::to_string(b), written);
  }
  std::optional<std::string> refusal;
  data_path::any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t s) {
    const bool written = u.writing_slots[s] > 0;
    if (written || (load && u.reading_slots[s] > 0)) refusal = why("image slot " + std::to_string(s), written);
    return refusal.has_value();
  });
  return refusal;
}

void Admission::count(const LiveTransfer& u, int delta) {
  if (!u.counting) return;
  InUse& in = in_use_[u.spec.registration];
  for (kv::BlockId b : u.spec.blocks) (u.load ? in.writing : in.reading)[b] += delta;
  for (std::int32_t s : u.slots) (u.load ? in.writing_slots : in.reading_slots)[s] += delta;
}

void Admission::count(const Op& op, int delta) {
  InUse& in = in_use_[op.spec.registration];
  const bool load = op.kind == TransferKind::load;
  for (kv::BlockId b : op.spec.blocks) (load ? in.writing : in.reading)[b] += delta;
  data_path::any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t s) {
    (load ? in.writing_slots : in.reading_slots)[s] += delta;
    return false;
  });
}

std::optional<std::string> Admission::claim(std::span<const Op> ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (auto refusal = conflict(ops[i])) {
      for (std::size_t j = 0; j < i; ++j) count(ops[j], -1);
      return refusal;
    }
    count(ops[i], +1);
  }
  return std::nullopt;
}

void Admission::forget_uses(const std::vector<TransferKey>& terminal) {
  for (const auto& key : terminal) {
    auto it = live_.find(key);
    if (it == live_.end()) continue;
    count(it->second, -1);
    // Terminal: still live for duplicate_transfer until drained, using nothing.
    it->second.counting = false;
  }
}

// Each outcome is made here from the transfer's live entry, whose spec the
// end names: this thread's memory, freed (or reused) by this thread.
void Admission::end(TransferEnd& e, Finished& f) {
  // Always there: an entry is dropped only here, once its end is drained.
  auto it = live_.find(TransferKeyView{e.spec->request, e.kind, e.spec->registration});
  LiveTransfer& u = it->second;
  TransferOutcome o;
  o.request = it->first.request;
  o.kind = e.kind;
  o.registration = u.spec.registration;
  o.ok = e.ok;
  o.error = e.error;
  o.reason = e.reason;  // a copy: a ring slot's buffer stays the strand's
  o.tokens = u.spec.tokens;
  if (e.source_safe) f.source_safe.push_back(SourceSafe{o.request, o.registration, u.spec.blocks});
  // A save's outcome names its blocks; a failed load's, the blocks it
  // would have written.
  count(u, -1);  // a terminal one (forget_uses) counts nothing any more
  if (e.kind == TransferKind::save || !e.ok) o.blocks = std::move(u.spec.blocks);
  (e.kind == TransferKind::save ? f.saves : f.loads).push_back(std::move(o));
  spare_.erase(live_, it);
}

}  // namespace kvstrand::connector
