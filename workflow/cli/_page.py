# The page's JavaScript and HTML are data here, written for a browser, not for the Python
# line length; and its typographic dashes and signs are meant for the reader.
# ruff: noqa: E501, RUF001

"""The timeline page: HTML, CSS and JavaScript in one string, with no network access.

Kept inline (not a package data file) so that any install of the package can write the
page. ``__TITLE__`` and ``__DATA__`` are replaced by ``render_page``.

The script's fold (:data:`FOLD_SCRIPT`, its ``APPLY`` one function a record kind) is the
fold of ``workflow/_fold.py`` over the page's compact columns: queues, steps in progress,
context, waiters, collect buffers and status. It touches no DOM, so tests/test_page.py runs
it alone in node, against the journal's payload types and the Python fold. Opening the page
with ``#selftest`` writes the state after every commit into ``<pre id="selftest">``, which
the browser tests compare with the Python fold.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FOLD_SCRIPT", "PAGE"]

_PAGE: Final = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { --fg:#1d2330; --muted:#667085; --line:#d0d5dd; --bg:#fff; --alt:#f6f7f9;
  --ok:#3a9d5d; --failed:#d92d20; --conflict:#f79009; --wait:#98a2b3; --lost:#7a5af8;
  --cancelled:#c1c7d0; --open:#2e90fa; --sel:#e31b54; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
header { padding: 10px 16px 4px; }
h1 { font-size: 17px; margin: 0 0 2px; }
h2 { font-size: 14px; margin: 0 0 6px; }
h3 { font-size: 12px; margin: 10px 0 3px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
code, td.v, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; }
a { color: #175cd3; }
.meta { color: var(--muted); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; color: #fff;
  font-weight: 600; background: var(--muted); }
.badge.finished { background: var(--ok); } .badge.failed { background: var(--failed); }
.badge.running { background: var(--open); } .badge.waiting { background: var(--wait); }
.badge.interrupted { background: var(--lost); } .badge.cancelled,
.badge.timed_out { background: #475467; }
nav { display: flex; gap: 6px; align-items: center; padding: 6px 16px;
  border-bottom: 1px solid var(--line); flex-wrap: wrap; }
nav input { width: 90px; }
nav .sep { width: 12px; }
.legend span { display: inline-flex; align-items: center; gap: 3px; margin-right: 8px; }
.legend i { display: inline-block; width: 14px; height: 9px; border-radius: 2px; }
#chart { display: flex; border-bottom: 1px solid var(--line); }
#labels { flex: none; background: var(--bg); border-right: 1px solid var(--line); }
#scroll { overflow-x: auto; overflow-y: hidden; flex: 1; }
#svg { display: block; cursor: crosshair; }
.bar.ok { fill: var(--ok); } .bar.failed { fill: var(--failed); }
.bar.conflict { fill: var(--conflict); } .bar.lost { fill: var(--lost); }
.bar.cancelled { fill: var(--cancelled); } .bar.open { fill: var(--open); }
.bar.wait { fill: url(#hatch); stroke: var(--wait); }
.bar.retry { stroke: #101828; stroke-width: 1; stroke-dasharray: 2 1; }
.blabel { fill: #fff; font-size: 10px; pointer-events: none; }
#panels { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; padding: 10px 16px; }
@media (max-width: 900px) { #panels { grid-template-columns: 1fr; } }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 2px 6px; border-bottom: 1px solid var(--alt);
  vertical-align: top; }
th { color: var(--muted); font-weight: 500; }
td.v { word-break: break-word; }
.empty { color: var(--muted); font-style: italic; }
.add { color: var(--ok); } .del { color: var(--failed); } .chg { color: #b54708; }
.error { color: var(--failed); }
pre.traceback { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; background: var(--alt); border-left: 3px solid var(--failed);
  padding: 6px 8px; margin: 4px 0 8px; overflow: auto; max-height: 28em; white-space: pre; }
details.traceback summary { cursor: pointer; color: var(--failed); }
</style>
</head>
<body data-ready="0">
__UI_HTML__<header id="head"></header>
<nav>
  <button id="first" title="First commit (Home)">&#xAB;</button>
  <button id="prev" title="Previous commit (&#x2190;)">&#x25C0;</button>
  <label>seq <input id="seq" type="number" title="Type a seq, then Enter"></label>
  <button id="next" title="Next commit (&#x2192;)">&#x25B6;</button>
  <button id="last" title="Last commit (End)">&#xBB;</button>
  <span class="sep"></span>
  <button id="prevfail" title="Previous failure ([ or p)">&#x25C0; failure</button>
  <button id="nextfail" title="Next failure (] or n)">failure &#x25B6;</button>
  <span class="sep"></span>
  <button id="axis" title="Switch the x axis between wall-clock time and commits">time axis</button>
  <button id="zoomout" title="Zoom out">&#x2212;</button>
  <button id="zoomin" title="Zoom in">+</button>
  <button id="fit" title="Fit the run to the window">fit</button>
  <span class="sep"></span>
  <span class="legend">
    <span><i style="background:var(--ok)"></i>finished</span>
    <span><i style="background:var(--failed)"></i>failed</span>
    <span><i style="background:var(--conflict)"></i>conflicted</span>
    <span><i style="background:var(--wait)"></i>waiting</span>
    <span><i style="background:var(--lost)"></i>process died</span>
    <span><i style="background:var(--cancelled)"></i>cancelled</span>
    <span><i style="background:var(--open)"></i>running</span>
  </span>
</nav>
<div id="chart"><svg id="labels"></svg><div id="scroll"><svg id="svg"></svg></div></div>
<div id="panels"><section id="state"></section><section id="diff"></section></div>
<pre id="selftest" hidden></pre>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
(function () {
// What the page keeps across a reload of its data (a live run's new commits): the axis
// and its zoom, and whether the selection follows the last commit.
const view = {axis: /axis=commits/.test(location.hash) ? "commits" : "time", ppc: 0, ppms: 0,
  gap: 0, follow: false, zoomed: false};
let api = null;
function boot(D) {
__FOLD__
const SNAP = 256, MAXROWS = 200;
const ROW = 14, LANEPAD = 8, AXIS = 30, RUNLANE = 24, LEFT = 8;
const svg = document.getElementById("svg"), labels = document.getElementById("labels");
const scroller = document.getElementById("scroll"), seqInput = document.getElementById("seq");

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
}
const short = t => String(t || "").split(":").pop();
const firstSeq = ci => R.seq[C.first[ci]];
const secs = ms => "+" + (ms / 1000).toFixed(3) + " s";
const LINK = D.link || "{}.html";
const runHref = id => LINK.replace("{}", encodeURIComponent(id));
const evText = id => (D.events[id] || ["", "#" + id])[1];
const evType = id => short((D.events[id] || ["?"])[0]);
// A failed attempt's stored traceback, as a block (none for i < 0: nothing was recorded).
// What an event carries, as a bar's label says it: its text without the module path.
const evLabel = id => evText(id).replace(/^[\w.]+:/, "");
const clipTo = (t, px) => { const n = Math.floor(px / 6); return t.length <= n ? t : t.slice(0, Math.max(1, n - 1)) + "…"; };
const tbHtml = i => i >= 0 ? `<pre class="traceback">${esc(D.tb[i])}</pre>` : "";

// The commit a seq belongs to by the checkpoint rule: the last one begun at or before it.
function commitAt(seq) {
  let lo = 0, hi = N - 1, found = 0;
  while (lo <= hi) {
    const m = (lo + hi) >> 1;
    if (firstSeq(m) <= seq) { found = m; lo = m + 1; } else { hi = m - 1; }
  }
  return found;
}

const clone = st => structuredClone(st);
let cur = {ci: -1, st: baseState()};
const snaps = new Map();
// Forward moves fold on from where the page is; going back restarts from the nearest
// snapshot (one every SNAP commits, taken on the way), so no seq costs a full replay twice.
function stateAt(ci) {
  if (ci < cur.ci) {
    let best = -1;
    for (const k of snaps.keys()) if (k <= ci && k > best) best = k;
    cur = best < 0 ? {ci: -1, st: baseState()} : {ci: best, st: clone(snaps.get(best))};
  }
  while (cur.ci < ci) {
    cur.ci++;
    const [a, b] = range(cur.ci);
    for (let i = a; i < b; i++) apply(cur.st, i);
    if (cur.ci % SNAP === SNAP - 1 && !snaps.has(cur.ci)) snaps.set(cur.ci, clone(cur.st));
  }
  return cur.st;
}

// ------------------------------------------------------------------ the chart
const nLanes = S.length;
const laneY = [];
let height = AXIS + RUNLANE;
for (let s = 0; s < nLanes; s++) { laneY.push(height); height += D.lanes[s] * ROW + LANEPAD; }
height += 4;
// The x axis: wall-clock time, or one slot per commit (ppc pixels each). On the time axis
// commits stand at least `gap` pixels apart and the time between them is drawn to scale
// (ppms pixels a millisecond) past that: a burst of quick commits stays readable, and an idle
// wait shows as the space it took. X holds each commit's left edge.
let ppc = view.ppc, ppms = view.ppms, gap = view.gap;
const CT = [];
for (let ci = 0; ci < N; ci++) CT.push(R.t[C.first[ci]]);
const SPAN = N ? Math.max(1, CT[N - 1] - CT[0]) : 1;
const X = new Float64Array(N + 1);
const timed = () => view.axis === "time";
function layout() {
  let at = LEFT;
  for (let ci = 0; ci < N; ci++) {
    if (ci) at += timed() ? Math.max(gap, (CT[ci] - CT[ci - 1]) * ppms) : ppc;
    X[ci] = at;
  }
  X[N] = N ? xe(N - 1) : LEFT;
}
const x = ci => X[ci];
// A commit's right edge: its slot's, or (time axis) the least room a commit takes.
const xe = ci => X[ci] + (timed() ? Math.max(2, gap) : ppc);
const mid = ci => (x(ci) + xe(ci)) / 2;
const room = () => Math.max(50, scroller.clientWidth - 2 * LEFT);
function fitPpc() { return Math.max(0.05, room() / Math.max(1, N)); }
// The time axis fitted to the window: at most half of it goes to the commits' least room.
function fitTime() {
  gap = Math.min(24, room() / Math.max(1, 2 * N));
  const width = p => {
    let w = gap;
    for (let ci = 1; ci < N; ci++) w += Math.max(gap, (CT[ci] - CT[ci - 1]) * p);
    return w;
  };
  let lo = 0, hi = room() / SPAN;
  for (let i = 0; i < 40; i++) { const m = (lo + hi) / 2; if (width(m) > room()) hi = m; else lo = m; }
  ppms = lo;
}
function fit() {
  view.zoomed = false;
  if (timed()) fitTime(); else ppc = fitPpc();
  layout();
}
function zoom(f) {
  view.zoomed = true;
  if (timed()) { ppms = Math.min(50, ppms * f); gap = Math.min(200, Math.max(0.02, gap * f)); }
  else ppc = Math.min(80, Math.max(0.05, ppc * f));
  layout();
}
// The commit under a point of the chart: the last one whose edge is left of it.
function commitAtX(px) {
  let lo = 0, hi = N - 1, found = 0;
  while (lo <= hi) {
    const m = (lo + hi) >> 1;
    if (x(m) <= px) { found = m; lo = m + 1; } else { hi = m - 1; }
  }
  if (found + 1 < N && x(found + 1) - px < px - xe(found)) found++;
  return found;
}
// Where a time (ms since the run began) falls on the time axis, between its commits.
function xAtTime(ms) {
  let lo = 0, hi = N - 1, i = 0;
  while (lo <= hi) {
    const m = (lo + hi) >> 1;
    if (CT[m] <= ms) { i = m; lo = m + 1; } else { hi = m - 1; }
  }
  if (i + 1 >= N || CT[i + 1] === CT[i]) return x(i);
  return x(i) + (ms - CT[i]) / (CT[i + 1] - CT[i]) * (x(i + 1) - x(i));
}
const nice = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 3e4, 6e4, 12e4,
  3e5, 6e5, 12e5, 18e5, 36e5, 72e5, 216e5, 432e5, 864e5];
function timeLabel(ms, step) {
  if (step < 1000) return "+" + (ms / 1000).toFixed(step < 10 ? 3 : step < 100 ? 2 : 1) + " s";
  if (step < 60000) return "+" + Math.round(ms / 1000) + " s";
  if (step < 3600000) return "+" + Math.round(ms / 60000) + " min";
  return "+" + (ms / 3600000).toFixed(step < 3600000 * 2 ? 1 : 0) + " h";
}

function drawLabels() {
  let out = `<text x="6" y="${AXIS - 10}" class="meta" font-size="11">seq</text>`;
  out += `<text x="6" y="${AXIS + 13}" font-size="12">run</text>`;
  let w = 40;
  for (let s = 0; s < nLanes; s++) {
    out += `<text x="6" y="${laneY[s] + ROW - 2}" font-size="12" class="lane-label">${esc(S[s])}</text>`;
    w = Math.max(w, 14 + 7.2 * S[s].length);
  }
  labels.setAttribute("width", w);
  labels.setAttribute("height", height);
  labels.innerHTML = out;
}

const RUNMARK = {run_started: "#2e90fa", run_resumed: "#2e90fa", run_finished: "#3a9d5d",
  run_failed: "#d92d20", run_cancelled: "#475467", run_timed_out: "#475467",
  run_suspended: "#98a2b3"};

function draw() {
  const W = Math.ceil(LEFT + X[N]);
  const out = [];
  out.push(`<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse"
    patternTransform="rotate(45)"><rect width="6" height="6" fill="#eef0f3"/>
    <line x1="0" y1="0" x2="0" y2="6" stroke="#98a2b3" stroke-width="2"/></pattern></defs>`);
  for (let s = 0; s < nLanes; s++) {
    if (s % 2 === 0) out.push(`<rect x="0" y="${laneY[s] - LANEPAD / 2}" width="${W}"
      height="${D.lanes[s] * ROW + LANEPAD}" fill="#f6f7f9"/>`);
  }
  // Commit ticks: one path for all of them (10,000 elements would be slow to lay out).
  const every = Math.max(1, Math.ceil(64 / Math.max(ppc, 0.01)));
  if (timed()) {
    const want = SPAN / Math.max(1, (X[N] - LEFT) / 90);
    const step = nice.find(v => v >= want) || nice[nice.length - 1];
    let last = -1e9;
    for (let ms = Math.ceil(CT[0] / step) * step; N && ms <= CT[N - 1]; ms += step) {
      const tx = xAtTime(ms);
      if (tx - last < 70 || tx > W - 36) continue;
      last = tx;
      out.push(`<text class="tlabel" x="${tx}" y="${AXIS - 14}" font-size="10" fill="#667085">${timeLabel(ms, step)}</text>`);
      out.push(`<line x1="${tx}" x2="${tx}" y1="${AXIS - 12}" y2="${height}" stroke="#eaecf0"/>`);
    }
  }
  let ticks = "", failTicks = "";
  for (let ci = 0; ci < N; ci++) {
    const [a, b] = range(ci);
    let bad = false;
    for (let i = a; i < b; i++) { const k = K[R.k[i]]; if (k === "step_failed" || k === "run_failed") bad = true; }
    const seg = `M${mid(ci)} ${AXIS - 6}v6`;
    if (bad) failTicks += seg; else ticks += seg;
    if (!timed() && ci % every === 0) out.push(`<text x="${x(ci)}" y="${AXIS - 10}" font-size="10" fill="#667085">${C.seq[ci]}</text>`);
  }
  out.push(`<path d="${ticks}" stroke="#98a2b3" stroke-width="1"/>`);
  out.push(`<path d="${failTicks}" stroke="#d92d20" stroke-width="2"/>`);
  out.push(`<line x1="0" x2="${W}" y1="${AXIS}" y2="${AXIS}" stroke="#d0d5dd"/>`);
  // Run-level records: a mark each in the run lane.
  for (let i = 0; i < NREC; i++) {
    const k = K[R.k[i]];
    if (!(k in RUNMARK)) continue;
    const ci = R.c[i];
    out.push(`<rect class="runmark ${k}" x="${x(ci)}" y="${AXIS + 4}" width="${Math.max(2, xe(ci) - x(ci))}" height="10" fill="${RUNMARK[k]}"><title>${esc(k + " at seq " + R.seq[i] + ": " + R.x[i])}</title></rect>`);
  }
  for (const [child, pseq, ci] of D.run.forks) {
    const cx = mid(ci);
    out.push(`<a class="forklink" href="${esc(runHref(child))}"><path d="M${cx} ${AXIS + 2}l5 7l-5 7l-5 -7z" fill="#f79009"><title>fork ${esc(child)} at seq ${pseq}</title></path></a>`);
  }
  // Step attempts, and waits.
  for (const [s, id, att, c0, c1, outcome, note, row] of D.attempts) {
    const end = c1 < 0 ? N - 1 : c1;
    const x0 = x(c0), w = Math.max(2, xe(end) - x0), y = laneY[s] + row * ROW;
    const cls = "bar " + outcome + (att > 1 ? " retry" : "");
    const took = ((CT[end] - CT[c0]) / 1000).toFixed(3);
    const tip = `${S[s]} #${id} ${evType(id)}, attempt ${att}: ${outcome}` +
      `${note ? " (" + note + ")" : ""}, seq ${C.seq[c0]}–${c1 < 0 ? "…" : C.seq[c1]}, ${took} s\n${evLabel(id)}`;
    out.push(`<rect class="${cls}" data-step="${esc(S[s])}" data-event="${id}" data-attempt="${att}" data-outcome="${outcome}" x="${x0}" y="${y}" width="${w}" height="${ROW - 3}" rx="2"><title>${esc(tip)}</title></rect>`);
    if (w > 24) {
      const label = `#${id}${att > 1 ? " ×" + att : ""} ${evLabel(id)}`;
      out.push(`<text class="blabel" x="${x0 + 3}" y="${y + ROW - 5}">${esc(clipTo(label, w - 6))}</text>`);
    }
  }
  for (const [s, id, c0, c1, aw, row] of D.waits) {
    const end = c1 < 0 ? N - 1 : c1;
    const x0 = x(c0), w = Math.max(2, xe(end) - x0), y = laneY[s] + row * ROW;
    out.push(`<rect class="bar wait" data-step="${esc(S[s])}" data-event="${id}" x="${x0}" y="${y}" width="${w}" height="${ROW - 3}"><title>${esc(S[s] + " #" + id + " waits for " + aw)}</title></rect>`);
  }
  out.push(`<line id="cursor" x1="0" x2="0" y1="0" y2="${height}" stroke="var(--sel)" stroke-width="2"/>`);
  svg.setAttribute("width", W);
  svg.setAttribute("height", height);
  svg.innerHTML = out.join("");
  if (selected >= 0) placeCursor();
}

// ------------------------------------------------------------------ panels
function rows(list, render) {
  const shown = list.slice(0, MAXROWS).map(render).join("");
  const more = list.length > MAXROWS ? `<tr><td colspan="9" class="empty">… and ${list.length - MAXROWS} more</td></tr>` : "";
  return shown + more;
}
function tableOf(heads, list, render, none) {
  if (!list.length) return `<p class="empty">${none}</p>`;
  return `<table><tr>${heads.map(h => `<th>${h}</th>`).join("")}</tr>${rows(list, render)}</table>`;
}
function stateHtml(st, ci) {
  const q = [], p = [], w = [], b = [];
  for (const [s, ids] of st.q) for (const id of ids) q.push([s, id]);
  for (const id of st.u) q.push(["(no step)", id]);
  for (const [s, m] of st.p) for (const [id, e] of m) p.push([s, id, e]);
  for (const [wid, e] of st.w) w.push([wid, e]);
  for (const [buf, m] of st.b) for (const [t, ids] of m) b.push([buf, t, ids]);
  const at = ci < 0 ? "the fork point" : `seq ${C.seq[ci]}`;
  let h = `<h2>State at ${at}</h2>`;
  h += `<p><span class="badge ${esc(st.status)}" id="state-status">${esc(st.status)}</span>`;
  if (ci >= 0) h += ` <span class="meta">commit ${ci + 1} of ${N}, ${secs(R.t[C.first[ci]])}</span>`;
  h += `</p>`;
  if (st.error) h += `<p class="error">${esc(st.error)}</p>`;
  if (st.result != null) h += `<p>result <code>${esc(st.result)}</code></p>`;
  h += `<h3>Queues</h3>` + tableOf(["step", "event", "type", "value"], q,
    ([s, id]) => `<tr><td>${esc(s)}</td><td>#${id}</td><td>${esc(evType(id))}</td><td class="v">${esc(evText(id))}</td></tr>`, "empty");
  h += `<h3>In progress</h3>` + tableOf(["step", "event", "attempts", "failures", "value"], p,
    ([s, id, e]) => `<tr><td>${esc(s)}</td><td>#${id} ${esc(evType(id))}</td><td>${e.a}</td><td>${e.f}${e.err ? ` <span class="error">${esc(e.err)}</span>` : ""}</td><td class="v">${esc(evText(id))}</td></tr>`, "nothing");
  // The last failure of each step in progress, open once the run has failed of it.
  for (const [s, id, e] of p) if (e.tb >= 0) h += `<details class="traceback"${st.status === "failed" ? " open" : ""}><summary>traceback of ${esc(s)} #${id}: ${esc(e.err)}</summary>${tbHtml(e.tb)}</details>`;
  const ctx = [...st.ctx];
  h += `<h3>Context</h3>` + tableOf(["key", "value"], ctx,
    ([k, v]) => `<tr><td>${esc(k)}</td><td class="v">${esc(v)}</td></tr>`, "empty");
  h += `<h3>Waiters</h3>` + tableOf(["waiter", "step", "event", "awaits"], w,
    ([wid, e]) => `<tr><td>${esc(wid)}</td><td>${esc(e.s)}</td><td>#${e.id}</td><td>${esc(e.aw)}</td></tr>`, "none");
  if (b.length) h += `<h3>Collect buffers</h3>` + tableOf(["buffer", "type", "events"], b,
    ([buf, t, ids]) => `<tr><td>${esc(buf)}</td><td>${esc(short(t))}</td><td>${ids.map(i => "#" + i).join(", ")}</td></tr>`, "");
  return h;
}
function diffHtml(before, after, ci) {
  const [a, b] = range(ci);
  const recs = [];
  for (let i = a; i < b; i++) recs.push(i);
  let h = `<h2>What commit seq ${C.seq[ci]} changed</h2>`;
  h += tableOf(["seq", "kind", "step", "what"], recs,
    i => `<tr><td>${R.seq[i]}</td><td>${esc(K[R.k[i]])}</td><td>${esc(stepOf(i) || "")}</td><td class="v">${esc(R.x[i])}</td></tr>`, "");
  for (const i of recs) {
    if (K[R.k[i]] === "step_failed" && R.a[i][3] >= 0)
      h += `<h3>Traceback of ${esc(stepOf(i))} #${R.a[i][0]}</h3>` + tbHtml(R.a[i][3]);
  }
  // The commit's own records say which keys it wrote: texts are cut short, so a change
  // past what they show (an append to a long list) would look like no change at all.
  const keys = [];
  for (let i = a; i < b; i++) {
    const k = K[R.k[i]];
    if ((k === "state_set" || k === "state_deleted") && !keys.includes(R.a[i][0])) keys.push(R.a[i][0]);
  }
  const changes = [];
  for (const k of keys) {
    const had = before.ctx.has(k), has = after.ctx.has(k);
    const old = before.ctx.get(k), now = after.ctx.get(k);
    if (!had && has) changes.push(`<li class="add">+ <code>${esc(k)}</code> = <code>${esc(now)}</code></li>`);
    else if (had && !has) changes.push(`<li class="del">− <code>${esc(k)}</code> (was <code>${esc(old)}</code>)</li>`);
    else if (had) changes.push(`<li class="chg">~ <code>${esc(k)}</code>: <code>${esc(old)}</code> → <code>${esc(now)}</code>${old === now ? ' <span class="meta">(changed past the part shown)</span>' : ""}</li>`);
  }
  h += `<h3>Context</h3>` + (changes.length ? `<ul id="ctx-changes">${changes.join("")}</ul>` : `<p class="empty">unchanged</p>`);
  if (before.status !== after.status) h += `<h3>Status</h3><p>${esc(before.status)} → ${esc(after.status)}</p>`;
  return h;
}

// ------------------------------------------------------------------ selection
let selected = -1;
// The commits that hold a failure: a failed or conflicted attempt, a failed run, or the
// commit that found an attempt's process dead.
const FAILS = [];
{
  const bad = new Set();
  for (let i = 0; i < NREC; i++) {
    const k = K[R.k[i]];
    if (k === "step_failed" || k === "run_failed" || k === "step_conflicted") bad.add(R.c[i]);
  }
  for (const a of D.attempts) if (a[5] === "lost" && a[4] >= 0) bad.add(a[4]);
  FAILS.push(...[...bad].sort((p, q) => p - q));
}
function jumpFailure(dir) {
  const list = dir > 0 ? FAILS.filter(c => c > selected) : FAILS.filter(c => c < selected).reverse();
  if (list.length) select(list[0]);
}
function placeCursor() {
  const c = document.getElementById("cursor");
  if (!c) return;
  const cx = mid(selected);
  c.setAttribute("x1", cx); c.setAttribute("x2", cx);
}
function select(ci, scroll) {
  if (!N) return;
  ci = Math.max(0, Math.min(N - 1, ci));
  selected = ci;
  const before = clone(stateAt(ci - 1));
  const after = stateAt(ci);
  document.getElementById("state").innerHTML = stateHtml(after, ci);
  document.getElementById("diff").innerHTML = diffHtml(before, after, ci);
  seqInput.value = C.seq[ci];
  document.body.dataset.seq = C.seq[ci];
  view.follow = ci === N - 1;
  placeCursor();
  if (scroll !== false) {
    const cx = x(ci);
    if (cx < scroller.scrollLeft || cx > scroller.scrollLeft + scroller.clientWidth - 20)
      scroller.scrollLeft = Math.max(0, cx - scroller.clientWidth / 2);
  }
  try { history.replaceState(null, "", "#seq=" + C.seq[ci]); } catch (e) { /* file: URLs may refuse */ }
}

function header() {
  const r = D.run;
  let h = `<h1>Run <code id="run-id">${esc(r.id)}</code> <span class="badge ${esc(r.status)}" id="run-status">${esc(r.status)}</span></h1>`;
  const span = N ? `seqs ${firstSeq(0)}–${C.seq[N - 1]}` : "no records";
  const dur = NREC ? secs(R.t[NREC - 1]) : "";
  h += `<p class="meta"><code>${esc(r.workflow)}</code> · ${N} commits · ${NREC} records · ${span} · ${dur}` +
    ` · started ${esc(new Date(r.created / 1000).toISOString().replace("T", " ").slice(0, 19))} UTC` +
    `${r.typed ? " · typed values" : " · raw values (no user code imported)"}</p>`;
  if (r.parent) h += `<p id="parent">forked from <a href="${esc(runHref(r.parent[0]))}#seq=${r.parent[1]}">${esc(r.parent[0])}</a> at seq ${r.parent[1]}</p>`;
  if (r.forks.length) h += `<p id="forks">forks: ` + r.forks.map(([c, s]) => `<a href="${esc(runHref(c))}">${esc(c)}</a> (at seq ${s})`).join(", ") + `</p>`;
  document.getElementById("head").innerHTML = h;
}

function selftest() {
  // The state after every commit, for the browser tests to compare with the Python fold.
  const out = [];
  let st = baseState();
  for (let ci = 0; ci < N; ci++) {
    const [a, b] = range(ci);
    for (let i = a; i < b; i++) apply(st, i);
    const q = {}, p = {}, ctx = {};
    for (const [s, ids] of st.q) if (ids.length) q[s] = ids.slice();
    for (const [s, m] of st.p) if (m.size) p[s] = [...m].map(([id, e]) => [id, e.a, e.f]);
    for (const [k, v] of st.ctx) ctx[k] = v;
    out.push([C.seq[ci], st.status, q, p, ctx, [...st.w.keys()].sort(), st.u.slice()]);
  }
  const pre = document.getElementById("selftest");
  pre.textContent = JSON.stringify(out);
}

header();
drawLabels();
if (!ppc) ppc = Math.min(40, Math.max(3, fitPpc()));
if (!gap) fitTime();
layout();
draw();
document.getElementById("axis").textContent = view.axis === "time" ? "time axis" : "commit axis";
svg.onclick = ev => {
  if (ev.target.closest && ev.target.closest("a")) return;
  const box = svg.getBoundingClientRect();
  select(commitAtX(ev.clientX - box.left), false);
};
const redraw = () => { draw(); select(selected); };
document.getElementById("first").onclick = () => select(0);
document.getElementById("prev").onclick = () => select(selected - 1);
document.getElementById("next").onclick = () => select(selected + 1);
document.getElementById("last").onclick = () => select(N - 1);
document.getElementById("prevfail").onclick = () => jumpFailure(-1);
document.getElementById("nextfail").onclick = () => jumpFailure(1);
document.getElementById("zoomin").onclick = () => { zoom(2); redraw(); };
document.getElementById("zoomout").onclick = () => { zoom(0.5); redraw(); };
document.getElementById("fit").onclick = () => { fit(); redraw(); };
document.getElementById("axis").onclick = () => {
  view.axis = timed() ? "commits" : "time";
  document.getElementById("axis").textContent = view.axis === "time" ? "time axis" : "commit axis";
  document.body.dataset.axis = view.axis;
  layout(); redraw();
};
seqInput.onchange = () => select(commitAt(Number(seqInput.value)));
document.onkeydown = ev => {
  if (ev.target === seqInput || (ev.target.closest && ev.target.closest("form"))) return;
  if (ev.key === "ArrowLeft") select(selected - 1);
  else if (ev.key === "ArrowRight") select(selected + 1);
  else if (ev.key === "Home") select(0);
  else if (ev.key === "End") select(N - 1);
  else if (ev.key === "]" || ev.key === "n") jumpFailure(1);
  else if (ev.key === "[" || ev.key === "p") jumpFailure(-1);
  else return;
  ev.preventDefault();
};
function fromHash() {
  const m = /seq=(\d+)/.exec(location.hash);
  select(m ? commitAt(Number(m[1])) : D.seq != null ? commitAt(D.seq) : N - 1);
}
window.onhashchange = fromHash;
if (/selftest/.test(location.hash)) selftest();
const follow = view.follow;
if (follow) select(N - 1); else fromHash();
document.body.dataset.commits = String(N);
document.body.dataset.lastSeq = String(N ? C.seq[N - 1] : 0);
document.body.dataset.failures = FAILS.map(ci => C.seq[ci]).join(",");
document.body.dataset.axis = view.axis;
document.body.dataset.status = D.run.status;
document.body.dataset.ready = "1";
// A zoom the user chose stays; otherwise the new data is fitted to the window again.
const keep = () => {
  view.ppc = view.zoomed ? ppc : 0; view.ppms = view.zoomed ? ppms : 0; view.gap = view.zoomed ? gap : 0;
};
return {keep: keep, scroll: () => scroller.scrollLeft};
}
api = boot(JSON.parse(document.getElementById("data").textContent));
// A live page (``workflow serve``) hands new data here; the static page never does.
window.TIMELINE = {
  reload(D) {
    const left = api.scroll();
    api.keep();
    api = boot(D);
    document.getElementById("scroll").scrollLeft = left;
  },
};
})();
</script>
__UI_SCRIPT__</body>
</html>
"""

