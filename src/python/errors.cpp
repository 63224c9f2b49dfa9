// Exceptions: the C++ types an engine catches, as Python types of the same
// names, each carrying what the C++ one carries.
//
//   KvstrandError                 base of all three
//   +- TransferRefused            nothing was posted (.code: TransferErrc)
//   +- FailStop                   a deadline passed: stop the engine (.code)
//   +- ConfigError (ValueError)   an option kvstrand cannot serve (.option)
//
// Translated where the C++ exception is caught, with the GIL held (pybind11
// runs translators after the call that released it has returned).
#include "bindings.hpp"

#include <kvstrand/errors.hpp>

#include <stdexcept>

namespace kvstrand::python {

namespace {

PyObject* g_base = nullptr;
PyObject* g_refused = nullptr;
PyObject* g_fail_stop = nullptr;
PyObject* g_config = nullptr;

PyObject* new_type(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string full = std::string("kvstrand.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (t == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(t));
  return t;  // the module keeps a reference for the interpreter's life
}

py::object code_of(const std::error_code& ec) {
  if (ec.category() == transfer_category()) return py::cast(static_cast<TransferErrc>(ec.value()));
  return py::int_(ec.value());
}

void raise(PyObject* type, const std::string& what, const char* attr, py::object value) {
  py::object e = py::reinterpret_borrow<py::object>(type)(what);
  e.attr(attr) = std::move(value);
  PyErr_SetObject(type, e.ptr());
}

// A C++ carrier for ConfigError, so that one translator raises it.
struct ConfigRefused : std::invalid_argument {
  ConfigRefused(std::string o, const std::string& m) : std::invalid_argument(m), option(std::move(o)) {}
  std::string option;
};

}  // namespace

void raise_config_error(const std::string& option, const std::string& message) {
  throw ConfigRefused(option, message);
}

std::string option_named_in(const std::string& message) {
  const std::string prefix = "invalid option '";
  if (message.rfind(prefix, 0) != 0) return {};
  const auto end = message.find('\'', prefix.size());
  return end == std::string::npos ? std::string() : message.substr(prefix.size(), end - prefix.size());
}

void bind_errors(py::module_& m) {
  py::enum_<TransferErrc>(m, "TransferErrc", "Why a transfer was refused or failed (kvstrand::TransferErrc).")
      .value("duplicate_transfer", TransferErrc::duplicate_transfer)
      .value("not_registered", TransferErrc::not_registered)
      .value("bad_spec", TransferErrc::bad_spec)
      .value("closed", TransferErrc::closed)
      .value("deadline_exceeded", TransferErrc::deadline_exceeded)
      .value("fence_timeout", TransferErrc::fence_timeout)
      .value("tier_full", TransferErrc::tier_full)
      .value("missing_chunk", TransferErrc::missing_chunk)
      .value("device_error", TransferErrc::device_error)
      .value("tier_unavailable", TransferErrc::tier_unavailable)
      .value("too_many_live", TransferErrc::too_many_live)
      .value("blocks_in_use", TransferErrc::blocks_in_use);

  g_base = new_type(m, "KvstrandError", PyExc_Exception, "Base of every error kvstrand raises on purpose.");
  g_refused = new_type(m, "TransferRefused", g_base,
                       "A call kvstrand refused; nothing was posted. `.code` is a TransferErrc.");
  g_fail_stop = new_type(m, "FailStop", g_base,
                         "A transfer passed its deadline, so a copy may still touch device memory: stop the engine "
                         "and restart the process, reusing no block. Raised by every later call. `.code` is a "
                         "TransferErrc.");
  py::tuple config_bases = py::make_tuple(py::handle(g_base), py::handle(PyExc_ValueError));
  g_config = new_type(m, "ConfigError", config_bases.ptr(),
                      "An option or layout kvstrand cannot serve correctly. `.option` names it.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const FailStop& e) {
      raise(g_fail_stop, e.what(), "code", code_of(e.code()));
    } catch (const TransferRefused& e) {
      raise(g_refused, e.what(), "code", code_of(e.code()));
    } catch (const ConfigRefused& e) {
      raise(g_config, e.what(), "option", py::str(e.option));
    }
  });
}

}  // namespace kvstrand::python
