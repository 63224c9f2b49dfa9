// The PageStore (include/kvstrand/page_store.hpp): the node tier for pages
// in the engine's own host memory (kvstrand.sglang's data path).
//
// Threads: every call releases the GIL while it is in the library, and
// calls from several Python threads run at once (the C++ PageStore takes
// them so), each returning when its copies are done.
#include "bindings.hpp"

#include <pybind11/stl.h>

#include <kvstrand/page_store.hpp>

#include <optional>

namespace kvstrand::python {

using namespace pybind11::literals;

namespace {

std::chrono::milliseconds millis_of(const py::handle& v, const char* what) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration_of(v, what));
}

// Pages cross as any sequence of ints (a list, a NumPy array, a CPU tensor's tolist()).
std::vector<std::uint32_t> pages_of(const py::handle& pages) {
  std::vector<std::uint32_t> out;
  for (const py::handle& p : py::iter(pages)) {
    const auto v = p.cast<long long>();
    if (v < 0 || v > UINT32_MAX) throw py::value_error("a page index must be 0 to 2^32-1, got " + std::to_string(v));
    out.push_back(static_cast<std::uint32_t>(v));
  }
  return out;
}

class PyPageStore {
 public:
  explicit PyPageStore(PageStoreOptions o) {
    py::gil_scoped_release unlocked;
    try {
      s_.emplace(std::move(o));
    } catch (const std::invalid_argument& e) {
      raise_config_error(option_named_in(e.what()), e.what());
    }
  }
  ~PyPageStore() {
    py::gil_scoped_release unlocked;
    s_.reset();
  }
  PageStore& store() {
    if (!s_) throw std::runtime_error("PageStore: closed");
    return *s_;
  }
  std::optional<PageStore> s_;
};

}  // namespace

void bind_page_store(py::module_& m) {
  py::class_<PyPageStore>(m, "PageStore",
                          "The node tier for pages already in host memory (an SGLang HiCache host pool): each page "
                          "one chunk, copied by this process's threads. Calls may come from several threads at once; "
                          "none raises for the tier's sake (a server down is a miss or a page not stored).")
      .def(py::init([](const std::string& server_socket, const py::object& request_timeout, std::int64_t server_uid,
                       const py::object& lease_bound, unsigned copy_threads, const std::string& reads_tenant) {
             PageStoreOptions o;
             o.server_socket = server_socket;
             o.request_timeout = millis_of(request_timeout, "request_timeout");
             o.server_uid = server_uid;
             o.lease_bound = millis_of(lease_bound, "lease_bound");
             o.copy_threads = copy_threads;
             o.reads_tenant = reads_tenant;
             return std::make_unique<PyPageStore>(std::move(o));
           }),
           py::kw_only(), "server_socket"_a, "request_timeout"_a = 5.0, "server_uid"_a = -1, "lease_bound"_a = 30.0,
           "copy_threads"_a = 3, "reads_tenant"_a = "")
      .def(
          "register_layout",
          [](PyPageStore& s, const Registration& r) {
            py::gil_scoped_release unlocked;
            return s.store().register_layout(r);
          },
          "registration"_a, "A pool of pages (one plane per piece of a page, one block per page): its id.")
      .def(
          "exists",
          [](PyPageStore& s, std::uint32_t reg, const std::vector<kv::ChunkKey>& keys, bool keep_lease) {
            py::gil_scoped_release unlocked;
            return s.store().exists(reg, keys, keep_lease);
          },
          "registration"_a, "keys"_a, "keep_lease"_a = true,
          "How many of keys, from the first, the tier holds (with keep_lease, leased for the get after).")
      .def(
          "get",
          [](PyPageStore& s, std::uint32_t reg, const std::vector<kv::ChunkKey>& keys, const py::object& pages) {
            const std::vector<std::uint32_t> p = pages_of(pages);
            py::gil_scoped_release unlocked;
            return s.store().get(reg, keys, p);
          },
          "registration"_a, "keys"_a, "pages"_a, "Copies the leading run of keys the tier holds into pages: how many.")
      .def(
          "set",
          [](PyPageStore& s, std::uint32_t reg, const std::vector<kv::ChunkKey>& keys, const py::object& pages) {
            const std::vector<std::uint32_t> p = pages_of(pages);
            py::gil_scoped_release unlocked;
            return s.store().set(reg, keys, p);
          },
          "registration"_a, "keys"_a, "pages"_a, "Stores pages under keys: per key, whether the tier has it now.")
      .def(
          "invalidate",
          [](PyPageStore& s, std::uint32_t reg) {
            py::gil_scoped_release unlocked;
            return s.store().invalidate(reg);
          },
          "registration"_a = 0, "Drops every object of the registration's namespace: how many.")
      .def("stats",
           [](PyPageStore& s) {
             const PageStoreStats st = s.store().stats();
             py::dict d;
             d["pages_read"] = st.pages_read;
             d["pages_written"] = st.pages_written;
             d["pages_existed"] = st.pages_existed;
             d["bytes_read"] = st.bytes_read;
             d["bytes_written"] = st.bytes_written;
             d["pages_not_stored"] = st.pages_not_stored;
             d["calls_failed"] = st.calls_failed;
             d["leases_expired"] = st.leases_expired;
             return d;
           })
      .def(
          "close",
          [](PyPageStore& s) {
            py::gil_scoped_release unlocked;
            if (s.s_) s.s_->close();
          },
          "Releases leases and ends the session. Idempotent.");
}

}  // namespace kvstrand::python
