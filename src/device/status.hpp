// Typed errors of the device runtime.
//
// Every call into the device runtime reports failure as a `Status`: a
// `std::error_code` in kvstrand's device category (so callers can compare
// against `Errc` values), plus the runtime call that failed and the backend's
// own message. Nothing in src/device throws across its API; awaited operations
// complete with the `error_code` part (see ../../docs/ARCHITECTURE.md).
#pragma once

#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace kvstrand::device {

enum class Errc {
  success = 0,
  invalid_value,    // a pointer, size or handle the runtime cannot accept
  out_of_memory,
  not_ready,        // an event or stream has work outstanding (not a failure)
  no_device,        // no device of this backend is present
  launch_failure,   // an operation failed while executing on a stream
  ipc_failure,      // an IPC handle could not be exported or opened
  injected_fault,   // the sim backend's test hook made the operation fail
  wrong_executor,   // an owner-bound object was used from another thread
  not_supported,    // the backend does not offer this (e.g. sim hooks on a GPU)
  backend_error,    // any other error the backend reported
};

const std::error_category& device_category() noexcept;
std::error_code make_error_code(Errc e) noexcept;

// The outcome of one runtime call. Default-constructed means success.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc e, std::string call, std::string message = {})
      : code_(make_error_code(e)), call_(std::move(call)), message_(std::move(message)) {}

  bool ok() const noexcept { return !code_; }
  const std::error_code& code() const noexcept { return code_; }
  // The runtime call that failed, e.g. "hipMemcpyAsync(D2H)".
  const std::string& call() const noexcept { return call_; }
  // The backend's own description of the failure.
  const std::string& message() const noexcept { return message_; }
  // "hipMemcpyAsync(D2H): invalid value (backend: ...)".
  std::string describe() const;

 private:
  std::error_code code_;
  std::string call_;
  std::string message_;
};

// Thrown only by `Result<T>::value()` when the caller chose not to check.
class DeviceError : public std::system_error {
 public:
  explicit DeviceError(const Status& s) : std::system_error(s.code(), s.describe()), status_(s) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT: implicit by design
  Result(Status failure) : v_(std::move(failure)) {}  // NOLINT: implicit by design

  bool ok() const noexcept { return v_.index() == 0; }
  T& value() & {
    if (!ok()) throw DeviceError(std::get<1>(v_));
    return std::get<0>(v_);
  }
  T&& value() && {
    if (!ok()) throw DeviceError(std::get<1>(v_));
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }
  // Success yields a default Status.
  Status status() const { return ok() ? Status{} : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvstrand::device

template <>
struct std::is_error_code_enum<kvstrand::device::Errc> : std::true_type {};
