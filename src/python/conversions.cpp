// Conversions every binding file uses: digests as bytes, durations as
// seconds or timedelta, a prompt's tokens read in place where they can be.
#include "bindings.hpp"

#include <pybind11/stl.h>

#include <cstring>

namespace kvstrand::python {

py::bytes to_bytes(const kv::Digest& d) { return py::bytes(reinterpret_cast<const char*>(d.data()), d.size()); }

kv::Digest to_digest(const py::handle& b, const char* what) {
  if (!py::isinstance<py::bytes>(b)) throw py::type_error(std::string(what) + " must be bytes (32 of them)");
  const std::string s = py::cast<std::string>(b);
  if (s.size() != 32)
    throw py::value_error(std::string(what) + " must be 32 bytes (a SHA-256 digest), not " + std::to_string(s.size()));
  kv::Digest d;
  std::memcpy(d.data(), s.data(), d.size());
  return d;
}

std::chrono::microseconds duration_of(const py::handle& v, const char* what) {
  double seconds = 0;
  if (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)) {
    seconds = py::cast<double>(v);
  } else if (py::hasattr(v, "total_seconds")) {
    seconds = py::cast<double>(v.attr("total_seconds")());
  } else {
    throw py::type_error(std::string(what) + " must be seconds (int or float) or a datetime.timedelta");
  }
  if (!(seconds > -1e9 && seconds < 1e9)) throw py::value_error(std::string(what) + " is out of range");
  return std::chrono::microseconds(static_cast<std::int64_t>(seconds * 1e6));
}

py::object seconds_of(std::chrono::microseconds d) { return py::float_(static_cast<double>(d.count()) / 1e6); }

Tokens::Tokens(const py::handle& obj) {
  if (PyObject_CheckBuffer(obj.ptr())) {
    py::buffer buf = py::reinterpret_borrow<py::buffer>(obj);
    py::buffer_info info = buf.request();
    const bool u32 = info.itemsize == 4 && (info.format == "I" || info.format == "=I" || info.format == "<I" ||
                                            (info.format == "L" && sizeof(unsigned long) == 4));
    if (u32 && info.ndim == 1 && (info.shape[0] <= 1 || info.strides[0] == 4)) {
      span_ = {static_cast<const std::uint32_t*>(info.ptr), static_cast<std::size_t>(info.shape[0])};
      view_.emplace(std::move(info));
      return;
    }
  }
  try {
    copy_ = py::cast<std::vector<std::uint32_t>>(obj);
  } catch (const py::cast_error&) {
    throw py::type_error("tokens must be a sequence of ints in [0, 2^32) (a list, or a numpy uint32 array)");
  }
  span_ = copy_;
}

}  // namespace kvstrand::python
