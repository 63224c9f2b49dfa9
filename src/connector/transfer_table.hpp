// The strand's half of a Connector: every live transfer (producer event ->
// tier -> terminal), its deadline, the fences over them, the lookups',
// adoptions' and releases' coroutines, and close's settling.
//
// Strand only. The engine's thread reaches it through the submission ring
// (HandoffQueue<Submission>) and posts; it answers through the Mailbox. No
// member is read or written by the engine's thread.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "common/gate.hpp"
#include "connector/connector_metrics.hpp"
#include "connector/mailbox.hpp"
#include "connector/packed_spec.hpp"
#include "connector/queued_events.hpp"
#include "connector/spare_nodes.hpp"
#include "reactor/reactor.hpp"
#include "data_path/registration.hpp"
#include "data_path/host_tier.hpp"
#include "connector/transfer.hpp"

namespace kvstrand::reactor {
template <class T>
class HandoffQueue;
}  // namespace kvstrand::reactor

namespace kvstrand::connector {

// One transfer as the submission ring carries it, written into the ring's
// slot by the engine's thread and read there by the strand, once: the spec
// packed (what the strand reads of the engine's memory: a few lines, in a
// slot reused from lap to lap), and the live entry's spec, which the strand
// only hands back in the transfer's end so that the engine's thread finds
// its entry.
struct Submission {
  TransferKind kind = TransferKind::save;
  const kv::TransferSpec* spec = nullptr;
  std::atomic<const device::Event*>* queued_notice = nullptr;  // a load's live entry's (LiveTransfer::queued)
  std::shared_ptr<const device::Event> producer;
  PackedSpec packed;
};

// A live transfer, as the debug views show it.
struct TransferInfo {
  std::uint64_t id = 0;
  std::string request;
  TransferKind kind = TransferKind::save;
  TransferState state = TransferState::queued;
  std::chrono::microseconds age{};
  std::chrono::microseconds deadline_left{};
  std::uint64_t bytes = 0;
  bool past_deadline = false;  // fail-stopped; its copy has not been seen to end
};

class TransferTable : public std::enable_shared_from_this<TransferTable> {
 public:
  using Handler = boost::asio::any_completion_handler<void(std::error_code)>;

  TransferTable(reactor::Reactor& r, std::unique_ptr<data_path::HostTier> t, std::shared_ptr<Mailbox> m,
                std::chrono::milliseconds d);

  // Transfers of submit() not yet taken by the strand; more wait in posts.
  static constexpr std::size_t kSubmissionSlots = 256;
  // Ended transfers kept for the next starts, at most.
  static constexpr std::size_t kSpareTransfers = 64;

  // The engine thread's submit()s, taken on every poller tick. Everything
  // else the engine thread posts polls it first (Connector's
  // post_after_submissions): the strand sees the engine's calls in the order
  // they were made.
  const std::shared_ptr<reactor::HandoffQueue<Submission>>& submissions() const noexcept { return submissions_; }

  // A registration kept here (its id: the next) and attached to the tier;
  // the tier's refusal forgets it again.
  boost::asio::awaitable<index_plane::Failure> attach(Registration reg);
  // Takes one submission off the ring: the transfer starts inside the gate.
  void start(Submission& p);
  // Completes `h` once every transfer of `requests` (all of them: `all`) is
  // terminal, or with fence_timeout (close's bound: abandons) at `timeout`.
  void fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, bool all, Handler h);
  static void complete(Handler h, std::error_code ec);

  // A lookup's or an adoption's answer, and a lease's release, run inside
  // the gate; a lookup always gets an answer (a miss when closing or when
  // its coroutine threw).
  void start_lookup(std::uint64_t id, std::uint32_t registration, std::vector<kv::ChunkKey> keys);
  void start_adopt(std::uint64_t id, std::uint32_t registration, std::uint64_t lease, std::vector<kv::ChunkKey> keys);
  void start_release(std::uint64_t lease);

  // close(): resumes once every live transfer is terminal (settled, or
  // failed by its own deadline), lets the tier drain, then closes the gate,
  // all within close_bound().
  static boost::asio::awaitable<void> settle(std::shared_ptr<TransferTable> self);
  // Once the reactor thread has ended: the tier goes, unless a copy was
  // never seen to end; then its memory is left allocated on purpose (said).
  void release_tier();

  std::vector<TransferInfo> snapshot() const;
  std::size_t live_count() const noexcept { return transfers_.size() + stuck_.size(); }
  // Transfers failed by their deadline whose copy was never seen to end.
  std::size_t stuck_count() const noexcept { return stuck_.size(); }
  // Ended transfers kept for reuse (Connector::kept_transfers, a debug
  // view).
  std::size_t spare_transfers() const noexcept { return spare_transfers_.size(); }
  reactor::Reactor& reactor() const noexcept { return reactor_; }
  data_path::HostTier& tier() const noexcept { return *tier_; }
  const ConnectorMetrics& metrics() const noexcept { return metrics_; }
  // The fail-stop's words, once set (empty until then).
  const std::string& fail_stop() const noexcept { return fail_what_; }
  bool failed() const noexcept { return fail_code_.has_value(); }

 private:
  // Boost 1.81's any_completion_handler must not be move-assigned (it
  // recurses), so fences live in a list and are only moved-constructed.
  struct Fence {
    Fence(std::uint64_t i, std::set<std::string> r, bool a, Handler h)
        : id(i), requests(std::move(r)), all(a), handler(std::move(h)) {}
    Fence(Fence&&) noexcept = default;
    Fence& operator=(Fence&&) = delete;

