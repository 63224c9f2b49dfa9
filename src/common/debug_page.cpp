#include "common/debug_page.hpp"

namespace kvstrand::common {

std::string debug_page(const std::string& title, const std::vector<std::string>& json_endpoints) {
  std::string list;
  for (const auto& e : json_endpoints) list += (list.empty() ? "\"" : ", \"") + e + "\"";
  return R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>)" +
         title + R"(</title>
<link rel="icon" href="data:,">
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: .3em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f2f2f2; }
#health.ok { color: #176f2c; } #health.bad { color: #b00020; font-weight: bold; }
.empty { color: #888; }
</style></head>
<body>
<h1>)" + title + R"(</h1>
<p>health: <span id="health">?</span> &middot; refreshed <span id="when">never</span> &middot; <a href="/metrics">/metrics</a></p>
<div id="sections"></div>
<script>
"use strict";
const endpoints = [)" + list + R"(];
function cell(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
function table(value) {
  const t = document.createElement("table");
  if (Array.isArray(value)) {
    if (value.length === 0) { const p = document.createElement("p"); p.className = "empty"; p.textContent = "none"; return p; }
    const cols = Object.keys(value[0]);
    const head = t.insertRow();
    for (const c of cols) { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); }
    for (const row of value) { const r = t.insertRow(); for (const c of cols) r.insertCell().textContent = cell(row[c]); }
  } else {
    for (const [k, v] of Object.entries(value)) {
      const r = t.insertRow();
      const th = document.createElement("th"); th.textContent = k; r.appendChild(th);
      if (v !== null && typeof v === "object") r.insertCell().appendChild(table(v));
      else r.insertCell().textContent = cell(v);
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
      const body = box.lastChild; body.replaceChildren(table(await r.json()));
    } catch (e) { box.lastChild.textContent = "unavailable"; }
  }
  document.getElementById("when").textContent = new Date().toLocaleTimeString();
}
refresh();
setInterval(refresh, 2000);
</script>
</body></html>
)";
}

}  // namespace kvstrand::common
