# The page's JavaScript is data here, written for a browser, not for the Python line length.
# ruff: noqa: E501

"""The timeline page's fold: ``workflow/_fold.py`` over the page's compact columns.

Queues, steps in progress, context, waiters, collect buffers and status, from the embedded
data alone (``D``, what ``timeline_data`` makes; a window's ``base`` is the state just
before it). Its ``APPLY`` has one function a record kind. It touches no DOM, so
tests/test_page.py runs it alone in node, against the journal's payload types and the
Python fold.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FOLD_SCRIPT"]

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
// (a[0]: pairs of step indexes) and so do their collect buffers (a[1]: pairs of keys);
// the events of classes renamed since go under the new names in every buffer (a[2]).
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
  for (const [old, now] of a[2] || []) {
    for (const b of st.b.values()) {
      const ids = b.get(old);
      if (!ids || old === now) continue;
      b.delete(old);
      b.set(now, (b.get(now) || []).concat(ids));
    }
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
    if (a[1]) return;  // a stream's member, held at a collect step until its release
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
      const name = (D.events[a[1]] || [""])[0];
      const t = a[4] != null ? a[4] : name.slice(name.lastIndexOf(":") + 1);
      if (!buf.has(t)) buf.set(t, []);
      buf.get(t).push(a[1]);
    }
    const runs = a[3] && a[3].reduce((n, [first, last]) => n + (last - first + 1), 0);
    if (runs === a[2].length) {  // the ids it took (as the Python fold: those it holds)
      const want = new Set();
      for (const [first, last] of a[3]) for (let i = first; i <= last; i++) want.add(i);
      for (const t of new Set(a[2])) {
        const es = buf.get(t);
        if (!es) continue;
        const kept = es.filter(id => !want.has(id));
        if (kept.length) buf.set(t, kept); else buf.delete(t);
      }
    } else {
      for (const t of a[2]) {
        const es = buf.get(t);
        if (es && es.length) { es.shift(); if (!es.length) buf.delete(t); }
      }
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
