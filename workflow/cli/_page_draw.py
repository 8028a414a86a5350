# The page's JavaScript is data here, written for a browser, not for the Python line length;
# and its typographic dashes and signs are meant for the reader.
# ruff: noqa: E501, RUF001

"""What the timeline page draws: the chart (a lane per step, attempts as bars, on a time or
a commit axis) and the panels (the state at the selected commit, and what it changed).

A part of the page's ``boot`` function (``_page``): it uses the fold's names (``R``, ``C``,
``N``, ``range``...) and the page's helpers, and is spliced in where ``__DRAW__`` stands.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DRAW_SCRIPT"]

DRAW_SCRIPT: Final = r"""// ------------------------------------------------------------------ the chart
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
  // A lane per worker: each row of a step names the worker whose attempts it holds.
  const LW = D.lane_workers || [], wx = w;
  for (let s = 0; s < nLanes; s++) {
    const rows = LW[s] || [];
    if (rows.filter(v => v !== null).length < 2) continue;
    rows.forEach((wk, r) => {
      if (wk === null) return;
      out += `<text x="${wx}" y="${laneY[s] + r * ROW + ROW - 5}" font-size="10" fill="#667085" class="worker-label" data-step="${esc(S[s])}" data-worker="${wk}">w${wk}</text>`;
    });
    w = wx + 28;
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
    if (ci < 0) continue;  // forked outside this window
    const cx = mid(ci);
    out.push(`<a class="forklink" href="${esc(runHref(child))}"><path d="M${cx} ${AXIS + 2}l5 7l-5 7l-5 -7z" fill="#f79009"><title>fork ${esc(child)} at seq ${pseq}</title></path></a>`);
  }
  // Step attempts, and waits.
  for (const [s, id, att, c0, c1, outcome, note, row, who] of D.attempts) {
    const end = c1 < 0 ? N - 1 : c1;
    const x0 = x(c0), w = Math.max(2, xe(end) - x0), y = laneY[s] + row * ROW;
    const cls = "bar " + outcome + (att > 1 ? " retry" : "");
    const took = ((CT[end] - CT[c0]) / 1000).toFixed(3);
    const ran = who && who[0] !== null ? `, worker ${who[0]} of session ${who[1]}` : "";
    const tip = `${S[s]} #${id} ${evType(id)}, attempt ${att}: ${outcome}` +
      `${note ? " (" + note + ")" : ""}, seq ${C.seq[c0]}–${c1 < 0 ? "…" : C.seq[c1]}, ${took} s${ran}\n${evLabel(id)}`;
    out.push(`<rect class="${cls}" data-step="${esc(S[s])}" data-event="${id}" data-attempt="${att}" data-outcome="${outcome}" data-worker="${who && who[0] !== null ? who[0] : ""}" data-session="${who ? who[1] : ""}" x="${x0}" y="${y}" width="${w}" height="${ROW - 3}" rx="2"><title>${esc(tip)}</title></rect>`);
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
  h += `<h3>Context</h3>`;
  if (st.upcast) h += `<p class="meta" id="ctx-upcast">upcast to this workflow's state model (the log holds an older version)</p>`;
  h += tableOf(["key", "value"], ctx,
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
  // An upcast context (shown()) may change under other names than the records wrote.
  if (before.upcast || after.upcast)
    for (const k of new Set([...before.ctx.keys(), ...after.ctx.keys()]))
      if (!keys.includes(k) && before.ctx.get(k) !== after.ctx.get(k)) keys.push(k);
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

"""
