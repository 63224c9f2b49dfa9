// The engine thread's half of a Connector: the registrations, every
// transfer posted and not yet drained from finished(), and what blocks and
// image slots those use. It decides whether a batch may be posted (all of it
// or none) and turns each end the strand hands back into the engine's
// outcome.
//
// Engine thread only, but for one word per load entry (the queued notice)
// which the strand writes once, through the submission it was given.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <kvstrand/transfer_spec.hpp>
#include "device/event.hpp"
#include "connector/mailbox.hpp"
#include "data_path/registration.hpp"
#include "connector/spare_nodes.hpp"
#include "connector/transfer.hpp"

namespace kvstrand::connector {

// One transfer as the engine posts it.
struct Op {
  TransferKind kind = TransferKind::save;
  kv::TransferSpec spec;
  std::shared_ptr<const device::Event> producer;  // null: nothing to wait for
};

// A transfer posted and not yet drained, with the blocks and image slots it
// names: a load writes them, a save reads them (blocks_in_use). A transfer
// whose outcome already waits in the mailbox keeps its entry
// (duplicate_transfer) but uses nothing any more.
struct LiveTransfer {
  bool load = false;
  bool counting = true;  // its blocks and slots are counted (not once terminal)
  // The transfer's spec itself, kept here, on the engine's thread, which
  // makes the outcome from it and frees it: the strand never reads it (it
  // reads the spec packed into the submission ring's slot).
  kv::TransferSpec spec;
  std::vector<std::int32_t> slots;  // numbered across state memories (any_slot_use)
  // A load's copies-queued event, once the strand has recorded it (the one
  // word of this entry the strand writes; the strand lends the event to no
  // other load until this thread has taken the end: QueuedEvents). Moved
  // only before the strand knows the entry.
  struct QueuedNotice {
    std::atomic<const device::Event*> event{nullptr};
    QueuedNotice() = default;
    QueuedNotice(QueuedNotice&& o) noexcept : event(o.event.load(std::memory_order_relaxed)) {}
    QueuedNotice& operator=(QueuedNotice&& o) noexcept {
      event.store(o.event.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  } queued;
};

class Admission {
 public:
  explicit Admission(std::size_t max_live_transfers) : max_live_(max_live_transfers) {}

  // A registration the tier attached; its id is its index.
  void add(Registration registration);
  const std::vector<Registration>& registrations() const noexcept { return registrations_; }
  // Throws TransferRefused unless `registration` exists.
  void check_registered(std::uint32_t registration) const;

  // Checks a batch (registrations, specs, duplicates, max_live_transfers,
  // blocks and slots in use) and counts its uses; throws TransferRefused,
  // counting nothing, for the first refusal. A transfer whose end already
  // waits in `mailbox` uses nothing: on a conflict those are forgotten and
  // the batch tried once more.
  void admit(std::span<const Op> ops, const Mailbox& mailbox);
  // Moves an admitted op's spec into its live entry; returns that entry.
  LiveTransfer& add_live(Op& op);
  // The live entry of a transfer, if any.
  const LiveTransfer* find(TransferKeyView key) const;
  std::size_t live() const noexcept { return live_.size(); }

  // finished(): the end's live entry made its outcome (into `f`), and dropped.
  void end(TransferEnd& e, Finished& f);

 private:
  void check(TransferKind kind, const kv::TransferSpec& spec) const;
  // Why `op` cannot use its blocks and slots now; none if it can.
  std::optional<std::string> conflict(const Op& op) const;
  // Counts every op's uses, or none of them: the first refusal, if any.
  std::optional<std::string> claim(std::span<const Op> ops);
  void forget_uses(const std::vector<TransferKey>& terminal);
  void count(const LiveTransfer& u, int delta);
  void count(const Op& op, int delta);

  std::size_t max_live_;
  std::vector<Registration> registrations_;
  // Hashed: a transfer looks itself up three times (check, insert, end),
  // and a tree's string compares were a measurable part of the step.
  using LiveMap = std::unordered_map<TransferKey, LiveTransfer, TransferKeyHash, TransferKeyEqual>;
  LiveMap live_;
  // Entries of live_ drained and kept for the next post: a post reuses a
  // node, its request string and its slot list.
  SpareNodes<LiveMap> spare_;
  std::vector<TransferKeyView> batch_;  // admit()'s duplicate check, reused
  // How many live transfers read (a save) or write (a load) each block and
  // image slot, per registration (each group has its own pool): flat
  // counts by id, so a post allocates nothing for them.
  struct InUse {
    std::vector<std::uint32_t> reading, writing;              // by block id
    std::vector<std::uint32_t> reading_slots, writing_slots;  // by image slot
  };
  std::vector<InUse> in_use_;  // by registration
};

}  // namespace kvstrand::connector
