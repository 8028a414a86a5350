"""``workflow timeline``: one self-contained HTML page of a run, and the data it embeds.

The page must stay quick for runs of 10,000 commits, so it embeds no states: it embeds the
log's columns (seq, commit, time, kind, step, a few arguments a record, a short text) and
computes the state at a selected seq in the browser by replaying them, the same fold in a
few lines of JavaScript. Only what the browser cannot compute without the user's code (the
text of each event and of each context value after each commit) is rendered here.

A run longer than a window (:data:`WINDOW` commits) is shown a window at a time: the data
holds the commits of one window and, as its base, the state just before it (folded from
the nearest snapshot), so any window of a run of a million records costs what the window
holds. ``workflow serve`` loads the next window as one moves past an edge; the static page
says how to write another.
"""

from __future__ import annotations

import html
from bisect import bisect_right
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import click
import orjson

from eventstore import EventStore

from .. import _journal as J
from .._buffers import collect_key, taken
from .._checkpoints import event_class
from .._fold import Folded, fold
from .._ownership import probe_owners
from .._read import Wrap, check_seq, commits, fold_run, run_info, shown_status, start_state
from ._app import cli
from ._common import emit_json, progress, reader, workflow_option
from ._inspect import Viewer, describe
from ._page import PAGE
from ._render import short_class

__all__ = [
    "UNSHOWN",
    "WINDOW",
    "embed_json",
    "render_page",
    "timeline",
    "timeline_data",
    "window_after",
]

# Characters of text kept per value and per record: enough to recognise a value, small
# enough that 10,000 commits make a page of a few megabytes.
TEXT: Final = 160
# Characters kept of a traceback (its end, which says where it failed). Each different
# traceback is embedded once: retries that fail alike share it.
TRACEBACK: Final = 20_000
# Commits a page holds at most: a window of a longer run (a few hundred KiB of page).
WINDOW: Final = 2_000
# Attempt outcomes, as the page draws them.
OK, FAILED, CONFLICT, WAIT, LOST, CANCELLED, OPEN = (
    "ok",
    "failed",
    "conflict",
    "wait",
    "lost",
    "cancelled",
    "open",
)
_ENDS_RUN: Final = frozenset({J.RUN_FINISHED, J.RUN_FAILED, J.RUN_CANCELLED, J.RUN_TIMED_OUT})
# The payload fields the page has no use for, by kind: every other field of each kind's
# payload type (``_journal``) reaches the page, in its arguments or its text. A new field is
# added to one or the other (tests/test_page.py holds both to the payload types).
UNSHOWN: Final[Mapping[str, frozenset[str]]] = {
    J.RUN_STARTED: frozenset({"fingerprint", "graph"}),  # `workflow graph` draws the steps
    J.ENQUEUED: frozenset({"recoveries"}),  # the StepFailedEvent it carries says what failed
    J.STEP_FINISHED: frozenset({"base", "answers"}),  # what its reads and answers were
    J.STEP_FAILED: frozenset({"module"}),  # the error's class name says enough
    J.WAITING: frozenset({"requirements", "deadline", "event"}),  # `workflow state` has them
    J.RUN_FINISHED: frozenset({"id"}),
    J.MEMOIZED: frozenset({"digest"}),  # only a re-run compares it
}


