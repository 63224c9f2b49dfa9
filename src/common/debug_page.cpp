#include "common/debug_page.hpp"

#include <boost/json.hpp>
#include <cstdio>
#include <optional>
#include <string_view>

namespace kvstrand::common {

namespace {

std::string escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

bool is_bytes(std::string_view key) { return key.size() >= 5 && key.substr(key.size() - 5) == "bytes"; }

// The same tables the script builds (table() below), from the same JSON.
std::string cell(const boost::json::value& v, std::string_view key = {}) {
  if (is_bytes(key) && (v.is_int64() || v.is_uint64()))
    return "<span title=\"" + cell(v) + " B\">" + page_bytes(v.to_number<double>()) + "</span>";
  switch (v.kind()) {
    case boost::json::kind::null: return "";
    case boost::json::kind::string: return escaped(v.get_string());
    case boost::json::kind::int64: return std::to_string(v.get_int64());
    case boost::json::kind::uint64: return std::to_string(v.get_uint64());
    case boost::json::kind::double_: return page_number(v.get_double());
    case boost::json::kind::bool_: return v.get_bool() ? "true" : "false";
    default: return escaped(boost::json::serialize(v));
  }
}

std::string table(const boost::json::value& v) {
  if (const auto* a = v.if_array()) {
    if (a->empty() || !a->front().is_object()) return "<p class=\"empty\">none</p>";
    std::string t = "<table><tr>";
    for (const auto& [k, x] : a->front().as_object()) t += "<th>" + escaped(k) + "</th>";
    t += "</tr>";
    for (const auto& row : *a) {
      t += "<tr>";
      for (const auto& [k, x] : a->front().as_object()) {
        const auto* o = row.if_object();
        t += "<td>" + (o && o->contains(k) ? cell(o->at(k), k) : std::string()) + "</td>";
      }
      t += "</tr>";
    }
    return t + "</table>";
  }
  if (const auto* o = v.if_object()) {
    std::string t = "<table>";
    for (const auto& [k, x] : *o)
      t += "<tr><th>" + escaped(k) + "</th><td>" + (x.is_object() ? table(x) : cell(x, k)) + "</td></tr>";
    return t + "</table>";
  }
  return cell(v);
}

std::string page(const std::string& title, const std::vector<std::string>& json_endpoints, const HttpRoutes& routes,
                 const HttpRoutes::mapped_type* healthz, const std::string& summary_script) {
  std::string list;
  for (const auto& e : json_endpoints) list += (list.empty() ? "\"" : ", \"") + e + "\"";
  std::string health = "?";
  std::string health_class;
  if (healthz != nullptr) {
    const HttpResponse h = (*healthz)();
    health = escaped(h.body);
    while (!health.empty() && health.back() == '\n') health.pop_back();
    health_class = h.status == 200 ? "ok" : "bad";
  }
  std::string sections;
  for (const auto& e : json_endpoints) {
    std::string body = "unavailable";
    if (auto it = routes.find(e); it != routes.end()) {
      boost::system::error_code ec;
      const boost::json::value v = boost::json::parse(it->second().body, ec);
      if (!ec) body = table(v);
    }
    sections += "<section id=\"" + escaped(e) + "\"><h2>" + escaped(e) + "</h2><div>" + body + "</div></section>\n";
  }
  return R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>)" +
         escaped(title) + R"(</title>
<link rel="icon" href="data:,">
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: .3em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f2f2f2; }
#health.ok { color: #176f2c; } #health.bad { color: #b00020; font-weight: bold; }
.empty { color: #888; }
#summary { display: flex; flex-wrap: wrap; gap: 1.2em; align-items: flex-start; }
#summary .headline { width: 100%; font-size: 1.15em; }
#summary figure { margin: 0; } #summary figcaption { font-size: .9em; color: #444; }
#summary svg { background: #fafafa; border: 1px solid #ddd; }
#summary polyline { fill: none; stroke: #1f5fbf; stroke-width: 1.5; }
</style></head>
<body>
<h1>)" + escaped(title) + R"(</h1>
<p>health: <span id="health" class=")" + health_class + R"(">)" + health + R"(</span> &middot; refreshed <span id="when">on the server</span> &middot; <a href="/metrics">/metrics</a></p>
<div id="summary">)" + std::string(summary_script.empty() ? "" : "<p class=\"empty\">summary: needs scripts</p>") +
         R"(</div>
