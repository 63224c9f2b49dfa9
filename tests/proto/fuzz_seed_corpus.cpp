// Writes one valid frame of every request and reply type into DIR, the seed
// corpus of fuzz_frame_decoder (so the fuzzer starts past the magic and the
// length checks); with DESCRIPTIONS, chunk descriptions the server accepts
// into it, fuzz_chunk_description's seeds.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <kvstrand/namespace_id.hpp>
#include "proto/protocol.hpp"

using namespace kvstrand::kv;
using namespace kvstrand::proto;

namespace {

// msgpack written out by hand (this program links no server code): maps of
// vLLM's BlockStored fields, hashes as integers and as bytes.
void write_descriptions(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string hash32 = "\xc4\x20" + std::string(32, '\x5a');
  const std::string seeds[] = {
      "\x84\xac" "block_hashes" "\x92\x0b\x0c" "\xb1" "parent_block_hash" "\x0a" "\xa9" "token_ids"
      "\x92\x05\x06" "\xaa" "block_size" "\x10",
      "\x86\xac" "block_hashes" "\x91" + hash32 + "\xb1" "parent_block_hash" "\xc0" "\xa9" "token_ids" "\x91\x07"
      "\xaa" "block_size" "\x10" "\xa9" "group_idx" "\x03" "\xa9" "lora_name" "\xa4" "base",
  };
  int n = 0;
  for (const std::string& s : seeds) std::ofstream(dir + "/seed-" + std::to_string(n++), std::ios::binary) << s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s DIR [DESCRIPTIONS]\n", argv[0]);
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  if (argc == 3) write_descriptions(argv[2]);
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
