#include "server/events/event_publisher.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "common/await_codes.hpp"
#include "common/log_escaped.hpp"
#include "server/events/zmq_library.hpp"

namespace kvstrand::server {

namespace asio = boost::asio;

struct EventPublisher::Sockets {
  const ZmqLibrary* z = nullptr;
  void* ctx = nullptr;
  void* pub = nullptr;
  void* router = nullptr;
  std::optional<asio::posix::stream_descriptor> router_fd;  // libzmq's, never closed here

  ~Sockets() {
    if (router_fd) router_fd->release();
    const int linger = 1000;  // the last batches leave, or are given up after a second
    for (void* s : {pub, router}) {
      if (s == nullptr) continue;
      z->setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
      z->close(s);
    }
    if (ctx != nullptr) z->ctx_term(ctx);
  }
  // Frames, the last without ZMQ_SNDMORE; never blocks.
  bool send(void* s, std::initializer_list<std::string_view> frames) {
    std::size_t i = 0;
    for (std::string_view f : frames) {
      const int more = ++i < frames.size() ? ZMQ_SNDMORE : 0;
      if (z->send(s, f.data(), f.size(), ZMQ_DONTWAIT | more) < 0) return false;
    }
    return true;
  }
};

namespace {

std::string big_endian(std::int64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(static_cast<std::uint64_t>(v) >> (56 - 8 * i));
  return out;
}

}  // namespace

EventPublisher::EventPublisher(common::Strand strand, EventOptions options)
    : strand_(strand), opt_(std::move(options)), z_(std::make_unique<Sockets>()) {}

EventPublisher::~EventPublisher() = default;

namespace {
// Binds `socket` to `endpoint`; an ipc:// path is created with its final
// mode (as the server's own socket is: no moment when more may connect)
// and given `group`. Empty on success, else why.
std::string bind_endpoint(const ZmqLibrary& z, void* socket, const std::string& endpoint,
                          std::optional<gid_t> group) {
  const bool ipc = endpoint.rfind("ipc://", 0) == 0;
  const mode_t old = ipc ? ::umask(group ? 0117 : 0177) : 0;
  const int rc = z.bind(socket, endpoint.c_str());
  if (ipc) ::umask(old);
  if (rc != 0) return z.error();
  // lchown: the path is the socket just bound, never a link's target.
  if (ipc && group && ::lchown(endpoint.c_str() + 6, static_cast<uid_t>(-1), *group) != 0)
    return "cannot be given gid " + std::to_string(*group) + " (--socket-group): " + std::strerror(errno);
  return {};
}
}  // namespace

common::Expected<std::shared_ptr<EventPublisher>> EventPublisher::open(common::Strand strand, EventOptions options) {
  auto lib = zmq_library();
  if (!lib) return common::unexpected("--events: " + lib.why());
  std::shared_ptr<EventPublisher> p(new EventPublisher(strand, std::move(options)));
  Sockets& s = *p->z_;
  s.z = *lib;
  s.ctx = s.z->ctx_new();
  if (s.ctx == nullptr) return common::unexpected(std::string("--events: zmq_ctx_new: ") + s.z->error());
  s.pub = s.z->socket(s.ctx, ZMQ_PUB);
  // Batches a slow subscriber may fall behind by: its queue inside libzmq
  // is at most --events-queue-bytes, batches being at most kMaxBatchBytes.
  const int hwm = static_cast<int>(std::clamp<std::uint64_t>(p->opt_.queue_bytes / kMaxBatchBytes, 1, 1'000'000));
  if (s.pub == nullptr || s.z->setsockopt(s.pub, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0)
    return common::unexpected("--events " + p->opt_.endpoint + ": " + s.z->error());
  if (std::string why = bind_endpoint(*s.z, s.pub, p->opt_.endpoint, p->opt_.ipc_group); !why.empty())
    return common::unexpected("--events " + p->opt_.endpoint + ": " + why);
  if (!p->opt_.replay_endpoint.empty()) {
    s.router = s.z->socket(s.ctx, ZMQ_ROUTER);
    // A full pipe says EAGAIN and a gone peer EHOSTUNREACH, instead of the
    // batch being dropped silently; a request is 8 bytes, so anything much
    // larger ends its peer's connection before it is held.
    const int mandatory = 1;
    const std::int64_t max_message = 256;
    if (s.router == nullptr || s.z->setsockopt(s.router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) != 0 ||
        s.z->setsockopt(s.router, ZMQ_MAXMSGSIZE, &max_message, sizeof max_message) != 0)
      return common::unexpected("--events-replay " + p->opt_.replay_endpoint + ": " + s.z->error());
    if (std::string why = bind_endpoint(*s.z, s.router, p->opt_.replay_endpoint, p->opt_.ipc_group); !why.empty())
      return common::unexpected("--events-replay " + p->opt_.replay_endpoint + ": " + why);
    int fd = -1;
    std::size_t len = sizeof fd;
    if (s.z->getsockopt(s.router, ZMQ_FD, &fd, &len) != 0)
      return common::unexpected(std::string("--events-replay: ZMQ_FD: ") + s.z->error());
    s.router_fd.emplace(strand, fd);
  }
  return p;
}

void EventPublisher::stored(std::string_view description, std::string_view medium) {
  encode_stored(batch_, description, medium, opt_.format);
  ++st_.stored;
  added();
}

void EventPublisher::removed(std::string_view description, std::string_view medium) {
  encode_removed(batch_, description, medium, opt_.format);
  ++st_.removed;
  added();
}

void EventPublisher::cleared() {
  encode_cleared(batch_, opt_.format);
  ++st_.cleared;
  added();
}

void EventPublisher::added() {
  ++count_;
  if (batch_.buffer().size() >= kMaxBatchBytes) return flush();  // the turn's rest goes in the next batch
  if (flush_posted_ || closed_) return;
  flush_posted_ = true;
  asio::post(strand_, [weak = weak_from_this()] {
    if (auto self = weak.lock()) {
      self->flush_posted_ = false;
      self->flush();
    }
  });
}

void EventPublisher::flush() {
  if (count_ == 0 || closed_) return;
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string payload = encode_batch(ts, batch_.buffer(), count_, opt_.format);
  batch_.buffer().clear();
  count_ = 0;
  const std::uint64_t seq = next_seq_++;
  if (!z_->send(z_->pub, {opt_.topic, big_endian(static_cast<std::int64_t>(seq)), payload}))
    spdlog::debug("kvstrand-server: KV event batch {} not sent: {}", seq, z_->z->error());
  ++st_.batches;
  if (opt_.buffer == 0) return;
  st_.kept_bytes += payload.size();
  kept_.emplace_back(seq, std::move(payload));
  while (!kept_.empty() && (kept_.size() > opt_.buffer || st_.kept_bytes > opt_.buffer_bytes)) {
    st_.kept_bytes -= kept_.front().second.size();
    kept_.pop_front();
  }
  st_.kept = kept_.size();
}

void EventPublisher::start() {
  if (!z_->router_fd) return;
  gate_.spawn(serve_replays(), common::LogEscaped{"kvstrand-server's KV event replays"});
}

asio::awaitable<void> EventPublisher::serve_replays() {
  auto keep = shared_from_this();
  // libzmq's descriptor only says "look again": what is there is read
  // from ZMQ_EVENTS, after every wake-up and after every slice.
  asio::steady_timer pause(strand_);
  while (!closed_) {
    int events = 0;
    std::size_t len = sizeof events;
    if (z_->z->getsockopt(z_->router, ZMQ_EVENTS, &events, &len) != 0) co_return;
    if (events & ZMQ_POLLIN) take_request();
    // One slice of each replay being answered, in turn.
    bool progress = false, blocked = false;
    const std::size_t active = std::min(replays_.size(), kMaxReplays);
    for (std::size_t i = 0; i < active && !closed_; ++i) {
      Replay r = std::move(replays_.front());
      replays_.pop_front();
      switch (send_slice(r)) {
        case Sent::done: progress = true; break;
        case Sent::progress: progress = true; replays_.push_back(std::move(r)); break;
        case Sent::blocked: blocked = true; replays_.push_back(std::move(r)); break;
      }
    }
    if (closed_) break;
    if (progress || (events & ZMQ_POLLIN)) {
      // The strand serves everything else before the next slice.
      co_await asio::post(strand_, common::kAwait);
      continue;
    }
    if (blocked) {
      // A requester's pipe is full: look again soon (libzmq's descriptor
      // does not reliably say when one drains).
      pause.expires_after(std::chrono::milliseconds(5));
      co_await pause.async_wait(common::kAwait);
      continue;
    }
    auto [ec] = co_await z_->router_fd->async_wait(asio::posix::descriptor_base::wait_read, common::kAwait);
    if (ec) co_return;  // closed
  }
}

void EventPublisher::take_request() {
  std::vector<std::string> frames;
  for (int more = 1; more != 0;) {
    zmq_msg_t m;
    z_->z->msg_init(&m);
    if (z_->z->msg_recv(&m, z_->router, ZMQ_DONTWAIT) < 0) {
      z_->z->msg_close(&m);
      return;
    }
    if (frames.size() < 4) frames.emplace_back(static_cast<const char*>(z_->z->msg_data(&m)), z_->z->msg_size(&m));
    z_->z->msg_close(&m);
    std::size_t len = sizeof more;
    z_->z->getsockopt(z_->router, ZMQ_RCVMORE, &more, &len);
  }
  // [identity, "", first seq]: anything else is not vLLM's request.
  if (frames.size() != 3 || frames[2].size() != 8) {
    spdlog::debug("kvstrand-server: a KV event replay request of {} frames ignored", frames.size());
    return;
  }
  if (replays_.size() >= kMaxReplays + kMaxQueuedReplays) {
    ++st_.replays_refused;  // answered at once, so that it does not wait for ever
    send_end(frames[0]);
    return;
  }
  std::uint64_t first = 0;
  for (char c : frames[2]) first = (first << 8) | static_cast<std::uint8_t>(c);
  // The newest batches are sent before a new one is made: flush first.
  flush();
  replays_.push_back(Replay{std::move(frames[0]), first, {}});
}

EventPublisher::Sent EventPublisher::send_slice(Replay& r) {
  // A send that did not go: the requester gone (forgotten), or its pipe
  // full (looked at again; given up once full for kReplayStall).
  const auto refused = [&](std::size_t sent) {
    if (z_->z->errno_() == EHOSTUNREACH) return Sent::done;
    const auto now = std::chrono::steady_clock::now();
    if (r.stalled_since == std::chrono::steady_clock::time_point{}) r.stalled_since = now;
    if (now - r.stalled_since < kReplayStall) return sent > 0 ? Sent::progress : Sent::blocked;
    ++st_.replays_refused;
    return Sent::done;
  };
  const std::uint64_t front = kept_.empty() ? next_seq_ : kept_.front().first;
  if (r.next < front) r.next = front;  // what is no longer kept is skipped
  std::size_t sent = 0;
  for (; sent < kReplaySlice && r.next < next_seq_; ++sent, ++r.next) {
    const auto& [seq, payload] = kept_[static_cast<std::size_t>(r.next - front)];
    if (!z_->send(z_->router, {r.identity, "", big_endian(static_cast<std::int64_t>(seq)), payload}))
      return refused(sent);
    r.stalled_since = {};
  }
  if (r.next < next_seq_) return Sent::progress;
  if (!z_->send(z_->router, {r.identity, "", big_endian(-1), ""})) return refused(sent);
  ++st_.replays;
  return Sent::done;
}

bool EventPublisher::send_end(const std::string& identity) {
  return z_->send(z_->router, {identity, "", big_endian(-1), ""}) || z_->z->errno_() == EHOSTUNREACH;
}

asio::awaitable<void> EventPublisher::close(std::chrono::milliseconds bound) {
  auto keep = shared_from_this();
  if (!closed_) {
    flush();
    closed_ = true;
    if (z_->router_fd) {
      boost::system::error_code ignored;
      z_->router_fd->cancel(ignored);
    }
  }
  if (!co_await gate_.close(bound))
    spdlog::warn("kvstrand-server: the KV event replays still run {} ms after close", bound.count());
}

}  // namespace kvstrand::server
