// A registration: one KV-cache group's geometry (a Layout) and where its
// device memory is. Device memory is named by address only (an engine's
// tensor.data_ptr()); kvstrand never allocates or frees it.
//
// A registration with no memory at all (no planes, no state) serves lookups
// only: a scheduler process that plans loads but never copies registers its
// layouts so, and saves and loads naming it are refused.
//
// A tier object holds, plane after plane, that plane's bytes of the chunk's
// blocks in block order, then the checkpoint image when it has one: the
// state memories' slots in their order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kvstrand/layout.hpp>
#include <kvstrand/transfer_spec.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

struct PlaneMemory {
  void* base = nullptr;         // device memory of block 0
  std::uint32_t num_blocks = 0; // blocks in the pool
};

struct StateMemory {
  void* base = nullptr;  // device memory of image slot 0
  std::uint32_t slots = 0;
  // Bytes of one slot, and the distance between slots. 0: the whole image
  // (layout.checkpoint.image_bytes), the one-memory case.
  std::uint64_t slot_bytes = 0;
};

struct Registration {
  kv::Layout layout;
  std::vector<PlaneMemory> planes;  // one per layout plane, same order
  StateMemory state;                // used when layout.has_state() and state_parts is empty
  // An image kept in several memories, each with its own slots (a hybrid
  // engine's state layers, one tensor and one block pool each: vLLM's Mamba
  // groups): the image is their slots' bytes in this order, so their
  // slot_bytes add up to image_bytes, and a spec names one slot per memory
  // (TransferSpec::state_slots). Empty: `state` alone.
  std::vector<StateMemory> state_parts;

  // Checks the memory against the layout; empty when they fit.
  std::optional<std::string> check() const;

  bool lookup_only() const noexcept {
    return planes.empty() && state.base == nullptr && state.slots == 0 && state_parts.empty();
  }
  // The memories an image is kept in: 1, or state_parts' count.
  std::size_t state_part_count() const noexcept { return state_parts.empty() ? 1 : state_parts.size(); }

  std::uint64_t object_bytes() const { return layout.object_bytes(layout.has_state()); }
  std::uint64_t image_offset() const { return layout.bytes_per_block() * layout.blocks_per_chunk(); }

  // Why the spec does not fit (block out of range, keys and range disagree,
  // ...); empty when it fits. Checked before any copy is queued.
  std::optional<std::string> check_save(const kv::TransferSpec& s) const;
  std::optional<std::string> check_load(const kv::TransferSpec& s) const;
};

}  // namespace kvstrand
#pragma GCC visibility pop
