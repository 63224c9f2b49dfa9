// The Connector (the blocking facade of include/kvstrand/connector.hpp) and
// what it takes and returns: options, registrations, transfer specs,
// producers, outcomes.
//
// Threads: every method releases the GIL while it is in the library, so a
// fence or a registration never stops other Python threads. A Connector is
// one engine thread's; calls from several Python threads are serialized by
// a lock here (the C++ Connector must not be called concurrently).
#include "bindings.hpp"

#include <pybind11/stl.h>

#include <kvstrand/connector.hpp>

#include <mutex>
#include <optional>

namespace kvstrand::python {

using namespace pybind11::literals;

namespace {

void* pointer(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::chrono::milliseconds millis(const py::handle& v, const char* what) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration_of(v, what));
}

py::object error_of(const std::error_code& ec) {
  if (!ec) return py::none();
  if (ec.category() == transfer_category()) return py::cast(static_cast<TransferErrc>(ec.value()));
  return py::int_(ec.value());
}

class PyConnector {
 public:
  explicit PyConnector(const ConnectorOptions& o) {
    py::gil_scoped_release unlocked;
    try {
      c_.emplace(o);
    } catch (const std::invalid_argument& e) {
      raise_config_error(option_named_in(e.what()), e.what());
    }
  }

  // Closing waits for in-flight transfers: other Python threads run meanwhile.
  ~PyConnector() {
    py::gil_scoped_release unlocked;
    std::lock_guard lk(m_);
    c_.reset();
  }

  // No lock and the GIL kept: one atomic load (the Connector lives as long
  // as this object).
  bool finished_pending() const noexcept { return c_->finished_pending(); }

  // Runs `f` on the C++ Connector with the GIL released and the lock held.
  template <class F>
  auto call(F&& f) {
    py::gil_scoped_release unlocked;
    std::lock_guard lk(m_);
    return f(*c_);
  }

 private:
  std::mutex m_;
  std::optional<Connector> c_;
};

std::string repr_outcome(const TransferOutcome& o) {
  return std::string("TransferOutcome(") + to_string(o.kind) + " '" + o.request + "' group " +
         std::to_string(o.registration) + " [" + std::to_string(o.tokens.begin) + ", " + std::to_string(o.tokens.end) +
         ") " + (o.ok ? "ok" : "failed: " + o.reason) + ")";
}

// What finished() returns with nothing to drain: one Finished (read-only
// from Python), made once the type is bound and never freed (it may be
// returned until the interpreter's last moment).
PyObject* g_empty_finished = nullptr;

// Connector.finished(): nothing to drain is the step loop's common case, a
// call every step. Then the shared empty result, no lock, the GIL kept, and
// none of pybind11's dispatch (which builds an argument vector and a call
// record a call: most of what the call cost). Otherwise the drain is
// Connector._drain's.
PyObject* finished_now(PyObject* self, PyObject*) {
  py::detail::make_caster<PyConnector> conn;
  if (!conn.load(self, false)) {
    PyErr_SetString(PyExc_TypeError, "Connector.finished: not called on a Connector");
    return nullptr;
  }
  if (!py::detail::cast_op<PyConnector&>(conn).finished_pending()) {
    Py_INCREF(g_empty_finished);
    return g_empty_finished;
  }
  return PyObject_CallMethod(self, "_drain", nullptr);
}

}  // namespace

