#include "server/event_publisher.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <optional>

#include "common/await_codes.hpp"
#include "server/zmq_library.hpp"

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

common::Expected<std::shared_ptr<EventPublisher>> EventPublisher::open(common::Strand strand, EventOptions options) {
  auto lib = zmq_library();
  if (!lib) return common::unexpected("--events: " + lib.why());
  std::shared_ptr<EventPublisher> p(new EventPublisher(strand, std::move(options)));
  Sockets& s = *p->z_;
  s.z = *lib;
  s.ctx = s.z->ctx_new();
  if (s.ctx == nullptr) return common::unexpected(std::string("--events: zmq_ctx_new: ") + s.z->error());
  s.pub = s.z->socket(s.ctx, ZMQ_PUB);
  const int hwm = 100000;  // batches a slow subscriber may fall behind by (vLLM's default)
  if (s.pub == nullptr || s.z->setsockopt(s.pub, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
      s.z->bind(s.pub, p->opt_.endpoint.c_str()) != 0)
    return common::unexpected("--events " + p->opt_.endpoint + ": " + s.z->error());
  if (!p->opt_.replay_endpoint.empty()) {
    s.router = s.z->socket(s.ctx, ZMQ_ROUTER);
    if (s.router == nullptr || s.z->bind(s.router, p->opt_.replay_endpoint.c_str()) != 0)
      return common::unexpected("--events-replay " + p->opt_.replay_endpoint + ": " + s.z->error());
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
  if (flush_posted_ || closed_) return;
  flush_posted_ = true;
  asio::post(strand_, [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->flush();
  });
}

void EventPublisher::flush() {
  flush_posted_ = false;
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
  kept_.emplace_back(seq, std::move(payload));
  if (kept_.size() > opt_.buffer) kept_.pop_front();
}

void EventPublisher::start() {
  if (!z_->router_fd) return;
  asio::co_spawn(strand_, [self = shared_from_this()]() { return self->serve_replays(); }, asio::detached);
}

asio::awaitable<void> EventPublisher::serve_replays() {
  // libzmq's descriptor only says "look again": what is there is read
  // from ZMQ_EVENTS, after every wake-up and after every answer.
  while (!closed_) {
    int events = 0;
    std::size_t len = sizeof events;
    if (z_->z->getsockopt(z_->router, ZMQ_EVENTS, &events, &len) != 0) co_return;
    if (events & ZMQ_POLLIN) {
      answer_replay();
      continue;
    }
    auto [ec] = co_await z_->router_fd->async_wait(asio::posix::descriptor_base::wait_read, common::kAwait);
    if (ec) co_return;  // closed
  }
}

void EventPublisher::answer_replay() {
  std::vector<std::string> frames;
  for (int more = 1; more != 0;) {
    zmq_msg_t m;
    z_->z->msg_init(&m);
    if (z_->z->msg_recv(&m, z_->router, ZMQ_DONTWAIT) < 0) {
      z_->z->msg_close(&m);
      return;
    }
    frames.emplace_back(static_cast<const char*>(z_->z->msg_data(&m)), z_->z->msg_size(&m));
    z_->z->msg_close(&m);
    std::size_t len = sizeof more;
    z_->z->getsockopt(z_->router, ZMQ_RCVMORE, &more, &len);
  }
  // [identity, "", first seq]: anything else is not vLLM's request.
  if (frames.size() != 3 || frames[2].size() != 8) {
    spdlog::debug("kvstrand-server: a KV event replay request of {} frames ignored", frames.size());
    return;
  }
  std::uint64_t first = 0;
  for (char c : frames[2]) first = (first << 8) | static_cast<std::uint8_t>(c);
  // The newest batches are sent before a new one is made: flush first.
  flush();
  for (const auto& [seq, payload] : kept_)
    if (seq >= first) z_->send(z_->router, {frames[0], "", big_endian(static_cast<std::int64_t>(seq)), payload});
  z_->send(z_->router, {frames[0], "", big_endian(-1), ""});
  ++st_.replays;
}

void EventPublisher::close() {
  if (closed_) return;
  flush();
  closed_ = true;
  if (z_->router_fd) {
    boost::system::error_code ignored;
    z_->router_fd->cancel(ignored);
  }
}

}  // namespace kvstrand::server
