// A helper process the demo starts for itself (kvstrand-server,
// redis-server): spawned, waited for until it is ready, and stopped with
// SIGTERM (then reaped) when this object goes away.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace kvstrand::engine {

class DemoProcess {
 public:
  // Starts args[0] and returns once `ready()` says so. Throws
  // std::runtime_error saying what failed: it could not be started (`hint`
  // says which flag names another binary), it exited, or it was not ready
  // within `timeout`.
  DemoProcess(std::vector<std::string> args, const std::function<bool()>& ready, std::chrono::seconds timeout,
              const std::string& hint);
  ~DemoProcess();
  // SIGKILL (a crash, an OOM kill), then reaped.
  void kill_now();
  DemoProcess(const DemoProcess&) = delete;
  DemoProcess& operator=(const DemoProcess&) = delete;

 private:
  void stop();
  pid_t pid_ = -1;
};

}  // namespace kvstrand::engine
