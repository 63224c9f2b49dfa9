// kvstrand-server's options: every flag round-trips through a --config
// file (--print-config writes the options in force, --config reads them
// back), the command line wins over the file, and a file's bad or unknown
// key is refused naming it.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "server/server_options.hpp"

using namespace kvstrand;
using server::ServerOptions;

namespace {

// A directory of this process's own for the files the tests write, removed
// at exit (CTest runs each case as a process of its own: one directory each).
const std::string& scratch_dir() {
  struct Scratch {
    std::string path = "/tmp/kvstrand-options.XXXXXX";
    Scratch() { REQUIRE(::mkdtemp(path.data()) != nullptr); }
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Scratch dir;
  return dir.path;
}

// Every field of the options, as text: two options are the same when this is.
std::string describe(const ServerOptions& o) {
  std::ostringstream s;
  s << "socket=" << o.socket << " tier=" << o.tier_bytes << " slab=" << o.slab_bytes << " huge=" << o.huge_pages
    << " arena=" << o.arena_path << " chunk=" << o.chunk_tokens << " log=" << o.log_level << " frame=" << o.max_frame
    << " leased=" << o.max_client_leased << " reserved=" << o.max_client_reserved << " queue=" << o.max_reply_queue;
  if (o.http) s << " http=" << o.http->address << ":" << o.http->port << "/" << o.http->allow_non_loopback;
  if (o.l2) {
    s << " l2=";
    for (const auto& a : o.l2->seeds) s << a.str() << ",";
    s << " l2.timeout=" << o.l2->timeout.count() << " l2.inflight=" << o.l2->max_inflight << " l2.ttl="
      << o.l2->ttl.count() << " l2.user=" << o.l2->credentials.username << " l2.password="
      << o.l2->credentials.password << " l2.mac=" << (o.l2->mac ? o.l2->mac->secret : "-");
  }
  if (o.disk) {
    s << " disk=";
    for (const auto& p : o.disk->paths) s << p << ",";
    s << " disk.bytes=" << o.disk->bytes << " disk.timeout=" << o.disk->timeout.count() << " disk.queue="
      << o.disk->max_queued;
  }
  for (const auto& [name, q] : o.tenant_quotas) s << " tenant." << name << "=" << q;
  for (const auto& [name, q] : o.tenant_segments) s << " segment." << name << "=" << q;
  for (const auto& name : o.public_tenants) s << " public." << name;
  if (o.tenant_default_quota) s << " tenant.default=" << *o.tenant_default_quota;
  for (const auto& [uid, name] : o.binding.uids) s << " uid." << uid << "=" << name;
  for (const auto& [gid, name] : o.binding.gids) s << " gid." << gid << "=" << name;
  if (o.binding.admin_gid) s << " admin=" << *o.binding.admin_gid;
  if (o.socket_gid) s << " socket-group=" << *o.socket_gid;
  if (o.events)
    s << " events=" << o.events->endpoint << " replay=" << o.events->replay_endpoint << " topic=" << o.events->topic
      << " format=" << server::to_string(o.events->format) << " buffer=" << o.events->buffer;
  return s.str();
}

struct Parsed {
  std::variant<ServerOptions, int> result;
  std::string out, err;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kvstrand-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  auto r = server::parse_server_options(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {std::move(r), out.str(), err.str()};
}

// The command line is refused, naming `flag` and saying `why`.
void refused(std::vector<std::string> args, const std::string& flag, const std::string& why) {
  auto r = parse(std::move(args));
  INFO(r.err);
  REQUIRE(std::holds_alternative<int>(r.result));
  REQUIRE(r.err.find("invalid " + flag) != std::string::npos);
  REQUIRE(r.err.find(why) != std::string::npos);
}

std::string write_file(const std::string& name, const std::string& text, mode_t mode = 0600) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

}  // namespace

TEST_CASE("server options: every flag round-trips through --print-config and --config", "[server]") {
  const std::string password = write_file("l2-password", "s3cret\n");
  const std::string mac = write_file("l2-mac-key", std::string(40, 'k') + "\n");
  const std::vector<std::string> every = {
      "--socket", scratch_dir() + "/opts.sock", "--tier-bytes", "64M", "--slab-bytes", "4M",
      "--no-huge-pages", "--arena-path", scratch_dir() + "/arena", "--chunk-tokens", "128",
      "--log-level", "warn", "--max-frame", "2M", "--max-client-leased", "40M", "--max-client-reserved", "20M",
      "--max-reply-queue", "1M", "--http", "127.0.0.1:9411", "--http-allow-remote",
      "--l2", "redis://127.0.0.1:7001,127.0.0.1:7002", "--l2-timeout", "250", "--l2-max-inflight", "64",
      "--l2-ttl", "3600", "--l2-user", "kvs", "--l2-password-file", password, "--l2-mac-key-file", mac,
      "--disk", scratch_dir() + "/d1", "--disk", scratch_dir() + "/d2", "--disk-bytes", "1G",
      "--disk-timeout", "750", "--disk-queue", "99", "--events", "tcp://127.0.0.1:5557",
      "--events-replay", "ipc://" + scratch_dir() + "/replay", "--events-topic", "kv-events",
      "--events-format", "array", "--events-buffer", "500", "--tenant-quota", "team-a=16M",
      "--tenant-quota", "team-b=8M", "--tenant-quota-default", "4M", "--tenant-uid", "team-a=61001",
      "--tenant-gid", "team-b=61002", "--admin-group", "61003", "--socket-group", "61004"};
  auto direct = parse(every);
  INFO(direct.err);
  REQUIRE(std::holds_alternative<ServerOptions>(direct.result));
  const std::string want = describe(std::get<ServerOptions>(direct.result));

  auto args = every;
  args.push_back("--print-config");
  auto printed = parse(args);
  REQUIRE(std::get<int>(printed.result) == 0);
  INFO(printed.out);
  const std::string file = write_file("server.toml", printed.out);
  auto from_file = parse({"--config", file});
  INFO(from_file.err);
  REQUIRE(std::holds_alternative<ServerOptions>(from_file.result));
  REQUIRE(describe(std::get<ServerOptions>(from_file.result)) == want);

  // The defaults round-trip too (every key commented out), and the command line wins.
  auto defaults = parse({"--print-config"});
  const std::string empty = write_file("defaults.toml", defaults.out);
  auto again = parse({"--config", empty, "--tier-bytes", "64M"});
  REQUIRE(std::holds_alternative<ServerOptions>(again.result));
  REQUIRE(describe(std::get<ServerOptions>(again.result)) ==
          describe(std::get<ServerOptions>(parse({"--tier-bytes", "64M"}).result)));
  auto wins = parse({"--config", file, "--chunk-tokens", "256"});
  REQUIRE(std::get<ServerOptions>(wins.result).chunk_tokens == 256);
  REQUIRE(std::get<ServerOptions>(wins.result).tier_bytes == 64u << 20);
}

TEST_CASE("server options: a config file's bad value or unknown key is refused, naming it", "[server]") {
  auto bad = parse({"--config", write_file("bad.toml", "tier-bytes = \"lots\"\n")});
  REQUIRE(std::get<int>(bad.result) == 2);
  REQUIRE(bad.err.find("--tier-bytes") != std::string::npos);
  auto unknown = parse({"--config", write_file("unknown.toml", "tier-byte = \"8G\"\n")});
  REQUIRE(std::get<int>(unknown.result) == 2);
  REQUIRE(unknown.err.find("tier-byte") != std::string::npos);
  auto orphan = parse({"--config", write_file("orphan.toml", "l2-timeout = 50\n")});
  REQUIRE(std::get<int>(orphan.result) == 2);
  REQUIRE(orphan.err.find("--l2-timeout: needs --l2") != std::string::npos);
  auto missing = parse({"--config", scratch_dir() + "/no-such.toml"});
  REQUIRE(std::get<int>(missing.result) == 2);
}

TEST_CASE("server options: the --events flags are checked at start-up, each naming itself", "[server][events]") {
  const auto refused = [](std::vector<std::string> args, const std::string& flag) {
    auto r = parse(std::move(args));
    INFO(r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(std::get<int>(r.result) == 2);
    REQUIRE(r.err.find("invalid " + flag) != std::string::npos);
  };
  refused({"--events", "127.0.0.1:5557"}, "--events");  // no transport
  refused({"--events", "tcp://127.0.0.1"}, "--events");  // no port
  refused({"--events", "tcp://127.0.0.1:5557", "--events-replay", "tcp://127.0.0.1:5557"}, "--events-replay");
  refused({"--events", "ipc:///tmp/e", "--events-format", "json"}, "--events-format");
  refused({"--events", "ipc:///tmp/e", "--events-buffer", "-1"}, "--events-buffer");
  refused({"--events-topic", "kv"}, "--events-topic");  // needs --events
  auto ok = parse({"--events", "ipc:///tmp/e"});
  REQUIRE(std::holds_alternative<ServerOptions>(ok.result));
  REQUIRE(std::get<ServerOptions>(ok.result).events->format == server::EventFormat::map);  // vLLM main's
  REQUIRE(std::get<ServerOptions>(ok.result).events->buffer == 10000);
}

TEST_CASE("server options: tenant quotas are NAME=BYTES, named once, and add up to no more than the tier",
          "[server][tenants]") {
  refused({"--tier-bytes", "64M", "--tenant-quota", "team-a"}, "--tenant-quota", "NAME=BYTES");
  refused({"--tier-bytes", "64M", "--tenant-quota", "team a=1M"}, "--tenant-quota", "letters");
  refused({"--tier-bytes", "64M", "--tenant-quota", "a=1M", "--tenant-quota", "a=2M"}, "--tenant-quota", "twice");
  refused({"--tier-bytes", "64M", "--tenant-quota", "a=40M", "--tenant-quota", "b=40M"}, "--tenant-quota",
          "more than --tier-bytes");
  refused({"--tier-bytes", "64M", "--tenant-quota-default", "1G"}, "--tenant-quota-default", "--tier-bytes");
  auto ok = parse({"--tier-bytes", "64M", "--tenant-quota", "a=40M", "--tenant-quota", "b=24M"});
  REQUIRE(std::holds_alternative<ServerOptions>(ok.result));
  REQUIRE(std::get<ServerOptions>(ok.result).tenant_quotas.at("b") == 24u << 20);
}

TEST_CASE("server options: tenants bound to users and groups, as flags or [tenants.NAME] tables, other users' "
          "clients need --socket-group",
          "[server][tenants][trust]") {
  refused({"--tenant-uid", "team-a=61001"}, "--tenant-uid", "--socket-group");
  refused({"--admin-group", "61001"}, "--admin-group", "--socket-group");
  refused({"--tenant-uid", "team-a", "--socket-group", "0"}, "--tenant-uid", "NAME=USER");
  refused({"--tenant-uid", "team-a=no-such-user-of-kvstrand", "--socket-group", "0"}, "--tenant-uid", "NAME=USER");
  refused({"--tenant-gid", "team a=61001", "--socket-group", "0"}, "--tenant-gid", "letters");
  refused({"--tenant-uid", "team-a=61001", "--tenant-uid", "team-b=61001", "--socket-group", "0"}, "--tenant-uid",
          "one tenant each");
  // The same user named twice for the same tenant (a flag and a table, say) is one mapping, not a conflict.
  REQUIRE(std::holds_alternative<ServerOptions>(
      parse({"--tenant-uid", "team-a=61001", "--tenant-uid", "team-a=61001", "--socket-group", "0"}).result));
  refused({"--tenant-uid", "team-a=" + std::to_string(::geteuid()), "--socket-group", "0"}, "--tenant-uid",
          "the server's own");
  refused({"--socket-group", "no-such-group-of-kvstrand"}, "--socket-group", "not a group");
  auto flags = parse({"--tenant-uid", "team-a=61001", "--tenant-uid", "team-a=nobody", "--tenant-gid", "team-b=nogroup",
                      "--socket-group", "61000"});
  INFO(flags.err);
  const auto& o = std::get<ServerOptions>(flags.result);
  REQUIRE(o.binding.uids.at(61001) == "team-a");
  REQUIRE(o.binding.uids.at(65534) == "team-a");  // Debian's nobody
  REQUIRE(o.binding.gids.at(65534) == "team-b");  // and nogroup
  REQUIRE(o.socket_gid == 61000u);

  auto tables = parse({"--config", write_file("tenants.toml", "tier-bytes = \"64M\"\nsocket-group = 61000\n"
                                                               "[tenants.team-a]\nuids = [61001, \"nobody\"]\n"
                                                               "gids = [61010]\nquota = \"8M\"\n"
                                                               "[tenants.team-b]\nuids = [61002]\n")});
  INFO(tables.err);
  const auto& t = std::get<ServerOptions>(tables.result);
  REQUIRE(t.binding.uids == std::map<uid_t, std::string>{{61001, "team-a"}, {61002, "team-b"}, {65534, "team-a"}});
  REQUIRE(t.binding.gids == std::map<gid_t, std::string>{{61010, "team-a"}});
  REQUIRE(t.tenant_quotas == std::map<std::string, std::uint64_t>{{"team-a", 8u << 20}});
  const auto bad_table = [](const std::string& name, const std::string& text, const std::string& says) {
    auto r = parse({"--config", write_file(name, text)});
    INFO(r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(r.err.find(says) != std::string::npos);
  };
  bad_table("quota.toml", "[tenants.team-a]\nquota = 8\n", "needs a size with a unit");
  bad_table("users.toml", "[tenants.team-a]\nusers = [1]\n", "no key 'users'");
  bad_table("both.toml", "tenant-quota = [\"team-a=8M\"]\n[tenants.team-a]\nuids = [1]\n", "not both");
  bad_table("flat.toml", "[tenants]\nteam-a = 1\n", "is not a [tenants.team-a] table");
}

TEST_CASE("server options: a tenant's segment is whole slabs, for a tenant bound to users, and not with a named "
          "arena",
          "[server][tenants][trust]") {
  const std::vector<std::string> bound = {"--tier-bytes", "64M", "--slab-bytes", "4M", "--tenant-uid",
                                          "team-a=61001", "--socket-group", "61000"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), bound.begin(), bound.end());
    return more;
  };
  refused(with({"--tenant-segment", "team-a"}), "--tenant-segment", "NAME=BYTES");
  refused(with({"--tenant-segment", "team-b=8M"}), "--tenant-segment", "--tenant-uid team-b=USER");
  refused(with({"--tenant-segment", "team-a=8M", "--tenant-segment", "team-a=4M"}), "--tenant-segment", "twice");
  refused(with({"--tenant-segment", "team-a=8M", "--arena-path", scratch_dir() + "/seg-arena"}), "--tenant-segment",
          "--arena-path");
  refused(with({"--tenant-segment", "team-a=100000G"}), "--tenant-segment", "more than this machine");
  // Each segment is a pool of its own beside the arena's: the classes' bound
  // holds 63 segments, not 64.
  for (const std::size_t segments : {63u, 64u}) {
    std::vector<std::string> many = bound;
    for (std::size_t i = 0; i < segments; ++i) {
      const std::string name = "t" + std::to_string(i);
      many.insert(many.end(), {"--tenant-uid", name + "=" + std::to_string(62000 + i), "--tenant-segment", name + "=4M"});
    }
    auto r = parse(many);
    INFO(r.err);
    REQUIRE(std::holds_alternative<ServerOptions>(r.result) == (segments == 63));
  }
  auto ok = parse(with({"--tenant-segment", "team-a=5M"}));
  INFO(ok.err);
  REQUIRE(std::get<ServerOptions>(ok.result).tenant_segments.at("team-a") == 8u << 20);  // two 4M slabs
  // From a config file's table, and round-tripped through --print-config.
  auto tables = parse({"--config", write_file("segment.toml", "tier-bytes = \"64M\"\nslab-bytes = \"4M\"\n"
                                                               "socket-group = 61000\n[tenants.team-a]\n"
                                                               "uids = [61001]\nsegment = \"8M\"\n")});
  INFO(tables.err);
  const auto& t = std::get<ServerOptions>(tables.result);
  REQUIRE(t.tenant_segments == std::map<std::string, std::uint64_t>{{"team-a", 8u << 20}});
  auto printed = parse(with({"--tenant-segment", "team-a=8M", "--print-config"}));
  auto again = parse({"--config", write_file("segment-printed.toml", printed.out)});
  INFO(again.err);
  REQUIRE(describe(std::get<ServerOptions>(again.result)) == describe(t));
}

TEST_CASE("server options: a published tenant (--public-tenant, public = true) has a segment of its own",
          "[server][tenants][trust]") {
  const std::vector<std::string> bound = {"--tier-bytes", "64M", "--slab-bytes", "4M", "--tenant-uid", "team-a=61001",
                                          "--tenant-uid", "team-b=61002", "--socket-group", "61000",
                                          "--tenant-segment", "team-a=8M"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), bound.begin(), bound.end());
    return more;
  };
  // In the arena, which every client maps read-write, it could not be read-only.
  refused(with({"--public-tenant", "team-b"}), "--public-tenant", "no --tenant-segment");
  refused(with({"--public-tenant", "team-a", "--public-tenant", "team-a"}), "--public-tenant", "twice");
  refused(with({"--public-tenant", "bad name"}), "--public-tenant", "letters");
  auto ok = parse(with({"--public-tenant", "team-a"}));
  INFO(ok.err);
  REQUIRE(std::get<ServerOptions>(ok.result).public_tenants == std::set<std::string>{"team-a"});
  auto tables = parse({"--config", write_file("public.toml", "tier-bytes = \"64M\"\nslab-bytes = \"4M\"\n"
                                                              "socket-group = 61000\n[tenants.team-a]\n"
                                                              "uids = [61001]\nsegment = \"8M\"\npublic = true\n"
                                                              "[tenants.team-b]\nuids = [61002]\npublic = false\n")});
  INFO(tables.err);
  const auto& t = std::get<ServerOptions>(tables.result);
  REQUIRE(t.public_tenants == std::set<std::string>{"team-a"});
  auto printed = parse(with({"--public-tenant", "team-a", "--print-config"}));
  auto again = parse({"--config", write_file("public-printed.toml", printed.out)});
  INFO(again.err);
  REQUIRE(describe(std::get<ServerOptions>(again.result)) == describe(t));
  auto not_bool = parse({"--config", write_file("public-bad.toml", "[tenants.team-a]\nuids = [61001]\npublic = 1\n")});
  REQUIRE(not_bool.err.find("tenants.team-a.public is not true or false") != std::string::npos);
}

