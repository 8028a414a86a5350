# The pages' CSS and scripts are data here, written for a browser, not for the Python
# line length; their typographic signs are meant for the reader.
# ruff: noqa: E501

"""The web UI's own HTML: the run list, error pages, and what it adds to the timeline page
(the bar back to the list, live updates, the actions panel)."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote, urlencode

from eventstore import StoredRecord

from .._read import RunSummary, lease_text
from ..cli._filters import STATUSES
from ..cli._keys import encrypted_text
from ..cli._render import bare_class, clip, fmt_time

__all__ = ["error_page", "run_extras", "runs_page", "runs_table", "sealed_page"]

_STYLE: Final = """
:root { --fg:#1d2330; --muted:#667085; --line:#d0d5dd; --alt:#f6f7f9; --ok:#3a9d5d;
  --failed:#d92d20; --wait:#98a2b3; --lost:#7a5af8; --open:#2e90fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); }
header, main { padding: 10px 16px; }
h1 { font-size: 17px; margin: 0 0 4px; }
a { color: #175cd3; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.meta { color: var(--muted); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; color: #fff; font-weight: 600;
  background: var(--muted); }
.badge.finished { background: var(--ok); } .badge.failed { background: var(--failed); }
.badge.running { background: var(--open); } .badge.waiting { background: var(--wait); }
.badge.interrupted { background: var(--lost); } .badge.submitted { background: #f79009; } .badge.cancelled, .badge.timed_out { background: #475467; }
form.filters { display: flex; gap: 8px; align-items: end; flex-wrap: wrap; margin: 6px 0 10px; }
form.filters label { display: flex; flex-direction: column; font-size: 11px; color: var(--muted); }
#counts a { margin-right: 10px; text-decoration: none; }
#counts a.on { font-weight: 700; text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--alt); vertical-align: top; }
th { color: var(--muted); font-weight: 500; }
tr:hover td { background: var(--alt); }
.empty { color: var(--muted); font-style: italic; }
.error { color: var(--failed); }
"""

_RUNS_SCRIPT: Final = """<script>
"use strict";
// Live: the list is fetched again whenever the store's last seq moves (server-sent events).
(function () {
  const table = document.getElementById("runs");
  let head = Number(document.body.dataset.head), busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const r = await fetch("/runs-table" + location.search);
      if (r.ok) { table.innerHTML = await r.text(); document.body.dataset.refreshed = String(head); }
    } finally { busy = false; if (again) { again = false; refresh(); } }
  }
  const es = new EventSource("/events?head=" + head);
  es.addEventListener("head", ev => { head = JSON.parse(ev.data).head; document.body.dataset.head = String(head); refresh(); });
})();
</script>"""


def _page(title: str, body: str, attrs: str = "") -> str:
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body{attrs}>{body}</body></html>"
    )


def error_page(status: int, message: str) -> str:
    """A page that says what was wrong (an unknown run, a bad seq) and links back."""
    reason = {400: "Bad request", 403: "Not allowed", 404: "Not found", 409: "Cannot read"}.get(
        status, "Error"
    )
    return _page(
        f"{status} {reason}",
        f'<header><h1>{status} {reason}</h1><p class="error" id="message">{html.escape(message)}</p>'
        f'<p><a href="/">all runs</a></p></header>',
    )


def run_href(run_id: str, seq: int | None = None) -> str:
    """The run page's address (at a seq)."""
    return f"/runs/{quote(run_id, safe='')}" + ("" if seq is None else f"#seq={seq}")


def _status(s: RunSummary) -> str:
    text = s.status
    if s.status == "waiting" and s.waiting_for:
        text = "waiting for " + ", ".join(bare_class(t) for t in s.waiting_for)
    elif s.lease is not None:
        text = f"{s.status} ({lease_text(s.lease)})"
    return f'<span class="badge {html.escape(s.status)}">{html.escape(text)}</span>'


