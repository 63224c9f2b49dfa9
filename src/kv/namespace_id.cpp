#include <kvstrand/namespace_id.hpp>

#include <openssl/evp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvstrand::kv {

namespace {

class Canonical {
 public:
  void u64(std::string_view tag, std::uint64_t v) {
    str_raw(tag);
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void str(std::string_view tag, std::string_view v) {
    str_raw(tag);
    str_raw(v);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  void str_raw(std::string_view s) {
    const std::uint64_t n = s.size();
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    bytes_.append(s);
  }
  std::string bytes_;
};

}  // namespace

Digest namespace_of(const Layout& l) {
  Canonical c;
  c.str("kvstrand.namespace", "v1");
  c.str("model_id", l.model_id);
  c.str("layout_name", l.layout_name);
  c.u64("layout_version", l.layout_version);
  c.u64("planes", l.planes.size());
  for (const Plane& p : l.planes) {
    c.str("plane.name", p.name);
    c.u64("plane.bytes_per_block", p.bytes_per_block);
  }
  c.u64("block_tokens", l.block_tokens);
  c.u64("chunk_tokens", l.chunk_tokens);
  c.u64("sliding_window", l.sliding_window);
  c.str("checkpoint.kind", l.checkpoint.kind);
  c.u64("checkpoint.image_bytes", l.checkpoint.image_bytes);
  c.u64("checkpoint.interval_tokens", l.checkpoint.interval_tokens);
  c.str("speculative.method", l.speculative.method);
  c.u64("speculative.num_tokens", l.speculative.num_tokens);
  auto params = l.speculative.params;
  std::sort(params.begin(), params.end());
  c.u64("speculative.params", params.size());
  for (const auto& [k, v] : params) c.str(k, v);
  c.str("dtype", l.dtype);
  c.u64("tp_size", l.tp_size);
  c.u64("replicated_across_tp", l.replicated_across_tp ? 1 : 0);
  c.str("tenant_salt", l.tenant_salt);
  // Only when said, so that every namespace from before the field keeps its
  // objects (a node tier's arena and disk outlive a client's upgrade).
  if (!l.weight_version.empty()) c.str("weight_version", l.weight_version);
  if (!l.tenant.empty()) c.str("tenant", l.tenant);

  Digest out{};
  unsigned len = 0;
  if (EVP_Digest(c.bytes().data(), c.bytes().size(), reinterpret_cast<unsigned char*>(out.data()), &len,
                 EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("kvstrand: SHA-256 failed");
  return out;
}

}  // namespace kvstrand::kv