void bind_connector(py::module_& m) {
  py::class_<ConnectorOptions>(m, "ConnectorOptions",
                               "Options of a Connector; durations are seconds (float) or datetime.timedelta.")
      .def(py::init([](const py::object& deadline, std::uint64_t tier_bytes, std::string socket,
                       const py::object& request_timeout, int device, std::size_t live_transfers,
                       std::size_t live_lookups, int debug_port, std::string debug_address,
                       const py::object& idle_spin, std::string load_path) {
             ConnectorOptions o;
             o.transfer_deadline = millis(deadline, "transfer_deadline");
             o.tier_bytes = tier_bytes;
             o.server_socket = std::move(socket);
             o.server_request_timeout = millis(request_timeout, "server_request_timeout");
             o.device = device;
             o.max_live_transfers = live_transfers;
             o.max_live_lookups = live_lookups;
             o.debug_port = debug_port;
             o.debug_address = std::move(debug_address);
             o.reactor_idle_spin = duration_of(idle_spin, "reactor_idle_spin");
             o.load_path = std::move(load_path);
             return o;
           }),
           py::kw_only(), "transfer_deadline"_a = 60.0, "tier_bytes"_a = 1ull << 30,
           "server_socket"_a = "", "server_request_timeout"_a = 10.0, "device"_a = 0,
           "max_live_transfers"_a = 4096, "max_live_lookups"_a = 4096, "debug_port"_a = -1,
           "debug_address"_a = "127.0.0.1", "reactor_idle_spin"_a = 0.002, "load_path"_a = "rule")
      .def_property(
          "transfer_deadline", [](const ConnectorOptions& o) { return seconds_of(o.transfer_deadline); },
          [](ConnectorOptions& o, const py::object& v) { o.transfer_deadline = millis(v, "transfer_deadline"); },
          "Every transfer's own deadline, in seconds; passing it is fail-stop.")
      .def_readwrite("tier_bytes", &ConnectorOptions::tier_bytes, "The embedded tier's arena (no server_socket).")
      .def_readwrite("server_socket", &ConnectorOptions::server_socket,
                     "kvstrand-server's socket: the node tier. Empty: an embedded tier in this process.")
      .def_property(
          "server_request_timeout", [](const ConnectorOptions& o) { return seconds_of(o.server_request_timeout); },
          [](ConnectorOptions& o, const py::object& v) { o.server_request_timeout = millis(v, "server_request_timeout"); },
          "Node tier: bound, in seconds, on connect + hello + register and on each lookup.")
      .def_readwrite("device", &ConnectorOptions::device)
      .def_readwrite("server_uid", &ConnectorOptions::server_uid,
                     "A kvstrand-server run by this uid is trusted too (-1: only this process's user and root).")
      .def_readwrite("max_live_transfers", &ConnectorOptions::max_live_transfers)
      .def_readwrite("max_live_lookups", &ConnectorOptions::max_live_lookups)
      .def_readwrite("debug_port", &ConnectorOptions::debug_port,
                     "The read-only debug endpoint: -1 off, 0 any free port (Connector.debug_port says which).")
      .def_readwrite("debug_address", &ConnectorOptions::debug_address)
      .def_property(
          "reactor_idle_spin", [](const ConnectorOptions& o) { return seconds_of(o.reactor_idle_spin); },
          [](ConnectorOptions& o, const py::object& v) { o.reactor_idle_spin = duration_of(v, "reactor_idle_spin"); },
          "Seconds the reactor thread keeps polling for the next call once idle (a busy core); after it the next "
          "call wakes it (a syscall on the caller's thread). 0: sleep at once.")
      .def_readwrite("load_path", &ConnectorOptions::load_path,
                     "How loads gather onto the device: 'rule' (the default: the kernel, the copy engines when "
                     "every segment is 1 MiB or more), 'measure' (both paths timed on each registration's "
                     "segment sizes; each load takes the faster), 'kernel' or 'dma-batch' (forced). "
                     "Process-wide: the last Connector constructed sets it.");

  py::class_<PlaneMemory>(m, "PlaneMemory", "One plane's device memory: the address of block 0 (an int, as "
                                            "tensor.data_ptr() gives it) and the blocks in the pool.")
      .def(py::init([](std::uintptr_t base, std::uint32_t n) { return PlaneMemory{pointer(base), n}; }), "base"_a,
           "num_blocks"_a)
      .def_property(
          "base", [](const PlaneMemory& p) { return address(p.base); },
          [](PlaneMemory& p, std::uintptr_t a) { p.base = pointer(a); })
      .def_readwrite("num_blocks", &PlaneMemory::num_blocks)
      .def("__repr__", [](const PlaneMemory& p) {
        return "PlaneMemory(base=" + std::to_string(address(p.base)) + ", num_blocks=" + std::to_string(p.num_blocks) +
               ")";
      });
  py::class_<StateMemory>(m, "StateMemory",
                          "Checkpoint image slots: slot 0's address, the number of slots, and the bytes of one slot "
                          "(0: the whole image; a part of it where a Registration's state_parts keep it in several).")
      .def(py::init([](std::uintptr_t base, std::uint32_t slots, std::uint64_t slot_bytes) {
             return StateMemory{pointer(base), slots, slot_bytes};
           }),
           "base"_a = 0, "slots"_a = 0, "slot_bytes"_a = 0)
      .def_property(
          "base", [](const StateMemory& s) { return address(s.base); },
          [](StateMemory& s, std::uintptr_t a) { s.base = pointer(a); })
      .def_readwrite("slots", &StateMemory::slots)
      .def_readwrite("slot_bytes", &StateMemory::slot_bytes)
      .def("__repr__", [](const StateMemory& s) {
        return "StateMemory(base=" + std::to_string(address(s.base)) + ", slots=" + std::to_string(s.slots) +
               ", slot_bytes=" + std::to_string(s.slot_bytes) + ")";
      });
  py::class_<Registration>(m, "Registration",
                           "A KV-cache group: its layout and device memory. No memory at all (no planes, no state): "
                           "it serves lookups only, as a scheduler process's does. An image kept in several memories "
                           "(a hybrid model's state layers): state_parts, one StateMemory each, in the image's order.")
      .def(py::init([](kv::Layout l, std::vector<PlaneMemory> planes, StateMemory state,
                       std::vector<StateMemory> state_parts) {
             return Registration{std::move(l), std::move(planes), state, std::move(state_parts)};
           }),
           "layout"_a, "planes"_a = std::vector<PlaneMemory>{}, "state"_a = StateMemory{},
           "state_parts"_a = std::vector<StateMemory>{})
      .def_readwrite("layout", &Registration::layout)
      .def_readwrite("planes", &Registration::planes)
      .def_readwrite("state", &Registration::state)
      .def_readwrite("state_parts", &Registration::state_parts)
      .def_property_readonly("lookup_only", &Registration::lookup_only)
      .def_property_readonly("object_bytes", &Registration::object_bytes)
      .def("check", &Registration::check, "Why the memory does not fit the layout; None when it does.");

  py::class_<kv::TransferSpec>(m, "TransferSpec", "One save or load, as the scheduler decides it.")
      .def(py::init([](std::string request, std::uint32_t registration, kv::TokenRange tokens,
                       std::vector<kv::ChunkKey> keys, std::vector<kv::BlockId> blocks, bool with_state,
                       std::vector<std::int32_t> slots, std::uint64_t tier_lease,
                       std::vector<py::bytes> chunk_events) {
             kv::TransferSpec s;
             s.request = std::move(request);
             s.registration = registration;
             s.tokens = tokens;
             s.keys = std::move(keys);
             s.blocks = std::move(blocks);
             s.with_state = with_state;
             s.state_slots = std::move(slots);
             s.tier_lease = tier_lease;
             for (const py::bytes& e : chunk_events) s.chunk_events.emplace_back(e);
             return s;
           }),
           py::kw_only(), "request"_a, "registration"_a = 0, "tokens"_a, "keys"_a, "blocks"_a, "with_state"_a = false,
           "state_slots"_a = std::vector<std::int32_t>{}, "tier_lease"_a = 0,
           "chunk_events"_a = std::vector<py::bytes>{})
      .def_readwrite("request", &kv::TransferSpec::request)
      .def_readwrite("registration", &kv::TransferSpec::registration)
      .def_readwrite("tokens", &kv::TransferSpec::tokens)
      .def_readwrite("keys", &kv::TransferSpec::keys, "The chunks the range touches, in order.")
      .def_readwrite("blocks", &kv::TransferSpec::blocks, "One per block of the range: save source / load destination.")
      .def_readwrite("with_state", &kv::TransferSpec::with_state)
      .def_readwrite("state_slots", &kv::TransferSpec::state_slots,
                     "Save: one per key, -1 where that chunk's end has no image. Load: one, the destination slot.")
      .def_readwrite("tier_lease", &kv::TransferSpec::tier_lease,
                     "A load: the lease its lookup returned (LookupOutcome.lease); 0: none.")
      // bytes, not str: an event description is msgpack, not text.
      .def_property(
          "chunk_events",
          [](const kv::TransferSpec& s) {
            std::vector<py::bytes> out;
            for (const std::string& e : s.chunk_events) out.emplace_back(e);
            return out;
          },
          [](kv::TransferSpec& s, const std::vector<py::bytes>& events) {
            s.chunk_events.clear();
            for (const py::bytes& e : events) s.chunk_events.emplace_back(e);
          },
          "A save, optionally: one msgpack map per key describing its blocks for the node tier's KV events "
          "(docs/events.md); bytes each.");

  py::enum_<TransferKind>(m, "TransferKind").value("save", TransferKind::save).value("load", TransferKind::load);

  py::class_<Producer>(m, "Producer", "What a transfer waits for on the device before it touches its blocks.")
      .def(py::init<>())
      .def_static("after_stream", &Producer::after_stream, "stream"_a,
                  "Whatever is queued on the engine's stream (an int handle) now; it is never synchronized.")
      .def_static("after_event", &Producer::after_event, "event"_a,
                  "The engine's own event (an int handle), recorded already; kept alive until the transfer ends.")
      .def_property_readonly("handle", &Producer::handle)
      .def("__repr__", [](const Producer& p) {
        switch (p.kind()) {
          case Producer::Kind::stream: return "Producer.after_stream(" + std::to_string(p.handle()) + ")";
          case Producer::Kind::event: return "Producer.after_event(" + std::to_string(p.handle()) + ")";
          case Producer::Kind::none: break;
        }
        return std::string("Producer()");
      });

  py::class_<Op>(m, "Op", "One transfer of a step's submit().")
      .def(py::init([](TransferKind k, kv::TransferSpec s, Producer p) { return Op{k, std::move(s), p}; }), "kind"_a,
           "spec"_a, "producer"_a = Producer{})
      .def_readwrite("kind", &Op::kind)
      .def_readwrite("spec", &Op::spec)
      .def_readwrite("producer", &Op::producer);

  py::class_<TransferOutcome>(m, "TransferOutcome")
      .def_readonly("request", &TransferOutcome::request)
      .def_readonly("kind", &TransferOutcome::kind)
      .def_readonly("registration", &TransferOutcome::registration)
      .def_readonly("ok", &TransferOutcome::ok)
      .def_property_readonly("error", [](const TransferOutcome& o) { return error_of(o.error); },
                             "A TransferErrc (or a device error's number); None when ok.")
      .def_readonly("reason", &TransferOutcome::reason)
      .def_readonly("tokens", &TransferOutcome::tokens)
      .def_readonly("blocks", &TransferOutcome::blocks, "A failed load: exactly the blocks it would have written.")
      .def("__repr__", &repr_outcome);
  py::class_<SourceSafe>(m, "SourceSafe", "Blocks of a save the engine may reuse: the copy out of them is done.")
      .def_readonly("request", &SourceSafe::request)
      .def_readonly("registration", &SourceSafe::registration)
      .def_readonly("blocks", &SourceSafe::blocks);
  py::class_<LookupOutcome>(m, "LookupOutcome")
      .def_readonly("id", &LookupOutcome::id)
      .def_readonly("hit", &LookupOutcome::hit)
      .def_readonly("lease", &LookupOutcome::lease,
                    "Keeps the hit stored until a load names it (tier_lease) or release_lookup; 0: nothing held.")
      .def_readonly("registration", &LookupOutcome::registration);
  py::class_<Finished>(m, "Finished", "Everything that became terminal since the last finished().")
      .def_readonly("saves", &Finished::saves)
      .def_readonly("loads", &Finished::loads)
      .def_readonly("source_safe", &Finished::source_safe)
      .def_readonly("lookups", &Finished::lookups)
      .def("empty", &Finished::empty)
      .def("failed_loads", [](const Finished& f) {
        std::vector<TransferOutcome> out;
        for (const auto* o : f.failed_loads()) out.push_back(*o);
        return out;
      });
  g_empty_finished = py::cast(Finished{}).release().ptr();

  py::enum_<LoadOrder>(m, "LoadOrder", "What Connector.order_after_load did.")
      .value("ordered", LoadOrder::ordered)
      .value("not_queued_yet", LoadOrder::not_queued_yet)
      .value("no_live_load", LoadOrder::no_live_load);

  py::class_<PyConnector> connector(m, "Connector",
                          "Offloads and restores KV blocks without stalling the caller: save/load/submit/lookup only "
                          "post, finished() only reads; fence() and close() wait (GIL released). Raises "
                          "TransferRefused (nothing posted), FailStop (stop the engine), ConfigError (options).");
  connector
      .def(py::init([](const std::optional<ConnectorOptions>& options, const py::kwargs& kwargs) {
             py::object o = py::cast(options.value_or(ConnectorOptions{}));
             for (const auto& [k, v] : kwargs) {
               const std::string key = py::cast<std::string>(k);
               if (!py::hasattr(o, key.c_str())) throw py::type_error("Connector: unknown option '" + key + "'");
               py::setattr(o, key.c_str(), v);
             }
             return std::make_unique<PyConnector>(o.cast<ConnectorOptions>());
           }),
           "options"_a = py::none(),
           "Connector(options=None, **option): the options as a ConnectorOptions, or by name.")
      .def(
          "register_layout",
          [](PyConnector& c, const Registration& r) { return c.call([&](Connector& x) { return x.register_layout(r); }); },
          "registration"_a, "Adds a registration and returns its id (0, 1, ...); waits until the tier attached it.")
      .def(
          "save",
          [](PyConnector& c, kv::TransferSpec s, Producer p) {
            c.call([&](Connector& x) { x.save(std::move(s), p); });
          },
          "spec"_a, "producer"_a = Producer{})
      .def(
          "load",
          [](PyConnector& c, kv::TransferSpec s, Producer p) {
            c.call([&](Connector& x) { x.load(std::move(s), p); });
          },
          "spec"_a, "producer"_a = Producer{})
      .def(
          "submit", [](PyConnector& c, std::vector<Op> ops) { c.call([&](Connector& x) { x.submit(std::move(ops)); }); },
          "ops"_a, "A step's transfers: all checked first; if one is refused, none is posted.")
      .def(
          "lookup",
          [](PyConnector& c, std::vector<kv::ChunkKey> keys, std::uint32_t reg) {
            return c.call([&](Connector& x) { return x.lookup(std::move(keys), reg); });
          },
          "keys"_a, "registration"_a = 0,
          "Posts a lookup; its answer (LookupOutcome) arrives in finished().lookups under the returned id.")
      .def(
          "release_lookup",
          [](PyConnector& c, std::uint64_t lease) { c.call([&](Connector& x) { x.release_lookup(lease); }); },
          "lease"_a)
      .def(
          "invalidate",
          [](PyConnector& c, std::uint32_t reg) { return c.call([&](Connector& x) { return x.invalidate(reg); }); },
          "registration"_a = 0,
          "Drops every object of the registration's namespace from the tier (an online weight update); blocks "
          "until the tier answered and returns how many objects it dropped.")
      .def(
          "export_lease",
          [](PyConnector& c, std::uint64_t lease) {
            std::vector<std::byte> b = c.call([&](Connector& x) { return x.export_lease(lease); });
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "lease"_a, "Node tier: the lease as bytes for another process; this Connector forgets it.")
      .def(
          "adopt_lease",
          [](PyConnector& c, const py::bytes& handoff) {
            const std::string b = handoff;
            return c.call([&](Connector& x) { return x.adopt_lease(std::as_bytes(std::span(b.data(), b.size()))); });
          },
          "handoff"_a, "Takes over an exported lease; the hit arrives in finished().lookups under the returned id.")
      .def(
          "order_after_load",
          [](PyConnector& c, const std::string& request, std::uintptr_t stream, std::uint32_t reg) {
            return c.call([&](Connector& x) { return x.order_after_load(request, stream, reg); });
          },
          "request"_a, "stream"_a, "registration"_a = 0,
          "Makes the engine's stream wait, on the device, for the copies of the live load of `request`.")
      // finished() itself is a plain CPython method (finished_now, added last);
      // what it drains comes from here, through pybind11's exception
      // translation (FailStop).
      .def("_drain", [](PyConnector& c) { return c.call([](Connector& x) { return x.finished(); }); })
      .def(
          "fence",
          [](PyConnector& c, std::vector<std::string> requests, const py::object& timeout) {
            const auto t = millis(timeout, "timeout");
            // A negative timeout is a mistake (not "forever"): it would be fail-stop at once.
            if (t.count() < 0) throw py::value_error("fence: timeout must be >= 0 seconds");
            c.call([&](Connector& x) { x.fence(requests, t); });
          },
          "requests"_a, "timeout"_a,
          "Returns when every transfer of `requests` is terminal; raises FailStop when `timeout` passes first.")
      .def(
          "close", [](PyConnector& c) { c.call([](Connector& x) { x.close(); }); },
          "Lets in-flight transfers settle (bounded by their deadlines), then stops. Idempotent.")
      .def_property_readonly(
          "never_ended", [](PyConnector& c) { return c.call([](Connector& x) { return x.never_ended(); }); },
          "After close(): how many transfers' copies were never seen to end. While it is not 0, keep the memory "
          "you registered (the KV tensors) alive until the process exits: such a copy may still touch it.")
      .def_property_readonly("debug_port",
                             [](PyConnector& c) { return c.call([](Connector& x) { return x.debug_port(); }); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyConnector& c, const py::args&) { c.call([](Connector& x) { x.close(); }); });
  // A method descriptor of the type, as a C type's own methods are.
  static PyMethodDef finished_def{"finished", finished_now, METH_NOARGS,
                                  "finished(self) -> Finished\n\nEverything that became terminal since the last call. "
                                  "Never waits. Raises FailStop once a deadline passed."};
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(connector.ptr()), &finished_def);
  if (descr == nullptr) throw py::error_already_set();
  connector.attr("finished") = py::reinterpret_steal<py::object>(descr);
}

}  // namespace kvstrand::python
