#include "server/config_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

// Header-only: the server needs no toml++ library at run time (the GPU pack
// carries the server to hosts without it).
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

namespace kvstrand::server {

namespace {

// Keys whose values are sizes, and keys whose values are paths.
const std::set<std::string, std::less<>> kSizeKeys{
    "tier-bytes",          "slab-bytes",    "max-frame",     "max-client-leased",   "max-client-reserved",
    "max-reply-queue",     "min-object-bytes", "max-index-bytes", "disk-bytes",     "tenant-quota-default",
    "events-buffer-bytes", "events-queue-bytes"};
const std::set<std::string, std::less<>> kPathKeys{"socket", "arena-path", "disk", "l2-password-file", "http-token-file",
                                                   "l2-mac-key-file"};

bool has_unit(std::string_view size) {
  if (size == "auto") return true;  // --slab-bytes's word
  return !size.empty() && std::isalpha(static_cast<unsigned char>(size.back()));
}

std::string mode_text(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

}  // namespace

common::Expected<std::string> read_config_file(const std::string& path) {
  // O_NONBLOCK: a FIFO opens without waiting for a writer, and is then refused.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return common::unexpected(path + ": " + std::strerror(errno));
  struct stat st {};
  std::string why, text;
  if (::fstat(fd, &st) != 0) {
    why = path + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = path + " is not a regular file";
  } else if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    why = path + " is owned by uid " + std::to_string(st.st_uid) + ", neither this server's user (uid " +
          std::to_string(::geteuid()) + ") nor root: it chooses where every KV value goes; chown it";
  } else if ((st.st_mode & 022) != 0) {
    why = path + " can be written by group or others (mode " + mode_text(st.st_mode) + "): chmod go-w it";
  } else if (static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
    why = path + " is larger than " + std::to_string(kMaxConfigBytes >> 20) + " MiB: not a kvstrand-server config";
  } else {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t at = 0;
    while (at < text.size()) {
      const ssize_t n = ::read(fd, text.data() + at, text.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    text.resize(at);
  }
  ::close(fd);
  if (!why.empty()) return common::unexpected(why);
  return text;
}

std::vector<CLI::ConfigItem> TomlConfig::from_config(std::istream&) const {
  toml::table table;
  try {
    table = toml::parse(text_, path_);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << path_ << " line " << e.source().begin.line << ": " << e.description();
    throw CLI::ConfigError(s.str());
  }
  std::vector<CLI::ConfigItem> items;
  // [tenants.NAME] uids = [...], gids = [...], quota = "40G", segment =
  // "40G", public = true: the flags --tenant-uid NAME=UID, --tenant-gid
  // NAME=GID, --tenant-quota NAME=BYTES, --tenant-segment NAME=BYTES,
  // --public-tenant NAME.
  if (const toml::node* tenants = table.get("tenants")) {
    const auto refuse = [&](const std::string& why) { throw CLI::ConfigError(path_ + ": [tenants]: " + why); };
    for (const char* flat : {"tenant-uid", "tenant-gid", "tenant-quota", "tenant-segment", "public-tenant"})
      if (table.contains(flat))
        refuse(std::string("give tenants as [tenants.NAME] tables or as '") + flat + "' keys, not both");
    if (!tenants->is_table()) refuse("is not a table of [tenants.NAME] tables");
    CLI::ConfigItem uid, gid, quota, segment, published;
    uid.name = "tenant-uid";
    gid.name = "tenant-gid";
    quota.name = "tenant-quota";
    segment.name = "tenant-segment";
    published.name = "public-tenant";
    for (const auto& [n, t] : *tenants->as_table()) {
      const std::string name(n.str());
      if (!t.is_table()) refuse("'" + name + "' is not a [tenants." + name + "] table");
      for (const auto& [f, v] : *t.as_table()) {
        const std::string field(f.str());
        const auto ids = [&](CLI::ConfigItem& into) {
          if (!v.is_array()) refuse("tenants." + name + "." + field + " is not an array, e.g. [1001, \"alice\"]");
          for (const toml::node& e : *v.as_array()) {
            if (const auto* i = e.as_integer()) into.inputs.push_back(name + "=" + std::to_string(i->get()));
            else if (const auto* str = e.as_string()) into.inputs.push_back(name + "=" + str->get());
            else refuse("tenants." + name + "." + field + " holds a value that is neither a number nor a name");
          }
        };
        if (field == "uids") {
          ids(uid);
        } else if (field == "gids") {
          ids(gid);
        } else if (field == "quota" || field == "segment") {
          const auto* q = v.as_string();
          if (!q || !has_unit(q->get()))
            refuse("tenants." + name + "." + field + " needs a size with a unit, e.g. \"40G\"");
          (field == "quota" ? quota : segment).inputs.push_back(name + "=" + q->get());
        } else if (field == "public") {
          const auto* b = v.as_boolean();
          if (!b) refuse("tenants." + name + ".public is not true or false");
          if (b->get()) published.inputs.push_back(name);
        } else {
          refuse("tenants." + name + " has no key '" + field + "' (uids, gids, quota, segment and public are its keys)");
        }
      }
    }
    for (CLI::ConfigItem* i : {&uid, &gid, &quota, &segment, &published})
      if (!i->inputs.empty()) items.push_back(std::move(*i));
  }
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (key == "tenants") continue;  // read above
    CLI::ConfigItem item;
    item.name = key;
    const auto refuse = [&](const std::string& why) { throw CLI::ConfigError(path_ + ": key '" + key + "': " + why); };
    // One value as the command line would give it.
    const auto text_of = [&](const toml::node& v) -> std::string {
      if (const auto* s = v.as_string()) return s->get();
      if (const auto* b = v.as_boolean()) return b->get() ? "true" : "false";
      if (const auto* i = v.as_integer()) return std::to_string(i->get());  // a size's is refused below: no unit
      std::ostringstream type;
      type << v.type();
      refuse("a value of type " + type.str() + " is not an option's (strings, integers, booleans and arrays are)");
      return {};
    };
    if (const auto* a = node.as_array()) {
      for (const toml::node& v : *a) item.inputs.push_back(text_of(v));
    } else if (node.is_table()) {
      refuse("is a table; every key is a flag without its \"--\" (kvstrand-server --print-config lists them)");
    } else {
      item.inputs.push_back(text_of(node));
    }
    for (const std::string& v : item.inputs) {
      if (kSizeKeys.contains(key) && !has_unit(v)) refuse("'" + v + "' needs a unit, e.g. \"" + v + "G\"");
      const bool per_tenant_size = key == "tenant-quota" || key == "tenant-segment";
      if (per_tenant_size && v.find('=') != std::string::npos && !has_unit(v.substr(v.find('=') + 1)))
        refuse("'" + v + "' needs a unit after '=', e.g. team-a=40G");
      if (kPathKeys.contains(key) && !v.empty() && v.front() != '/')
        refuse("'" + v + "' is not an absolute path (a config file's paths do not depend on where it is started)");
    }
    items.push_back(std::move(item));
  }
  return items;
}

std::optional<std::string> untrusted_link_in(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) return std::nullopt;  // opening it says what is wrong
  std::filesystem::path at;
  for (const auto& part : abs) {
    at /= part;
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) break;  // not there (yet): made by the server, as no link
    if (S_ISLNK(st.st_mode) && st.st_uid != 0)
      return at.string() + " is a symbolic link owned by uid " + std::to_string(st.st_uid) +
             " (not root): its owner decides where it leads; give the real path";
  }
  return std::nullopt;
}

}  // namespace kvstrand::server
