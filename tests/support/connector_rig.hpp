// A small registered KV geometry on the device, and a Connector over it, for
// the reactor tests: 3 planes, 64 blocks of 16 tokens, 64-token chunks
// (4 blocks), a 512-byte state image per chunk boundary.
#pragma once

#include <thread>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "connector/connector.hpp"
#include "index_plane/local_index.hpp"
#include "support.hpp"

namespace kvstrand::test {

// A Connector's options with its transfer deadline set.
inline connector::ConnectorOptions with_deadline(std::chrono::milliseconds d) {
  connector::ConnectorOptions o;
  o.transfer_deadline = d;
  return o;
}

inline bool has_state(connector::Connector& c, connector::TransferState s) {
  for (const auto& t : c.transfers())
    if (t.state == s) return true;
  return false;
}

inline void wait_for_state(connector::Connector& c, connector::TransferState s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!has_state(c, s)) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

struct Rig {
  static constexpr std::uint32_t kBlocks = 64;
  static constexpr std::uint64_t kPlaneBlockBytes = 2048;
  static constexpr std::uint32_t kSlots = 16;

  kv::Layout layout;
  kv::Digest ns{};
  device::Stream engine_stream = must(device::Stream::create());  // the engine's own stream
  std::vector<device::DeviceBuffer> planes;
  std::optional<device::DeviceBuffer> state;
  // The tier's streams, once registered (the sim's hooks hold them).
  connector::Connector::TierStreams streams;
  std::unique_ptr<connector::Connector> conn;

  explicit Rig(connector::ConnectorOptions opts = {}, std::uint64_t tier_objects = 64, std::string tenant = {}) {
    layout.model_id = "rig";
    layout.layout_name = "rig";
    layout.planes = {{"k", kPlaneBlockBytes}, {"v", kPlaneBlockBytes}, {"idx", kPlaneBlockBytes}};
    layout.block_tokens = 16;
    layout.chunk_tokens = 64;
    layout.checkpoint = {"ring", 512, 64};
    layout.dtype = "bf16";
    layout.tenant = std::move(tenant);
    ns = kv::namespace_of(layout);
    for (int p = 0; p < 3; ++p) planes.push_back(must(device::DeviceBuffer::allocate(kBlocks * kPlaneBlockBytes)));
    state.emplace(must(device::DeviceBuffer::allocate(kSlots * 512)));
    randomize(1);
    if (!opts.make_index && opts.server_socket.empty()) {
      const std::uint64_t bytes = tier_objects * layout.object_bytes(true);
      opts.make_index = [bytes](reactor::Reactor&) { return std::make_unique<index_plane::LocalIndex>(bytes); };
    }
    conn = std::make_unique<connector::Connector>(opts);
    conn->register_layout(registration());
    streams = conn->tier_streams();
  }

  // The rule a fail-stop puts on an engine, kept here too: memory that a copy
  // never seen to end may still touch is never freed. A test that releases a
  // held stream just before it ends races that copy; freeing the planes under
  // it crashed the sim stream's worker (test_debug_http, once in CI).
  ~Rig() {
    if (!conn) return;
    conn->close();
    if (conn->never_ended() == 0) return;
    static auto* forever = new std::vector<device::DeviceBuffer>;
    for (auto& p : planes) forever->push_back(std::move(p));
    if (state) forever->push_back(std::move(*state));
    if (swa) forever->push_back(std::move(swa->plane));
  }
  Rig(const Rig&) = delete;
  device::Stream& save_stream() { return *streams.save; }
  device::Stream& load_stream() { return *streams.load; }
  Rig& operator=(const Rig&) = delete;

  kvstrand::Registration registration() {
    kvstrand::Registration reg;
    reg.layout = layout;
    for (auto& p : planes) reg.planes.push_back({p.data(), kBlocks});
    reg.state = {state->data(), kSlots};
    return reg;
  }

  void randomize(std::uint64_t seed) {
    for (std::size_t p = 0; p < planes.size(); ++p)
      write_device(engine_stream, planes[p].data(), random_bytes(planes[p].size(), seed * 10 + p));
    write_device(engine_stream, state->data(), random_bytes(state->size(), seed * 10 + 9));
  }

