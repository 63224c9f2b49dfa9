// kvstrand-server's --config file, read strictly: it chooses where every KV
// value goes (l2, disk, events, http), so it is a file only its owner can
// change, and a mistake in it is refused rather than guessed at.
// - The file: a regular file (not a FIFO or a device: neither can hang the
//   start), at most kMaxConfigBytes, owned by the server's user or root,
//   writable by no one else.
// - TOML, read by a TOML parser (toml++): a key given twice is an error, as
//   the format says. Every key is a flag without its "--"; CLI11 then takes
//   them as the command line's (which wins) and refuses unknown ones.
// - A size needs a unit ("64G", not 64 or "64"): a bare number was bytes,
//   and `tier-bytes = 64` started a 2 MiB tier. A path is absolute.
// - One table only: [tenants.NAME] with uids, gids and quota, the flags
//   --tenant-uid, --tenant-gid and --tenant-quota of tenant NAME.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"

namespace kvstrand::server {

inline constexpr std::size_t kMaxConfigBytes = 1 << 20;

// The text of the config file at `path`, or why it is refused.
common::Expected<std::string> read_config_file(const std::string& path);

// CLI11's reader of --config over a text read_config_file already checked
// (CLI11 opens the file again; what it reads there is not used). Its
// from_config throws CLI::ConfigError naming the key it refuses.
class TomlConfig : public CLI::ConfigTOML {
 public:
  explicit TomlConfig(std::string text, std::string path) : text_(std::move(text)), path_(std::move(path)) {}
  std::vector<CLI::ConfigItem> from_config(std::istream&) const override;

 private:
  std::string text_;
  std::string path_;
};

// Where `path` (made absolute against the working directory) passes
// through a symbolic link that root does not own, why that is refused;
// nothing otherwise. A link's target can be changed by its owner: the disk
// files, the arena and the socket would go where they choose.
std::optional<std::string> untrusted_link_in(const std::string& path);

}  // namespace kvstrand::server
