#include "server/server_options.hpp"

#include "server/config_file.hpp"
#include "server/commands/drop_command.hpp"
#include "server/tenant_options.hpp"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <tuple>
#include <vector>

#include <kvstrand/version.hpp>

#include "common/parse_bytes.hpp"
#include "proto/protocol.hpp"
#include "tier/arena.hpp"
#include "tier/size_classes.hpp"
#include "tier/tenant_book.hpp"

namespace kvstrand::server {

namespace {
// A user or group as a number, or a name the system knows.
std::optional<std::uint32_t> id_named(const std::string& text, bool is_group) {
  if (text.empty()) return std::nullopt;
  if (std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (text.size() > 9) return std::nullopt;
    return static_cast<std::uint32_t>(std::stoul(text));
  }
  std::vector<char> buf(1 << 16);
  if (is_group) {
    ::group g{}, *found = nullptr;
    if (::getgrnam_r(text.c_str(), &g, buf.data(), buf.size(), &found) != 0 || !found) return std::nullopt;
    return found->gr_gid;
  }
  ::passwd pw{}, *found = nullptr;
  if (::getpwnam_r(text.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found) return std::nullopt;
  return found->pw_uid;
}

// A secret (the L2 password, the L2 MAC key): the first line of `path`, a
// regular file no one but its owner can read (a secret must not leak where
// the command line would not), or why not. The text is never logged.
common::Expected<std::string> read_secret_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return common::unexpected(path + ": " + std::strerror(errno));
  struct stat st {};
  std::string text, why;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = path + " is not a regular file";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = path + " can be read by group or others (mode " + mode + "): chmod 600 it";
  } else {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() < 64 * 1024) text.append(buf, static_cast<std::size_t>(n));
    if (n < 0) why = path + ": " + std::strerror(errno);
  }
  ::close(fd);
  if (!why.empty()) return common::unexpected(why);
  text = text.substr(0, text.find_first_of("\r\n"));
  if (text.empty()) return common::unexpected(path + " holds nothing on its first line");
  return text;
}
// The options as a --config file: each one given (in the file read or on
// the command line) as a key, each other one commented out at its default,
// so that reading the file back gives the same options (an unset option
// written as set would count as given: "--l2-timeout needs --l2").
std::string printable_config(const CLI::App& app) {
  std::istringstream all(app.config_to_str(true, true));
  std::string out, line;
  while (std::getline(all, line)) {
    const auto eq = line.find('=');
    if (!line.empty() && line[0] != '#' && eq != std::string::npos) {
      const CLI::Option* o = app.get_option_no_throw("--" + line.substr(0, eq));
      if (o != nullptr && o->count() == 0) line = "# " + line;
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::variant<ServerOptions, int> parse_server_options(int argc, char** argv) {
  ServerOptions o;
  CLI::App app{"kvstrand-server: the node-wide host tier for KV-cache prefixes, shared by every engine rank"};
  std::string tier_bytes = "auto", slab_bytes = "auto", max_frame = "16M", max_leased, max_reserved, max_queue = "4M";
  std::string min_object = "512", max_index = "1G";
  bool no_huge = false;
  app.set_version_flag("--version", std::string("kvstrand-server ") + KVSTRAND_VERSION_STRING + " (protocol " +
                                        std::to_string(proto::kMajor) + "." + std::to_string(proto::kMinor) +
                                        ")");
  app.add_option("--socket", o.socket, "Unix-domain socket to listen on (created 0600)")->capture_default_str();
  app.add_option("--tier-bytes", tier_bytes,
                 "Shared host memory for stored objects, e.g. 100G, 512M (auto: 8G, or half the memory available at "
                 "start where that is less, so that a small host starts)")
      ->capture_default_str();
  app.add_option("--slab-bytes", slab_bytes,
                 "The arena grows by this much at a time, and each object size gets slabs of it (a multiple of "
                 "2M; auto: a sixteenth of --tier-bytes, from 2M to 1G)")
      ->capture_default_str();
  app.add_flag("--no-huge-pages", no_huge, "Plain pages even where huge pages are reserved");
  app.add_option("--arena-path", o.arena_path,
                 "Keep the arena in this file (on tmpfs, e.g. /dev/shm/kvstrand-arena, or hugetlbfs) so that a "
                 "restarted server finds its objects again and clients keep their pinned mappings; mode 0600, "
                 "this user only. Unset: the arena lives as long as this server");
  app.add_option("--chunk-tokens", o.chunk_tokens, "Tokens per stored chunk; registrations must match")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  app.add_option("--max-frame", max_frame, "Largest frame body accepted; larger closes the connection")
      ->capture_default_str();
  app.add_option("--max-client-leased", max_leased, "Bytes one client process's leases may pin (default: half the tier)");
  app.add_option("--max-client-reserved", max_reserved,
                 "Bytes one client process's reservations may hold (default: a quarter of the tier)");
  app.add_option("--max-reply-queue", max_queue, "Reply bytes queued for one connection before reading from it pauses")
      ->capture_default_str();
  app.add_option("--min-object-bytes", min_object,
                 "Smallest object (one chunk of one rank) a registration may store; smaller layouts are refused")
      ->capture_default_str();
  app.add_option("--max-index-bytes", max_index,
                 "Memory one object size's index may need were the whole arena given to it; a layout whose objects "
                 "would need more is refused at registration")
      ->capture_default_str();
  app.add_option("--max-tenants", o.max_tenants,
                 "Tenants the server tells apart at most (the unnamed one and every --tenant-quota among them); a "
                 "registration of one more is refused")
      ->capture_default_str();
  std::vector<std::string> tenant_uids, tenant_gids;
  std::string admin_group, socket_group;
  app.add_option("--tenant-uid", tenant_uids,
                 "NAME=USER: a client process of this user (a name or a uid) is tenant NAME, and registers as no other; "
                 "give it once per user. With any --tenant-uid or --tenant-gid, tenants are the kernel's word, not the "
                 "client's (a config file's [tenants.NAME] uids = [...])");
  app.add_option("--tenant-gid", tenant_gids,
                 "NAME=GROUP: a client process in this group (a name or a gid) is tenant NAME, unless its user is "
                 "mapped itself (a config file's [tenants.NAME] gids = [...])");
  app.add_option("--admin-group", admin_group,
                 "Clients in this group may drop any namespace or tenant, as the server's user and root may; a "
                 "tenant's own clients drop only their own");
  app.add_option("--socket-group", socket_group,
                 "The socket is made 0660 and this group's, so that other users' clients (--tenant-uid, "
                 "--tenant-gid) can connect; without it, 0600");
  std::string http;
  bool http_remote = false;
  app.add_option("--http", http, "Serve the read-only debug endpoint (/debug, /metrics) at ADDR:PORT, e.g. 127.0.0.1:9400");
  app.add_flag("--http-allow-remote", http_remote, "Allow --http on a non-loopback address (it shows every session)");
  std::string http_token_file;
  app.add_option("--http-token-file", http_token_file,
                 "File whose first line (mode 0600 or stricter) every --http route but /healthz and /readyz needs as "
                 "'Authorization: Bearer TOKEN' (Prometheus: bearer_token_file); the pages show client pids, holds "
                 "and namespaces to any local user otherwise");
  std::string l2_url;
  long long l2_timeout_ms = 100, l2_inflight = 256, l2_ttl_s = 0;
  app.add_option("--l2", l2_url,
                 "Redis under the arena: redis://HOST:PORT[,HOST:PORT...] (Cluster seed nodes, or one plain Redis)");
  app.add_option("--l2-timeout", l2_timeout_ms, "Milliseconds a lookup waits for L2 at most; what comes later is a miss")
      ->capture_default_str();
  app.add_option("--l2-max-inflight", l2_inflight,
                 "Objects queued for writing to L2 (more are dropped, counted); commands unanswered per Redis node")
      ->capture_default_str();
  app.add_option("--l2-ttl", l2_ttl_s, "Seconds an object lives in L2 (0: until Redis evicts it)")->capture_default_str();
  std::string l2_user, l2_password_file, l2_mac_key_file;
  app.add_option("--l2-user", l2_user, "Redis ACL user for L2 (default: Redis's default user); needs a password");
  app.add_option("--l2-password-file", l2_password_file,
                 "File whose first line is the L2 Redis password (mode 0600 or stricter); or set KVSTRAND_L2_PASSWORD. "
                 "Never on the command line");
  app.add_option("--l2-mac-key-file", l2_mac_key_file,
                 "File whose first line (at least 32 bytes, mode 0600 or stricter) is the key every L2 value is "
                 "MACed under (GMAC, a key per value): a Redis writer without it cannot forge or alter what is loaded. "
                 "Every node sharing the L2 needs the same key");
  std::vector<std::string> disk_paths;
  std::string disk_bytes;
  long long disk_timeout_ms = 500, disk_queue = 1024;
  app.add_option("--disk", disk_paths,
                 "A file (or a directory, for its kvstrand.disk) on a local disk for a third level under the arena; "
                 "give it once per drive to stripe over several. Needs --disk-bytes");
  app.add_option("--disk-bytes", disk_bytes, "Disk space for the disk tier over all --disk paths, preallocated, e.g. 2T");
  app.add_option("--disk-timeout", disk_timeout_ms,
                 "Milliseconds a lookup waits for the disk at most; what is read later serves the next lookup")
      ->capture_default_str();
  app.add_option("--disk-queue", disk_queue,
                 "Objects waiting to be written to disk at most (each held in the arena until written, together at "
                 "most an eighth of the arena); more are dropped and counted")
      ->capture_default_str();
  TenantFlags tenant_flags;
  app.add_option("--tenant-quota", tenant_flags.quotas,
                 "NAME=BYTES: tenant NAME (a layout's tenant) may hold this much of the arena (and the same share of "
                 "the disk), and no other tenant evicts it below that; give it once per tenant, e.g. team-a=40G");
  app.add_option("--tenant-segment", tenant_flags.segments,
                 "NAME=BYTES: tenant NAME's objects live in memory of their own, beside --tier-bytes, handed only to "
                 "its own clients (so no other client can read or write them); NAME must be bound by --tenant-uid or "
                 "--tenant-gid; give it once per tenant, e.g. team-a=40G");
  app.add_option("--public-tenant", tenant_flags.publics,
                 "NAME: tenant NAME's prefixes (system prompts shared by design) may be read by every other tenant's "
                 "clients, through its segment handed to them read-only; only NAME's own users write them. NAME needs "
                 "--tenant-segment; give it once per tenant");
  app.add_option("--tenant-quota-default", tenant_flags.default_quota,
                 "The quota of every tenant --tenant-quota does not name, the one with no name included (default: "
                 "none, and no reserve)");
  std::string events, events_replay, events_topic, events_format = "map", events_buffer_bytes = "64M",
                                                                          events_queue_bytes = "256M",
                                                                          events_media = "vllm";
  long long events_buffer = 10000;
  app.add_option("--events", events,
                 "Publish the tier's KV events (vLLM's BlockStored, BlockRemoved, AllBlocksCleared; media: "
                 "--events-medium-names) on a ZeroMQ PUB socket bound here: tcp://HOST:PORT or ipc://PATH (needs libzmq5)");
  app.add_option("--events-replay", events_replay,
                 "A ZeroMQ ROUTER socket bound here answers replays of missed batches, as vLLM's publisher does");
  bool events_remote = false;
  app.add_flag("--events-allow-remote", events_remote,
               "Allow --events and --events-replay on a tcp:// address that is not loopback (every prompt's token "
               "ids go out on them)");
  app.add_option("--events-topic", events_topic, "The topic frame of every batch (vLLM's kv_events_config.topic)");
  app.add_option("--events-format", events_format,
                 "How batches are encoded: map (vLLM main), events-map (vLLM v0.26: the batch an array, each event a "
                 "map) or array (vLLM before its PR 42892, v0.18 among them)")
      ->capture_default_str();
  app.add_option("--events-buffer", events_buffer, "Batches kept for --events-replay")->capture_default_str();
  app.add_option("--events-medium-names", events_media,
                 "What the events call the arena and the disk: vllm (CPU and STORAGE, as vLLM's offload tiers and "
                 "Dynamo's router read them) or sglang (CPU_PINNED and DISK, as SGLang's events and sgl-router)")
      ->capture_default_str();
  app.add_option("--events-buffer-bytes", events_buffer_bytes,
                 "Bytes the batches kept for --events-replay may take at most (the oldest go first)")
      ->capture_default_str();
  app.add_option("--events-queue-bytes", events_queue_bytes,
                 "Bytes of batches one slow subscriber may have queued inside the server; past that its batches "
                 "are dropped (it replays what it missed)")
      ->capture_default_str();
  app.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key is refused, not ignored
  app.set_config("--config", "",
                 "Read options from this file (TOML, or INI): every flag above is a key, e.g. tier-bytes = \"64G\"; "
                 "a flag on the command line wins over the file");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "Print the options in force (the file's, the command line's, the defaults) as a --config file, and exit")
      ->configurable(false);
  long long check_wait_s = 0;
  app.add_option("--check", o.check,
                 "Only check whether a kvstrand-server answers a hello at this socket: exit 0 if one does, 1 if not "
                 "(for scripts and container probes)")
      ->configurable(false);
  app.add_option("--check-wait", check_wait_s, "With --check: keep trying this many seconds before giving up")
      ->configurable(false);
  app.add_option("--drop-namespace", o.drop_namespace,
                 "Only have the server at --socket drop every object of this namespace (64 hex digits, as "
                 "/debug/tier lists them) from its arena, disk and L2, and exit (an online weight update)")
      ->configurable(false);
  app.add_option("--drop-tenant", o.drop_tenant,
                 "Only have the server at --socket drop every namespace it holds objects of this tenant in (its "
                 "arena, disk and L2), and exit")
      ->configurable(false);
  // The config file is checked and read before CLI11 opens it: a FIFO or
  // /dev/zero there would hang the start, and a file others can change
  // would choose where the KV goes.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string path;
    if (a == "--config" && i + 1 < argc) path = argv[i + 1];
    else if (a.rfind("--config=", 0) == 0) path = a.substr(9);
    else continue;
    auto text = read_config_file(path);
    if (!text) {
      std::cerr << "kvstrand-server: invalid --config: " << text.why() << "\n";
      return 2;
    }
    app.config_formatter(std::make_shared<TomlConfig>(std::move(*text), path));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    const std::string what = e.what(), prefix = "INI was not able to parse ";
    std::cerr << "kvstrand-server: invalid --config: "
              << (what.rfind(prefix, 0) == 0 ? "no such key '" + what.substr(prefix.size()) +
                                                   "' (keys are the flags without --; --print-config lists them)"
                                             : what)
              << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto refuse = [](const std::string& flag, const std::string& why) {
    std::cerr << "kvstrand-server: invalid " << flag << ": " << why << "\n";
    return 2;
  };
  if (!o.check.empty()) {  // a probe: no server options are read or checked
    if (check_wait_s < 0 || check_wait_s > 3600) return refuse("--check-wait", "must be 0 to 3600 s");
    o.check_within = std::chrono::seconds(check_wait_s);
    return o;
  }
  if (app.get_option("--check-wait")->count() > 0) return refuse("--check-wait", "needs --check");
  if (!o.drop_tenant.empty()) {  // a request to the running server, as --drop-namespace
    if (auto why = kv::tenant_problem(o.drop_tenant)) return refuse("--drop-tenant", *why);
    return o;
  }
  if (!o.drop_namespace.empty()) {  // a request to the running server: no server options are read or checked
    kv::Digest ns{};
    if (!parse_namespace(o.drop_namespace, &ns))
      return refuse("--drop-namespace", "'" + o.drop_namespace + "' is not 64 hex digits");
    return o;
  }
  constexpr std::uint64_t k2M = 2u << 20;
  auto bytes = common::parse_bytes(tier_bytes);
  if (tier_bytes == "auto") {
    const std::uint64_t avail = tier::available_memory_bytes();
    bytes = avail == 0 ? o.tier_bytes : std::min(o.tier_bytes, std::max(avail / 2 / k2M * k2M, k2M));
  }
  if (!bytes) return refuse("--tier-bytes", "'" + tier_bytes + "' is not a size like 8G or 512M, nor auto");
  if (*bytes == 0) return refuse("--tier-bytes", "must be more than 0, e.g. 8G or 512M");
  o.tier_bytes = *bytes;
  // auto: at least 16 slabs where the tier allows, so that several object
  // sizes (registrations of different groups) each get slabs of their own.
  auto slab = slab_bytes == "auto" ? std::optional<std::uint64_t>(std::clamp<std::uint64_t>(
                                         o.tier_bytes / 16 / k2M * k2M, k2M, 1ull << 30))
                                   : common::parse_bytes(slab_bytes);
  if (!slab || *slab == 0 || *slab % k2M != 0)
    return refuse("--slab-bytes", "'" + slab_bytes + "' is not a multiple of 2M");
  // A tier smaller than a slab is one slab of its own size.
  o.slab_bytes = std::min(*slab, (o.tier_bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20));
  const std::uint64_t asked = o.tier_bytes;
  o.tier_bytes = (o.tier_bytes + o.slab_bytes - 1) / o.slab_bytes * o.slab_bytes;
  if (o.tier_bytes != asked && tier_bytes != "auto") o.tier_bytes_rounded_from = tier_bytes;
  // A restart on a named arena reuses the memory the file holds already.
  if (const std::uint64_t avail = tier::available_memory_bytes(); avail != 0 &&
      o.tier_bytes > avail + tier::held_by_named_arena(o.arena_path, o.tier_bytes))
    return refuse("--tier-bytes", tier_bytes + " is more than this machine can hold now (" +
                                      std::to_string(avail >> 20) + " MiB available)");
  o.huge_pages = !no_huge;
  auto frame = common::parse_bytes(max_frame);
  if (!frame || *frame < 1024 || *frame > (1ull << 30))
    return refuse("--max-frame", "'" + max_frame + "' must be a size between 1K and 1G");
  o.max_frame = static_cast<std::uint32_t>(*frame);
  auto size_flag = [&](const std::string& flag, const std::string& text, std::uint64_t def,
                       std::uint64_t* out) -> bool {
    if (text.empty()) {
      *out = def;
      return true;
    }
    auto v = common::parse_bytes(text);
    if (!v || *v == 0) return false;
    *out = *v;
    (void)flag;
    return true;
  };
  if (!size_flag("--max-client-leased", max_leased, o.tier_bytes / 2, &o.max_client_leased))
    return refuse("--max-client-leased", "'" + max_leased + "' is not a size above 0");
  if (!size_flag("--max-client-reserved", max_reserved, o.tier_bytes / 4, &o.max_client_reserved))
    return refuse("--max-client-reserved", "'" + max_reserved + "' is not a size above 0");
  if (!size_flag("--max-reply-queue", max_queue, 4u << 20, &o.max_reply_queue) || o.max_reply_queue < 64 * 1024)
    return refuse("--max-reply-queue", "'" + max_queue + "' must be a size of at least 64K");
  if (auto v = common::parse_bytes(min_object); !v || *v == 0 || *v > o.slab_bytes)
    return refuse("--min-object-bytes", "'" + min_object + "' must be a size from 1 byte to --slab-bytes");
  else
    o.min_object_bytes = *v;
  if (auto v = common::parse_bytes(max_index); !v || *v < (1u << 20))
    return refuse("--max-index-bytes", "'" + max_index + "' must be a size of at least 1M");
  else
    o.max_index_bytes = *v;
  if (o.max_tenants < 1 || o.max_tenants > tier::TenantBook::kMaxTenants)
    return refuse("--max-tenants", "must be 1 to " + std::to_string(tier::TenantBook::kMaxTenants));
  if (o.socket.empty() || o.socket.size() >= 108) return refuse("--socket", "must be a path of 1 to 107 bytes");
  for (const auto& [flag, given, group] : {std::tuple<const char*, const std::vector<std::string>&, bool>{
                                               "--tenant-uid", tenant_uids, false},
                                           {"--tenant-gid", tenant_gids, true}})
    for (const std::string& t : given) {
      const auto eq = t.find('=');
      const std::string name = eq == std::string::npos ? "" : t.substr(0, eq);
      const auto id = eq == std::string::npos ? std::nullopt : id_named(t.substr(eq + 1), group);
      if (name.empty() || !id)
        return refuse(flag, "'" + t + "' is not NAME=" + (group ? "GROUP" : "USER") + " of a " +
                                (group ? "group" : "user") + " this system knows, e.g. team-a=" +
                                (group ? "team-a" : "1001"));
      if (auto why = kv::tenant_problem(name)) return refuse(flag, *why);
      auto& to = group ? o.binding.gids : o.binding.uids;
      if (auto [it, fresh] = to.emplace(*id, name); !fresh && it->second != name)
        return refuse(flag, std::string(group ? "gid " : "uid ") + std::to_string(*id) + " is tenant '" + it->second +
                                "' and '" + name + "': one tenant each");
    }
  if (o.binding.uids.contains(::geteuid()))
    return refuse("--tenant-uid", "uid " + std::to_string(::geteuid()) +
                                      " is the server's own: its clients are admins, and any tenant a tenant's "
                                      "process could act as; map the engines' users instead");
  if (!admin_group.empty()) {
    o.binding.admin_gid = id_named(admin_group, true);
    if (!o.binding.admin_gid) return refuse("--admin-group", "'" + admin_group + "' is not a group this system knows");
  }
  if (!socket_group.empty()) {
    o.socket_gid = id_named(socket_group, true);
    if (!o.socket_gid) return refuse("--socket-group", "'" + socket_group + "' is not a group this system knows");
  } else if (o.binding.maps_tenants() || o.binding.admin_gid) {
    return refuse(o.binding.maps_tenants() ? (o.binding.uids.empty() ? "--tenant-gid" : "--tenant-uid") : "--admin-group",
                  "lets other users' clients in, but the socket would be 0600 (the server's user alone): give "
                  "--socket-group, a group those users are in");
  }
  if (auto why = untrusted_link_in(o.socket)) return refuse("--socket", *why);
  if (!o.arena_path.empty())
    if (auto why = untrusted_link_in(o.arena_path)) return refuse("--arena-path", *why);
  if (o.chunk_tokens == 0 || o.chunk_tokens > kv::kMaxChunkTokens)
    return refuse("--chunk-tokens", "must be 1 to " + std::to_string(kv::kMaxChunkTokens) + ", got " +
                                        std::to_string(o.chunk_tokens));
  static const char* levels[] = {"trace", "debug", "info", "warn", "error", "off"};
  if (std::find(std::begin(levels), std::end(levels), o.log_level) == std::end(levels))
    return refuse("--log-level", "'" + o.log_level + "' is not one of trace, debug, info, warn, error, off");
  if (!http.empty()) {
    auto h = common::parse_http_address(http);
    if (!h) return refuse("--http", "'" + http + "' is not ADDR:PORT, e.g. 127.0.0.1:9400");
    h->allow_non_loopback = http_remote;
    if (auto e = common::validate(*h))
      return refuse("--http", e->option == "http.allow_non_loopback"
                                  ? "'" + http + "' is not a loopback address, and the debug endpoint shows every "
                                                 "session, hold and namespace: bind 127.0.0.1, or give "
                                                 "--http-allow-remote to mean it"
                                  : e->message);
    if (!http_token_file.empty()) {
      auto token = read_secret_file(http_token_file);
      if (!token) return refuse("--http-token-file", token.why());
      h->token = std::move(*token);
    }
    o.http = *h;
  } else if (http_remote) {
    return refuse("--http-allow-remote", "needs --http");
  } else if (!http_token_file.empty()) {
    return refuse("--http-token-file", "needs --http");
  }
  if (!l2_url.empty()) {
    auto seeds = l2::parse_redis_url(l2_url);
    if (!seeds) return refuse("--l2", seeds.why());
    if (l2_timeout_ms <= 0 || l2_timeout_ms > 60'000) return refuse("--l2-timeout", "must be 1 to 60000 ms");
    if (l2_inflight <= 0 || l2_inflight > 1'000'000) return refuse("--l2-max-inflight", "must be 1 to 1000000");
    if (l2_ttl_s < 0) return refuse("--l2-ttl", "must be >= 0 s");
    L2Options l2;
    l2.seeds = *seeds;
    l2.timeout = std::chrono::milliseconds(l2_timeout_ms);
    l2.max_inflight = static_cast<std::size_t>(l2_inflight);
    l2.ttl = std::chrono::seconds(l2_ttl_s);
    const char* env = std::getenv("KVSTRAND_L2_PASSWORD");
    if (!l2_password_file.empty() && env != nullptr)
      return refuse("--l2-password-file", "and KVSTRAND_L2_PASSWORD are both set: use one");
    if (!l2_password_file.empty()) {
      auto password = read_secret_file(l2_password_file);
      if (!password) return refuse("--l2-password-file", password.why());
      l2.credentials.password = std::move(*password);
    } else if (env != nullptr) {
      l2.credentials.password = env;
      if (l2.credentials.password.empty()) return refuse("--l2-password-file", "KVSTRAND_L2_PASSWORD is set but empty");
    }
    if (!l2_user.empty() && l2.credentials.password.empty())
      return refuse("--l2-user", "needs a password: --l2-password-file or KVSTRAND_L2_PASSWORD");
    l2.credentials.username = l2_user;
    if (!l2_mac_key_file.empty()) {
      auto secret = read_secret_file(l2_mac_key_file);
      if (!secret) return refuse("--l2-mac-key-file", secret.why());
      l2::MacKey key{std::move(*secret)};
      if (key.secret.size() < l2::kMinMacKeyBytes)
        return refuse("--l2-mac-key-file", l2_mac_key_file + " holds " + std::to_string(key.secret.size()) +
                                               " bytes on its first line; a key needs at least " +
                                               std::to_string(l2::kMinMacKeyBytes) + " (openssl rand -hex 32)");
      l2.mac = std::move(key);
    }
    o.l2 = std::move(l2);
  } else {
    for (const char* f :
         {"--l2-timeout", "--l2-max-inflight", "--l2-ttl", "--l2-user", "--l2-password-file", "--l2-mac-key-file"})
      if (app.get_option(f)->count() > 0) return refuse(f, "needs --l2");
  }
  if (!disk_paths.empty()) {
    auto n = common::parse_bytes(disk_bytes);
    if (disk_bytes.empty()) return refuse("--disk-bytes", "is needed with --disk: how much disk space, e.g. 2T");
    if (!n || *n == 0) return refuse("--disk-bytes", "'" + disk_bytes + "' is not a size like 2T or 500G");
    if (disk_timeout_ms <= 0 || disk_timeout_ms > 60'000) return refuse("--disk-timeout", "must be 1 to 60000 ms");
    if (disk_queue <= 0 || disk_queue > 1'000'000) return refuse("--disk-queue", "must be 1 to 1000000");
    for (std::size_t i = 0; i < disk_paths.size(); ++i)
      for (std::size_t j = i + 1; j < disk_paths.size(); ++j)
        if (disk_paths[i] == disk_paths[j]) return refuse("--disk", disk_paths[i] + " is given twice");
    for (const std::string& p : disk_paths)
      if (auto why = untrusted_link_in(p)) return refuse("--disk", *why);
    DiskOptions d;
    d.paths = disk_paths;
    d.bytes = *n;
    d.timeout = std::chrono::milliseconds(disk_timeout_ms);
    d.max_queued = static_cast<std::size_t>(disk_queue);
    o.disk = std::move(d);
  } else {
    for (const char* f : {"--disk-bytes", "--disk-timeout", "--disk-queue"})
      if (app.get_option(f)->count() > 0) return refuse(f, "needs --disk");
  }
  if (auto refused = take_tenant_flags(tenant_flags, o)) return refuse(refused->first, refused->second);
  if (!events.empty()) {
    const auto endpoint_ok = [](const std::string& e) {
      return (e.rfind("tcp://", 0) == 0 && e.find(':', 6) != std::string::npos) ||
             (e.rfind("ipc://", 0) == 0 && e.size() > 6);
    };
    if (!endpoint_ok(events)) return refuse("--events", "'" + events + "' is not tcp://HOST:PORT or ipc://PATH");
    if (!events_replay.empty() && !endpoint_ok(events_replay))
      return refuse("--events-replay", "'" + events_replay + "' is not tcp://HOST:PORT or ipc://PATH");
    if (events_replay == events) return refuse("--events-replay", "is the same endpoint as --events");
    // The events carry every prompt's token ids: to this host only, unless meant.
    const auto loopback = [](const std::string& e) {
      if (e.rfind("ipc://", 0) == 0) return true;
      const std::string host = e.substr(6, e.rfind(':') - 6);
      return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
    };
    for (const auto& [flag, e] : {std::pair<const char*, const std::string&>{"--events", events},
                                  std::pair<const char*, const std::string&>{"--events-replay", events_replay}})
      if (!e.empty() && !loopback(e) && !events_remote)
        return refuse(flag, "'" + e + "' is not a loopback address, and the events carry every prompt's token ids: "
                            "bind 127.0.0.1 (or ipc://), or give --events-allow-remote to mean it");
    auto format = event_format(events_format);
    if (!format) return refuse("--events-format", "'" + events_format + "' is not one of map, events-map, array");
    if (events_buffer < 0 || events_buffer > 10'000'000) return refuse("--events-buffer", "must be 0 to 10000000");
    const auto buffer_bytes = common::parse_bytes(events_buffer_bytes);
    if (!buffer_bytes || *buffer_bytes > (64ull << 30))
      return refuse("--events-buffer-bytes", "'" + events_buffer_bytes + "' is not a size from 0 to 64G");
    const auto queue_bytes = common::parse_bytes(events_queue_bytes);
    if (!queue_bytes || *queue_bytes < EventPublisher::kMaxBatchBytes || *queue_bytes > (64ull << 30))
      return refuse("--events-queue-bytes", "'" + events_queue_bytes + "' is not a size from 256K to 64G");
    if (events_media != "vllm" && events_media != "sglang")
      return refuse("--events-medium-names", "'" + events_media + "' is not vllm or sglang");
    o.events = EventOptions{events,  events_replay, events_topic, *format, static_cast<std::size_t>(events_buffer),
                            *buffer_bytes, *queue_bytes, events_media == "vllm" ? "CPU" : "CPU_PINNED",
                            events_media == "vllm" ? "STORAGE" : "DISK", o.socket_gid};
  } else {
    for (const char* f : {"--events-replay", "--events-topic", "--events-format", "--events-buffer",
                          "--events-buffer-bytes", "--events-queue-bytes", "--events-allow-remote",
                          "--events-medium-names"})
      if (app.get_option(f)->count() > 0) return refuse(f, "needs --events");
  }
  if (print_config) {  // checked first: a file printed here is one the server takes
    std::cout << printable_config(app);
    return 0;
  }
  return o;
}

}  // namespace kvstrand::server