# The page's fold: what the page knows of a run's state at each commit, from the embedded data
# alone (``D``, the data ``timeline_data`` makes). It touches no DOM: the tests run it alone.
FOLD_SCRIPT: Final = r"""// ------------------------------------------------------------------ the fold
// The page's fold (workflow/_fold.py over the page's columns). It touches no DOM, so that
// the tests run it on its own (in node) against the Python fold, kind by kind.
const R = D.rec, C = D.commits, K = D.kinds, S = D.steps, N = C.seq.length;
const NREC = R.seq.length;
const stepOf = i => R.s[i] < 0 ? null : S[R.s[i]];
const range = ci => [C.first[ci], ci + 1 < N ? C.first[ci + 1] : NREC];
function baseState() {
  const b = D.base;
  const st = {status: b.status, result: null, error: null, q: new Map(), p: new Map(),
    ctx: new Map(), w: new Map(), u: b.u.slice(), b: new Map()};
  for (const [s, ids] of Object.entries(b.q)) st.q.set(s, ids.slice());
  for (const [s, list] of Object.entries(b.p))
    st.p.set(s, new Map(list.map(([id, a, f]) => [id, {a: a, f: f, c: 0, err: null, tb: -1}])));
  for (const [k, v] of Object.entries(b.ctx)) st.ctx.set(k, v);
  for (const [wid, s, id, aw] of b.w) st.w.set(wid, {s: s, id: id, aw: aw});
  for (const [buf, types] of Object.entries(b.b))
    st.b.set(buf, new Map(Object.entries(types).map(([t, ids]) => [t, ids.slice()])));
  return st;
}
function prog(st, s, id) { const m = st.p.get(s); return m ? m.get(id) : undefined; }
// A key's text after the commit (none: the commit deleted it).
function setKey(st, s, a) { if (a[1] == null) st.ctx.delete(a[0]); else st.ctx.set(a[0], a[1]); }
// Steps renamed since (a resume's or a fork's moves): their work moves to the new names
// (a[0]: pairs of step indexes) and so do their collect buffers (a[1]: pairs of keys).
function moveWork(st, a) {
  for (const [o, n] of a[0] || []) {
    const old = S[o], now = S[n];
    if (old === now) continue;
    const q = st.q.get(old);
    if (q) { st.q.delete(old); st.q.set(now, (st.q.get(now) || []).concat(q)); }
    const m = st.p.get(old);
    if (m) { st.p.delete(old); st.p.set(now, new Map([...(st.p.get(now) || []), ...m])); }
    for (const w of st.w.values()) if (w.s === old) w.s = now;
  }
  for (const [old, now] of a[1] || []) {
    const b = st.b.get(old);
    if (!b || old === now) continue;
    st.b.delete(old);
    const into = st.b.get(now) || new Map();
    for (const [t, ids] of b) into.set(t, (into.get(t) || []).concat(ids));
    st.b.set(now, into);
  }
}
// What each record kind does to the state, from its step s and its arguments a (built by
// _timeline.py): one entry per record kind of the journal, also for those it ignores.
const APPLY = {
  run_started(st, s, a) {
    st.status = "running"; st.result = null; st.error = null;
    moveWork(st, a);  // a fork of work under steps renamed since
  },
  enqueued(st, s, a) {
    if (s === null) st.u.push(a[0]);
    else { if (!st.q.has(s)) st.q.set(s, []); st.q.get(s).push(a[0]); }
  },
  dequeued(st, s, a) {
    const q = st.q.get(s) || [], j = q.indexOf(a[0]);
    if (j >= 0) q.splice(j, 1);
    if (!st.p.has(s)) st.p.set(s, new Map());
    st.p.get(s).set(a[0], {a: 0, f: 0, c: 0, err: null, tb: -1});
  },
  step_started(st, s, a) { const e = prog(st, s, a[0]); if (e) e.a = a[1]; },
  step_finished(st, s, a) { const m = st.p.get(s); if (m) m.delete(a[0]); },
  step_failed(st, s, a) { const e = prog(st, s, a[0]); if (e) { e.f++; e.err = a[1]; e.tb = a[3]; } },
  step_conflicted(st, s, a) { const e = prog(st, s, a[0]); if (e) e.c++; },
  waiting(st, s, a) {
    const m = st.p.get(s); if (m) m.delete(a[0]);
    st.w.set(a[1], {s: s, id: a[0], aw: a[2]});
  },
  wait_resolved(st, s, a) {
    st.w.delete(a[0]);
    const j = a[1] == null ? -1 : st.u.indexOf(a[1]);
    if (j >= 0) st.u.splice(j, 1);
  },
  state_set: setKey,
  state_deleted: setKey,
  collected(st, s, a) {
    if (!st.b.has(a[0])) st.b.set(a[0], new Map());
    const buf = st.b.get(a[0]);
    if (a[1] != null) {
      const name = (D.events[a[1]] || [""])[0], t = name.slice(name.lastIndexOf(":") + 1);
      if (!buf.has(t)) buf.set(t, []);
      buf.get(t).push(a[1]);
    }
    for (const t of a[2]) {
      const es = buf.get(t);
      if (es && es.length) { es.shift(); if (!es.length) buf.delete(t); }
    }
    if (!buf.size) st.b.delete(a[0]);
  },
  streamed(st, s, a) { /* the page shows no stream */ },
  memoized(st, s, a) { /* a recorded call: its line says what it returned */ },
  run_finished(st, s, a) { st.status = "finished"; st.result = a[0]; st.p.clear(); },
  run_failed(st, s, a) { st.status = "failed"; st.error = a[0]; },
  run_cancelled(st, s, a) { st.status = "cancelled"; },
  run_timed_out(st, s, a) { st.status = "timed_out"; },
  run_resumed(st, s, a) { st.status = "running"; st.error = null; moveWork(st, a); },
  run_suspended(st, s, a) { st.status = "waiting"; },
};
function apply(st, i) {
  const f = APPLY[K[R.k[i]]];
  if (f) f(st, stepOf(i), R.a[i]);
}
"""

PAGE: Final = _PAGE.replace("__FOLD__\n", FOLD_SCRIPT)
