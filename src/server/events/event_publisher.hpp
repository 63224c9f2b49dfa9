// kvstrand-server's KV events (--events): what the node tier stores and
// removes, on every medium, published as vLLM's own publisher does
// (vllm/distributed/kv_events.py, ZmqEventPublisher), so that a router
// written for vLLM's events reads the node's:
// - a ZeroMQ PUB socket bound at --events; each batch is three frames:
//   the topic (--events-topic), the batch's sequence number (8 bytes, big
//   endian, from 0 at the server's start), the batch (kv_event_codec);
// - a ROUTER socket at --events-replay, optionally: a request
//   [identity, "", first sequence number (8 bytes)] is answered with every
//   batch kept from that number on, each [identity, "", seq, batch], then
//   [identity, "", -1 (8 bytes), ""]; the last --events-buffer batches
//   (at most --events-buffer-bytes of them) are kept.
// Events are batched by the strand's turn: what one request or one
// completion changes goes out as one batch, after it (a batch past
// kMaxBatchBytes goes out at once, and the turn's rest in the next). Sends
// never block (PUB drops for a subscriber past its high-water mark, as
// vLLM's does: --events-queue-bytes / kMaxBatchBytes batches).
//
// Replays are answered a slice at a time (kReplaySlice batches, then the
// strand serves others), as the requester's pipe drains, and always end
// with the end marker: a requester that is gone is forgotten, one whose
// pipe stays full is given up after kReplayStall. At most kMaxReplays are
// answered at once and kMaxQueuedReplays wait; past that a request is
// answered with the end marker alone (counted). Requests are tiny: a
// larger message closes its peer's connection (ZMQ_MAXMSGSIZE).
//
// On the server's strand, like everything the server does.
#pragma once

#include <sys/types.h>

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/expected.hpp"
#include "common/gate.hpp"
#include "common/strand.hpp"
#include "server/events/kv_event_codec.hpp"

namespace kvstrand::server {

struct EventOptions {
  std::string endpoint;         // --events: tcp://HOST:PORT or ipc://PATH
  std::string replay_endpoint;  // --events-replay; "" for none
  std::string topic;            // --events-topic
  EventFormat format = EventFormat::map;
  std::size_t buffer = 10000;   // --events-buffer: batches kept for replay
  std::uint64_t buffer_bytes = 64ull << 20;  // --events-buffer-bytes: their bytes at most
  std::uint64_t queue_bytes = 256ull << 20;  // --events-queue-bytes: what one slow subscriber may have queued
  // --events-medium-names: what the arena and the disk are called (vllm:
  // CPU and STORAGE, as vLLM's offload tiers say; sglang: CPU_PINNED and DISK).
  std::string arena_medium = "CPU";
  std::string disk_medium = "STORAGE";
  // An ipc:// endpoint's socket file: 0660 and this group's (--socket-group,
  // the engines' routers read it), or 0600 (the server's user alone).
  std::optional<gid_t> ipc_group;
};

struct EventStats {
  std::uint64_t batches = 0;
  std::uint64_t stored = 0;   // BlockStored events
  std::uint64_t removed = 0;  // BlockRemoved events
  std::uint64_t cleared = 0;  // AllBlocksCleared events
  std::uint64_t replays = 0;  // replay requests answered
  std::uint64_t replays_refused = 0;  // answered with the end marker alone: too many at once, or stalled
  std::uint64_t kept_bytes = 0;       // of the batches kept for replay
  std::size_t kept = 0;
};

class EventPublisher : public std::enable_shared_from_this<EventPublisher> {
 public:
  static constexpr std::size_t kMaxBatchBytes = 256 * 1024;
  static constexpr std::size_t kReplaySlice = 64;
  static constexpr std::size_t kMaxReplays = 8;
  static constexpr std::size_t kMaxQueuedReplays = 64;
  static constexpr std::chrono::seconds kReplayStall{10};

  // Loads libzmq and binds the sockets; or why not, naming the option.
  static common::Expected<std::shared_ptr<EventPublisher>> open(common::Strand strand, EventOptions options);
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Into the batch this turn of the strand sends.
  void stored(std::string_view description, std::string_view medium);
  void removed(std::string_view description, std::string_view medium);
  void cleared();
  // On the strand: the replay socket starts being served, inside the
  // publisher's gate.
  void start();
  // Sends what is batched, stops serving replays and waits (at most
  // `bound`) for that to end; the sockets close with the publisher
  // (waiting at most 1 s for the last batches to leave). On the strand.
  boost::asio::awaitable<void> close(std::chrono::milliseconds bound);

  const EventStats& stats() const noexcept { return st_; }
  const EventOptions& options() const noexcept { return opt_; }

 private:
  struct Sockets;
  EventPublisher(common::Strand strand, EventOptions options);
  void added();
  void flush();
  struct Replay {
    std::string identity;
    std::uint64_t next = 0;        // the next batch it is sent
    std::chrono::steady_clock::time_point stalled_since{};  // its pipe full since (epoch: not stalled)
  };
  enum class Sent { progress, blocked, done };
  boost::asio::awaitable<void> serve_replays();
  void take_request();
  Sent send_slice(Replay& r);
  bool send_end(const std::string& identity);

  common::Strand strand_;
  EventOptions opt_;
  std::unique_ptr<Sockets> z_;
  msgpack::Writer batch_;  // the events of the batch being made
  std::uint32_t count_ = 0;
  bool flush_posted_ = false;
  bool closed_ = false;
  std::uint64_t next_seq_ = 0;
  std::deque<std::pair<std::uint64_t, std::string>> kept_;  // (seq, batch), for replay; seqs consecutive
  std::deque<Replay> replays_;  // being answered (the first kMaxReplays) or waiting, oldest first
  EventStats st_;
  common::Gate gate_{strand_};  // serve_replays runs inside it
};

}  // namespace kvstrand::server
