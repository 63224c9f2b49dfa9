// Reading one frame off a stream socket, for both ends of the protocol (the
// server's sessions and the node tier's client): the header, then the body
// in pieces of at most kBodyPiece, so that memory follows the bytes that
// arrived, not the size a header announced. Header-only: Asio is its
// includers' (the rest of src/proto does no I/O).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/read.hpp>
#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "common/await_codes.hpp"
#include "proto/protocol.hpp"

namespace kvstrand::proto {

inline constexpr std::size_t kBodyPiece = 64 * 1024;

struct ReadFrame {
  boost::system::error_code io;            // the stream failed or closed: nothing more comes
  HeaderError header = HeaderError::none;  // not a frame this end reads (its body is not read)
  Header h;                                // decoded as far as it could be (other_major: all of it)
  std::vector<std::byte> body;
};

// Completes with what happened, never by throwing.
template <class Stream>
boost::asio::awaitable<ReadFrame> read_frame(Stream& s, std::uint32_t max_body) {
  ReadFrame f;
  std::array<std::byte, kHeaderBytes> head{};
  auto [ec, n] = co_await boost::asio::async_read(s, boost::asio::buffer(head), common::kAwait);
  if ((f.io = ec)) co_return f;
  if ((f.header = decode_header(head, max_body, &f.h)) != HeaderError::none) co_return f;
  while (f.body.size() < f.h.body_bytes) {
    const std::size_t at = f.body.size();
    f.body.resize(at + std::min<std::size_t>(kBodyPiece, f.h.body_bytes - at));
    auto [e, got] = co_await boost::asio::async_read(s, boost::asio::buffer(f.body.data() + at, f.body.size() - at),
                                                     common::kAwait);
    if ((f.io = e)) co_return f;
  }
  co_return f;
}

}  // namespace kvstrand::proto
