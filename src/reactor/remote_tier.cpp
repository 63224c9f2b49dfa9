#include "reactor/remote_tier.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <set>

#include "hip/imported_buffer.hpp"
#include "kv/chunk_keys.hpp"
#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace kv::proto;

namespace {
const auto kAwait = asio::as_tuple(asio::use_awaitable);  // awaited ops complete with error codes

std::error_code to_error(Status s) {
  switch (s) {
    case Status::ok: return {};
    case Status::tier_full: return TransferErrc::tier_full;
    case Status::missing_chunk:
    case Status::lock_expired: return TransferErrc::missing_chunk;
    case Status::out_of_range:
    case Status::bad_request:
    case Status::unknown_registration: return TransferErrc::bad_spec;
    case Status::device_error: return TransferErrc::device_error;
    default: return TransferErrc::tier_unavailable;
  }
}
}  // namespace

// A request waiting for its reply. The timer is the signal: cancelled when
// the reply (or the connection's failure) arrives, expiring at the timeout.
struct RemoteTier::Pending {
  explicit Pending(Strand& s) : signal(s) {}
  asio::steady_timer signal;
  std::optional<Reply> reply;
  std::error_code failure;
};

RemoteTier::RemoteTier(Reactor& reactor, RemoteTierOptions options) : reactor_(reactor), opt_(std::move(options)) {}

RemoteTier::~RemoteTier() {
  if (sock_) {
    boost::system::error_code ignored;
    sock_->close(ignored);
  }
}

asio::awaitable<std::error_code> RemoteTier::attach(const Registration& reg) {
  reg_ = &reg;
  co_return co_await ensure_connected();
}

asio::awaitable<std::error_code> RemoteTier::ensure_connected() {
  while (connecting_) {  // another coroutine is connecting: wait for its outcome
    asio::steady_timer t(reactor_.strand(), std::chrono::milliseconds(1));
    co_await t.async_wait(kAwait);
  }
  if (connected_) co_return std::error_code{};
  connecting_ = true;
  std::error_code ec = co_await handshake();
  connecting_ = false;
  if (ec) drop_connection("connect: " + ec.message());
  co_return ec;
}

asio::awaitable<std::error_code> RemoteTier::handshake() {
  if (reg_ == nullptr) co_return TransferErrc::not_registered;
  ++generation_;
  sock_.emplace(reactor_.strand());
  auto [cec] = co_await sock_->async_connect(local::endpoint(opt_.socket), kAwait);
  if (cec) {
    spdlog::debug("kvstrand: RemoteTier: connect {}: {}", opt_.socket, cec.message());
    co_return TransferErrc::tier_unavailable;
  }
  asio::co_spawn(reactor_.strand(), read_loop(generation_), asio::detached);
  const auto until = Clock::now() + opt_.request_timeout;
  // GCC 12 destroys twice the non-trivial temporaries of a co_await
  // expression (a Request converted in the call, a bound result): requests
  // and results are named variables here.
  Request hello_req = Hello{kMajor, kMinor, "kvstrand RemoteTier"};
  std::pair<std::error_code, Reply> hello = co_await call(std::move(hello_req), until);
  if (hello.first) co_return hello.first;
  if (hello.second.status != Status::ok) {
    spdlog::error("kvstrand: RemoteTier: the server refused hello: {}", hello.second.message);
    co_return TransferErrc::tier_unavailable;
  }
  RegisterLayout r;
  r.layout = reg_->layout;
  auto handle = [](const void* base, std::uint32_t count, MemoryHandle* out) -> hip::Status {
    auto range = hip::export_ipc_range(base);
    if (!range.ok()) return range.status();
    const auto wire = range->handle.to_bytes();
    std::copy(wire.begin(), wire.end(), out->handle.begin());
    out->offset = range->offset;
    out->count = count;
    return {};
  };
  for (const PlaneMemory& p : reg_->planes) {
    MemoryHandle m;
    if (hip::Status s = handle(p.base, p.num_blocks, &m); !s.ok()) {
      spdlog::error("kvstrand: RemoteTier: cannot export plane memory: {}", s.describe());
      co_return TransferErrc::bad_spec;
    }
    r.planes.push_back(m);
  }
  if (reg_->layout.has_state()) {
    if (hip::Status s = handle(reg_->state.base, reg_->state.slots, &r.state); !s.ok()) {
      spdlog::error("kvstrand: RemoteTier: cannot export state memory: {}", s.describe());
      co_return TransferErrc::bad_spec;
    }
  }
  Request reg_req = std::move(r);
  std::pair<std::error_code, Reply> reg = co_await call(std::move(reg_req), until);
  if (reg.first) co_return reg.first;
  if (reg.second.status != Status::ok) {
    spdlog::error("kvstrand: RemoteTier: the server refused the registration: {}", reg.second.message);
    co_return to_error(reg.second.status);
  }
  registration_ = std::get<RegisterReply>(reg.second.payload).registration;
  if (generation_ > 1) ++reconnects_;
  connected_ = true;
  co_return std::error_code{};
}

