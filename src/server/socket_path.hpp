// The server's socket path: claimed at start (a stale socket, one nobody
// listens on: a server that died, is removed; anything else there is
// someone's and stays, refused naming --socket), bound owner-only, and
// removed at exit only while it is still the file this server bound.
#pragma once

#include <sys/types.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <optional>
#include <string>
#include <utility>

namespace kvstrand::server {

// The socket file a server bound (device, inode).
using SocketFile = std::optional<std::pair<dev_t, ino_t>>;

// Claims `path`, binds `acceptor` there (0600: only this user connects;
// with `group`, 0660 and that group's: --socket-group) and listens;
// `bound` names the file made. Empty, or why not, naming --socket. Start-up
// only: an existing socket is probed by a blocking local connect.
std::string bind_socket_path(boost::asio::local::stream_protocol::acceptor& acceptor, const std::string& path,
                             SocketFile& bound, std::optional<gid_t> group = std::nullopt);

// Unlinks `path` if it is still the file `bound` names: a server started on
// the path since (after this one stopped accepting) keeps its own.
void remove_socket_file(const std::string& path, const SocketFile& bound);

}  // namespace kvstrand::server