    std::uint64_t id = 0;
    std::set<std::string> requests;
    bool all = false;  // close(): every transfer
    Handler handler;
    std::unique_ptr<boost::asio::steady_timer> timer;
  };

  static boost::asio::awaitable<void> run(std::shared_ptr<TransferTable> self, std::shared_ptr<Transfer> t);
  // A Transfer for the next start: an ended one's, its spec's vectors and
  // strings with their capacity, where one is kept; a new one otherwise.
  std::shared_ptr<Transfer> fresh_transfer();
  // Keeps an ended transfer for reuse once nothing else holds it (`t` is
  // then the last reference: not stuck, its coroutine's frame gone).
  void keep_ended(const std::shared_ptr<Transfer>& t);
  // The live transfer `id`, or transfers_.end().
  std::deque<std::shared_ptr<Transfer>>::iterator live(std::uint64_t id);
  bool is_live(std::uint64_t id) { return live(id) != transfers_.end(); }
  void add_request(const std::string& request);
  void drop_request(const std::string& request);
  static boost::asio::awaitable<void> answer_lookup(std::shared_ptr<TransferTable> self, std::uint64_t id,
                                                    std::uint32_t registration, std::vector<kv::ChunkKey> keys);
  static boost::asio::awaitable<void> answer_adopt(std::shared_ptr<TransferTable> self, std::uint64_t id,
                                                   std::uint32_t registration, std::uint64_t lease,
                                                   std::vector<kv::ChunkKey> keys);
  void finish(Transfer& t, std::error_code ec);
  // Every transfer's deadline is its start plus the one transfer_deadline,
  // so the deadlines come in start order: one timer, armed for the oldest
  // live transfer's, fails each at its own (nothing another transfer does
  // moves it), without a timer per transfer (a timerfd update on the
  // strand's path to each copy, docs/PERFORMANCE.md).
  void arm_deadlines();
  void deadlines_due();
  void forget_ended_deadlines();
  void deadline_passed(std::uint64_t id);
  void set_fail_stop(std::error_code code, const std::string& what);
  std::uint64_t bytes_of(const Transfer& t) const;
  // Hands the transfer's end to the engine's thread, which frees or reuses
  // its entry from then on (the strand reads only its own spec).
  void deliver(Transfer& t);
  bool fence_done(const Fence& f) const;
  void check_fences();
  void fence_timed_out(std::uint64_t id, std::chrono::milliseconds timeout);
  void close_timed_out(std::uint64_t id, std::chrono::milliseconds bound);

  reactor::Reactor& reactor_;
  std::unique_ptr<data_path::HostTier> tier_;
  std::shared_ptr<Mailbox> mailbox_;
  std::chrono::milliseconds deadline_;
  // Every coroutine the Connector starts (transfers, lookups, adoptions,
  // lease releases) runs inside it; close() closes it. Each one's
  // completion holds the table, so the gate outlives what it counts.
  common::Gate gate_;
  std::shared_ptr<reactor::HandoffQueue<Submission>> submissions_;
  // A load's "copies queued" event; none if the device cannot make one:
  // order_after_load then answers not_queued_yet and the engine waits for
  // finished().
  QueuedEvents queued_events_;
  std::uint64_t next_id_ = 1;
  std::uint64_t next_fence_ = 1;
  // Live, in start order (ids ascend): a transfer is appended at its start
  // and found by its id's binary search; no node to allocate a transfer,
  // and the oldest (the usual end) leaves from the front without shifting
  // the rest (max_live_transfers of them).
  std::deque<std::shared_ptr<Transfer>> transfers_;
  // Ended transfers kept for the next starts (at most kSpareTransfers), so
  // that a load's start allocates nothing on the strand: docs/PERFORMANCE.md
  // ("Where a load's time goes").
  std::vector<std::shared_ptr<Transfer>> spare_transfers_;
  // (deadline, id) of every live transfer in start order, and of ended ones
  // behind the oldest live one until it ends; the timer is armed while it
  // is not empty, for a time no later than its front's.
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::uint64_t>> deadlines_;
  boost::asio::steady_timer deadline_timer_;
  bool deadline_armed_ = false;
  std::map<std::uint64_t, std::shared_ptr<Transfer>> stuck_;  // failed by deadline, copy not seen to end
  // Live transfers by request (what a fence waits for); an ended request's
  // node, with its string's capacity, is kept for the next one.
  std::map<std::string, std::uint32_t> live_per_request_;
  SpareNodes<std::map<std::string, std::uint32_t>> spare_requests_;
  std::list<Fence> fences_;
  std::optional<std::error_code> fail_code_;
  std::string fail_what_;
  ConnectorMetrics metrics_;
};

// close() and async_close() complete within this of being called, whatever
// the transfers and the device do: every live transfer's own deadline, then
// 1.5 s for the last completions to arrive, then at most 0.5 s for the tier
// to end its session (the node tier). A transfer still live at 1.5 s past the
// deadline is abandoned: failed, kept as stuck, the fail-stop set and the
// log naming it; the tier's memory is then left allocated on purpose.
constexpr std::chrono::milliseconds close_bound(std::chrono::milliseconds transfer_deadline) {
  return transfer_deadline + std::chrono::milliseconds(2000);
}

}  // namespace kvstrand::connector
