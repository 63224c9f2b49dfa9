// The public device helpers (include/kvstrand/device_memory.hpp) over the
// device runtime.
#include <kvstrand/device_memory.hpp>
#include <kvstrand/version.hpp>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "device/backend.hpp"
#include "device/copy.hpp"
#include "device/device_buffer.hpp"
#include "device/event.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"

namespace kvstrand {

namespace {
template <class T>
T must(device::Result<T> r) {
  if (!r.ok()) throw std::runtime_error("kvstrand: " + r.status().describe());
  return std::move(r).value();
}
void must(const device::Status& s) {
  if (!s.ok()) throw std::runtime_error("kvstrand: " + s.describe());
}
}  // namespace

const char* backend() noexcept { return device::backend::name(); }

struct DeviceStream::Impl {
  device::Stream stream;
};

DeviceStream::DeviceStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceStream DeviceStream::create() { return DeviceStream(std::make_unique<Impl>(Impl{must(device::Stream::create())})); }
DeviceStream::~DeviceStream() = default;
DeviceStream::DeviceStream(DeviceStream&&) noexcept = default;
DeviceStream& DeviceStream::operator=(DeviceStream&&) noexcept = default;
NativeStream DeviceStream::native() const noexcept { return reinterpret_cast<NativeStream>(impl_->stream.native()); }
void DeviceStream::synchronize() { must(impl_->stream.synchronize()); }

struct DeviceEvent::Impl {
  device::Event event;
};

DeviceEvent::DeviceEvent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceEvent DeviceEvent::create() { return DeviceEvent(std::make_unique<Impl>(Impl{must(device::Event::create())})); }
DeviceEvent::~DeviceEvent() = default;
DeviceEvent::DeviceEvent(DeviceEvent&&) noexcept = default;
DeviceEvent& DeviceEvent::operator=(DeviceEvent&&) noexcept = default;
NativeEvent DeviceEvent::native() const noexcept { return reinterpret_cast<NativeEvent>(impl_->event.native()); }
void DeviceEvent::record(DeviceStream& stream) { must(impl_->event.record(stream.impl_->stream)); }
void DeviceEvent::synchronize() { must(impl_->event.synchronize()); }

struct DeviceMemory::Impl {
  device::DeviceBuffer buffer;

  void check(std::size_t offset, std::size_t n) const {
    if (offset > buffer.size() || n > buffer.size() - offset)
      throw std::out_of_range("kvstrand: DeviceMemory: [" + std::to_string(offset) + ", +" + std::to_string(n) +
                              ") is past its " + std::to_string(buffer.size()) + " bytes");
  }
};

DeviceMemory::DeviceMemory(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceMemory DeviceMemory::allocate(std::size_t bytes) {
  return DeviceMemory(std::make_unique<Impl>(Impl{must(device::DeviceBuffer::allocate(bytes))}));
}
DeviceMemory::~DeviceMemory() = default;
DeviceMemory::DeviceMemory(DeviceMemory&&) noexcept = default;
DeviceMemory& DeviceMemory::operator=(DeviceMemory&&) noexcept = default;
std::uintptr_t DeviceMemory::address() const noexcept { return reinterpret_cast<std::uintptr_t>(impl_->buffer.data()); }
void* DeviceMemory::data() const noexcept { return impl_->buffer.data(); }
std::size_t DeviceMemory::size() const noexcept { return impl_->buffer.size(); }

void DeviceMemory::write(std::size_t offset, std::span<const std::byte> from) {
  impl_->check(offset, from.size());
  if (from.empty()) return;
  auto stream = must(device::Stream::create());
  auto staging = must(device::PinnedBuffer::allocate(from.size()));
  std::memcpy(staging.data(), from.data(), from.size());
  must(device::copy_h2d(stream, impl_->buffer.data() + offset, staging.data(), from.size()));
  must(stream.synchronize());
}

void DeviceMemory::read(std::size_t offset, std::span<std::byte> to) const {
  impl_->check(offset, to.size());
  if (to.empty()) return;
  auto stream = must(device::Stream::create());
  auto staging = must(device::PinnedBuffer::allocate(to.size()));
  must(device::copy_d2h(stream, staging.data(), impl_->buffer.data() + offset, to.size()));
  must(stream.synchronize());
  std::memcpy(to.data(), staging.data(), to.size());
}

void DeviceMemory::write_async(std::size_t offset, std::span<const std::byte> from, DeviceStream& stream) {
  impl_->check(offset, from.size());
  if (from.empty()) return;
  must(device::copy_h2d(stream.impl_->stream, impl_->buffer.data() + offset, from.data(), from.size()));
}

void DeviceMemory::read_async(std::size_t offset, std::span<std::byte> to, DeviceStream& stream) const {
  impl_->check(offset, to.size());
  if (to.empty()) return;
  must(device::copy_d2h(stream.impl_->stream, to.data(), impl_->buffer.data() + offset, to.size()));
}

void DeviceMemory::copy_async(std::size_t offset, const DeviceMemory& from, std::size_t from_offset, std::size_t n,
                              DeviceStream& stream) {
  impl_->check(offset, n);
  from.impl_->check(from_offset, n);
  if (n == 0) return;
  must(device::copy_d2d(stream.impl_->stream, impl_->buffer.data() + offset, from.impl_->buffer.data() + from_offset, n));
}

struct HostMemory::Impl {
  device::PinnedBuffer buffer;
};

HostMemory::HostMemory(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostMemory HostMemory::allocate(std::size_t bytes) {
  return HostMemory(std::make_unique<Impl>(Impl{must(device::PinnedBuffer::allocate(bytes))}));
}
HostMemory::~HostMemory() = default;
HostMemory::HostMemory(HostMemory&&) noexcept = default;
HostMemory& HostMemory::operator=(HostMemory&&) noexcept = default;
std::byte* HostMemory::data() const noexcept { return impl_->buffer.data(); }
std::size_t HostMemory::size() const noexcept { return impl_->buffer.size(); }

}  // namespace kvstrand