  // Contents of the given blocks, plane by plane, and of the state slots.
  std::vector<std::byte> snapshot(const std::vector<kv::BlockId>& blocks, const std::vector<std::int32_t>& slots) {
    std::vector<std::byte> out;
    for (auto& p : planes)
      for (kv::BlockId b : blocks) {
        auto v = read_device(engine_stream, p.data() + b * kPlaneBlockBytes, kPlaneBlockBytes);
        out.insert(out.end(), v.begin(), v.end());
      }
    for (std::int32_t s : slots) {
      auto v = read_device(engine_stream, state->data() + s * 512, 512);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // Keys of chunks [first, last) of a prompt made from `seed`.
  std::vector<kv::ChunkKey> keys(std::uint64_t seed, std::uint32_t first, std::uint32_t last) {
    std::vector<std::uint32_t> toks(last * layout.chunk_tokens);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(seed * 7919 + i * 31);
    auto all = kv::chunk_keys(layout, ns, toks);
    return {all.begin() + first, all.begin() + last};
  }

  // A transfer of chunks [first, last) of prompt `seed` with state. A save
  // takes an image at every chunk end from slots 0, 1, ...; a load puts the
  // image at its end into `slot`.
  kv::TransferSpec spec(const std::string& req, std::uint64_t seed, std::uint32_t first, std::uint32_t last,
                        std::vector<kv::BlockId> blocks) {
    kv::TransferSpec s;
    s.request = req;
    s.tokens = {first * layout.chunk_tokens, last * layout.chunk_tokens};
    s.keys = keys(seed, first, last);
    s.blocks = std::move(blocks);
    s.with_state = true;
    return s;
  }
  kv::TransferSpec save_spec(const std::string& req, std::uint64_t seed, std::uint32_t first, std::uint32_t last,
                             std::vector<kv::BlockId> blocks) {
    kv::TransferSpec s = spec(req, seed, first, last, std::move(blocks));
    for (std::uint32_t i = 0; i < last - first; ++i) s.state_slots.push_back(static_cast<std::int32_t>(i));
    return s;
  }
  kv::TransferSpec load_spec(const std::string& req, std::uint64_t seed, std::uint32_t first, std::uint32_t last,
                             std::vector<kv::BlockId> blocks, std::int32_t slot) {
    kv::TransferSpec s = spec(req, seed, first, last, std::move(blocks));
    s.state_slots = {slot};
    return s;
  }

  // Saves 3 chunks from scattered blocks, looks up one key more than stored,
  // overwrites the device, loads into other blocks: KV and the state image
  // come back byte for byte. Every tier's test suite runs it.
  void round_trip() {
    const auto src = std::vector<kv::BlockId>{5, 9, 2, 40, 41, 42, 43, 7, 8, 60, 61, 62};  // 3 chunks
    const auto before = snapshot(src, {2});
    conn->save(save_spec("a", 1, 0, 3, src));
    // The outcome and the source-safe notice are two mailbox entries: wait for both.
    auto f = wait_for([](const kvstrand::Finished& f) { return !f.saves.empty() && !f.source_safe.empty(); });
    INFO(f.saves[0].reason);
    REQUIRE(f.saves[0].ok);
    REQUIRE(f.source_safe.size() == 1);
    REQUIRE(f.source_safe[0].blocks == src);

    const auto id = conn->lookup(keys(1, 0, 4));  // one more key than stored
    f = wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });
    REQUIRE(f.lookups[0].id == id);
    REQUIRE(f.lookups[0].hit.tokens == 192);
    REQUIRE(f.lookups[0].hit.checkpoints == std::vector<std::uint32_t>{64, 128, 192});
    const std::uint64_t lease = f.lookups[0].lease;  // the node tier's; 0 for the embedded one

    randomize(2);  // "evicted": the device memory now holds other data
    const auto dst = Rig::block_range(20, 12);
    auto spec = load_spec("a", 1, 0, 3, dst, 7);
    spec.tier_lease = lease;
    conn->load(spec);
    f = wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
    INFO(f.loads[0].reason);
    REQUIRE(f.loads[0].ok);
    // Destination blocks hold the saved blocks; slot 7 the image saved at the end (slot 2).
    REQUIRE(snapshot(dst, {7}) == before);
  }