def runs_table(shown: list[RunSummary], forks: Mapping[str, int]) -> str:
    """The rows of the run list: each run links to its page, its parent and its forks."""
    if not shown:
        return '<p class="empty">no runs match</p>'
    rows = []
    for s in shown:
        parent = ""
        if s.parent_run_id:
            parent = (
                f'<a class="parent" href="{run_href(s.parent_run_id, s.parent_seq)}">'
                f"{html.escape(s.parent_run_id)}</a> at seq {s.parent_seq}"
            )
        n = forks.get(s.run_id, 0)
        fork_link = (
            f'<a class="forks" href="/?{urlencode({"parent": s.run_id})}">{n} fork{"s" if n > 1 else ""}</a>'
            if n
            else ""
        )
        rows.append(
            f'<tr data-run="{html.escape(s.run_id)}" data-status="{html.escape(s.status)}">'
            f'<td><a class="run" href="{run_href(s.run_id)}"><code>{html.escape(s.run_id)}</code></a></td>'
            f"<td>{_status(s)}</td><td><code>{html.escape(s.workflow)}</code></td>"
            f"<td>{fmt_time(s.created)}</td><td>{'' if s.last_seq is None else s.last_seq}</td>"
            f"<td>{parent}</td><td>{fork_link}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("run", "status", "workflow", "started (UTC)", "last seq", "parent", "forks")
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def runs_page(
    where: str,
    every: list[RunSummary],
    shown: list[RunSummary],
    query: Mapping[str, str],
    head: int,
    mode: str = "read-only",
) -> str:
    """The run list: filters, counts by status (each a link to that status), the runs."""
    counts = Counter(s.status for s in every)
    forks = Counter(s.parent_run_id for s in every if s.parent_run_id)
    others = {k: v for k, v in query.items() if k != "status" and v}
    wanted = query.get("status", "")
    links = [
        f'<a href="/?{urlencode(others)}" class="{"on" if not wanted else ""}">all {len(every)}</a>'
    ]
    for st in STATUSES:
        if counts[st]:
            q = urlencode({**others, "status": st})
            on = "on" if wanted == st else ""
            links.append(f'<a href="/?{q}" class="{on}" data-status="{st}">{st} {counts[st]}</a>')
    options = "".join(
        f'<option value="{st}"{" selected" if wanted == st else ""}>{st}</option>'
        for st in ("", *STATUSES)
    )

    def field(name: str, label: str, hint: str) -> str:
        value = html.escape(query.get(name, ""))
        return f'<label>{label}<input name="{name}" value="{value}" placeholder="{hint}"></label>'

    body = (
        f'<header><h1>Runs</h1><p class="meta"><code>{html.escape(where)}</code> · '
        f"{len(every)} runs · {html.escape(mode)} · live</p>"
        f'<form class="filters" method="get" action="/">'
        f'<label>status<select name="status">{options}</select></label>'
        + field("workflow", "workflow", "module:Class or Class")
        + field("since", "started since", "30m, 2h, 7d or 2026-12-01")
        + field("parent", "forks of", "run id")
        + '<button type="submit">filter</button></form>'
        f'<p id="counts">{"".join(links)}</p></header>'
        f'<main id="runs">{runs_table(shown, forks)}</main>{_RUNS_SCRIPT}'
    )
    return _page("runs", body, f' data-head="{head}"')


_RUN_BAR: Final = """<style>
#uibar { display: flex; gap: 12px; align-items: center; padding: 6px 16px; background: #f6f7f9;
  border-bottom: 1px solid #d0d5dd; }
#live { color: #667085; } #live.on::before { content: "● "; color: #3a9d5d; }
#actions { padding: 8px 16px; border-bottom: 1px solid #d0d5dd; display: flex; gap: 14px; flex-wrap: wrap; align-items: end; }
#actions form { display: flex; gap: 6px; align-items: end; }
#actions label { display: flex; flex-direction: column; font-size: 11px; color: #667085; }
#actions input { width: 220px; }
#act-result { flex-basis: 100%; min-height: 1.4em; }
#act-result.error { color: #d92d20; }
</style>
<div id="uibar"><a href="/" id="back">← all runs</a><span id="live">__LIVE__</span></div>
"""

_ACTIONS: Final = """<section id="actions">
<form id="act-resume-form"><button type="submit" id="act-resume">resume</button></form>
<form id="act-cancel-form"><button type="submit" id="act-cancel">cancel</button></form>
<form id="act-fork-form"><label>context updates (JSON object)<input id="fork-updates" value="{}"></label>
<button type="submit" id="act-fork">fork at selected seq</button></form>
<form id="act-send-form"><label>event class (module:Class)<input id="send-event"></label>
<label>fields (JSON object)<input id="send-data" value="{}"></label>
<button type="submit" id="act-send">send event</button></form>
<p id="act-result" class="meta">__WHO__</p>
</section>
"""

_RUN_SCRIPT: Final = """<script>
"use strict";
// Live: the run's new commits arrive as server-sent events; the page fetches what is new
// since its data (records, commits, the attempts and waits from the first open one on) and
// redraws in place, keeping the selection (or following the last commit).
(function () {
  const base = location.pathname.replace(/\\/$/, "");
  const live = document.getElementById("live");
  let D = JSON.parse(document.getElementById("data").textContent);
  let have = Number(document.body.dataset.lastSeq), busy = false, again = false;
  const firstOpen = (xs, end) => { const i = xs.findIndex(a => a[end] < 0); return i < 0 ? xs.length : i; };
  function held() {
    const ids = Object.keys(D.events).map(Number), n = D.rec.seq.length;
    return new URLSearchParams({nrec: n, ncommits: D.commits.seq.length,
      attempts_from: firstOpen(D.attempts, 4), waits_from: firstOpen(D.waits, 3), ntb: D.tb.length,
      next_event: ids.length ? Math.max(...ids) + 1 : 0, seq: n ? D.rec.seq[n - 1] : 0});
  }
  function merge(P) {
    for (const k of Object.keys(P.rec)) D.rec[k] = D.rec[k].concat(P.rec[k]);
    for (const k of Object.keys(P.commits)) D.commits[k] = D.commits[k].concat(P.commits[k]);
    D.attempts = D.attempts.slice(0, P.attempts_from).concat(P.attempts);
    P.rows.forEach((r, i) => { D.attempts[i][7] = r; });
    D.waits = D.waits.slice(0, P.waits_from).concat(P.waits);
    P.wait_rows.forEach((r, i) => { D.waits[i][5] = r; });
    D.tb = D.tb.slice(0, P.tb_from).concat(P.tb);
    Object.assign(D.events, P.events);
    for (const k of ["run", "steps", "kinds", "lanes", "lane_workers", "window"]) if (k in P) D[k] = P[k];
    D.uctx = P.uctx;  // the upcast contexts come whole (none: the page's fold is shown)
  }
  // The data the page shows, whichever way it came (a window the page loaded itself too).
  const reload = window.TIMELINE.reload.bind(window.TIMELINE);
  window.TIMELINE.reload = (d, pick) => { D = d; reload(d, pick); };
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      // The last window follows the run: only what is new is fetched, after the window's
      // start (limit: none), and appended. Another window is fetched whole.
      const W = D.window, last = !W || !W.more_after;
      const url = last ? "/data?" + held() + (W ? "&after=" + W.after + "&limit=1000000000" : "")
        : "/data" + window.TIMELINE.query();
      const r = await fetch(base + url);
      if (r.ok) {
        const text = await r.text(), P = JSON.parse(text);
        if (P.patch === true) merge(P); else D = P.patch === false ? P.data : P;
        document.body.dataset.fetched = (P.patch === true ? "patch:" + P.rec.seq.length : "whole") + ":" + text.length;
        reload(D);
      }
    } finally { busy = false; if (again) { again = false; refresh(); } }
  }
  // A long run's other windows, fetched as one moves through it.
  window.TIMELINE.connect(q => fetch(base + "/data?" + new URLSearchParams(q)).then(r => r.ok ? r.json() : null));
  const es = new EventSource(base + "/events?after=" + have);
  es.onopen = () => live.classList.add("on");
  es.onerror = () => live.classList.remove("on");
  es.addEventListener("commit", ev => { const d = JSON.parse(ev.data); have = d.last_seq; live.textContent = "live · seq " + have + " · " + d.status; refresh(); });
  // Actions (only when the server allows them): JSON posts, the answer shown below them.
  const result = document.getElementById("act-result");
  if (!result) return;
  async function act(name, body) {
    result.className = "meta"; result.textContent = name + "…";
    const r = await fetch(base + "/" + name, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const d = await r.json();
    result.className = d.ok ? "" : "error";
    result.innerHTML = "";
    result.append(d.message);
    if (d.href) { const a = document.createElement("a"); a.href = d.href; a.id = "act-link"; a.textContent = " open " + d.run_id; result.append(a); }
    document.body.dataset.acted = name + ":" + (d.ok ? "ok" : "error");
  }
  const on = (id, f) => document.getElementById(id).addEventListener("submit", ev => { ev.preventDefault(); f(); });
  on("act-resume-form", () => act("resume", {}));
  on("act-cancel-form", () => act("cancel", {}));
  on("act-fork-form", () => act("fork", {seq: Number(document.body.dataset.seq), updates: document.getElementById("fork-updates").value}));
  on("act-send-form", () => act("send", {event: document.getElementById("send-event").value, data: document.getElementById("send-data").value}));
})();
</script>"""


def run_extras(actions: str | None) -> tuple[str, str]:
    """What the web UI adds to the timeline page: its bar and actions, and its script.

    ``actions`` None: a read-only server (no actions panel); else who carries them out."""
    bar = _RUN_BAR.replace("__LIVE__", "live")
    if actions is not None:
        bar += _ACTIONS.replace("__WHO__", html.escape(actions))
    return bar, _RUN_SCRIPT


def sealed_page(where: str, run_id: str, key_id: str, records: list[StoredRecord]) -> str:
    """A run whose payloads are encrypted, served without its key: the log's seqs, commits,
    times, kinds and steps, each payload shown as "encrypted (key id)"."""
    t0 = records[0].ts if records else 0
    rows = "".join(
        f'<tr data-seq="{r.seq}"><td>{r.seq}</td><td>{r.commit_seq}</td>'
        f"<td>+{max(0, r.ts - t0) / 1e6:.3f} s</td><td><code>{html.escape(r.kind)}</code></td>"
        f"<td>{html.escape(r.step or '')}</td>"
        f'<td class="payload">{html.escape(encrypted_text(r.payload) or clip(r.payload, 120))}</td></tr>'
        for r in records
    )
    head = "".join(f"<th>{h}</th>" for h in ("seq", "commit", "time", "kind", "step", "payload"))
    body = (
        f'<header><p><a href="/" id="back">← all runs</a></p>'
        f"<h1>run <code>{html.escape(run_id)}</code></h1>"
        f'<p class="meta"><code>{html.escape(where)}</code> · {len(records)} records</p>'
        f'<p class="error" id="sealed">Its payloads are encrypted (key id {html.escape(key_id)}):'
        " start <code>workflow --key-file KEYS serve</code> with the key file to see the"
        " timeline, its state and its values.</p></header>"
        f'<main><table id="records"><tr>{head}</tr>{rows}</table></main>'
    )
    return _page(f"run {run_id} (encrypted)", body, f' data-key-id="{html.escape(key_id)}"')
