// kvstrand-consumer: a small engine built out of kvstrand's tree against its
// installed package. Two KV-cache groups of different block sizes (an
// attention group with recurrent state, a sliding-window group), one
// request saved, looked up, planned with plan_groups and loaded into other
// blocks, every byte checked; the step's fence awaited by a C++20 coroutine
// that continues on the engine's own Asio io_context.
//
// Exits 0 and prints "consumer: ... exact" when every byte came back.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <kvstrand/kvstrand.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

using namespace std::chrono_literals;

namespace {

struct Task {
  struct promise_type {
    Task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

struct Group {
  kvstrand::kv::Layout layout;
  kvstrand::DeviceMemory plane;
  std::optional<kvstrand::DeviceMemory> state;
  std::uint32_t id = 0;
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 251 + seed * 13) % 256);
  return v;
}

kvstrand::kv::TransferSpec spec(const Group& g, const std::string& req, const std::vector<std::uint32_t>& prompt,
                                std::uint32_t tokens, kvstrand::kv::BlockId first_block) {
  kvstrand::kv::TransferSpec s;
  s.request = req;
  s.registration = g.id;
  s.tokens = {0, tokens};
  auto keys = kvstrand::kv::chunk_keys(g.layout, kvstrand::kv::namespace_of(g.layout), prompt);
  s.keys.assign(keys.begin(), keys.begin() + tokens / g.layout.chunk_tokens);
  for (std::uint32_t b = 0; b < tokens / g.layout.block_tokens; ++b) s.blocks.push_back(first_block + b);
  return s;
}

Task fence_step(kvstrand::Connector& conn, kvstrand::Connector::Resume resume, bool* done) {
  std::vector<std::string> requests{"req-1"};
  co_await conn.fenced(std::move(requests), 10s, std::move(resume));
  *done = true;
}

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "consumer: %s\n", why.c_str());
  std::exit(1);
}

}  // namespace

int main() {
  using namespace kvstrand;
  kvstrand::ConnectorOptions o;
  o.tier_bytes = 16u << 20;
  Connector conn(o);

  Group att{{}, DeviceMemory::allocate(32 * 2048), DeviceMemory::allocate(8 * 256), 0};
  att.layout.model_id = "consumer";
  att.layout.layout_name = "consumer-attention";
  att.layout.planes = {{"kv", 2048}};
  att.layout.block_tokens = 16;
  att.layout.chunk_tokens = 64;
  att.layout.checkpoint = {"ring", 256, 64};
  att.layout.dtype = "bf16";
  Group swa{{}, DeviceMemory::allocate(16 * 1024), std::nullopt, 0};
  swa.layout = att.layout;
  swa.layout.layout_name = "consumer-window";
  swa.layout.planes = {{"window", 1024}};
  swa.layout.block_tokens = 32;
  swa.layout.checkpoint = {};
  Registration r1{att.layout, {{att.plane.data(), 32}}, {att.state->data(), 8}};
  Registration r2{swa.layout, {{swa.plane.data(), 16}}, {}};
  att.id = conn.register_layout(r1);
  swa.id = conn.register_layout(r2);

  std::vector<std::uint32_t> prompt(200);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::uint32_t>(i * 17 + 3);
  att.plane.write(0, pattern(12 * 2048, 1));
  att.state->write(0, pattern(3 * 256, 2));
  swa.plane.write(0, pattern(6 * 1024, 3));

  kv::TransferSpec s1 = spec(att, "req-1", prompt, 192, 0);
  s1.with_state = true;
  s1.state_slots = {0, 1, 2};
  conn.submit({{TransferKind::save, s1, {}}, {TransferKind::save, spec(swa, "req-1", prompt, 192, 0), {}}});

  // The engine's own executor: the fence's coroutine continues there.
  boost::asio::io_context io;
  bool fenced = false;
  fence_step(conn, [&io](std::function<void()> f) { boost::asio::post(io, std::move(f)); }, &fenced);
  while (!fenced) {
    io.run_for(10ms);
    io.restart();
  }
  Finished f = conn.finished();
  if (f.saves.size() != 2) fail("the fence returned before both saves were terminal");
  for (const auto& o2 : f.saves)
    if (!o2.ok) fail("save failed: " + o2.reason);

  const auto l1 = conn.lookup(spec(att, "x", prompt, 192, 0).keys, att.id);
  const auto l2 = conn.lookup(spec(swa, "x", prompt, 192, 0).keys, swa.id);
  std::vector<LookupOutcome> answers;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (answers.size() < 2 && std::chrono::steady_clock::now() < end) {
    for (auto& a : conn.finished().lookups) answers.push_back(a);
    std::this_thread::sleep_for(1ms);
  }
  if (answers.size() != 2) fail("lookups unanswered");
  const auto& a1 = answers[0].id == l1 ? answers[0] : answers[1];
  const auto& a2 = answers[0].id == l2 ? answers[0] : answers[1];
  const kv::GroupsPlan plan = kv::plan_groups({{&att.layout, {}, a1.hit}, {&swa.layout, {}, a2.hit}}, 200, 0);
  if (plan.frontier != 192) fail("planned frontier " + std::to_string(plan.frontier) + ", not 192");

  att.plane.write(0, std::vector<std::byte>(32 * 2048));  // the blocks now hold other data
  swa.plane.write(0, std::vector<std::byte>(16 * 1024));
  kv::TransferSpec d1 = spec(att, "req-2", prompt, 192, 16);
  d1.with_state = true;
  d1.state_slots = {5};
  d1.tier_lease = a1.lease;
  kv::TransferSpec d2 = spec(swa, "req-2", prompt, 192, 8);
  d2.tier_lease = a2.lease;
  conn.submit({{TransferKind::load, d1, {}}, {TransferKind::load, d2, {}}});
  conn.fence({"req-2"}, 10s);
  f = conn.finished();
  for (const auto& o2 : f.loads)
    if (!o2.ok) fail("load failed: " + o2.reason);

  std::vector<std::byte> got(12 * 2048), img(256), win(6 * 1024);
  att.plane.read(16 * 2048, got);
  att.state->read(5 * 256, img);
  swa.plane.read(8 * 1024, win);
  const auto want_img = pattern(3 * 256, 2);
  const bool exact = got == pattern(12 * 2048, 1) &&
                     std::equal(img.begin(), img.end(), want_img.begin() + 2 * 256) && win == pattern(6 * 1024, 3);
  conn.close();
  std::printf("consumer: kvstrand %s (headers %s, backend %s): two groups, %u tokens resumed, %s\n", version(),
              KVSTRAND_VERSION_STRING, backend(), plan.frontier, exact ? "exact" : "MISMATCH");
  return exact ? 0 : 1;
}
