#include "server/events/zmq_library.hpp"

#include <dlfcn.h>

#include <string>

namespace kvstrand::server {

namespace {

common::Expected<ZmqLibrary> load() {
  void* h = ::dlopen("libzmq.so.5", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr)
    return common::unexpected(std::string("libzmq.so.5 cannot be loaded (") + ::dlerror() +
                              "): install libzmq5 (Debian, Ubuntu) to publish KV events");
  ZmqLibrary z{};
  std::string missing;
  const auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  get(z.ctx_new, "zmq_ctx_new");
  get(z.ctx_term, "zmq_ctx_term");
  get(z.socket, "zmq_socket");
  get(z.close, "zmq_close");
  get(z.bind, "zmq_bind");
  get(z.setsockopt, "zmq_setsockopt");
  get(z.getsockopt, "zmq_getsockopt");
  get(z.send, "zmq_send");
  get(z.msg_init, "zmq_msg_init");
  get(z.msg_recv, "zmq_msg_recv");
  get(z.msg_data, "zmq_msg_data");
  get(z.msg_size, "zmq_msg_size");
  get(z.msg_close, "zmq_msg_close");
  get(z.errno_, "zmq_errno");
  get(z.strerror, "zmq_strerror");
  if (!missing.empty()) return common::unexpected("libzmq.so.5 lacks " + missing + ": a libzmq older than 4.0");
  return z;
}

}  // namespace

common::Expected<const ZmqLibrary*> zmq_library() {
  static const common::Expected<ZmqLibrary> loaded = load();
  if (!loaded) return common::unexpected(loaded.why());
  return &*loaded;
}

}  // namespace kvstrand::server
