// What a Redis command answers, as plain values the rest of kvstrand can
// hold after hiredis has freed its reply, and the ways a command can fail
// without an answer. Awaited Redis operations complete with these, never
// with an exception (an exception would be held back by `op || timer`).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

namespace kvstrand::l2 {

struct RedisValue {
  enum class Kind { nil, string, integer, status, error, array };
  Kind kind = Kind::nil;
  std::string str;  // string, status and error replies
  long long integer = 0;
  std::vector<RedisValue> elements;

  bool is_error() const noexcept { return kind == Kind::error; }
};

// No answer came: the command may or may not have run on the node.
enum class RedisErrc {
  timeout = 1,           // not answered within the call's timeout
  unreachable,           // no connection to the node could be made
  disconnected,          // the connection was lost with the command unanswered
  overloaded,            // the node already has max_inflight commands unanswered
  redirected_too_often,  // MOVED/ASK more times than a slot migration can explain
  no_node,               // no node is known for the key's slot
  auth_refused,          // the node refused this client's credentials (NOAUTH, WRONGPASS)
};
const std::error_category& redis_category() noexcept;
inline std::error_code make_error_code(RedisErrc e) noexcept { return {static_cast<int>(e), redis_category()}; }

struct RedisResult {
  std::error_code ec;  // set: no answer; `value` is meaningless
  RedisValue value;    // may itself be a Redis error reply (`-ERR ...`)
  std::string why;     // for a person: what failed, where

  bool answered() const noexcept { return !ec; }
};

}  // namespace kvstrand::l2

template <>
struct std::is_error_code_enum<kvstrand::l2::RedisErrc> : std::true_type {};
