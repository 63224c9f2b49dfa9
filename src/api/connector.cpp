// The public Connector (include/kvstrand/connector.hpp): the reactor's
// Connector behind a boundary that names no Boost and no vendor type.
// Native handles become borrowed device::Stream / device::Event here.
#include <kvstrand/connector.hpp>
#include <kvstrand/sim.hpp>

#include <stdexcept>

#include "device/event.hpp"
#include "device/shared_events.hpp"
#include "device/stream.hpp"
#include "connector/connector.hpp"

namespace kvstrand {

namespace {

// The same fields: the internal options add only what engines never set.
connector::ConnectorOptions internal(const ConnectorOptions& o) {
  connector::ConnectorOptions r;
  static_cast<ConnectorOptions&>(r) = o;
  return r;
}

}  // namespace

struct Connector::Impl {
  explicit Impl(const ConnectorOptions& o) : conn(internal(o)) {}

  // The event a transfer waits for. after_stream: one of this pool's
  // events, recorded on the engine's stream now (the transfer lets go of it
  // when it has seen it complete). Engine thread only.
  std::shared_ptr<const device::Event> producer(const Producer& p) {
    switch (p.kind()) {
      case Producer::Kind::none: return nullptr;
      case Producer::Kind::event:
        if (p.handle() == 0) throw TransferRefused(TransferErrc::bad_spec, "Producer::after_event(0): no event");
        return std::make_shared<const device::Event>(device::Event::borrow(reinterpret_cast<void*>(p.handle())));
      case Producer::Kind::stream: break;
    }
    auto made = events.acquire();
    if (!made.ok()) throw TransferRefused(TransferErrc::device_error, "Producer::after_stream: " + made.status().describe());
    std::shared_ptr<device::Event> ev = std::move(made).value();
    device::Stream engine = device::Stream::borrow(reinterpret_cast<void*>(p.handle()));
    if (device::Status s = ev->record(engine); !s.ok())
      throw TransferRefused(TransferErrc::device_error, "Producer::after_stream: " + s.describe());
    return ev;
  }

  connector::Connector conn;
  device::SharedEvents events;
};

Connector::Connector(ConnectorOptions options) : impl_(std::make_unique<Impl>(options)) {}
Connector::~Connector() = default;

std::uint32_t Connector::register_layout(const Registration& registration) {
  return impl_->conn.register_layout(registration);
}

void Connector::save(kv::TransferSpec spec, Producer producer) {
  impl_->conn.save(std::move(spec), impl_->producer(producer));
}

void Connector::load(kv::TransferSpec spec, Producer producer) {
  impl_->conn.load(std::move(spec), impl_->producer(producer));
}

void Connector::submit(std::vector<Op> ops) {
  std::vector<connector::Connector::Op> in;
  in.reserve(ops.size());
  // Ops after the same stream share one event: "what is queued on it now"
  // is one point for the whole step.
  NativeStream shared_stream = 0;
  std::shared_ptr<const device::Event> shared;
  for (Op& op : ops) {
    std::shared_ptr<const device::Event> ev;
    if (op.producer.kind() == Producer::Kind::stream && shared && op.producer.handle() == shared_stream) {
      ev = shared;
    } else {
      ev = impl_->producer(op.producer);
      if (op.producer.kind() == Producer::Kind::stream) {
        shared_stream = op.producer.handle();
        shared = ev;
      }
    }
    in.push_back({op.kind, std::move(op.spec), std::move(ev)});
  }
  impl_->conn.submit(std::move(in));
}

std::uint64_t Connector::lookup(std::vector<kv::ChunkKey> keys, std::uint32_t registration) {
  return impl_->conn.lookup(std::move(keys), registration);
}

void Connector::release_lookup(std::uint64_t lease) { impl_->conn.release_lookup(lease); }

std::uint64_t Connector::invalidate(std::uint32_t registration) { return impl_->conn.invalidate(registration); }

std::vector<std::byte> Connector::export_lease(std::uint64_t lease) { return impl_->conn.export_lease(lease); }

std::uint64_t Connector::adopt_lease(std::span<const std::byte> handoff) { return impl_->conn.adopt_lease(handoff); }

LoadOrder Connector::order_after_load(const std::string& request, NativeStream stream, std::uint32_t registration) {
  device::Stream engine = device::Stream::borrow(reinterpret_cast<void*>(stream));
  return impl_->conn.order_after_load(request, engine, registration);
}

Finished Connector::finished() { return impl_->conn.finished(); }
bool Connector::finished_pending() const noexcept { return impl_->conn.finished_pending(); }

void Connector::fence(const std::vector<std::string>& requests, std::chrono::milliseconds timeout) {
  impl_->conn.fence(requests, timeout);
}

void Connector::fence_async(std::vector<std::string> requests, std::chrono::milliseconds timeout,
                            std::function<void(std::exception_ptr)> done) {
  if (!done) throw std::invalid_argument("fence_async: no completion function");
  impl_->conn.async_fence(std::move(requests), timeout, [done = std::move(done)](std::exception_ptr e) {
    // Moved, not copied: the engine's thread is to hold the last reference
    // (an exception_ptr released last on this thread is a race TSan reports).
    done(std::move(e));
  });
}

void Connector::close() { impl_->conn.close(); }

std::size_t Connector::never_ended() const noexcept { return impl_->conn.never_ended(); }

std::uint16_t Connector::debug_port() const noexcept { return impl_->conn.http_port(); }

NativeStream sim::load_stream(Connector& connector) {
  if (!sim::available()) throw std::runtime_error("kvstrand::sim::load_stream: not the sim backend (" +
                                                  std::string(backend()) + ")");
  void* s = connector.impl_->conn.load_stream_native();
  if (s == nullptr)
    throw std::runtime_error("kvstrand::sim::load_stream: the connector's tier has no load stream (closed, or no "
                             "layout registered yet)");
  return reinterpret_cast<NativeStream>(s);
}

}  // namespace kvstrand
