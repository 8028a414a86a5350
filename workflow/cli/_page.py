# The page's JavaScript and HTML are data here, written for a browser, not for the Python
# line length; and its typographic dashes and signs are meant for the reader.
# ruff: noqa: E501, RUF001

"""The timeline page: HTML, CSS and JavaScript in one string, with no network access.

Kept inline (not a package data file) so that any install of the package can write the
page. ``__TITLE__`` and ``__DATA__`` are replaced by ``render_page``.

Here: the page's frame (style, markup), how it moves (selection, keys, windows) and how it
starts. Its fold is ``_page_fold`` (:data:`FOLD_SCRIPT`: it touches no DOM, so
tests/test_page.py runs it alone in node), its chart and panels ``_page_draw``. Opening the
page with ``#selftest`` writes the state after every commit into ``<pre id="selftest">``,
which the browser tests compare with the Python fold.
"""

from __future__ import annotations

from typing import Final

from ._page_draw import DRAW_SCRIPT
from ._page_fold import FOLD_SCRIPT

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
.badge.interrupted { background: var(--lost); } .badge.submitted { background: #f79009; }
.badge.cancelled, .badge.timed_out { background: #475467; }
nav { display: flex; gap: 6px; align-items: center; padding: 6px 16px;
  border-bottom: 1px solid var(--line); flex-wrap: wrap; }
nav input { width: 90px; }
nav .sep { width: 12px; }
#window { padding: 5px 16px; background: #fffaeb; border-bottom: 1px solid var(--line); }
#window button { margin-left: 6px; }
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
<div id="window" hidden></div>
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
function boot(D, pick) {
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
// The state as the page shows it: a server that knows the workflow sends the context
// upcast to today's state model where the log's is in an older version (D.uctx: [commit
// index, texts or null] in order, -1 the window's base), as `workflow state --workflow`
// shows it; the fold itself keeps the log's keys.
function shown(st, ci) {
  let texts = null;
  for (const [c, t] of D.uctx || []) { if (c > ci) break; texts = t; }
  return texts ? Object.assign({}, st, {ctx: new Map(Object.entries(texts)), upcast: true}) : st;
}

__DRAW__
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
// A run longer than a window: the page holds one window (D.window says where it lies);
// moving past its edge loads the next one, when the page can (window.TIMELINE.fetch, which
// `workflow serve` gives it), and the selection lands where the move meant (`pick`: a seq,
// or "first" / "last" of the new window).
const WIN = D.window || {after: 0, more_before: false, more_after: false};
function goWindow(q, pick) {
  const fetchWindow = window.TIMELINE && window.TIMELINE.fetch;
  if (!fetchWindow) return false;
  fetchWindow(Object.assign(WIN.limit ? {limit: WIN.limit} : {}, q)).then(d => { if (d) window.TIMELINE.reload(d, pick); });
  return true;
}
const inWindow = seq => !N || ((!WIN.more_before || seq >= firstSeq(0)) && (!WIN.more_after || seq <= C.seq[N - 1]));
function windowBar() {
  const bar = document.getElementById("window");
  bar.hidden = !(WIN.more_before || WIN.more_after);
  if (bar.hidden) { bar.innerHTML = ""; return; }
  const span = N ? `seqs ${firstSeq(0)}–${C.seq[N - 1]}` : `no commits after seq ${WIN.after}`;
  let h = `<span id="window-span">This page shows ${N} commits (${span}) of a longer run (seqs ${WIN.first}–${WIN.last}).</span>`;
  if (window.TIMELINE && window.TIMELINE.fetch) {
    h += `<button id="earlier"${WIN.more_before ? "" : " disabled"}>&#x25C0; earlier commits</button>` +
      `<button id="later"${WIN.more_after ? "" : " disabled"}>later commits &#x25B6;</button>`;
  } else {
    h += ` <span class="meta"><code>workflow timeline DB RUN --at SEQ</code> writes the page around another seq;` +
      ` <code>workflow serve DB</code> shows this page and loads the other windows as you move.</span>`;
  }
  bar.innerHTML = h;
  const earlier = document.getElementById("earlier"), later = document.getElementById("later");
  if (earlier) earlier.onclick = () => goWindow({before: WIN.after}, "last");
  if (later) later.onclick = () => goWindow({after: N ? C.seq[N - 1] : WIN.after}, "first");
}
function select(ci, scroll) {
  if (ci < 0 && WIN.more_before && goWindow({before: WIN.after}, "last")) return;
  if (ci >= N && WIN.more_after && goWindow({after: N ? C.seq[N - 1] : WIN.after}, "first")) return;
  if (!N) return;
  ci = Math.max(0, Math.min(N - 1, ci));
  selected = ci;
  const before = shown(clone(stateAt(ci - 1)), ci - 1);
  const after = shown(stateAt(ci), ci);
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
windowBar();
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
// The run's first and last commits, in another window if need be.
const toFirst = () => { if (!(WIN.more_before && goWindow({after: 0}, "first"))) select(0); };
const toLast = () => { if (!(WIN.more_after && goWindow({}, "last"))) select(N - 1); };
const toSeq = seq => { if (inWindow(seq) || !goWindow({around: seq}, seq)) select(commitAt(seq)); };
document.getElementById("first").onclick = toFirst;
document.getElementById("prev").onclick = () => select(selected - 1);
document.getElementById("next").onclick = () => select(selected + 1);
document.getElementById("last").onclick = toLast;
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
seqInput.onchange = () => toSeq(Number(seqInput.value));
document.onkeydown = ev => {
  if (ev.target === seqInput || (ev.target.closest && ev.target.closest("form"))) return;
  if (ev.key === "ArrowLeft") select(selected - 1);
  else if (ev.key === "ArrowRight") select(selected + 1);
  else if (ev.key === "Home") toFirst();
  else if (ev.key === "End") toLast();
  else if (ev.key === "]" || ev.key === "n") jumpFailure(1);
  else if (ev.key === "[" || ev.key === "p") jumpFailure(-1);
  else return;
  ev.preventDefault();
};
function fromHash() {
  const m = /seq=(\d+)/.exec(location.hash);
  select(m ? commitAt(Number(m[1])) : D.seq != null ? commitAt(D.seq) : N - 1);
}
// A seq the window does not hold (a link into a long run): its window, once it can load.
function outside() {
  const m = /seq=(\d+)/.exec(location.hash);
  if (!m || inWindow(Number(m[1]))) return false;
  toSeq(Number(m[1]));
  return true;
}
window.onhashchange = () => { if (!outside()) fromHash(); };
if (/selftest/.test(location.hash)) selftest();
const follow = view.follow;
if (pick === "first") select(0);
else if (pick === "last") select(N - 1);
else if (typeof pick === "number") select(commitAt(pick));
else if (follow) select(N - 1); else fromHash();
document.body.dataset.commits = String(N);
document.body.dataset.lastSeq = String(D.window ? D.window.last : N ? C.seq[N - 1] : 0);
document.body.dataset.window = WIN.more_before || WIN.more_after ? `${WIN.after}:${N ? C.seq[N - 1] : WIN.after}` : "";
document.body.dataset.failures = FAILS.map(ci => C.seq[ci]).join(",");
document.body.dataset.axis = view.axis;
document.body.dataset.status = D.run.status;
document.body.dataset.ready = "1";
// A zoom the user chose stays; otherwise the new data is fitted to the window again.
const keep = () => {
  view.ppc = view.zoomed ? ppc : 0; view.ppms = view.zoomed ? ppms : 0; view.gap = view.zoomed ? gap : 0;
};
// What the live page asks for again when the run grows: the last window if this is it
// (it follows the run), else this one.
const query = () => (WIN.more_after ? "?after=" + WIN.after + "&" : "?") + "limit=" + (WIN.limit || "");
return {keep: keep, scroll: () => scroller.scrollLeft, query: query, bar: windowBar, outside: outside};
}
api = boot(JSON.parse(document.getElementById("data").textContent));
// A live page (``workflow serve``) hands new data here; the static page never does.
// It may also connect a fetch (query -> a promise of a window's data): then the page loads
// the windows of a long run as one moves.
window.TIMELINE = {
  reload(D, pick) {
    const left = api.scroll();
    api.keep();
    if (pick !== undefined) view.follow = false;
    api = boot(D, pick);
    if (pick === undefined) document.getElementById("scroll").scrollLeft = left;
  },
  query: () => api.query(),
  fetch: null,
  connect(f) { this.fetch = f; api.bar(); api.outside(); },
};
})();
</script>
__UI_SCRIPT__</body>
</html>
"""

PAGE: Final = _PAGE.replace("__FOLD__\n", FOLD_SCRIPT).replace("__DRAW__\n", DRAW_SCRIPT)