def _retry_text(p: J.StepFailed) -> str:
    """A retried attempt's note: when its retry was due and how long after the first attempt
    it failed (records written before durable retries say only that it was retried)."""
    if not p.get("retry"):
        return ""
    due, elapsed = p.get("retry_at"), p.get("elapsed")
    parts = ["retried"]
    if isinstance(due, int | float):
        parts[0] += (
            " at " + datetime.fromtimestamp(due, tz=UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"
        )
    if isinstance(elapsed, int | float):
        parts.append(f"{elapsed:.3f} s after the first attempt")
    return f" ({', '.join(parts)})"


class _Builder:
    def __init__(self, view: Viewer) -> None:
        self.view = view
        self.steps: dict[str, int] = {}
        self.kinds: dict[str, int] = {}
        self.events: dict[int, list[str]] = {}
        self.cols: dict[str, list[Any]] = {"seq": [], "c": [], "t": [], "k": [], "s": [], "a": []}
        self.text: list[str] = []
        self.commit_seq: list[int] = []
        self.commit_first: list[int] = []
        self.attempts: list[list[Any]] = []
        self.waits: list[list[Any]] = []
        self.tracebacks: list[str] = []
        self._tb_index: dict[str, int] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._waiting: dict[str, int] = {}
        # Who ran each attempt: the step's worker that dequeued its event (None: not in
        # this log), and the session (1 + the resumes before it: which process ran it).
        self.who: list[tuple[int | None, int]] = []
        self._worker: dict[tuple[str, int], int] = {}
        self._session = 1

    def step(self, name: str | None) -> int:
        if name is None:
            return -1
        return self.steps.setdefault(name, len(self.steps))

    def event(self, ev_id: int, dump: Any) -> None:
        self.events[ev_id] = [event_class(dump), self.view.show(dump, TEXT)]

    def traceback(self, p: J.StepFailed) -> int:
        """The index of a failure's traceback in ``tb`` (-1 when none was recorded)."""
        tb = p.get("traceback")
        if not isinstance(tb, str) or not tb:
            return -1
        if len(tb) > TRACEBACK:
            tb = "…\n" + tb[-TRACEBACK:]
        i = self._tb_index.get(tb)
        if i is None:
            i = self._tb_index[tb] = len(self.tracebacks)
            self.tracebacks.append(tb)
        return i

    def seed(self, s: Folded, *, windowed: bool = False) -> dict[str, Any]:
        """The state a fork (or a window) starts from, in the page's compact form.

        A window's attempts and waits still open at its start are drawn from its first
        commit on (a fork's steps in progress run again: their attempts are its own)."""
        for q in s.queues.values():
            for e in q.values():
                self.event(e.id, e.dump)
        for ps in s.in_progress.values():
            for p in ps.values():
                self.event(p.ev.id, p.ev.dump)
        for w in s.waiters.values():
            self.event(w.ev.id, w.ev.dump)
        for e in s.unclaimed.values():
            self.event(e.id, e.dump)
        buffers: dict[str, dict[str, list[int]]] = {}
        for b, d in s.buffers.items():
            for t, es in d.items():
                for e in es:
                    self.event(e.id, e.dump)
                buffers.setdefault(b, {})[t] = [e.id for e in es]
        for step in (*s.queues, *s.in_progress):
            self.step(step)
        if windowed:
            for step, ps in s.in_progress.items():
                for p in ps.values():
                    if p.attempt > 0:
                        self._open[(step, p.ev.id)] = len(self.attempts)
                        self.attempts.append([self.step(step), p.ev.id, p.attempt, 0, -1, OPEN, ""])
                        self.who.append((None, self._session))  # begun before the window
            for w in s.waiters.values():
                self._waiting[w.waiter_id] = len(self.waits)
                self.waits.append([self.step(w.step), w.ev.id, 0, -1, short_class(w.awaited)])
        return {
            "status": s.status,
            "q": {k: list(q) for k, q in s.queues.items() if q},
            "p": {
                k: [[p.ev.id, p.attempt, p.failures] for p in ps.values()]
                for k, ps in s.in_progress.items()
                if ps
            },
            "ctx": {k: self.view.show(v.dump, TEXT) for k, v in s.context.items()},
            "w": [
                [w.waiter_id, w.step, w.ev.id, short_class(w.awaited)] for w in s.waiters.values()
            ],
            "u": list(s.unclaimed),
            "b": buffers,
        }

    def _close(self, key: tuple[str, int], ci: int, outcome: str, note: str = "") -> None:
        i = self._open.pop(key, None)
        if i is not None:
            self.attempts[i][4] = ci
            self.attempts[i][5] = outcome
            if note:
                self.attempts[i][6] = note

    def _close_all(self, ci: int, outcome: str) -> None:
        for key in list(self._open):
            self._close(key, ci, outcome)

    def record(self, r: Any, p: Any, ci: int, t0: int) -> list[Any]:
        """Adds a record's columns and follows attempts and waits; returns its arguments."""
        k, step = r.kind, r.step
        args: list[Any] = []
        if k == J.ENQUEUED:
            enqueued: J.Enqueued = p
            self.event(enqueued["id"], enqueued["event"])
            args = [enqueued["id"]]
        elif k in (J.DEQUEUED, J.STEP_FINISHED, J.STEP_CONFLICTED):
            ended: J.Dequeued | J.StepFinished | J.StepConflicted = p
            args = [ended["id"]]
            key = (step or "", ended["id"])
            if k == J.DEQUEUED:
                worker = p.get("worker")
                if isinstance(worker, int):
                    self._worker[key] = worker
            if k == J.STEP_FINISHED:
                finished: J.StepFinished = p
                emitted = ", ".join(f"#{i}" for i in finished["emitted"]) or "nothing"
                self._close(key, ci, OK, "emitted " + emitted)
            elif k == J.STEP_CONFLICTED:
                conflicted: J.StepConflicted = p
                self._close(key, ci, CONFLICT, f"stale keys {conflicted.get('keys')}")
        elif k == J.STEP_STARTED:
            started: J.StepStarted = p
            ev_id, attempt = started["id"], started["attempt"]
            args = [ev_id, attempt]
            key = (step or "", ev_id)
            # A new attempt while one is open: the process running it died.
            self._close(key, ci, LOST, "the process died during this attempt")
            self._open[key] = len(self.attempts)
            self.attempts.append([self.step(step), ev_id, attempt, ci, -1, OPEN, ""])
            self.who.append((self._worker.get(key), self._session))
        elif k == J.STEP_FAILED:
            failed: J.StepFailed = p
            error = f"{failed.get('error')}: {failed.get('message')}"
            retry = failed.get("retry")
            args = [failed["id"], error, 1 if retry else 0, self.traceback(failed)]
            key = (step or "", failed["id"])
            self._close(key, ci, FAILED, error + _retry_text(failed))
        elif k == J.WAITING:
            waiting: J.Waiting = p
            awaited = short_class(str(waiting.get("awaited")))
            args = [waiting["id"], waiting["waiter"], awaited]
            key = (step or "", waiting["id"])
            self._close(key, ci, WAIT, f"waits for {awaited}")
            self._waiting[waiting["waiter"]] = len(self.waits)
            self.waits.append([self.step(step), waiting["id"], ci, -1, awaited])
        elif k == J.WAIT_RESOLVED:
            resolved: J.WaitResolved = p
            answer_id = resolved.get("id")
            args = [resolved["waiter"], answer_id]
            if answer_id is not None:
                self.event(answer_id, resolved.get("event"))
            i = self._waiting.pop(resolved["waiter"], None)
            if i is not None:
                self.waits[i][3] = ci
        elif k == J.STATE_SET or k == J.STATE_DELETED:
            changed: J.StateSet | J.StateDeleted = p
            args = [changed["key"]]  # the value's text is added once the whole commit is folded
        elif k == J.COLLECTED:
            collected: J.Collected = p
            put = collected.get("put")
            if put:
                self.event(put["id"], put["event"])
            args = [  # buffers and the events in them as the fold keys them
                collect_key(step or "", collected),
                put["id"] if put else None,
                [name for name, n in taken(collected) for _ in range(n)],
            ]
        elif k == J.MEMOIZED:
            memo: J.Memoized = p
            args = [memo["id"], memo["key"]]
        elif k == J.RUN_STARTED:
            run_started: J.RunStarted = p
            start = run_started.get("start")
            if start:
                self.event(start["id"], start["event"])
        elif k == J.RUN_FINISHED:
            finished_run: J.RunFinished = p
            args = [self.view.show(finished_run.get("result"), TEXT)]
        elif k == J.RUN_FAILED:
            failed_run: J.RunFailed = p
            args = [f"{failed_run.get('error')}: {failed_run.get('message')}"]
        elif k == J.RUN_RESUMED:
            resumed: J.RunResumed = p
            renamed = resumed.get("renamed") or {}
            args = [[[self.step(old), self.step(new)] for old, new in renamed.items()]]
        if k in _ENDS_RUN:
            self._close_all(ci, CANCELLED)
        elif k == J.RUN_RESUMED:
            self._close_all(ci, LOST)
            self._session += 1
        c = self.cols
        c["seq"].append(r.seq)
        c["c"].append(ci)
        c["t"].append(max(0, r.ts - t0) // 1000)
        c["k"].append(self.kinds.setdefault(k, len(self.kinds)))
        c["s"].append(self.step(step))
        c["a"].append(args)
        self.text.append(describe(r, p, self.view, TEXT))
        return args


def _rows(
    attempts: list[list[Any]],
    waits: list[list[Any]],
    n_steps: int,
    workers: list[int | None] | None = None,
) -> list[int]:
    """Gives each bar of a lane a row: an attempt the row of the step's worker that ran it
    (a lane per worker), a wait or an attempt of no known worker the first free row (so
    overlapping bars never share one); returns the rows per lane."""
    ends: list[list[int]] = [[] for _ in range(n_steps)]
    ranks: list[dict[int, int]] = [{} for _ in range(n_steps)]
    by = workers if workers is not None else [None] * len(attempts)
    for a, w in zip(attempts, by, strict=True):
        if a[0] >= 0 and w is not None:
            ranks[a[0]].setdefault(w, 0)
    for step_ranks in ranks:  # workers 0, 1, 2 ... top to bottom
        for rank, w in enumerate(sorted(step_ranks)):
            step_ranks[w] = rank
    bars = [(a[0], a[3], a, 7, w) for a, w in zip(attempts, by, strict=True)]
    bars += [(w[0], w[2], w, 5, None) for w in waits]
    bars.sort(key=lambda b: (b[0], b[1]))
    for step, start, bar, slot, worker in bars:
        if step < 0:
            continue
        end = bar[4] if slot == 7 else bar[3]
        lane = ends[step]
        want = None if worker is None else ranks[step][worker]
        if want is not None:
            while len(lane) <= want:
                lane.append(-1)
        if want is not None and lane[want] < start:
            row = want
        else:
            row = next((r for r, last in enumerate(lane) if last < start), len(lane))
            if row == len(lane):
                lane.append(-1)
        lane[row] = end if end >= 0 else 1 << 60
        bar.append(row)
    return [max(1, len(lane)) for lane in ends]


def _worker_rows(
    attempts: list[list[Any]], who: list[tuple[int | None, int]], n: int
) -> list[list[Any]]:
    """Per lane, the worker each row shows (None for a row of waits alone)."""
    rows: list[list[Any]] = [[] for _ in range(n)]
    for a, (worker, _) in zip(attempts, who, strict=True):
        if a[0] < 0 or worker is None:
            continue
        lane = rows[a[0]]
        while len(lane) <= a[7]:
            lane.append(None)
        lane[a[7]] = worker
    return rows


def _ends(store: EventStore, rid: int, upto: int, n: int) -> list[int]:
    """The last seqs of the run's last ``n`` commits ending at or before ``upto``, latest
    first (an index walk back from ``upto``: it costs what it returns)."""
    rows = store.query(
        "SELECT seq FROM log WHERE rid = ? AND seq <= ? AND seq = commit_seq"
        " ORDER BY seq DESC LIMIT ?",
        (rid, upto, n),
    )
    return [int(seq) for (seq,) in rows]


def window_after(
    store: EventStore,
    run_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    around: int | None = None,
    limit: int = WINDOW,
) -> int:
    """The seq a window of ``limit`` commits starts after (0: the run's start).

    ``after`` a seq: the window of the commits after it; ``before``: the last ``limit``
    commits ending at or before it; ``around``: the window holding that seq near its middle;
    none of them: the run's last ``limit`` commits.

    :raises ValueError: ``limit`` is not positive.
    """
    if limit < 1:
        msg = f"a window holds at least one commit, not {limit}"
        raise ValueError(msg)
    info = run_info(store, run_id)
    first = info.first_seq or 0
    if after is not None:
        return 0 if after < first else after
    upto = info.last_seq or 0 if before is None or around is not None else before
    ends = _ends(store, info.rid, upto, limit + 1)
    start = ends[limit] if len(ends) > limit else 0
    if around is not None and around <= start:  # not in the last window: one around it
        half = max(1, limit // 2)
        ends = _ends(store, info.rid, around - 1, half)
        start = ends[-1] if len(ends) == half else 0
    return start


def timeline_data(
    store: EventStore,
    run_id: str,
    view: Viewer | None = None,
    wrap: Wrap | None = None,
    *,
    after: int | None = None,
    before: int | None = None,
    around: int | None = None,
    limit: int = WINDOW,
) -> dict[str, Any]:
    """What the timeline page embeds: the run's log as columns plus per-commit texts, for
    the window of at most ``limit`` commits :func:`window_after` picks (the run's last by
    default).

    ``rec`` holds one entry per record in each column (``seq``, ``c`` its commit's index,
    ``t`` milliseconds since the run began, ``k`` kind and ``s`` step as indexes into
    ``kinds`` and ``steps``, ``a`` the arguments the page's fold needs, ``x`` a short text);
    ``commits`` the last seq and first record of each commit; ``attempts`` one bar per step
    attempt ``[step, event id, attempt, first commit, last commit or -1, outcome, note,
    row]``; ``waits`` ``[step, event id, first commit, last commit or -1, awaited, row]``;
    ``base`` the state a fork starts from; ``events`` each event id's class and text;
    ``tb`` the failed attempts' tracebacks, each once (a ``step_failed`` record's fourth
    argument is its index there, -1 when it has none); ``window`` where the window lies
    (``after``, the seq it starts after, 0 at the run's start; ``more_before`` and
    ``more_after``, whether the run has commits outside it; the run's ``first`` and
    ``last`` seqs; ``limit``).
    """
    view = view or Viewer()
    info = run_info(store, run_id)
    start = window_after(store, run_id, after=after, before=before, around=around, limit=limit)
    b = _Builder(view)
    if start:  # the state just before the window: from the nearest snapshot
        state = fold_run(store, run_id, start)
        base = b.seed(state, windowed=True)
    else:
        state = start_state(store, info, wrap=wrap)
        base = b.seed(state)
    t0 = info.created
    upto = info.last_seq or 0  # as of now: a run that grows meanwhile is read consistently
    records = store.records(run_id, after=start, upto=upto)
    chunks = commits(records if wrap is None or start else wrap(records))
    for ci, commit in enumerate(chunks):
        if ci == limit:
            break  # the rest of the run is other windows
        fold(state, commit)
        b.commit_seq.append(commit[-1].seq)
        b.commit_first.append(len(b.text))
        for r in commit:
            args = b.record(r, r.data(), ci, t0)
            if r.kind == J.STATE_SET or r.kind == J.STATE_DELETED:
                entry = state.context.get(args[0])
                args.append(None if entry is None else view.show(entry.dump, TEXT))
    rows = _rows(b.attempts, b.waits, len(b.steps), [w for w, _ in b.who])
    lane_workers = _worker_rows(b.attempts, b.who, len(b.steps))
    for a, (worker, session) in zip(b.attempts, b.who, strict=True):
        a.append([worker, session])  # [8]: which worker of which session ran it
    first_seqs = [b.cols["seq"][i] for i in b.commit_first]
    forks = []
    last = b.commit_seq[-1] if b.commit_seq else start
    for other in store.runs():
        if other.parent_run_id == run_id and other.parent_seq is not None:
            at = max(0, bisect_right(first_seqs, other.parent_seq) - 1)
            if not start < other.parent_seq <= last:
                at = -1  # outside the window: named in the header, not drawn
            forks.append([other.run_id, other.parent_seq, at])
    return {
        "v": 1,
        "run": {
            "id": run_id,
            "workflow": state.workflow or str(info.meta.get("workflow", "")),
            "status": _status(store, state, last < upto) if b.commit_seq else state.status,
            "created": info.created,
            "parent": [info.parent_run_id, info.parent_seq] if info.parent_run_id else None,
            "forks": forks,
            "typed": view.typed,
        },
        "steps": list(b.steps),
        "lanes": rows,
        "lane_workers": lane_workers,
        "kinds": list(b.kinds),
        "rec": {**b.cols, "x": b.text},
        "commits": {"seq": b.commit_seq, "first": b.commit_first},
        "attempts": b.attempts,
        "waits": b.waits,
        "base": base,
        "events": {str(k): v for k, v in b.events.items()},
        "tb": b.tracebacks,
        "window": {
            "after": start,
            "more_before": start > 0,
            "more_after": last < upto,
            "first": info.first_seq,
            "last": upto,
            "limit": limit,
        },
    }


def _status(store: EventStore, state: Folded, earlier: bool) -> str:
    """The run's status now; ``state`` is its latest unless the window is an ``earlier`` one."""
    latest = fold_run(store, state.run_id) if earlier else state
    return shown_status(store, latest, probe_owners(store), latest.seq)


def embed_json(data: Any) -> str:
    """JSON to put inside a ``<script>`` element: "<" only occurs inside JSON strings, where
    \u003c means the same, so the data can never close the element."""
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def render_page(data: dict[str, Any], ui_html: str = "", ui_script: str = "") -> str:
    """The self-contained HTML page for timeline data (no network: script and style inline).

    ``ui_html`` (before the data) and ``ui_script`` (after the page's script) are what the
    web UI (``workflow serve``) adds: its live updates and actions; the static page has none.
    """
    title = f"run {data['run']['id']} — timeline"
    return (
        PAGE.replace("__TITLE__", html.escape(title))
        .replace("__UI_HTML__", ui_html)
        .replace("__UI_SCRIPT__", ui_script)
        .replace("__DATA__", embed_json(data))
    )


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the page (default: RUN.html, which is what fork links point to).",
)
@click.option(
    "--at",
    "at",
    type=int,
    metavar="SEQ",
    help="A run longer than a window: the window around this seq (default: the last one).",
)
@click.option(
    "--window",
    "limit",
    type=click.IntRange(min=1),
    default=WINDOW,
    show_default=True,
    metavar="N",
    help="Commits the page holds at most.",
)
@workflow_option
@click.option("--json", "as_json", is_flag=True, help="Print the page's data as JSON instead.")
def timeline(
    db: str,
    run: str,
    output: str | None,
    at: int | None,
    limit: int,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """Write RUN's timeline: a lane per step, attempts as bars, the state at any seq.

    A run longer than --window commits gets the page of one window (the last, or the one
    around --at SEQ), which opens at once however long the run; `workflow serve DB` shows
    the same page and loads the other windows as you move through the run.
    """
    store, view, _ = reader(db, workflow_spec)
    if at is not None:
        check_seq(store, run, at)
    wrap = progress(store, run, "reading")
    data = timeline_data(store, run, view, wrap, around=at, limit=limit)
    if as_json:
        emit_json(data)
        return
    path = Path(output or f"{run}.html")
    page = render_page(data)
    path.write_text(page, encoding="utf-8")
    n, w = len(data["commits"]["seq"]), data["window"]
    part = ""
    if w["more_before"] or w["more_after"]:
        seqs = data["commits"]["seq"]
        part = (
            f" of seqs {w['after'] + 1}-{seqs[-1] if seqs else w['after']} of the run's"
            f" {w['first']}-{w['last']}: --at SEQ writes another window,"
            f" `workflow serve {db}` loads them as you move"
        )
    click.echo(f"wrote {path} ({n} commits{part}, {len(page) // 1024} KiB)")