<div id="sections">)" + sections + R"(</div>
<script>
"use strict";
const endpoints = [)" + list + R"(];
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  const digits = i === 0 || n >= 100 ? 0 : n >= 10 ? 1 : 2;
  return String(Number(n.toFixed(digits))) + " " + units[i];
}
function cell(v, key) {
  if (v === null || v === undefined) return "";
  if (key && key.endsWith("bytes") && Number.isInteger(v)) return bytes(v);
  if (typeof v === "object") return JSON.stringify(v);
  if (typeof v === "number" && !Number.isInteger(v)) return String(Math.round(v * 100) / 100);
  return String(v);
}
function table(value) {
  const t = document.createElement("table");
  if (Array.isArray(value)) {
    if (value.length === 0) { const p = document.createElement("p"); p.className = "empty"; p.textContent = "none"; return p; }
    const cols = Object.keys(value[0]);
    const head = t.insertRow();
    for (const c of cols) { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); }
    for (const row of value) { const r = t.insertRow(); for (const c of cols) r.insertCell().textContent = cell(row[c], c); }
  } else {
    for (const [k, v] of Object.entries(value)) {
      const r = t.insertRow();
      const th = document.createElement("th"); th.textContent = k; r.appendChild(th);
      if (v !== null && typeof v === "object") r.insertCell().appendChild(table(v));
      else r.insertCell().textContent = cell(v, k);
    }
  }
  return t;
}
async function refresh() {
  try {
    const h = await fetch("/healthz");
    const text = (await h.text()).trim();
    const el = document.getElementById("health");
    el.textContent = text; el.className = h.ok ? "ok" : "bad";
  } catch (e) { document.getElementById("health").textContent = "unreachable"; }
  const sections = document.getElementById("sections");
  const data = {};
  for (const ep of endpoints) {
    let box = document.getElementById(ep);
    if (!box) {
      box = document.createElement("section"); box.id = ep;
      const h2 = document.createElement("h2"); h2.textContent = ep; box.appendChild(h2);
      box.appendChild(document.createElement("div"));
      sections.appendChild(box);
    }
    try {
      const r = await fetch(ep);
      data[ep] = await r.json();
      const body = box.lastChild; body.replaceChildren(table(data[ep]));
    } catch (e) { box.lastChild.textContent = "unavailable"; }
  }
  if (typeof summary === "function") {
    try { await summary(data); }
    catch (e) { document.getElementById("summary").textContent = "summary unavailable: " + e; }
  }
  document.getElementById("when").textContent = new Date().toLocaleTimeString();
}
refresh();
setInterval(refresh, 2000);
</script>
)" + (summary_script.empty() ? std::string() : "<script>\n\"use strict\";\n" + summary_script + "\n</script>") + R"(
</body></html>
)";
}


}  // namespace

std::string page_number(double v) {
  if (v == static_cast<double>(static_cast<long long>(v))) return std::to_string(static_cast<long long>(v));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string page_bytes(double v) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t i = 0;
  while (v >= 1024 && i + 1 < std::size(kUnits)) {
    v /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 || v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s + " " + kUnits[i];
}

void add_debug_page(HttpRoutes& routes, const std::string& title, const std::vector<std::string>& json_endpoints,
                    const std::string& summary_script) {
  HttpRoutes parts;
  for (const auto& e : json_endpoints)
    if (auto it = routes.find(e); it != routes.end()) parts[e] = it->second;
  std::optional<HttpRoutes::mapped_type> healthz;
  if (auto it = routes.find("/healthz"); it != routes.end()) healthz = it->second;
  routes["/debug"] = [title, json_endpoints, parts = std::move(parts), healthz = std::move(healthz), summary_script] {
    return HttpResponse{200, "text/html; charset=utf-8",
                        page(title, json_endpoints, parts, healthz ? &*healthz : nullptr, summary_script)};
  };
}

}  // namespace kvstrand::common