TEST_CASE("server options: --drop-namespace reads no server option, and takes 64 hex digits only", "[server]") {
  const std::string ns(64, 'a');
  auto drop = parse({"--socket", "/tmp/x.sock", "--drop-namespace", ns, "--tier-bytes", "999999T"});
  REQUIRE(std::holds_alternative<ServerOptions>(drop.result));
  REQUIRE(std::get<ServerOptions>(drop.result).drop_namespace == ns);
  for (const std::string& bad : {std::string(63, 'a'), std::string(64, 'g'), std::string(65, 'a')}) {
    auto r = parse({"--drop-namespace", bad});
    REQUIRE(std::get<int>(r.result) == 2);
    REQUIRE(r.err.find("invalid --drop-namespace") != std::string::npos);
  }
}

TEST_CASE("server options: --drop-tenant reads no server option, and takes a tenant's name only", "[server]") {
  auto drop = parse({"--socket", "/tmp/x.sock", "--drop-tenant", "team-a", "--tier-bytes", "999999T"});
  REQUIRE(std::holds_alternative<ServerOptions>(drop.result));
  REQUIRE(std::get<ServerOptions>(drop.result).drop_tenant == "team-a");
  auto bad = parse({"--drop-tenant", "team a"});
  REQUIRE(std::get<int>(bad.result) == 2);
  REQUIRE(bad.err.find("invalid --drop-tenant") != std::string::npos);
}

