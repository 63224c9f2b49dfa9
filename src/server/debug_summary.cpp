#include "server/debug_summary.hpp"

namespace kvstrand::server {

const std::string& debug_summary_script() {
  static const std::string script = R"JS(
function percent(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + " %"; }
function rate(x) { return x >= 100 ? String(Math.round(x)) : String(Number(x.toFixed(1))); }
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
// A chart of one series over the window: x from the oldest point to now,
// y from 0 to the series' largest value (or `top`).
function chart(title, points, value, shown, top) {
  const w = 320, h = 70, svgns = "http://www.w3.org/2000/svg";
  const fig = el("figure");
  const values = points.map(value);
  const last = values.length ? values[values.length - 1] : null;
  fig.appendChild(el("figcaption", title + ": " + (last === null ? "-" : shown(last))));
  const svg = document.createElementNS(svgns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  const span = points.length ? Math.max(points[0].seconds_ago, 1) : 1;
  const max = top || Math.max(1e-9, ...values.filter((v) => v !== null));
  const xy = [];
  points.forEach((p, i) => {
    if (values[i] === null) return;
    const x = (w - 2) * (1 - p.seconds_ago / span) + 1, y = h - 2 - (h - 4) * values[i] / max;
    xy.push(x.toFixed(1) + "," + y.toFixed(1));
  });
  const line = document.createElementNS(svgns, "polyline");
  line.setAttribute("points", xy.join(" "));
  svg.appendChild(line);
  fig.appendChild(svg);
  return fig;
}
function levels(tier) {
  const t = el("table");
  const cols = [["arena", {
    used: bytes(tier.used_bytes), capacity: bytes(tier.configured_bytes + (tier.segment_bytes || 0)),
    objects: tier.objects,
    health: tier.fill_error ? "cannot grow: " + tier.fill_error
          : tier.ready_bytes < tier.configured_bytes ? "populating " + percent(tier.ready_bytes / tier.configured_bytes)
          : "ok"}]];
  if (tier.disk) {
    const d = tier.disk, errors = d.read_errors + d.write_errors + d.checksum_failures;
    cols.push(["disk", {used: bytes(d.used_bytes), capacity: bytes(d.capacity_bytes), objects: d.objects,
                        health: errors ? errors + " errors" : "ok"}]);
  }
  if (tier.l2) {
    const l = tier.l2;
    cols.push(["L2", {used: "-", capacity: "-", objects: "-",
                      health: l.auth_refused ? "credentials refused" : !l.connected ? "not connected"
                            : l.write_failed + l.unanswered ? (l.write_failed + l.unanswered) + " failed" : "ok"}]);
  }
  const head = t.insertRow();
  head.appendChild(el("th", "level"));
  for (const [name] of cols) head.appendChild(el("th", name));
  for (const row of ["used", "capacity", "objects", "health"]) {
    const r = t.insertRow();
    r.appendChild(el("th", row));
    for (const [, c] of cols) r.insertCell().textContent = String(c[row]);
  }
  const fig = el("figure");
  fig.appendChild(el("figcaption", "levels"));
  fig.appendChild(t);
  return fig;
}
async function summary(data) {
  const tier = data["/debug/tier"];
  if (!tier) return;
  const history = await (await fetch("/debug/history")).json();
  const points = history.points;
  const box = document.getElementById("summary");
  const capacity = tier.configured_bytes + (tier.segment_bytes || 0);
  const minutes = history.window_seconds / 60;
  const head = el("p", "", "headline");
  head.id = "headline";
  head.textContent = "hit rate " + percent(history.window_hit_rate) + " over the last " +
      (minutes >= 1 ? minutes.toFixed(1) + " min" : Math.round(history.window_seconds) + " s") +
      " \u00b7 fill " + percent(tier.used_bytes / capacity) + " (" + bytes(tier.used_bytes) + " of " +
      bytes(capacity) + ") \u00b7 " + tier.objects + " objects \u00b7 " + tier.leases + " leases";
  box.replaceChildren(head,
      chart("hit rate", points, (p) => p.hit_rate, percent, 1),
      chart("chunks loaded a second", points, (p) => p.loads_per_s, rate),
      chart("chunks saved a second", points, (p) => p.saves_per_s, rate),
      chart("evictions a second", points, (p) => p.evictions_per_s, rate),
      chart("fill", points, (p) => p.used_bytes / capacity, percent, 1),
      levels(tier));
}
)JS";
  return script;
}

}  // namespace kvstrand::server
