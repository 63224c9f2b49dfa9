#include "l2/redis_connection.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>

namespace kvstrand::l2 {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

RedisValue convert(const redisReply* r) {
  RedisValue v;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      v.kind = RedisValue::Kind::string;
      v.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      v.kind = RedisValue::Kind::status;
      v.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      v.kind = RedisValue::Kind::error;
      v.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      v.kind = RedisValue::Kind::integer;
      v.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      v.kind = RedisValue::Kind::array;
      v.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) v.elements.push_back(convert(r->element[i]));
      break;
    default: break;  // nil
  }
  return v;
}

}  // namespace

// The socket's readiness, awaited on the strand for hiredis. hiredis owns
// the file descriptor: it is released (never closed) here, and released in
// hiredis's cleanup hook, before hiredis closes it, so that a later socket
// given the same number is never deregistered by mistake.
struct RedisConnection::Watch : std::enable_shared_from_this<Watch> {
  Watch(common::Strand s, int fd, redisAsyncContext* c) : sd(s, fd), ac(c) {}
  ~Watch() {
    if (sd.is_open()) (void)sd.release();
  }

  void arm(bool write) {
    bool& want = write ? want_write : want_read;
    bool& armed = write ? write_armed : read_armed;
    if (!want || armed || ac == nullptr) return;
    armed = true;
    sd.async_wait(write ? asio::posix::descriptor_base::wait_write : asio::posix::descriptor_base::wait_read,
                  [self = shared_from_this(), write](const boost::system::error_code& ec) {
                    (write ? self->write_armed : self->read_armed) = false;
                    if (ec || self->ac == nullptr || !(write ? self->want_write : self->want_read)) return;
                    // May free the context (cleanup below sets ac to null).
                    write ? redisAsyncHandleWrite(self->ac) : redisAsyncHandleRead(self->ac);
                    self->arm(write);
                  });
  }

  static void add_read(void* p) {
    auto* w = static_cast<Watch*>(p);
    w->want_read = true;
    w->arm(false);
  }
  static void del_read(void* p) { static_cast<Watch*>(p)->want_read = false; }
  static void add_write(void* p) {
    auto* w = static_cast<Watch*>(p);
    w->want_write = true;
    w->arm(true);
  }
  static void del_write(void* p) { static_cast<Watch*>(p)->want_write = false; }
  static void cleanup(void* p) {
    auto* w = static_cast<Watch*>(p);
    w->ac = nullptr;
    if (w->sd.is_open()) (void)w->sd.release();  // cancels the waits; hiredis closes the fd next
  }

  asio::posix::stream_descriptor sd;
  redisAsyncContext* ac;
  bool want_read = false, want_write = false, read_armed = false, write_armed = false;
};

// One command's completion, owned by hiredis (as privdata) until its reply
// callback runs, which it always does: with the reply, or with none when
// the context is freed.
struct RedisConnection::Call {
  RedisConnection* conn;
  Done done;
  bool counted;       // an ASKING's or AUTH's own reply is neither counted nor delivered
  bool auth = false;  // AUTH: its reply says whether the node took the credentials
};

RedisConnection::RedisConnection(common::Strand strand, std::string host, int port, std::size_t max_inflight,
                                 std::chrono::milliseconds retry_after, RedisCredentials credentials)
    : strand_(std::move(strand)),
      host_(std::move(host)),
      port_(port),
      max_inflight_(max_inflight),
      retry_after_(retry_after),
      credentials_(std::move(credentials)) {}

RedisConnection::~RedisConnection() { drop(); }

void RedisConnection::drop() {
  if (ac_ == nullptr) return;
  redisAsyncContext* ac = ac_;
  // Every reply callback runs now, with no reply: each posts its `done`.
  redisAsyncFree(ac);
  if (ac_ != nullptr) context_gone("dropped");  // never connected: no disconnect callback ran
}

void RedisConnection::post(Done done, RedisResult r) {
  asio::post(strand_, [d = std::move(done), r = std::move(r)]() mutable { d(std::move(r)); });
}

