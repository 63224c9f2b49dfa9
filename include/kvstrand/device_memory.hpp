// Device memory and streams for engines (and tests) that have no allocator
// of their own. An engine that has one (PyTorch, its own pools) registers
// its own memory by address instead: kvstrand never needs these.
//
// Errors are std::runtime_error naming the runtime call that failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

// An engine's stream or event, as the integer its handle is
// (hipStream_t / cudaStream_t, hipEvent_t / cudaEvent_t: what
// torch.cuda.Stream.cuda_stream or a CUDA graph's stream gives).
using NativeStream = std::uintptr_t;
using NativeEvent = std::uintptr_t;

class DeviceStream {
 public:
  // A new stream on the current device.
  static DeviceStream create();
  ~DeviceStream();
  DeviceStream(DeviceStream&&) noexcept;
  DeviceStream& operator=(DeviceStream&&) noexcept;

  NativeStream native() const noexcept;
  // Blocks until everything queued on the stream has run.
  void synchronize();

 private:
  struct Impl;
  friend class DeviceMemory;
  friend class DeviceEvent;
  explicit DeviceStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An event of kvstrand's own, for engines without their own: recorded on a
// stream after a step's writes, it is what Producer::after_event takes.
class DeviceEvent {
 public:
  static DeviceEvent create();
  ~DeviceEvent();
  DeviceEvent(DeviceEvent&&) noexcept;
  DeviceEvent& operator=(DeviceEvent&&) noexcept;

  NativeEvent native() const noexcept;
  // Marks the point after everything queued on `stream` so far.
  void record(DeviceStream& stream);
  // Blocks until the point last recorded has run (a host buffer's reuse,
  // set-up; never what the step thread waits for per step).
  void synchronize();

 private:
  struct Impl;
  explicit DeviceEvent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class DeviceMemory {
 public:
  // `bytes` of device memory on the current device.
  static DeviceMemory allocate(std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&&) noexcept;
  DeviceMemory& operator=(DeviceMemory&&) noexcept;

  std::uintptr_t address() const noexcept;
  void* data() const noexcept;
  std::size_t size() const noexcept;

  // Blocking copies between host memory and [offset, offset + n) of this
  // memory (set-up and checks, not the step loop). Throw std::out_of_range
  // past the end.
  void write(std::size_t offset, std::span<const std::byte> from);
  void read(std::size_t offset, std::span<std::byte> to) const;
  // Queued on `stream`; `from` must stay valid until the stream has run it.
  void write_async(std::size_t offset, std::span<const std::byte> from, DeviceStream& stream);
  // Queued on `stream`; `to` holds the bytes once the stream has run it.
  void read_async(std::size_t offset, std::span<std::byte> to, DeviceStream& stream) const;
  // Queued on `stream`: [offset, offset + n) of this memory becomes
  // [from_offset, from_offset + n) of `from` (which may be this memory; the
  // ranges must not overlap).
  void copy_async(std::size_t offset, const DeviceMemory& from, std::size_t from_offset, std::size_t n,
                  DeviceStream& stream);

 private:
  struct Impl;
  explicit DeviceMemory(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Page-locked host memory: what write_async and read_async copy from and to
// without the runtime staging it (a pageable buffer is copied through a
// staging buffer of the runtime's, and the call may wait for that).
class HostMemory {
 public:
  static HostMemory allocate(std::size_t bytes);
  ~HostMemory();
  HostMemory(HostMemory&&) noexcept;
  HostMemory& operator=(HostMemory&&) noexcept;

  std::byte* data() const noexcept;
  std::size_t size() const noexcept;

 private:
  struct Impl;
  explicit HostMemory(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstrand
#pragma GCC visibility pop
