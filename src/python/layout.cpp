// The layout (one model's KV geometry on one rank), its validation, the
// namespace it hashes to, and chunk keys.
#include "bindings.hpp"

#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/layout.hpp>
#include <kvstrand/namespace_id.hpp>

#include <cstring>

namespace kvstrand::python {

using namespace pybind11::literals;

namespace {
std::string repr_of(const kv::Layout& l) {
  std::string planes;
  for (const auto& p : l.planes) planes += (planes.empty() ? "" : ", ") + p.name + ":" + std::to_string(p.bytes_per_block);
  return "Layout(model_id='" + l.model_id + "', layout_name='" + l.layout_name + "', planes=[" + planes +
         "], block_tokens=" + std::to_string(l.block_tokens) + ", chunk_tokens=" + std::to_string(l.chunk_tokens) +
         ", tp=" + std::to_string(l.tp_rank) + "/" + std::to_string(l.tp_size) + ")";
}
}  // namespace

void bind_layout(py::module_& m) {
  py::class_<kv::Plane>(m, "Plane", "One KV plane (e.g. K, V, an index): its bytes per block.")
      .def(py::init([](std::string name, std::uint64_t bytes) { return kv::Plane{std::move(name), bytes}; }),
           "name"_a, "bytes_per_block"_a)
      .def_readwrite("name", &kv::Plane::name)
      .def_readwrite("bytes_per_block", &kv::Plane::bytes_per_block)
      .def("__repr__", [](const kv::Plane& p) {
        return "Plane('" + p.name + "', " + std::to_string(p.bytes_per_block) + ")";
      });

  py::class_<kv::CheckpointSpec>(m, "CheckpointSpec",
                                 "Recurrent state checkpointed at chunk boundaries; image_bytes 0: none.")
      .def(py::init([](std::string kind, std::uint64_t image_bytes, std::uint32_t interval) {
             return kv::CheckpointSpec{std::move(kind), image_bytes, interval};
           }),
           "kind"_a = "", "image_bytes"_a = 0, "interval_tokens"_a = 0)
      .def_readwrite("kind", &kv::CheckpointSpec::kind)
      .def_readwrite("image_bytes", &kv::CheckpointSpec::image_bytes)
      .def_readwrite("interval_tokens", &kv::CheckpointSpec::interval_tokens)
      .def("__repr__", [](const kv::CheckpointSpec& c) {
        return "CheckpointSpec('" + c.kind + "', " + std::to_string(c.image_bytes) + ", " +
               std::to_string(c.interval_tokens) + ")";
      });

  py::class_<kv::SpeculativeConfig>(m, "SpeculativeConfig", "Speculative decoding; num_tokens 0: off.")
      .def(py::init([](std::string method, std::uint32_t n, std::vector<std::pair<std::string, std::string>> params) {
             return kv::SpeculativeConfig{std::move(method), n, std::move(params)};
           }),
           "method"_a = "", "num_tokens"_a = 0, "params"_a = std::vector<std::pair<std::string, std::string>>{})
      .def_readwrite("method", &kv::SpeculativeConfig::method)
      .def_readwrite("num_tokens", &kv::SpeculativeConfig::num_tokens)
      .def_readwrite("params", &kv::SpeculativeConfig::params)
      .def_property_readonly("enabled", &kv::SpeculativeConfig::enabled)
      .def("__repr__", [](const kv::SpeculativeConfig& c) {
        return "SpeculativeConfig('" + c.method + "', " + std::to_string(c.num_tokens) + ")";
      });

  py::class_<kv::Layout>(m, "Layout",
                         "The KV geometry of one model on one rank. Every field that changes the stored bytes is "
                         "here: the namespace hashes all of them.")
      .def(py::init([](std::string model_id, std::string layout_name, std::uint32_t layout_version,
                       std::vector<kv::Plane> planes, std::uint32_t block_tokens, std::uint32_t chunk_tokens,
                       std::uint32_t sliding_window, kv::CheckpointSpec checkpoint, kv::SpeculativeConfig speculative,
                       std::string dtype, std::string tenant_salt, std::uint32_t tp_size, std::uint32_t tp_rank,
                       bool replicated_across_tp, std::string weight_version, std::string tenant) {
             kv::Layout l;
             l.model_id = std::move(model_id);
             l.layout_name = std::move(layout_name);
             l.layout_version = layout_version;
             l.planes = std::move(planes);
             l.block_tokens = block_tokens;
             l.chunk_tokens = chunk_tokens;
             l.sliding_window = sliding_window;
             l.checkpoint = std::move(checkpoint);
             l.speculative = std::move(speculative);
             l.dtype = std::move(dtype);
             l.tenant_salt = std::move(tenant_salt);
             l.tp_size = tp_size;
             l.tp_rank = tp_rank;
             l.replicated_across_tp = replicated_across_tp;
             l.weight_version = std::move(weight_version);
             l.tenant = std::move(tenant);
             return l;
           }),
           py::kw_only(), "model_id"_a = "", "layout_name"_a = "", "layout_version"_a = 1,
           "planes"_a = std::vector<kv::Plane>{}, "block_tokens"_a = 16, "chunk_tokens"_a = 256,
           "sliding_window"_a = 0, "checkpoint"_a = kv::CheckpointSpec{}, "speculative"_a = kv::SpeculativeConfig{},
           "dtype"_a = "", "tenant_salt"_a = "", "tp_size"_a = 1, "tp_rank"_a = 0, "replicated_across_tp"_a = false,
           "weight_version"_a = "", "tenant"_a = "")
      .def_readwrite("model_id", &kv::Layout::model_id)
      .def_readwrite("layout_name", &kv::Layout::layout_name)
      .def_readwrite("layout_version", &kv::Layout::layout_version)
      .def_readwrite("planes", &kv::Layout::planes)
      .def_readwrite("block_tokens", &kv::Layout::block_tokens)
      .def_readwrite("chunk_tokens", &kv::Layout::chunk_tokens)
      .def_readwrite("sliding_window", &kv::Layout::sliding_window)
      .def_readwrite("checkpoint", &kv::Layout::checkpoint)
      .def_readwrite("speculative", &kv::Layout::speculative)
      .def_readwrite("dtype", &kv::Layout::dtype)
      .def_readwrite("tenant_salt", &kv::Layout::tenant_salt)
      .def_readwrite("tp_size", &kv::Layout::tp_size)
      .def_readwrite("tp_rank", &kv::Layout::tp_rank)
      .def_readwrite("replicated_across_tp", &kv::Layout::replicated_across_tp)
      .def_readwrite("weight_version", &kv::Layout::weight_version)
      .def_readwrite("tenant", &kv::Layout::tenant,
                     "The tenant's name (not a secret): in the namespace when set, and what a node server's "
                     "--tenant-quota names")
      .def_property_readonly("has_state", &kv::Layout::has_state)
      .def_property_readonly("prefill_tail", &kv::Layout::prefill_tail)
      .def_property_readonly("blocks_per_chunk", &kv::Layout::blocks_per_chunk)
      .def_property_readonly("bytes_per_block", &kv::Layout::bytes_per_block)
      .def("object_bytes", &kv::Layout::object_bytes, "with_image"_a,
           "Bytes of one stored object: every plane's bytes of the chunk's blocks, plus the image when it has one.")
      .def("__copy__", [](const kv::Layout& l) { return l; })
      .def("__deepcopy__", [](const kv::Layout& l, py::dict) { return l; }, "memo"_a)
      .def("__repr__", &repr_of);

  m.def(
      "validate",
      [](const kv::Layout& l) {
        if (auto err = kv::validate(l)) raise_config_error(err->option, err->describe());
      },
      "layout"_a, "Raises ConfigError naming the option when kvstrand cannot serve this layout correctly.");
  m.def(
      "namespace_of", [](const kv::Layout& l) { return to_bytes(kv::namespace_of(l)); }, "layout"_a,
      "The 32-byte namespace: a stable hash of everything in the layout that moves the stored bytes (not the rank).");
  m.def(
      "tenant_problem", [](const std::string& name) { return kv::tenant_problem(name); }, "name"_a,
      "Why `name` cannot name a tenant (Layout.tenant), or None when it can.");
  m.def("kv_rank_of", &kv::kv_rank_of, "layout"_a,
        "The rank part of this layout's keys (0 for every rank when replicated_across_tp).");
  m.def("writes_to_tier", &kv::writes_to_tier, "layout"_a,
        "Whether this rank stores to the tier (with replicated_across_tp only rank 0 does; every rank reads).");

  py::class_<kv::ChunkKey>(m, "ChunkKey", "(namespace, kv_rank, chunk_hash): names one stored chunk.")
      .def(py::init([](const py::bytes& ns, std::uint32_t rank, const py::bytes& hash) {
             return kv::ChunkKey{to_digest(ns, "ns"), rank, to_digest(hash, "hash")};
           }),
           "ns"_a, "kv_rank"_a, "hash"_a)
      .def_property_readonly("ns", [](const kv::ChunkKey& k) { return to_bytes(k.ns); })
      .def_readonly("kv_rank", &kv::ChunkKey::kv_rank)
      .def_property_readonly("hash", [](const kv::ChunkKey& k) { return to_bytes(k.hash); })
      .def(py::self == py::self)
      .def("__hash__",
           [](const kv::ChunkKey& k) {
             std::size_t h = 0;
             std::memcpy(&h, k.hash.data(), sizeof h);  // the hash is SHA-256: any 8 bytes of it are uniform
             return h ^ k.kv_rank;
           })
      .def("__repr__",
           [](const kv::ChunkKey& k) {
             return "ChunkKey(rank=" + std::to_string(k.kv_rank) + ", hash=" + kv::to_hex(k.hash).substr(0, 16) + "…)";
           })
      .def(py::pickle([](const kv::ChunkKey& k) { return py::make_tuple(to_bytes(k.ns), k.kv_rank, to_bytes(k.hash)); },
                      [](const py::tuple& t) {
                        if (t.size() != 3) throw py::value_error("ChunkKey: a pickled key has 3 fields");
                        return kv::ChunkKey{to_digest(t[0], "ns"), t[1].cast<std::uint32_t>(), to_digest(t[2], "hash")};
                      }));

  m.def(
      "chunk_keys",
      [](const kv::Layout& l, const py::object& tokens, const std::optional<py::bytes>& ns) {
        const Tokens t(tokens);
        const kv::Digest d = ns ? to_digest(*ns, "ns") : kv::namespace_of(l);
        py::gil_scoped_release unlocked;  // SHA-256 over a long prompt
        return kv::chunk_keys(l, d, t.span());
      },
      "layout"_a, "tokens"_a, "ns"_a = py::none(),
      "Keys of every full chunk of `tokens` (a prompt from its start) under this layout and rank. `ns`: the "
      "namespace, when the caller has it already (namespace_of(layout) otherwise).");
  m.def(
      "chunk_hashes",
      [](const py::bytes& ns, const py::object& tokens, std::uint32_t chunk_tokens, const std::optional<py::bytes>& prev) {
        const Tokens t(tokens);
        const kv::Digest n = to_digest(ns, "ns");
        const kv::Digest p = prev ? to_digest(*prev, "prev") : kv::Digest{};
        if (chunk_tokens == 0) throw py::value_error("chunk_tokens must be > 0");
        std::vector<kv::Digest> hashes;
        {
          py::gil_scoped_release unlocked;
          kv::ChunkHasher hasher;
          hashes = hasher.hashes(n, t.span(), chunk_tokens, p);
        }
        py::list out;
        for (const auto& h : hashes) out.append(to_bytes(h));
        return out;
      },
      "ns"_a, "tokens"_a, "chunk_tokens"_a, "prev"_a = py::none(),
      "Chunk hashes of every full chunk of `tokens`, continuing from `prev` (the previous chunk's hash; none at a "
      "prompt's start): extend a prompt's keys without rehashing it.");
}

}  // namespace kvstrand::python
