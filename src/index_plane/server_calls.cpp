#include "index_plane/server_calls.hpp"

#include <spdlog/spdlog.h>

#include <optional>

#include "common/notifier.hpp"
#include "common/log_escaped.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::index_plane {

namespace asio = boost::asio;
using namespace proto;

struct ServerCalls::Waiter {
  Waiter(common::Strand& s, Type t) : signal(s), type(t) {}
  common::Notifier signal;  // notified by the reply, or the connection's end
  Type type;
  std::optional<Reply> reply;
  std::error_code failure;
  std::string why;  // with failure: the cause (the connection's end)
};

ServerCalls::ServerCalls(common::Strand strand, common::Gate& gate, Late late, Lost lost)
    : strand_(std::move(strand)), gate_(gate), late_(std::move(late)), lost_(std::move(lost)) {}

ServerCalls::~ServerCalls() {
  if (conn_) conn_->close();
}

void ServerCalls::open(channel::FramedConnection::Socket sock) {
  if (conn_) end("a new connection");
  const std::uint64_t generation = ++generation_;
  // A write that failed, or a writer that threw, ends the connection.
  conn_ = std::make_shared<channel::FramedConnection>(std::move(sock), strand_, gate_,
                                                     [this, generation](const std::string& why) {
                                                       if (generation == generation_) fail(why);
                                                     });
}

bool ServerCalls::read_replies() {
  return gate_.spawn(read_loop(conn_), [this, generation = generation_](std::exception_ptr e) {
    if (!e) return;
    common::LogEscaped{"RemoteIndex reader"}(e);
    if (generation == generation_) fail("the reader ended by an exception");
  });
}

asio::awaitable<std::pair<std::error_code, Reply>> ServerCalls::call(Request req, Clock::time_point until) {
  if (!is_open()) co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{}};
  const std::uint64_t id = next_id_++;
  auto w = std::make_shared<Waiter>(strand_, type_of(req));
  waiting_[id] = w;
  conn_->send(encode_request(req, id));
  if (!w->failure) co_await w->signal.wait(until);  // (a send that failed at once has ended it)
  waiting_.erase(id);
  if (w->reply) co_return std::pair{std::error_code{}, std::move(*w->reply)};
  if (w->failure) co_return std::pair{w->failure, Reply{Status::ok, w->why, Empty{}}};
  // Timed out: what a later reply grants is released when it comes.
  if (is_open()) abandoned_[id] = w->type;
  co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{}};
}

void ServerCalls::send_only(const Request& req) {
  if (!is_open()) return;
  // Once the handler that sent it has returned: the write would otherwise
  // start at once (a speculative send: the syscall, and waking the server),
  // before what that handler does next, such as delivering the load whose
  // hold it releases.
  conn_->send(encode_request(req, next_id_++), -1, true);
}

void ServerCalls::end(const std::string& why) {
  // Its reader ends at its next step, seeing it is no longer conn_.
  if (conn_) std::exchange(conn_, nullptr)->close();
  abandoned_.clear();
  for (auto& [id, w] : std::exchange(waiting_, {})) {
    w->failure = TransferErrc::tier_unavailable;
    w->why = "the connection was lost: " + why;
    w->signal.notify();
  }
}

void ServerCalls::fail(const std::string& why) {
  if (!conn_) return;
  end(why);
  if (lost_) lost_(why);
}

asio::awaitable<void> ServerCalls::read_loop(std::shared_ptr<channel::FramedConnection> conn) {
  for (;;) {
    channel::ReadFrame f = co_await conn->read(kDefaultMaxBody);
    if (conn != conn_) co_return;  // ended meanwhile
    if (f.io) {
      fail("read: " + f.io.message());
      co_return;
    }
    if (f.header != HeaderError::none) {
      fail("a frame that is not kvstrand protocol " + std::to_string(kMajor));
      co_return;
    }
    const Header& h = f.h;
    auto reply = decode_reply(h.type, f.body);
    if (reply && reply->status == Status::ok) {
      if (auto a = abandoned_.find(h.request_id); a != abandoned_.end()) {
        abandoned_.erase(a);
        if (late_) late_(*reply);
        continue;
      }
    }
    auto it = waiting_.find(h.request_id);
    if (it == waiting_.end()) continue;  // a release's reply, or a caller that gave up
    Waiter& w = *it->second;
    const Type got = static_cast<Type>(h.type & ~kReplyBit);
    if (got != w.type) {
      // A reply that does not answer its request: nothing after it on this
      // stream can be trusted. Every request on it fails with the cause.
      fail("protocol error: a " + std::string(to_string(got)) + " reply to " + to_string(w.type) + " request " +
           std::to_string(h.request_id));
      co_return;
    }
    if (!reply) {
      w.failure = TransferErrc::tier_unavailable;
      spdlog::error("kvstrand: node tier: malformed reply: {}", reply.why());
    } else if (reply->status == Status::ok && reply->payload.index() == 0 &&
               (w.type == Type::lookup || w.type == Type::adopt || w.type == Type::reserve ||
                w.type == Type::register_layout || w.type == Type::hello)) {
      w.failure = TransferErrc::tier_unavailable;  // a reply of another request's type
      spdlog::error("kvstrand: node tier: a reply that does not answer its {}", to_string(w.type));
    } else {
      w.reply = std::move(*reply);
    }
    w.signal.notify();
  }
}

}  // namespace kvstrand::index_plane
