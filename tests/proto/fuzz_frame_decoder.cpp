// libFuzzer target for the server's frame decoder: arbitrary bytes as a
// header plus body, decoded as a request and as a reply. It must never crash,
// read out of bounds or allocate without bound (ASan + UBSan watch).
// Built by `make fuzz` with clang-14; a decoded request must re-encode to
// the same frame.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "proto/protocol.hpp"

using namespace kvstrand::proto;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  Header h;
  if (decode_header(in, 1u << 20, &h) != HeaderError::none) return 0;
  auto body = in.subspan(kHeaderBytes);
  if (body.size() > h.body_bytes) body = body.first(h.body_bytes);
  if (auto req = decode_request(h.type, body)) {
    const auto again = encode_request(*req, h.request_id);
    // Only a complete frame of the current version decodes: it must
    // re-encode to itself.
    if (h.minor == kMinor && body.size() == h.body_bytes &&
        !std::equal(again.begin() + kHeaderBytes, again.end(), body.begin(), body.end()))
      std::abort();
  }
  (void)decode_reply(h.type, body);
  return 0;
}