void RemoteTier::drop_connection(const std::string& why) {
  if (sock_) {
    boost::system::error_code ignored;
    sock_->close(ignored);
  }
  if (connected_) spdlog::warn("kvstrand: RemoteTier: connection to {} lost: {}", opt_.socket, why);
  connected_ = false;
  outbox_.clear();
  lock_of_.clear();  // the server freed them with the session
  auto waiting = std::exchange(pending_, {});
  for (auto& [id, p] : waiting) {
    p->failure = TransferErrc::tier_unavailable;
    p->signal.cancel();
  }
}

asio::awaitable<std::pair<std::error_code, Reply>> RemoteTier::call(Request req, Clock::time_point until) {
  if (!sock_ || !sock_->is_open()) co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{}};
  const std::uint64_t id = next_id_++;
  auto p = std::make_shared<Pending>(reactor_.strand());
  p->signal.expires_at(until);
  pending_[id] = p;
  outbox_.push_back(encode_request(req, id));
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(reactor_.strand(), write_loop(generation_), asio::detached);
  }
  co_await p->signal.async_wait(kAwait);  // cancelled by the reply, or expired
  pending_.erase(id);
  if (p->reply) co_return std::pair{std::error_code{}, std::move(*p->reply)};
  if (p->failure) co_return std::pair{p->failure, Reply{}};
  // Timed out: the server did not answer in time. Later replies to this id
  // are ignored.
  co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{Status::internal, "timed out", Empty{}}};
}

asio::awaitable<void> RemoteTier::write_loop(std::uint64_t generation) {
  while (!outbox_.empty() && generation == generation_ && sock_) {
    auto [ec, n] = co_await asio::async_write(*sock_, asio::buffer(outbox_.front()), kAwait);
    if (generation != generation_) break;
    if (ec) {
      drop_connection("write: " + ec.message());
      break;
    }
    outbox_.pop_front();
  }
  writing_ = false;
}

asio::awaitable<void> RemoteTier::read_loop(std::uint64_t generation) {
  std::array<std::byte, kHeaderBytes> head{};
  for (;;) {
    auto [ec, n] = co_await asio::async_read(*sock_, asio::buffer(head), kAwait);
    if (generation != generation_) co_return;
    if (ec) {
      drop_connection("read: " + ec.message());
      co_return;
    }
    Header h;
    if (decode_header(head, kDefaultMaxBody, &h) != HeaderError::none) {
      drop_connection("a frame that is not kvstrand protocol 1");
      co_return;
    }
    std::vector<std::byte> body(h.body_bytes);
    auto [ec2, n2] = co_await asio::async_read(*sock_, asio::buffer(body), kAwait);
    if (generation != generation_) co_return;
    if (ec2) {
      drop_connection("read: " + ec2.message());
      co_return;
    }
    std::string why;
    auto reply = decode_reply(h.type, body, &why);
    auto it = pending_.find(h.request_id);
    if (it == pending_.end()) continue;  // its caller timed out
    if (!reply) {
      it->second->failure = TransferErrc::tier_unavailable;
      spdlog::error("kvstrand: RemoteTier: malformed reply: {}", why);
    } else {
      it->second->reply = std::move(*reply);
    }
    it->second->signal.cancel();
  }
}

