"""What ``workflow timeline`` builds from a run's records: the columns, texts, attempt bars
and waits the page embeds (:class:`Builder`, one record at a time), and the rows that
parallel bars take in their lane.

The page's fold (``_page_fold``) reads what :meth:`Builder.record` gives each record as its
arguments; ``_timeline`` picks the window and assembles the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from .. import _journal as J
from .._buffers import collect_key, taken
from .._checkpoints import event_class
from .._fold import Folded
from ._inspect import Viewer, describe
from ._render import short_class

__all__ = ["TEXT", "TRACEBACK", "UNSHOWN", "Builder", "lane_rows", "worker_rows"]

# Characters of text kept per value and per record: enough to recognise a value, small
# enough that 10,000 commits make a page of a few megabytes.
TEXT: Final = 160
# Characters kept of a traceback (its end, which says where it failed). Each different
# traceback is embedded once: retries that fail alike share it.
TRACEBACK: Final = 20_000
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
    # The StepFailedEvent it carries says what failed; a release's event holds its stream's.
    J.ENQUEUED: frozenset({"recoveries", "stream", "release"}),
    J.STEP_FINISHED: frozenset({"base", "answers", "opened"}),  # its reads, answers, stream
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


class Builder:
    """The page's data of a run's records, built one record at a time."""

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

    def _moves(self, p: J.RunResumed | J.RunStarted) -> list[Any]:
        """A resume's or a fork's moves of renamed steps' work: step pairs, buffer pairs,
        renamed classes' pairs (their events in every buffer)."""
        renamed, buffers = p.get("renamed") or {}, p.get("buffers") or {}
        return [
            [[self.step(old), self.step(new)] for old, new in renamed.items()],
            [[old, new] for old, new in buffers.items()],
            [[old, new] for old, new in (p.get("classes") or {}).items()],
        ]

    def record(self, r: Any, p: Any, ci: int, t0: int) -> list[Any]:
        """Adds a record's columns and follows attempts and waits; returns its arguments."""
        k, step = r.kind, r.step
        args: list[Any] = []
        if k == J.ENQUEUED:
            enqueued: J.Enqueued = p
            self.event(enqueued["id"], enqueued["event"])
            # [id], or [id, 1] for a stream's member held at a collect step (not queued)
            args = [enqueued["id"], 1] if enqueued.get("held") else [enqueued["id"]]
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
                collected.get("ids"),  # the events taken, as runs of ids (records since)
                collected.get("slot"),  # the class a put is buffered as, when not its own
            ]
        elif k == J.MEMOIZED:
            memo: J.Memoized = p
            args = [memo["id"], memo["key"]]
        elif k == J.RUN_STARTED:
            run_started: J.RunStarted = p
            start = run_started.get("start")
            if start:
                self.event(start["id"], start["event"])
            args = self._moves(run_started)
        elif k == J.RUN_FINISHED:
            finished_run: J.RunFinished = p
            args = [self.view.show(finished_run.get("result"), TEXT)]
        elif k == J.RUN_FAILED:
            failed_run: J.RunFailed = p
            args = [f"{failed_run.get('error')}: {failed_run.get('message')}"]
        elif k == J.RUN_RESUMED:
            resumed: J.RunResumed = p
            args = self._moves(resumed)
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


def lane_rows(
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


def worker_rows(
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
