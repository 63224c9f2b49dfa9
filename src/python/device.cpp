// Device memory and streams for Python engines and tests without an
// allocator of their own (an engine with PyTorch passes tensor.data_ptr()
// and torch.cuda.Stream.cuda_stream instead), and the `sim` submodule: the
// sim backend's host-visible device memory and its fault hooks.
#include "bindings.hpp"

#include <kvstrand/device_memory.hpp>
#include <kvstrand/sim.hpp>
#include <kvstrand/version.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

namespace kvstrand::python {

using namespace pybind11::literals;

namespace {

bool sim_backend() { return std::string(backend()) == "sim"; }

std::span<const std::byte> bytes_of(const py::buffer_info& info) {
  return {static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

// A contiguous read of any buffer (bytes, bytearray, numpy, memoryview).
py::buffer_info contiguous(const py::buffer& b) {
  auto view = std::make_unique<Py_buffer>();  // buffer_info releases and deletes it
  if (PyObject_GetBuffer(b.ptr(), view.get(), PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) throw py::error_already_set();
  return py::buffer_info(view.release(), true);
}

class PyStream {
 public:
  PyStream() : s_(DeviceStream::create()) {}
  ~PyStream() {
    if (pending_.empty()) return;
    // write_async's bytes must outlive the copies queued on this stream.
    py::gil_scoped_release unlocked;
    try {
      if (sim::available()) sim::release_stream(s_.native());  // a held sim stream would never drain
      s_.synchronize();
    } catch (...) {
      // A failed stream ran nothing more; the bytes can go.
    }
  }
  std::uintptr_t native() const { return s_.native(); }
  void synchronize() {
    {
      py::gil_scoped_release unlocked;
      s_.synchronize();
    }
    pending_.clear();
  }
  void keep(std::shared_ptr<std::vector<std::byte>> b) { pending_.push_back(std::move(b)); }
  DeviceStream& stream() { return s_; }

 private:
  DeviceStream s_;
  std::vector<std::shared_ptr<std::vector<std::byte>>> pending_;
};

struct PyMemory {
  DeviceMemory mem;
};

NativeStream stream_of(std::uintptr_t native) {
  if (native == 0) throw py::value_error("stream 0 (the legacy default stream) cannot be held or delayed");
  return native;
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<PyStream>(m, "DeviceStream",
                       "A stream of kvstrand's own on the current device. `native` is its handle as an int (what "
                       "Producer.after_stream and Connector.order_after_load take).")
      .def(py::init<>())
      .def_property_readonly("native", &PyStream::native)
      .def("synchronize", &PyStream::synchronize, "Waits (GIL released) until everything queued on it has run.");

  py::class_<PyMemory>(m, "DeviceMemory",
                       "Device memory of kvstrand's own, for engines without an allocator. `address` is what a "
                       "registration names.")
      .def(py::init([](std::size_t bytes) { return PyMemory{DeviceMemory::allocate(bytes)}; }), "bytes"_a)
      .def_property_readonly("address", [](const PyMemory& m) { return m.mem.address(); })
      .def_property_readonly("size", [](const PyMemory& m) { return m.mem.size(); })
      .def("__len__", [](const PyMemory& m) { return m.mem.size(); })
      .def(
          "write",
          [](PyMemory& m, std::size_t offset, const py::buffer& data) {
            py::buffer_info info = contiguous(data);
            py::gil_scoped_release unlocked;
            m.mem.write(offset, bytes_of(info));
          },
          "offset"_a, "data"_a, "Copies `data` (any contiguous buffer) to [offset, offset + len) and waits.")
      .def(
          "read",
          [](const PyMemory& m, std::size_t offset, std::size_t n) {
            std::string out(n, '\0');
            {
              py::gil_scoped_release unlocked;
              m.mem.read(offset, std::as_writable_bytes(std::span<char>(out.data(), out.size())));
            }
            return py::bytes(out);
          },
          "offset"_a, "n"_a, "The bytes of [offset, offset + n), waited for.")
      .def(
          "write_async",
          [](PyMemory& m, std::size_t offset, const py::buffer& data, PyStream& s) {
            py::buffer_info info = contiguous(data);
            auto copy = std::make_shared<std::vector<std::byte>>(bytes_of(info).begin(), bytes_of(info).end());
            m.mem.write_async(offset, *copy, s.stream());
            s.keep(std::move(copy));  // until the stream is synchronized
          },
          "offset"_a, "data"_a, "stream"_a,
          "Queues a copy of `data` (taken now) to [offset, ...) on `stream`: a forward pass's writes, in a test.");

  py::module_ sim = m.def_submodule(
      "sim", "The sim backend's test helpers: device memory the host can see, and fault hooks on streams. On a GPU "
             "backend available() is False and every other call raises RuntimeError.");
  sim.def("available", &sim_backend);

  struct SimBuffer {
    DeviceMemory mem;
  };
  py::class_<SimBuffer>(sim, "SimBuffer", py::buffer_protocol(),
                        "Sim device memory as a writable buffer (memoryview, numpy.frombuffer). `address` is what a "
                        "registration names.")
      .def_property_readonly("address", [](const SimBuffer& b) { return b.mem.address(); })
      .def("__len__", [](const SimBuffer& b) { return b.mem.size(); })
      .def_buffer([](SimBuffer& b) {
        return py::buffer_info(b.mem.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.mem.size())}, {1});
      });
  sim.def(
      "allocate",
      [](std::size_t bytes) {
        if (!sim_backend())
          throw std::runtime_error(std::string("kvstrand.sim.allocate: this library's backend is '") + backend() +
                                   "': its device memory is not host memory (use DeviceMemory and its read/write)");
        return std::make_unique<SimBuffer>(SimBuffer{DeviceMemory::allocate(bytes)});
      },
      "bytes"_a, "`bytes` of sim device memory, zeroed, as a writable buffer.");
  sim.def(
      "hold_stream", [](std::uintptr_t s) { sim::hold_stream(stream_of(s)); },
      "stream"_a, "The stream stops before its next operation until release_stream().");
  sim.def(
      "release_stream", [](std::uintptr_t s) { sim::release_stream(stream_of(s)); },
      "stream"_a);
  sim.def(
      "set_stream_delay",
      [](std::uintptr_t s, const py::object& delay) {
        const auto d = duration_of(delay, "delay");
        sim::set_stream_delay(stream_of(s), d);
      },
      "stream"_a, "delay"_a, "Every operation on the stream waits `delay` (seconds or timedelta) first; 0: off.");
}

}  // namespace kvstrand::python