asio::awaitable<kv::HitSource> RemoteTier::lookup(std::vector<kv::ChunkKey> keys) {
  if (co_await ensure_connected()) co_return kv::HitSource{};  // unreachable: a miss, recompute
  Request req = Lookup{registration_, keys};
  std::pair<std::error_code, Reply> res = co_await call(std::move(req), Clock::now() + opt_.request_timeout);
  if (res.first || res.second.status != Status::ok) co_return kv::HitSource{};
  auto& r = std::get<LookupReply>(res.second.payload);
  const std::size_t n = reg_ ? r.hit.tokens / reg_->layout.chunk_tokens : 0;
  if (r.lock != 0)
    for (std::size_t i = 0; i < n && i < keys.size(); ++i) lock_of_[keys[i]] = r.lock;
  co_return r.hit;
}

asio::awaitable<void> RemoteTier::release_lookup(std::vector<kv::ChunkKey> keys) {
  std::set<std::uint64_t> locks;
  for (const kv::ChunkKey& k : keys)
    if (auto it = lock_of_.find(k); it != lock_of_.end()) locks.insert(it->second);
  // Every key a lock holds goes with it: the server frees exactly what the
  // lookup took (F22), by the lock's id.
  std::erase_if(lock_of_, [&locks](const auto& kv) { return locks.contains(kv.second); });
  for (std::uint64_t lock : locks) {
    if (!connected_) co_return;  // a lost session took its locks with it
    Request req = FreeLocks{lock};
    (void)co_await call(std::move(req), Clock::now() + opt_.request_timeout);  // bounded; the TTL is the fallback
  }
}

asio::awaitable<std::error_code> RemoteTier::connect_for(Transfer& t) {
  std::error_code ec = co_await ensure_connected();
  if (ec) t.reason = "kvstrand-server at " + opt_.socket + " is unreachable";
  co_return ec;
}

asio::awaitable<std::error_code> RemoteTier::exchange(Transfer& t, Request req, Reply* out) {
  const char* what = to_string(type_of(req));
  t.state = TransferState::pending;
  std::pair<std::error_code, Reply> res = co_await call(std::move(req), t.deadline);
  if (res.first) {
    t.reason = "kvstrand-server at " + opt_.socket + " did not answer the " + what;
    co_return res.first;
  }
  if (res.second.status != Status::ok) {
    t.reason = std::string(to_string(res.second.status)) + ": " + res.second.message;
    co_return to_error(res.second.status);
  }
  *out = std::move(res.second);
  co_return std::error_code{};
}

asio::awaitable<std::error_code> RemoteTier::save(Transfer& t) {
  if (!kv::writes_to_tier(reg_->layout)) co_return std::error_code{};  // rank 0 stores the one copy
  if (std::error_code ec = co_await connect_for(t)) co_return ec;
  Request req = Store{registration_, t.spec};
  Reply reply;
  if (std::error_code ec = co_await exchange(t, std::move(req), &reply)) co_return ec;
  t.chunks_existed = std::get<StoreReply>(reply.payload).existed;
  co_return std::error_code{};
}

asio::awaitable<std::error_code> RemoteTier::load(Transfer& t) {
  if (std::error_code ec = co_await connect_for(t)) co_return ec;
  std::uint64_t lock = 0;
  if (!t.spec.keys.empty()) {
    if (auto it = lock_of_.find(t.spec.keys.front()); it != lock_of_.end()) {
      lock = it->second;
      std::erase_if(lock_of_, [lock](const auto& kv) { return kv.second == lock; });
    }
  }
  Request req = Retrieve{registration_, lock, t.spec};
  Reply reply;
  co_return co_await exchange(t, std::move(req), &reply);
}

asio::awaitable<void> RemoteTier::drain() {
  if (connected_) {
    // Best effort: the server reaps the session on the close anyway.
    Request req = EndSession{};
    co_await call(std::move(req), Clock::now() + std::chrono::milliseconds(500));
  }
  connected_ = false;  // a close, not a loss
  drop_connection("closed");
}

}  // namespace kvstrand::reactor
