#include <kvstrand/version.hpp>

namespace kvstrand {

const char* version() noexcept { return KVSTRAND_VERSION_STRING; }

}  // namespace kvstrand