  // Saves prompt 1's 3 chunks, invalidates the namespace: the lookup that
  // hit them misses, and a save of them stores them anew. Every tier's
  // test suite runs it.
  void invalidate_round() {
    const auto src = Rig::block_range(0, 12);
    conn->save(save_spec("a", 1, 0, 3, src));
    REQUIRE(wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
    auto hit = [&] {
      conn->lookup(keys(1, 0, 3));
      const auto f = wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });
      if (f.lookups[0].lease != 0) conn->release_lookup(f.lookups[0].lease);
      return f.lookups[0].hit.tokens;
    };
    REQUIRE(hit() == 192);
    REQUIRE(conn->invalidate() == 3);
    REQUIRE(hit() == 0);
    conn->save(save_spec("b", 1, 0, 3, src));
    REQUIRE(wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
    REQUIRE(hit() == 192);
    try {
      conn->invalidate(7);
      FAIL("invalidate of no registration returned");
    } catch (const kvstrand::TransferRefused& e) {
      REQUIRE(e.code() == kvstrand::TransferErrc::not_registered);
    }
  }

  // A second KV-cache group of the same model: a sliding-window group of
  // 32-token blocks (two a chunk), one 4 KiB plane, no state; its objects
  // are a third the size of the first group's. Registered as id 1.
  struct Group {
    kv::Layout layout;
    kv::Digest ns{};
    device::DeviceBuffer plane;
    std::uint32_t id = 0;
  };
  std::optional<Group> swa;
  static constexpr std::uint32_t kSwaBlocks = 32;
  static constexpr std::uint64_t kSwaBlockBytes = 4096;

