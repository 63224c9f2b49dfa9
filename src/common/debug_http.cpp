#include "common/log_escaped.hpp"
#include "common/debug_http.hpp"

#include "common/accept_backoff.hpp"
#include "common/await_codes.hpp"
#include "common/gate.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <list>

namespace kvstrand::common {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::optional<kv::ConfigError> validate(const HttpOptions& o) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(o.address, ec);
  if (ec) return kv::ConfigError{"http.address", "'" + o.address + "' is not an IP address"};
  if (!addr.is_loopback() && !o.allow_non_loopback)
    return kv::ConfigError{"http.allow_non_loopback",
                           "the debug endpoint would listen on " + o.address +
                               ", which is not loopback; it shows every transfer: set http.allow_non_loopback "
                               "(--http-allow-remote) to mean it"};
  if (o.max_connections == 0) return kv::ConfigError{"http.max_connections", "must be > 0"};
  if (o.header_limit < 1024) return kv::ConfigError{"http.header_limit", "must be >= 1024"};
  if (o.idle_timeout.count() <= 0) return kv::ConfigError{"http.idle_timeout", "must be > 0"};
  if (o.request_timeout.count() <= 0) return kv::ConfigError{"http.request_timeout", "must be > 0"};
  return std::nullopt;
}

std::optional<HttpOptions> parse_http_address(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return std::nullopt;
  HttpOptions o;
  o.address = text.substr(0, colon);
  if (o.address.size() > 2 && o.address.front() == '[' && o.address.back() == ']')
    o.address = o.address.substr(1, o.address.size() - 2);
  unsigned long port = 0;
  for (char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535) return std::nullopt;
  }
  o.port = static_cast<std::uint16_t>(port);
  return o;
}

struct DebugHttp::State : std::enable_shared_from_this<DebugHttp::State> {
  State(Strand& s, HttpOptions o, HttpRoutes rt)
      : strand(s), opt(std::move(o)), routes(std::move(rt)), acceptor(s), backoff(s), gate(s) {}

  HttpResponse route(const http::request<http::empty_body>& req) {
    if (req.method() != http::verb::get && req.method() != http::verb::head)
      return {405, "text/plain", "read-only: GET and HEAD only\n"};
    std::string path(req.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    if (!opt.token.empty() && path != "/healthz" && path != "/readyz" && !authorized(req))
      return {401, "text/plain", "this endpoint needs its token: Authorization: Bearer <the --http-token-file's>\n"};
    auto it = routes.find(path);
    if (it == routes.end()) {
      std::string known;
      for (const auto& [p, f] : routes) known += "  " + p + "\n";
      return {404, "text/plain", "no such endpoint: " + path + "\nendpoints:\n" + known};
    }
    return it->second();
  }

  // The request's bearer token is the endpoint's, compared in time that
  // does not depend on where they differ.
  bool authorized(const http::request<http::empty_body>& req) const {
    const auto h = req.find(http::field::authorization);
    if (h == req.end()) return false;
    const std::string_view given = h->value();
    const std::string want = "Bearer " + opt.token;
    if (given.size() != want.size()) return false;
    unsigned char diff = 0;
    for (std::size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i]);
    return diff == 0;
  }

  asio::awaitable<void> accept_loop() {
    for (;;) {
      std::tuple<boost::system::error_code, tcp::socket> accepted = co_await acceptor.async_accept(kAwait);
      if (const auto ec = std::get<0>(accepted)) {
        if (stopped) co_return;
        co_await backoff.failed(ec.value(), "kvstrand debug endpoint");
        continue;
      }
      backoff.succeeded();
      tcp::socket& sock = std::get<1>(accepted);
      if (stopped) co_return;
      if (live >= opt.max_connections && !make_room()) {
        boost::system::error_code ignored;
        sock.close(ignored);  // over the bound, every connection busy answering: closed at once, nothing read
        ++refused;
        continue;
      }
      connections.emplace_front(std::move(sock));
      ++live;
      if (!gate.spawn(serve(shared_from_this(), connections.begin()), LogEscaped{"a debug HTTP connection"})) {
        connections.pop_front();
        --live;
      }
    }
  }

  // The oldest connection still waiting for its request is closed to make
  // room for a new one; false when every connection is answering one.
  bool make_room() {
    for (auto it = connections.rbegin(); it != connections.rend(); ++it) {
      if (!it->waiting || it->evicted) continue;
      it->evicted = true;
      --live;
      ++evicted;
      boost::system::error_code ignored;
      it->stream.socket().close(ignored);  // its coroutine sees it and erases it
      return true;
    }
    return false;
  }