common::Expected<void> RedisConnection::ensure_context() {
  if (ac_ != nullptr) return {};
  if (Clock::now() < retry_at_) return common::unexpected("not retried yet after: " + last_error_);
  redisAsyncContext* ac = redisAsyncConnect(host_.c_str(), port_);
  if (ac == nullptr || ac->err) {
    last_error_ = ac ? ac->errstr : "out of memory";
    if (ac) redisAsyncFree(ac);
    retry_at_ = Clock::now() + retry_after_;
    return common::unexpected(last_error_);
  }
  ac->data = this;
  watch_ = std::make_shared<Watch>(strand_, ac->c.fd, ac);
  ac->ev.data = watch_.get();
  ac->ev.addRead = &Watch::add_read;
  ac->ev.delRead = &Watch::del_read;
  ac->ev.addWrite = &Watch::add_write;
  ac->ev.delWrite = &Watch::del_write;
  ac->ev.cleanup = &Watch::cleanup;
  redisAsyncSetConnectCallback(ac, &RedisConnection::on_connect);
  redisAsyncSetDisconnectCallback(ac, &RedisConnection::on_disconnect);
  ac_ = ac;
  connected_ = false;
  ++connects_;
  if (!credentials_.password.empty()) {
    // First on the connection: every command pipelined behind it runs as
    // this user (or fails NOAUTH when the node refused it).
    std::vector<const char*> argv = {"AUTH"};
    std::vector<std::size_t> lens = {4};
    if (!credentials_.username.empty()) {
      argv.push_back(credentials_.username.data());
      lens.push_back(credentials_.username.size());
    }
    argv.push_back(credentials_.password.data());
    lens.push_back(credentials_.password.size());
    redisAsyncCommandArgv(ac, &RedisConnection::on_reply, new Call{this, nullptr, false, true},
                          static_cast<int>(argv.size()), argv.data(), lens.data());
  }
  return {};
}

void RedisConnection::send(const std::vector<std::string>& argv, Done done) { submit(argv, std::move(done), false); }

void RedisConnection::send_asking(const std::vector<std::string>& argv, Done done) {
  submit(argv, std::move(done), true);
}

void RedisConnection::submit(const std::vector<std::string>& argv, Done done, bool asking) {
  RedisResult fail;
  if (inflight_ >= max_inflight_) {
    fail.ec = RedisErrc::overloaded;
    fail.why = address() + ": " + std::to_string(inflight_) + " commands unanswered";
    post(std::move(done), std::move(fail));
    return;
  }
  if (auto context = ensure_context(); !context) {
    fail.ec = RedisErrc::unreachable;
    fail.why = address() + ": " + context.why();
    post(std::move(done), std::move(fail));
    return;
  }
  if (asking) {
    static const char* asking_argv[] = {"ASKING"};
    static const std::size_t asking_len[] = {6};
    redisAsyncCommandArgv(ac_, &RedisConnection::on_reply, new Call{this, nullptr, false}, 1, asking_argv,
                          asking_len);
  }
  std::vector<const char*> ptrs;
  std::vector<std::size_t> lens;
  for (const auto& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* call = new Call{this, std::move(done), true};
  if (redisAsyncCommandArgv(ac_, &RedisConnection::on_reply, call, static_cast<int>(argv.size()), ptrs.data(),
                            lens.data()) != REDIS_OK) {
    // Only a context already disconnecting refuses a command.
    fail.ec = RedisErrc::disconnected;
    fail.why = address() + ": the connection is closing";
    post(std::move(call->done), std::move(fail));
    delete call;
    return;
  }
  ++inflight_;
}

void RedisConnection::on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
  std::unique_ptr<Call> call(static_cast<Call*>(privdata));
  if (call->auth && reply != nullptr) {
    const auto* r = static_cast<const redisReply*>(reply);
    call->conn->auth_error_ = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : std::string();
  }
  if (!call->counted) return;
  RedisConnection* self = call->conn;
  --self->inflight_;
  RedisResult r;
  if (reply == nullptr) {
    r.ec = self->connected_ ? RedisErrc::disconnected : RedisErrc::unreachable;
    r.why = self->address() + ": " + (ac->errstr[0] != '\0' ? std::string(ac->errstr) : "connection closed");
  } else {
    r.value = convert(static_cast<const redisReply*>(reply));
  }
  self->post(std::move(call->done), std::move(r));
}

void RedisConnection::on_connect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (self == nullptr) return;
  if (status == REDIS_OK) {
    self->connected_ = true;
    return;
  }
  // hiredis frees the context right after this callback.
  self->context_gone(ac->errstr);
}

void RedisConnection::on_disconnect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (self == nullptr) return;
  self->context_gone(status == REDIS_OK ? "closed" : ac->errstr);
}

void RedisConnection::context_gone(const std::string& why) {
  last_error_ = why;
  retry_at_ = Clock::now() + retry_after_;
  ac_ = nullptr;
  connected_ = false;
  // Freed later, on the strand: hiredis may still call its hooks while it
  // tears the context down.
  asio::post(strand_, [w = std::move(watch_)] {});
}

}  // namespace kvstrand::l2