  void add_swa_group() {
    kv::Layout l = layout;
    l.layout_name = "rig-swa";
    l.planes = {{"swa", kSwaBlockBytes}};
    l.block_tokens = 32;
    l.checkpoint = {};
    swa.emplace(Group{l, kv::namespace_of(l), must(device::DeviceBuffer::allocate(kSwaBlocks * kSwaBlockBytes)), 0});
    write_device(engine_stream, swa->plane.data(), random_bytes(swa->plane.size(), 77));
    kvstrand::Registration reg;
    reg.layout = l;
    reg.planes = {{swa->plane.data(), kSwaBlocks}};
    swa->id = conn->register_layout(reg);
  }
  std::vector<kv::ChunkKey> swa_keys(std::uint64_t seed, std::uint32_t last) {
    std::vector<std::uint32_t> toks(last * layout.chunk_tokens);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(seed * 7919 + i * 31);
    return kv::chunk_keys(swa->layout, swa->ns, toks);
  }
  std::vector<std::byte> swa_snapshot(const std::vector<kv::BlockId>& blocks) {
    std::vector<std::byte> out;
    for (kv::BlockId b : blocks) {
      auto v = read_device(engine_stream, swa->plane.data() + b * kSwaBlockBytes, kSwaBlockBytes);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // One prompt in two groups of different block sizes: the first group
  // stores 3 chunks, the second only 2; the planner resumes both at the
  // least (128 tokens), each group loads exactly that into its own pool,
  // and every byte comes back (0 mismatches). Every tier's suite runs it.
  void two_group_round_trip() {
    add_swa_group();
    REQUIRE(swa->id == 1);
    const auto src = std::vector<kv::BlockId>{5, 9, 2, 40, 41, 42, 43, 7, 8, 60, 61, 62};  // 3 chunks
    const auto swa_src = std::vector<kv::BlockId>{3, 17, 30, 4};                           // 2 chunks of 2
    const auto kv_before = snapshot({5, 9, 2, 40, 41, 42, 43, 7}, {1});  // the first 2 chunks, image at 128
    const auto swa_before = swa_snapshot(swa_src);
    kv::TransferSpec s1 = save_spec("p", 1, 0, 3, src);
    kv::TransferSpec s2;
    s2.request = "p";
    s2.registration = swa->id;
    s2.tokens = {0, 2 * layout.chunk_tokens};
    s2.keys = swa_keys(1, 2);
    s2.blocks = swa_src;
    // One request, one save per group, in one submit: not duplicates.
    conn->submit({{kvstrand::TransferKind::save, s1, nullptr}, {kvstrand::TransferKind::save, s2, nullptr}});
    auto f = wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2 && f.source_safe.size() == 2; });
    for (const auto& o : f.saves) {
      INFO(o.reason);
      REQUIRE(o.ok);
    }
    REQUIRE(f.source_safe[0].registration != f.source_safe[1].registration);

    const auto l1 = conn->lookup(keys(1, 0, 4));
    const auto l2 = conn->lookup(swa_keys(1, 4), swa->id);
    f = wait_for([](const kvstrand::Finished& f) { return f.lookups.size() == 2; });
    const auto& a = f.lookups[0].id == l1 ? f.lookups[0] : f.lookups[1];
    const auto& b = f.lookups[0].id == l2 ? f.lookups[0] : f.lookups[1];
    REQUIRE(a.registration == 0);
    REQUIRE(b.registration == swa->id);
    REQUIRE(a.hit.tokens == 192);
    REQUIRE(b.hit.tokens == 128);
    const kv::GroupsPlan plan = kv::plan_groups({{&layout, {}, a.hit}, {&swa->layout, {}, b.hit}}, 4 * 64 + 1, 0);
    REQUIRE(plan.frontier == 128);
    REQUIRE(plan.groups[0].load == kv::TokenRange{0, 128});
    REQUIRE(plan.groups[1].load == kv::TokenRange{0, 128});

    randomize(2);
    write_device(engine_stream, swa->plane.data(), random_bytes(swa->plane.size(), 78));
    const auto dst = Rig::block_range(20, 8);
    const auto swa_dst = std::vector<kv::BlockId>{10, 11, 12, 13};
    kv::TransferSpec d1 = load_spec("p", 1, 0, 2, dst, 7);
    d1.tier_lease = a.lease;
    kv::TransferSpec d2;
    d2.request = "p";
    d2.registration = swa->id;
    d2.tokens = {0, 128};
    d2.keys = swa_keys(1, 2);
    d2.blocks = swa_dst;
    d2.tier_lease = b.lease;
    conn->submit({{kvstrand::TransferKind::load, d1, nullptr}, {kvstrand::TransferKind::load, d2, nullptr}});
    f = wait_for([](const kvstrand::Finished& f) { return f.loads.size() == 2; });
    for (const auto& o : f.loads) {
      INFO(o.reason);
      REQUIRE(o.ok);
    }
    REQUIRE(snapshot(dst, {7}) == kv_before);
    REQUIRE(swa_snapshot(swa_dst) == swa_before);
  }

  static std::vector<kv::BlockId> block_range(kv::BlockId from, std::uint32_t n) {
    std::vector<kv::BlockId> v(n);
    for (std::uint32_t i = 0; i < n; ++i) v[i] = from + i;
    return v;
  }

  // Polls finished() until `pred` holds for the accumulated outcomes, or 10 s.
  template <class Pred>
  kvstrand::Finished wait_for(Pred pred) {
    kvstrand::Finished all;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      auto f = conn->finished();
      for (auto& o : f.saves) all.saves.push_back(o);
      for (auto& o : f.loads) all.loads.push_back(o);
      for (auto& o : f.source_safe) all.source_safe.push_back(o);
      for (auto& o : f.lookups) all.lookups.push_back(o);
      if (pred(all)) return all;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    FAIL("timed out waiting for completions");
    return all;
  }
};

// Raises the connector's fail-stop within 10 s, or fails the test.
inline kvstrand::FailStop wait_for_fail_stop(connector::Connector& c) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    try {
      c.finished();
    } catch (const kvstrand::FailStop& e) {
      return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL("no fail-stop");
  throw std::logic_error("unreachable");
}

}  // namespace kvstrand::test