  struct Connection {
    explicit Connection(tcp::socket s) : stream(std::move(s)) {}
    beast::tcp_stream stream;
    bool waiting = true;   // for its next request (not answering one)
    bool evicted = false;  // closed by make_room, no longer counted in `live`
  };

  static asio::awaitable<void> serve(std::shared_ptr<State> self, std::list<Connection>::iterator it) {
    beast::tcp_stream& stream = it->stream;
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::empty_body> parser;
      parser.header_limit(self->opt.header_limit);
      // The whole request within the bound, however slowly its bytes come.
      stream.expires_after(self->opt.request_timeout);
      it->waiting = true;
      auto [ec, n] = co_await http::async_read(stream, buffer, parser, kAwait);
      it->waiting = false;
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || it->evicted || self->stopped) break;
      HttpResponse r;
      bool keep = false;
      if (ec) {
        r = ec == http::error::header_limit ? HttpResponse{431, "text/plain", "request header too large\n"}
                                            : HttpResponse{400, "text/plain", "bad request: " + ec.message() + "\n"};
      } else {
        r = self->route(parser.get());
        keep = parser.get().keep_alive();
      }
      http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
      res.set(http::field::server, "kvstrand");
      res.set(http::field::content_type, r.content_type);
      res.set(http::field::cache_control, "no-store");
      const bool head = !ec && parser.get().method() == http::verb::head;
      res.body() = std::move(r.body);
      res.keep_alive(keep);
      res.prepare_payload();
      if (head) res.body().clear();
      stream.expires_after(self->opt.idle_timeout);
      auto [wec, wn] = co_await http::async_write(stream, res, kAwait);
      if (wec || !keep) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
    if (!it->evicted) --self->live;
    self->connections.erase(it);
  }

  void stop() {
    if (stopped) return;
    stopped = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    backoff.cancel();
    for (auto& c : connections) c.stream.socket().close(ignored);  // their coroutines end and erase themselves
  }

  Strand& strand;
  HttpOptions opt;
  HttpRoutes routes;
  tcp::acceptor acceptor;
  AcceptBackoff backoff;
  std::list<Connection> connections;  // the newest first
  std::size_t live = 0;               // connections not evicted: what max_connections bounds
  std::uint64_t refused = 0;
  std::uint64_t evicted = 0;
  bool stopped = false;
  Gate gate;  // the acceptor and every connection run inside it
};

DebugHttp::DebugHttp(Strand& strand, HttpOptions options, HttpRoutes routes) : strand_(strand) {
  if (auto err = validate(options)) throw std::invalid_argument(err->describe());
  state_ = std::make_shared<State>(strand, std::move(options), std::move(routes));
  const std::string err = call_on(strand_, [st = state_]() -> asio::awaitable<std::string> {
    boost::system::error_code ec;
    const tcp::endpoint ep(asio::ip::make_address(st->opt.address), st->opt.port);
    st->acceptor.open(ep.protocol(), ec);
    if (!ec) st->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) st->acceptor.bind(ep, ec);
    if (!ec) st->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) co_return "invalid option 'http': cannot listen on " + st->opt.address + ":" +
        std::to_string(st->opt.port) + ": " + ec.message();
    st->gate.spawn(st->accept_loop(), LogEscaped{"the debug HTTP acceptor"});
    co_return std::string{};
  });
  if (!err.empty()) throw std::invalid_argument(err);
  port_ = call_on(strand_, [st = state_]() -> asio::awaitable<std::uint16_t> { co_return st->acceptor.local_endpoint().port(); });
  spdlog::info("kvstrand: debug endpoint on http://{}:{}/debug", state_->opt.address, port_);
}

DebugHttp::~DebugHttp() { stop(); }

void DebugHttp::stop() {
  if (!state_ || stopped_) return;  // the caller's own flag: State's is the strand's
  stopped_ = true;
  // Returns once the acceptor and every connection have ended (their
  // sockets closed, each sees it at once), or at the bound.
  call_on(strand_, [st = state_]() -> asio::awaitable<void> {
    st->stop();
    if (!co_await st->gate.close(std::chrono::seconds(1)))
      spdlog::warn("kvstrand: debug endpoint: {} connection(s) still running 1 s after stop", st->gate.inside());
  });
}

}  // namespace kvstrand::common
