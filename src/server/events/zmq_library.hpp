// libzmq, loaded when the server is asked to publish KV events (--events)
// and only then: a server without it installed runs as before, and the
// binaries carried to hosts without it (the GPU pack) start. zmq.h gives
// the constants and types; the functions come from libzmq.so.5 by dlsym.
#pragma once

#include <zmq.h>

#include "common/expected.hpp"

namespace kvstrand::server {

struct ZmqLibrary {
  void* (*ctx_new)();
  int (*ctx_term)(void*);
  void* (*socket)(void*, int);
  int (*close)(void*);
  int (*bind)(void*, const char*);
  int (*setsockopt)(void*, int, const void*, size_t);
  int (*getsockopt)(void*, int, void*, size_t*);
  int (*send)(void*, const void*, size_t, int);
  int (*msg_init)(zmq_msg_t*);
  int (*msg_recv)(zmq_msg_t*, void*, int);
  void* (*msg_data)(zmq_msg_t*);
  size_t (*msg_size)(const zmq_msg_t*);
  int (*msg_close)(zmq_msg_t*);
  int (*errno_)();
  const char* (*strerror)(int);

  // The last error, in words.
  const char* error() const { return strerror(errno_()); }
};

// Loaded once for the process's life (never unloaded: its I/O threads may
// outlive a socket); or why not, naming what to install.
common::Expected<const ZmqLibrary*> zmq_library();

}  // namespace kvstrand::server
