#include "server/socket_path.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvstrand::server {
namespace {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

const char* file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  return "a device or other special file";
}

std::string clear(const std::string& path, const asio::any_io_executor& ex) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return {};
  if (!S_ISSOCK(st.st_mode))
    return "--socket " + path + ": the path exists and is not a socket (" + file_kind(st.st_mode) +
           "); remove it or choose another path";
  local::socket probe(ex);
  boost::system::error_code ec;
  probe.connect(local::endpoint(path), ec);  // a local connect answers at once
  if (!ec) return "--socket " + path + ": another server is already listening there";
  ::unlink(path.c_str());
  return {};
}

}  // namespace

std::string bind_socket_path(local::acceptor& acceptor, const std::string& path, SocketFile& bound,
                             std::optional<gid_t> group) {
  if (std::string why = clear(path, acceptor.get_executor()); !why.empty()) return why;
  const local::endpoint ep(path);
  boost::system::error_code ec;
  acceptor.open(ep.protocol(), ec);
  // Created with its final mode: no moment when more may connect. Whoever
  // connects is still only served as its credentials allow (peer_identity).
  const mode_t old = ::umask(group ? 0117 : 0177);
  if (!ec) acceptor.bind(ep, ec);
  ::umask(old);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec == boost::system::errc::no_such_file_or_directory)
    return "--socket " + path + ": its directory does not exist: create it (the unit's RuntimeDirectory makes "
                                "/run/kvstrand), or give another --socket";
  if (ec) return "--socket " + path + ": " + ec.message();
  // lchown: the path is the socket just bound, never a link's target.
  if (group && ::lchown(path.c_str(), static_cast<uid_t>(-1), *group) != 0)
    return "--socket-group: " + path + " cannot be given gid " + std::to_string(*group) + ": " + std::strerror(errno);
  if (struct stat st{}; ::lstat(path.c_str(), &st) == 0) bound = std::pair{st.st_dev, st.st_ino};
  return {};
}

void remove_socket_file(const std::string& path, const SocketFile& bound) {
  struct stat st{};
  if (bound && ::lstat(path.c_str(), &st) == 0 && std::pair{st.st_dev, st.st_ino} == *bound) ::unlink(path.c_str());
}

}  // namespace kvstrand::server
