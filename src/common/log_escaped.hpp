// The completion handler of every co_spawn in kvstrand: nothing escapes a
// coroutine silently. Each coroutine completes with error codes; an
// exception that still escapes one (a bug, or an allocation failure) is
// logged with what the coroutine was, instead of vanishing as it would
// under Asio's detached token.
#pragma once

#include <spdlog/spdlog.h>

#include <exception>

namespace kvstrand::common {

struct LogEscaped {
  const char* what;
  template <class... Results>
  void operator()(std::exception_ptr e, Results&&...) const {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      spdlog::error("kvstrand: {} ended by an exception: {}", what, x.what());
    } catch (...) {
      spdlog::error("kvstrand: {} ended by an unknown exception", what);
    }
  }
};

}  // namespace kvstrand::common
