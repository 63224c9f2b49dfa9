#include "l2/redis_value.hpp"

namespace kvstrand::l2 {

namespace {
struct Category : std::error_category {
  const char* name() const noexcept override { return "kvstrand.redis"; }
  std::string message(int e) const override {
    switch (static_cast<RedisErrc>(e)) {
      case RedisErrc::timeout: return "no answer within the timeout";
      case RedisErrc::unreachable: return "the node cannot be reached";
      case RedisErrc::disconnected: return "the connection was lost before the answer";
      case RedisErrc::overloaded: return "the node has too many commands unanswered";
      case RedisErrc::redirected_too_often: return "redirected too many times";
      case RedisErrc::no_node: return "no node serves the key's slot";
      case RedisErrc::auth_refused: return "the node refused the credentials";
    }
    return "unknown redis error";
  }
};
}  // namespace

const std::error_category& redis_category() noexcept {
  static const Category c;
  return c;
}

}  // namespace kvstrand::l2
