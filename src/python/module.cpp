// kvstrand._kvstrand: the native half of the `kvstrand` package (the pure
// Python half, python/kvstrand, re-exports it and adds kvstrand.vllm).
#include "bindings.hpp"

#include <kvstrand/version.hpp>

PYBIND11_MODULE(_kvstrand, m) {
  using namespace kvstrand::python;
  m.doc() = "kvstrand: KV-cache offload between GPU memory and a host tier shared by a node's ranks";
  m.attr("__version__") = kvstrand::version();
  m.def("version", [] { return std::string(kvstrand::version()); }, "The library's version, e.g. '0.1.0'.");
  m.def("backend", [] { return std::string(kvstrand::backend()); },
        "The device backend the library was built for: 'sim', 'hip' or 'cuda'.");
  bind_errors(m);
  bind_layout(m);
  bind_planner(m);
  bind_device(m);
  bind_connector(m);
  bind_page_store(m);
}
