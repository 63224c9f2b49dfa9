// The engine thread's record of its lookups: how many are unanswered or
// undrained (max_live_lookups), and, on the node tier, what each asked and
// then what each lease holds, until a load names the lease, it is released
// or exported (export_lease hands its keys on).
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/finished.hpp>
#include "data_path/registration.hpp"

namespace kvstrand::connector {

class LookupBook {
 public:
  // `leases`: whether the tier's hits come with leases that can leave the
  // process (the node tier): only then is what a lookup asked kept.
  LookupBook(std::size_t max_live_lookups, bool leases) : max_live_(max_live_lookups), leases_(leases) {}

  // A new lookup's id; throws TransferRefused (too_many_live) at the bound.
  std::uint64_t start();
  // What lookup `id` asked (kept until its answer is drained; copied only
  // where leases can leave the process, so the embedded tier's step pays
  // nothing for it).
  void asked(std::uint64_t id, std::uint32_t registration, const std::vector<kv::ChunkKey>& keys);
  // A lease named by a load, released or exported: no longer held here.
  void drop(std::uint64_t lease) { held_.erase(lease); }
  // Exports a held lease: its keys, and the lease is no longer held here.
  // Throws TransferRefused (bad_spec) for one not held.
  std::vector<kv::ChunkKey> take(std::uint64_t lease);
  // Drained answers: each settles its lookup; a hit's lease is held.
  void answered(const Finished& f, const std::vector<Registration>& registrations);

 private:
  struct Asked {
    std::uint32_t registration = 0;
    std::vector<kv::ChunkKey> keys;
  };
  std::size_t max_live_;
  bool leases_;
  std::map<std::uint64_t, Asked> asked_;  // by lookup id
  std::map<std::uint64_t, Asked> held_;   // by lease: the hit's keys
  std::uint64_t next_ = 1;
  std::size_t live_ = 0;  // asked, answer not yet drained
};

}  // namespace kvstrand::connector