TEST_CASE("server options: --check reads no server option, and --check-wait needs --check", "[server]") {
  auto check = parse({"--check", "/tmp/x.sock", "--check-wait", "3", "--tier-bytes", "999999T"});
  REQUIRE(std::holds_alternative<ServerOptions>(check.result));
  REQUIRE(std::get<ServerOptions>(check.result).check == "/tmp/x.sock");
  REQUIRE(std::get<ServerOptions>(check.result).check_within == std::chrono::seconds(3));
  REQUIRE(std::get<int>(parse({"--check-wait", "3"}).result) == 2);
}

TEST_CASE("server options: a careless config file is refused, naming what to do", "[server]") {
  const auto refused = [](const std::string& path, const std::string& says) {
    auto r = parse({"--config", path});
    INFO(r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(std::get<int>(r.result) == 2);
    REQUIRE(r.err.find("invalid --config") != std::string::npos);
    REQUIRE(r.err.find(says) != std::string::npos);
  };
  // TOML forbids a key twice; CLI11's INI reader kept the first silently.
  refused(write_file("twice.toml", "tier-bytes = \"8G\"\ntier-bytes = \"16G\"\n"), "line 2");
  // A size is written with its unit: 64 was 64 bytes, a 2 MiB tier.
  refused(write_file("bare.toml", "tier-bytes = 64\n"), "needs a unit");
  refused(write_file("bare-string.toml", "tier-bytes = \"64\"\n"), "needs a unit");
  refused(write_file("bare-quota.toml", "tenant-quota = [\"team-a=4096\"]\n"), "needs a unit");
  // Paths do not depend on where the server was started.
  refused(write_file("relative.toml", "disk = [\"5\"]\ndisk-bytes = \"1G\"\n"), "not an absolute path");
  refused(write_file("relative-socket.toml", "socket = \"kv.sock\"\n"), "not an absolute path");
  refused(write_file("relative-token.toml", "http = \"127.0.0.1:0\"\nhttp-token-file = \"token\"\n"),
          "not an absolute path");
  refused(write_file("table.toml", "[http]\nx = 1\n"), "is a table");
  // Only its owner (or root) may change what chooses where the KV goes.
  refused(write_file("open.toml", "tier-bytes = \"8G\"\n", 0666), "chmod go-w");
  const std::string theirs = write_file("theirs.toml", "tier-bytes = \"8G\"\n");
  if (::geteuid() == 0) {
    REQUIRE(::chown(theirs.c_str(), 4242, 4242) == 0);
    refused(theirs, "owned by uid 4242");
  }
  // Nothing that is not a regular file: each of these hung the start.
  refused("/dev/zero", "not a regular file");
  const std::string fifo = scratch_dir() + "/fifo.toml";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  refused(fifo, "not a regular file");
  // A well-formed file is still taken, and a config file's sizes with units are.
  auto ok = parse({"--config", write_file("fine.toml", "tier-bytes = \"64M\"\nchunk-tokens = 128\nno-huge-pages = true\n")});
  INFO(ok.err);
  REQUIRE(std::holds_alternative<ServerOptions>(ok.result));
  REQUIRE(std::get<ServerOptions>(ok.result).tier_bytes == 64u << 20);
  REQUIRE(std::get<ServerOptions>(ok.result).chunk_tokens == 128);
}

TEST_CASE("server options: a symbolic link on the way to --disk, --arena-path or --socket is refused unless root's",
          "[server]") {
  if (::geteuid() != 0) return;  // lchown to another user needs root
  const std::string real = scratch_dir() + "/real";
  ::mkdir(real.c_str(), 0700);
  const std::string theirs = scratch_dir() + "/theirs-link", roots = scratch_dir() + "/roots-link";
  ::unlink(theirs.c_str());
  ::unlink(roots.c_str());
  REQUIRE(::symlink(real.c_str(), theirs.c_str()) == 0);
  REQUIRE(::lchown(theirs.c_str(), 4242, 4242) == 0);
  REQUIRE(::symlink(real.c_str(), roots.c_str()) == 0);
  for (const auto& [flag, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--disk", {"--disk", theirs + "/kv", "--disk-bytes", "1G"}},
           {"--arena-path", {"--arena-path", theirs + "/arena"}},
           {"--socket", {"--socket", theirs + "/kv.sock"}}}) {
    auto r = parse(args);
    INFO(flag << ": " << r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(r.err.find("invalid " + flag) != std::string::npos);
    REQUIRE(r.err.find("symbolic link owned by uid 4242") != std::string::npos);
  }
  // A link root made (the system's own, /var/run say) is followed.
  auto fine = parse({"--socket", roots + "/kv.sock", "--arena-path", roots + "/arena"});
  INFO(fine.err);
  REQUIRE(std::holds_alternative<ServerOptions>(fine.result));
}

TEST_CASE("server options: limits on tenants, objects and event memory have flags, each checked", "[server]") {
  auto o = parse({"--max-tenants", "8", "--min-object-bytes", "16K", "--max-index-bytes", "64M",
                  "--events", "tcp://127.0.0.1:5599", "--events-buffer-bytes", "8M", "--events-queue-bytes", "32M"});
  INFO(o.err);
  REQUIRE(std::holds_alternative<ServerOptions>(o.result));
  const auto& opts = std::get<ServerOptions>(o.result);
  REQUIRE(opts.max_tenants == 8);
  REQUIRE(opts.min_object_bytes == 16u << 10);
  REQUIRE(opts.max_index_bytes == 64u << 20);
  REQUIRE(opts.events->buffer_bytes == 8u << 20);
  REQUIRE(opts.events->queue_bytes == 32u << 20);
  const auto refused = [](std::vector<std::string> args, const std::string& flag) {
    auto r = parse(std::move(args));
    INFO(r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(r.err.find("invalid " + flag) != std::string::npos);
  };
  refused({"--max-tenants", "0"}, "--max-tenants");
  refused({"--max-tenants", "70000"}, "--max-tenants");
  refused({"--max-tenants", "2", "--tenant-quota", "a=1M", "--tenant-quota", "b=1M"}, "--max-tenants");
  refused({"--min-object-bytes", "0"}, "--min-object-bytes");
  refused({"--max-index-bytes", "1K"}, "--max-index-bytes");
  refused({"--events-buffer-bytes", "8M"}, "--events-buffer-bytes");  // needs --events
  refused({"--events", "tcp://127.0.0.1:5599", "--events-queue-bytes", "1K"}, "--events-queue-bytes");
}

TEST_CASE("server options: events on a non-loopback address are refused without --events-allow-remote",
          "[server][events]") {
  // Every prompt's token ids go out on them: --events tcp://0.0.0.0:... was
  // taken with no opt-in, where --http needs one.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--events", "tcp://0.0.0.0:5599"},
           {"--events", "tcp://*:5599"},
           {"--events", "tcp://127.0.0.1:5599", "--events-replay", "tcp://10.1.2.3:5600"}}) {
    auto r = parse(args);
    INFO(r.err);
    REQUIRE(std::holds_alternative<int>(r.result));
    REQUIRE(r.err.find("--events-allow-remote") != std::string::npos);
  }
  auto meant = parse({"--events", "tcp://0.0.0.0:5599", "--events-allow-remote"});
  REQUIRE(std::holds_alternative<ServerOptions>(meant.result));
  for (const std::string& e : {"tcp://127.0.0.1:5599", "tcp://localhost:5599", "tcp://[::1]:5599", "ipc:///tmp/ev"})
    REQUIRE(std::holds_alternative<ServerOptions>(parse({"--events", e}).result));
  REQUIRE(std::get<int>(parse({"--events-allow-remote"}).result) == 2);  // needs --events
  // The media's names: vLLM's by default, SGLang's on request, nothing else.
  auto vllm = parse({"--events", "tcp://127.0.0.1:5599"});
  REQUIRE(std::get<ServerOptions>(vllm.result).events->disk_medium == "STORAGE");
  auto sglang = parse({"--events", "tcp://127.0.0.1:5599", "--events-medium-names", "sglang"});
  REQUIRE(std::get<ServerOptions>(sglang.result).events->arena_medium == "CPU_PINNED");
  REQUIRE(std::get<ServerOptions>(sglang.result).events->disk_medium == "DISK");
  auto other = parse({"--events", "tcp://127.0.0.1:5599", "--events-medium-names", "dynamo"});
  REQUIRE(std::get<int>(other.result) == 2);
  REQUIRE(other.err.find("invalid --events-medium-names") != std::string::npos);
}

TEST_CASE("server options: --tier-bytes auto, the default, starts on a small host: 8G, or half the memory available",
          "[server]") {
  const auto tier_with = [](const char* available_mib, std::vector<std::string> flags) {
    ::setenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB", available_mib, 1);
    auto r = parse(flags);
    ::unsetenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB");
    INFO(r.err);
    return std::holds_alternative<ServerOptions>(r.result) ? std::get<ServerOptions>(r.result).tier_bytes : 0;
  };
  REQUIRE(tier_with("4096", {}) == 2ull << 30);  // 4 GiB available: half of it
  REQUIRE(tier_with("65536", {}) == 8ull << 30);
  REQUIRE(tier_with("4096", {"--tier-bytes", "auto"}) == 2ull << 30);
  REQUIRE(tier_with("4096", {"--tier-bytes", "8G"}) == 0);  // asked for: refused, naming the flag
  // Half of 3000 MiB is rounded up to whole slabs: the log says so only of a size the operator gave.
  ::setenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB", "3000", 1);
  const auto odd = parse({});
  const auto given = parse({"--tier-bytes", "1500M"});
  ::unsetenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB");
  REQUIRE(std::get<ServerOptions>(odd.result).tier_bytes == std::get<ServerOptions>(given.result).tier_bytes);
  REQUIRE(std::get<ServerOptions>(odd.result).tier_bytes > 1500ull << 20);
  REQUIRE(std::get<ServerOptions>(odd.result).tier_bytes_rounded_from.empty());
  REQUIRE(std::get<ServerOptions>(given.result).tier_bytes_rounded_from == "1500M");
}
