// The seam between the platform-neutral API and one backend.
//
// Internal to src/device: exactly one backend_*.cpp is compiled into a build and
// implements these functions over opaque handles. The public RAII types
// (Stream, Event, buffers, ImportedBuffer) own those handles and are the only
// callers. Every function returns a Status naming the runtime call that failed.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "device/copy.hpp"
#include "device/ipc_handle.hpp"
#include "device/status.hpp"

namespace kvstrand::device::backend {

const char* name() noexcept;
bool is_gpu() noexcept;

Status device_count(int* out);
Status device_name(int ordinal, std::string* out);
Status set_device(int ordinal);

Status device_malloc(void** out, std::size_t bytes);
Status device_free(void* p);
Status host_malloc(void** out, std::size_t bytes);  // page-locked
Status host_free(void* p);
// Pins memory mapped by other means (portable, mapped); undone by host_unregister.
Status host_register(void* p, std::size_t bytes);
Status host_unregister(void* p);

Status stream_create(void** out);
Status stream_destroy(void* s);  // work already queued still runs to the end
Status stream_synchronize(void* s);
Status stream_query(void* s);  // ok, not_ready, or the stream's failure
Status stream_host_func(void* s, void (*fn)(void*), void* arg);
// Work queued on s after this waits for e's latest record (none: no wait).
Status stream_wait_event(void* s, void* e);

Status event_create(void** out);  // ordinary, timing disabled
Status event_destroy(void* e);
Status event_record(void* e, void* s);
Status event_query(void* e);  // ok, not_ready, or the failure it observed
Status event_synchronize(void* e);

Status memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, void* s);
// How a batch may be moved: one copy a segment, the backend's fastest way
// by its built-in rule (its gather/scatter kernel, or a batched DMA call,
// by direction), one batched DMA call (the copy engines gather), or one
// gather/scatter kernel launch. A backend without the one asked for copies
// a segment at a time; `kernel` where the host side is not memory the
// device maps takes the batched DMA call.
enum class BatchVia { per_segment, fastest, dma_batch, kernel };
// Whether `via` is this backend's own (not its per-segment fallback).
bool batch_via_available(BatchVia via) noexcept;
// Whether a load's two paths can differ in speed here, so that timing them
// (device/load_path.hpp) can choose: cuda with both; the sim once a test gave
// a path a cost (sim_hooks.hpp).
bool load_paths_differ() noexcept;
// Segments are already validated as non-overlapping runs by the caller.
Status memcpy_batch_async(std::span<const Segment> segs, CopyKind kind, void* s, BatchVia via);
const char* fastest_batch_path() noexcept;

Status ipc_export(void* device_base, IpcHandle* out);
// The allocation containing `ptr`: its handle, and ptr's offset within it.
Status ipc_export_range(const void* ptr, IpcHandle* out, std::uint64_t* offset);
Status ipc_open(const IpcHandle& h, void** out);
Status ipc_close(void* p);

}  // namespace kvstrand::device::backend
