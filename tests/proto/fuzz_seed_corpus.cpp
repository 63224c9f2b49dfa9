// Writes one valid frame of every request and reply type into DIR, the seed
// corpus of fuzz_frame_decoder (so the fuzzer starts past the magic and the
// length checks).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <kvstrand/namespace_id.hpp>
#include "proto/protocol.hpp"

using namespace kvstrand::kv;
using namespace kvstrand::proto;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  Layout l;
  l.model_id = "m";
  l.layout_name = "l";
  l.planes = {{"k", 4096}, {"v", 4096}};
  l.checkpoint = {"ring", 512, 256};
  l.dtype = "bf16";
  std::vector<std::uint32_t> toks(512, 1);
  const std::vector<ChunkKey> keys = chunk_keys(l, namespace_of(l), toks);
  RegisterLayout reg{l};
  const std::vector<Request> requests = {Hello{kMajor, 0, "seed", {}}, reg,          Unregister{1},
                                         Lookup{1, keys},          Release{2},   Reserve{1, keys, {1, 0}},
                                         Commit{2, true},          EndSession{}, Stats{},
                                         Ping{},                   Adopt{1, 2, keys}};
  // 2.4's tails: a reserve's chunk events, a registration's tenant; the drops.
  RegisterLayout named{l};
  named.layout.tenant = "team-a";
  Reserve described{1, keys, {1, 0}};
  described.events = {"\x81\xac" "block_hashes" "\x91\x07", ""};
  const std::vector<Request> newer = {named, described, Drop{namespace_of(l)}, DropTenant{"team-a"}};
  int n = 0;
  auto write = [&](const std::vector<std::byte>& frame) {
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++), std::ios::binary)
        .write(reinterpret_cast<const char*>(frame.data()), static_cast<std::streamsize>(frame.size()));
  };
  for (const Request& r : requests) write(encode_request(r, 1));
  for (const Request& r : newer) write(encode_request(r, 1));
  write(encode_reply(Type::lookup, 1, Reply{Status::ok, "", LookupReply{3, {512, {256, 512}}, {0, 4096}}}));
  write(encode_reply(Type::reserve, 1,
                     Reply{Status::ok, "", ReserveReply{4, {ChunkState::reserved, ChunkState::full}, {8192, 0}}}));
  write(encode_reply(Type::hello, 1, Reply{Status::ok, "", HelloReply{1, kMajor, 0, 1 << 30, 1 << 30, 0, false}}));
  write(encode_reply(Type::stats, 1, Reply{Status::ok, "", StatsReply{}}));
  write(encode_reply(Type::commit, 1, Reply{Status::unknown_hold, "no", Empty{}}));
  return 0;
}
