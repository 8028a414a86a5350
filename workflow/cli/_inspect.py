"""What the read commands compute: a run's log as lines, its state, a diff of two seqs.

Everything here works on the log's JSON form (``Folded``, codec dumps), so no user code is
needed; a :class:`Viewer` decides how values become text (raw dumps, or decoded and repr'd
when the user named the workflow).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from eventstore import Codec, EventStore, LogCorruptedError, NotAStoreError, RunInfo, StoredRecord

from .. import _journal as J
from .._errors import CheckpointNotFoundError, WorkflowRuntimeError
from .._fold import Folded, fold
from .._ownership import LeaseOwners, Owners
from .._read import commits, event_type, fold_run, live_status, records_upto, run_info
from ._render import Show, short_class, show_dump, show_typed

__all__ = [
    "Change",
    "Damaged",
    "Viewer",
    "check_seq",
    "describe",
    "diff",
    "failed_attempts",
    "fold_at",
    "is_owned",
    "is_url",
    "open_store",
    "owners",
    "readable_records",
    "state_json",
    "traceback_lines",
]

# Wraps the records a fold reads (with a progress bar).
Wrap = Callable[[Iterator[StoredRecord]], Iterator[StoredRecord]]


@dataclass(frozen=True, slots=True)
class Viewer:
    """Turns codec dumps into text: raw (no user code), or typed through ``codec``."""

    codec: Codec | None = None

    @property
    def typed(self) -> bool:
        """Whether values are decoded with the user's classes."""
        return self.codec is not None

    def show(self, dump: Any, limit: int = 120) -> str:
        """The value as text of at most ``limit`` characters."""
        if self.codec is None:
            return show_dump(dump, limit)
        try:
            value = self.codec.load(dump)
        except Exception:
            # One undecodable old value should not hide the rest of a run from its debugger.
            return "<undecodable> " + show_dump(dump, max(10, limit - 14))
        return show_typed(value, limit)


def is_url(db: str) -> bool:
    """Whether DB names a PostgreSQL database rather than a file."""
    return db.startswith(("postgresql://", "postgres://"))


def open_store(db: str) -> EventStore:
    """Opens an existing store read-only: an SQLite file, or a PostgreSQL URL.

    :raises FileNotFoundError: no such file.
    :raises NotAStoreError: the file is not a store.
    """
    if not is_url(db):
        p = Path(db)
        if not p.exists():
            msg = f"{db}: no such file"
            raise FileNotFoundError(msg)
        if p.is_dir():
            raise NotAStoreError(db, "it is a directory")
    return EventStore(db, readonly=True)


class _Nobody(Owners):
    """Ownership of a store no executor ever ran: nobody owns any of its runs."""

    def is_owned(self, rid: int, run_id: str = "") -> bool:
        return False


def owners(store: EventStore) -> Owners | LeaseOwners:
    """The store's ownership, read without creating the lock file when there is none."""
    if store.kind == "postgres":
        return LeaseOwners(store)
    path = store.path
    # Executors create "<db>-owners" when they take a run; without it no run is owned, and
    # a reader should not leave files behind it.
    if path is None or not Path(str(Path(path).resolve()) + "-owners").exists():
        return _Nobody(path)
    return Owners(path)


def is_owned(store: EventStore, rid: int, run_id: str) -> bool:
    """Whether a live executor holds the run now."""
    return owners(store).is_owned(rid, run_id)


def check_seq(store: EventStore, run_id: str, seq: int | None) -> RunInfo:
    """The run's row, once ``seq`` is known to be a seq one can look at the run at.

    :raises RunNotFoundError: no such run.
    :raises CheckpointNotFoundError: ``seq`` is before the run's first record.
    :raises WorkflowRuntimeError: ``seq`` is past the end of the log.
    """
    info = run_info(store, run_id)
    if seq is None:
        return info
    head = store.head()
    if seq > head:
        msg = f"seq {seq} is past the end of the log (its last seq is {head})"
        raise WorkflowRuntimeError(msg)
    if info.first_seq is None or seq < info.first_seq:
        raise CheckpointNotFoundError(run_id, seq, info.first_seq)
    return info


def fold_at(store: EventStore, run_id: str, seq: int | None, wrap: Wrap | None = None) -> Folded:
    """The run's state at ``seq`` in JSON form (``fold_run``), with seqs checked first.

    ``wrap`` sees the records the fold reads (for a progress bar). Without it, or when the
    run has a cached state to start from, this is ``fold_run`` itself; with it, the whole
    log is folded, which is the same pure fold the cache always agrees with.

    :raises RunNotFoundError: no such run.
    :raises CheckpointNotFoundError: ``seq`` is before the run's first record.
    :raises WorkflowRuntimeError: ``seq`` is past the end of the log.
    """
    info = check_seq(store, run_id, seq)
    snap = None if wrap is None else store.snapshot(run_id)
    if wrap is None or (snap is not None and (seq is None or snap[0] <= seq)):
        return fold_run(store, run_id, seq)
    if info.parent_run_id is not None and info.parent_seq is not None:
        state = fold_at(store, info.parent_run_id, info.parent_seq, wrap)
        state.run_id = run_id
        state.first_seq = None
    else:
        state = Folded(run_id)
    return fold(state, wrap(records_upto(store, run_id, seq)))


def status_of(store: EventStore, s: Folded) -> str:
    """The status a state shows, as ``Workflow.state_at`` gives it.

    At the run's latest seq, whether a live executor owns it tells ``running`` from
    ``interrupted``; an earlier state shows the status the run had then.
    """
    info = run_info(store, s.run_id)
    if info.last_seq is not None and s.seq < info.last_seq:
        return s.status
    return live_status(s.status, s.only_waiters(), is_owned(store, info.rid, s.run_id))


# ---------------------------------------------------------------------------- damaged records


@dataclass(frozen=True, slots=True)
class Damaged:
    """A record that cannot be shown: its seq, why, and the row when that could be read."""

    seq: int
    error: BaseException
    record: StoredRecord | None = None

    def error_text(self) -> str:
        """The error's class and message, on one line."""
        return f"{type(self.error).__name__}: {' '.join(str(self.error).split())}"


def readable_records(
    store: EventStore,
    run_id: str,
    after: int,
    upto: int | None,
    kinds: list[str] | None = None,
) -> Iterator[StoredRecord | Damaged]:
    """The run's records after ``after``; one that cannot be read back comes as :class:`Damaged`.

    Reading goes on after a damaged record, so one flipped byte hides one line, not the rest
    of the log.
    """
    while upto is None or after < upto:
        try:
            for r in store.records(run_id, after=after, upto=upto, kinds=kinds):
                after = r.seq
                yield r
            return
        except LogCorruptedError as exc:
            if exc.seq is None or exc.seq <= after:
                raise  # not one record's fault: the store cannot be read here at all
            yield Damaged(exc.seq, exc)
            after = exc.seq


# ---------------------------------------------------------------------------- one record


def _src(src: Any) -> str:
    if isinstance(src, list) and len(src) == 2:
        return f"from #{src[0]} attempt {src[1]}"
    return f"from {src}"


def _ids(ids: Iterable[Any]) -> str:
    listed = ", ".join(f"#{i}" for i in ids)
    return listed or "nothing"


# Each kind's payload as one short line: Callable(payload, show, limit) -> text. A kind
# without an entry shows its payload whole.
_Line = Callable[[Any, Show, int], str]


def _run_started(p: J.RunStarted, show: Show, limit: int) -> str:
    parent = p.get("parent")
    start = p.get("start")
    text = f"{p.get('workflow', '')}"
    if start:
        text += f" start #{start.get('id')} {show(start.get('event'), limit)}"
    if parent:
        text += f" fork of {parent.get('run_id')} at seq {parent.get('seq')}"
    return text


def _enqueued(p: J.Enqueued, show: Show, limit: int) -> str:
    return f"#{p.get('id')} {show(p.get('event'), limit)} {_src(p.get('src'))}"


def _dequeued(p: J.Dequeued, show: Show, limit: int) -> str:
    return f"#{p.get('id')} worker {p.get('worker')}"


def _step_started(p: J.StepStarted, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')}"


def _step_finished(p: J.StepFinished, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} emitted {_ids(p.get('emitted', []))}"


def _step_failed(p: J.StepFailed, show: Show, limit: int) -> str:
    retry = p.get("retry")
    then = f"retry in {p.get('delay')}s" if retry else "no retry"
    return (
        f"#{p.get('id')} attempt {p.get('attempt')} {p.get('error')}: {p.get('message')} ({then})"
    )


def _step_conflicted(p: J.StepConflicted, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} stale keys {p.get('keys')}"


def _state_set(p: J.StateSet, show: Show, limit: int) -> str:
    if "value" in p:
        return f"{p.get('key')} = {show(p['value'], limit)}"
    return f"{p.get('key')} patched: {show_dump(p.get('patch'), limit)}"


def _state_deleted(p: J.StateDeleted, show: Show, limit: int) -> str:
    return f"del {p.get('key')}"


def _collected(p: J.Collected, show: Show, limit: int) -> str:
    put = p.get("put")
    take = p.get("take")
    text = f"buffer {p.get('buf')}"
    if put:
        text += f" put #{put.get('id')} {show(put.get('event'), limit)}"
    if take:
        text += f" took {', '.join(map(short_class, take))}"
    return text


def _waiting(p: J.Waiting, show: Show, limit: int) -> str:
    return (
        f"#{p.get('id')} attempt {p.get('attempt')} waits for "
        f"{short_class(str(p.get('awaited')))} (waiter {p.get('waiter')})"
    )


def _wait_resolved(p: J.WaitResolved, show: Show, limit: int) -> str:
    if p.get("id") is None:
        return f"waiter {p.get('waiter')} timed out"
    return f"waiter {p.get('waiter')} answered by #{p.get('id')} {show(p.get('event'), limit)}"


def _streamed(p: J.Streamed, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} {show(p.get('event'), limit)}"


def _run_finished(p: J.RunFinished, show: Show, limit: int) -> str:
    return f"result {show(p.get('result'), limit)}"


def _run_failed(p: J.RunFailed, show: Show, limit: int) -> str:
    return f"{p.get('error')}: {p.get('message')}"


def _run_resumed(p: J.RunResumed, show: Show, limit: int) -> str:
    return f"epoch {p.get('epoch')}, was {p.get('previous')}"


_LINES: Final[dict[str, _Line]] = {
    J.RUN_STARTED: _run_started,
    J.ENQUEUED: _enqueued,
    J.DEQUEUED: _dequeued,
    J.STEP_STARTED: _step_started,
    J.STEP_FINISHED: _step_finished,
    J.STEP_FAILED: _step_failed,
    J.STEP_CONFLICTED: _step_conflicted,
    J.STATE_SET: _state_set,
    J.STATE_DELETED: _state_deleted,
    J.COLLECTED: _collected,
    J.WAITING: _waiting,
    J.WAIT_RESOLVED: _wait_resolved,
    J.STREAMED: _streamed,
    J.RUN_FINISHED: _run_finished,
    J.RUN_FAILED: _run_failed,
    J.RUN_RESUMED: _run_resumed,
}


def describe(r: StoredRecord, p: Any, view: Viewer, limit: int = 200) -> str:
    """A record's payload as one short line: what happened, with ids and values."""
    line = _LINES.get(r.kind)
    if line is None:
        return show_dump(p, limit)
    return line(p, view.show, limit)


def record_json(r: StoredRecord) -> dict[str, Any]:
    """A record as JSON-native data (the payload parsed, never decoded)."""
    t = event_type(r)
    return {
        "seq": r.seq,
        "commit_seq": r.commit_seq,
        "ts": r.ts,
        "kind": r.kind,
        "step": r.step,
        "event_type": t,
        "payload": r.data(),
    }


def traceback_lines(p: Any, indent: str) -> list[str]:
    """A ``step_failed`` payload's stored traceback as indented lines (all of it)."""
    tb = p.get("traceback") if isinstance(p, dict) else None
    if not tb:
        return [f"{indent}(no traceback recorded)"]
    return [f"{indent}{line}".rstrip() for line in str(tb).rstrip("\n").split("\n")]


# ---------------------------------------------------------------------------- state


def _failure(r: StoredRecord, p: J.StepFailed) -> dict[str, Any]:
    return {
        "step": r.step,
        "event_id": p.get("id"),
        "attempt": p.get("attempt"),
        "seq": r.seq,
        "error": p.get("error"),
        "module": p.get("module"),
        "message": p.get("message"),
        "retry": p.get("retry"),
        "traceback": p.get("traceback"),
    }


def failed_attempts(store: EventStore, s: Folded) -> list[dict[str, Any]]:
    """The last failed attempt of each event still in progress at ``s.seq``, oldest first:
    its step, event id, attempt, seq, error and stored traceback.

    Only the log after the oldest such event was enqueued is read (and a fork's parent's,
    for events it was given by its parent), so the cost is that of the failures' stretch.
    """
    # Each event's enqueue seq (global, so it bounds the parent's log too): its failures follow.
    missing = {
        (step, i): p.ev.seq
        for step, ps in s.in_progress.items()
        for i, p in ps.items()
        if p.failures
    }
    found: dict[tuple[str, int], dict[str, Any]] = {}
    run_id, upto = s.run_id, s.seq
    while missing:
        after = max(0, min(missing.values()) - 1)
        here: dict[tuple[str, int], dict[str, Any]] = {}
        for r in store.records(run_id, after=after, upto=upto, kinds=[J.STEP_FAILED]):
            p: J.StepFailed = r.data()
            key = (r.step or "", p.get("id") if isinstance(p, dict) else None)
            if key in missing:
                here[key] = _failure(r, p)  # a later failure of the same event replaces it
        found.update(here)
        for key in here:
            del missing[key]
        info = run_info(store, run_id)
        if not missing or info.parent_run_id is None or info.parent_seq is None:
            break
        # Events a fork was given in progress may have failed in its parent.
        run_id, upto = info.parent_run_id, info.parent_seq
    return sorted(found.values(), key=lambda f: f["seq"])


def error_json(s: Folded, failed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's error with the traceback of the attempt that failed it, when one did."""
    if s.error is None:
        return None
    tb = None
    for f in failed:
        same = (f["error"], f["message"]) == (s.error.get("error"), s.error.get("message"))
        if f["step"] == s.error.get("step") and same:
            tb = f["traceback"]
    return {**s.error, "traceback": tb}


def state_json(
    s: Folded, status: str, inbox: int = 0, failed: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The folded state as JSON, shaped like ``RunState.to_json()`` plus event ids and,
    given them, the failed attempts (with tracebacks) of the events in progress."""
    failed = failed or []
    return {
        "run_id": s.run_id,
        "seq": s.seq,
        "status": status,
        "result": s.result,
        "error": error_json(s, failed),
        "failed_attempts": failed,
        "queues": {k: [e.dump for e in q.values()] for k, q in s.queues.items() if q},
        "queue_ids": {k: list(q) for k, q in s.queues.items() if q},
        "in_progress": {
            k: [
                {
                    "event_id": p.ev.id,
                    "event": p.ev.dump,
                    "attempt": p.attempt,
                    "failures": p.failures,
                }
                for p in v.values()
            ]
            for k, v in s.in_progress.items()
            if v
        },
        "context": {k: v.dump for k, v in s.context.items()},
        "collected": {
            b: {t: [e.dump for e in es] for t, es in d.items()} for b, d in s.buffers.items()
        },
        "waiters": [
            {
                "waiter_id": w.waiter_id,
                "step": w.step,
                "event_id": w.ev.id,
                "event": w.ev.dump,
                "awaited": w.awaited,
                "requirements": w.requirements,
                "deadline": w.deadline,
                "waiter_event": w.waiter_event,
            }
            for w in s.waiters.values()
        ],
        "unclaimed": [e.dump for e in s.unclaimed.values()],
        "stream": [e.dump for e in s.stream],
        "workflow": s.workflow,
        "fingerprint": s.fingerprint,
        "parent": list(s.parent) if s.parent else None,
        "pending_inbox": inbox,
    }


# ---------------------------------------------------------------------------- diff

_STEP_KINDS: Final = frozenset(
    {J.STEP_STARTED, J.STEP_FINISHED, J.STEP_FAILED, J.STEP_CONFLICTED, J.WAITING}
)


@dataclass(slots=True)
class Change:
    """What happened between two seqs of a run, as JSON-native lists."""

    run_id: str
    start: int  # the commit the first state ends at
    end: int
    status: tuple[str, str]
    enqueued: list[dict[str, Any]] = field(default_factory=list)
    consumed: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    added: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)
    result: Any = None

    def to_json(self) -> dict[str, Any]:
        """The change as JSON-native data; values stay codec dumps."""
        return {
            "run_id": self.run_id,
            "from": self.start,
            "to": self.end,
            "status": list(self.status),
            "enqueued": self.enqueued,
            "consumed": self.consumed,
            "steps": self.steps,
            "context": {
                "added": self.added,
                "changed": {k: {"old": o, "new": n} for k, (o, n) in self.changed.items()},
                "removed": self.removed,
            },
            "result": self.result,
        }


def _context_bytes(s: Folded) -> dict[str, bytes]:
    # Encoded text, not Python ==: 1 == 1.0 == True, but they are different values. It is
    # also a copy, which matters because folding on patches values in place.
    return {k: orjson.dumps(v.dump) for k, v in s.context.items()}


def diff(store: EventStore, run_id: str, a: int, b: int, wrap: Wrap | None = None) -> Change:
    """What changed in the run from its state at ``a`` to its state at ``b``.

    :raises WorkflowRuntimeError: ``a`` is after ``b``.
    """
    if a > b:
        msg = f"diff needs A <= B, got A={a} and B={b}; swap them"
        raise WorkflowRuntimeError(msg)
    check_seq(store, run_id, b)
    state = fold_at(store, run_id, a, wrap)
    before = _context_bytes(state)
    old_status = state.status
    start = state.seq
    events: dict[int, Any] = {}
    for q in state.queues.values():
        events.update((i, e.dump) for i, e in q.items())
    for ps in state.in_progress.values():
        events.update((i, p.ev.dump) for i, p in ps.items())
    out = Change(run_id, start, start, (old_status, old_status))
    rest = records_upto(store, run_id, b, after=start)
    for commit in commits(rest if wrap is None else wrap(rest)):
        fold(state, commit)
        for r in commit:
            p = r.data()
            _note(out, r, p, events)
    out.end = state.seq
    out.status = (old_status, state.status)
    after = {k: v.dump for k, v in state.context.items()}
    for k, v in after.items():
        if k not in before:
            out.added[k] = v
        elif orjson.dumps(v) != before[k]:
            out.changed[k] = (orjson.loads(before[k]), v)
    for k, old in before.items():
        if k not in after:
            out.removed[k] = orjson.loads(old)
    out.result = state.result if state.result is not None and old_status != "finished" else None
    return out


def _note(out: Change, r: StoredRecord, p: Any, events: dict[int, Any]) -> None:
    k = r.kind
    if k == J.ENQUEUED:
        enqueued: J.Enqueued = p
        events[enqueued["id"]] = enqueued["event"]
        out.enqueued.append(
            {"seq": r.seq, "step": r.step, "event_id": enqueued["id"], "event": enqueued["event"]}
        )
    elif k == J.DEQUEUED:
        dequeued: J.Dequeued = p
        ev_id = dequeued["id"]
        out.consumed.append(
            {"seq": r.seq, "step": r.step, "event_id": ev_id, "event": events.get(ev_id)}
        )
    elif k in _STEP_KINDS:
        attempted: J.OfAttempt = p
        entry: dict[str, Any] = {
            "seq": r.seq,
            "step": r.step,
            "event_id": attempted.get("id"),
            "attempt": attempted.get("attempt"),
            "outcome": k.removeprefix("step_"),
        }
        if k == J.STEP_FINISHED:
            finished: J.StepFinished = p
            entry["emitted"] = finished.get("emitted", [])
        elif k == J.STEP_FAILED:
            failed: J.StepFailed = p
            entry["error"] = f"{failed.get('error')}: {failed.get('message')}"
            entry["retry"] = failed.get("retry")
        elif k == J.STEP_CONFLICTED:
            conflicted: J.StepConflicted = p
            entry["keys"] = conflicted.get("keys")
        elif k == J.WAITING:
            waiting: J.Waiting = p
            entry["awaited"] = waiting.get("awaited")
        out.steps.append(entry)


# ---------------------------------------------------------------------------- event ids


def _type_of(dump: Any) -> str:
    return str(dump.get("c", "")) if isinstance(dump, dict) else type(dump).__name__


def note_event(r: StoredRecord, p: Any, types: dict[int, str]) -> None:
    """Remembers the class of each event id a record introduces."""
    if r.kind == J.ENQUEUED:
        enqueued: J.Enqueued = p
        types[enqueued["id"]] = _type_of(enqueued.get("event"))
    elif r.kind == J.WAIT_RESOLVED:
        resolved: J.WaitResolved = p
        answer_id = resolved.get("id")
        if answer_id is not None:
            types[answer_id] = _type_of(resolved.get("event"))
    elif r.kind == J.RUN_STARTED:
        started: J.RunStarted = p
        start = started.get("start")
        if start:
            types[start["id"]] = _type_of(start.get("event"))


def event_types_upto(store: EventStore, run_id: str, seq: int) -> dict[int, str]:
    """Event id -> class name for the events the run (and its ancestors) had up to ``seq``."""
    info = run_info(store, run_id)
    types: dict[int, str] = {}
    if info.parent_run_id is not None and info.parent_seq is not None:
        types = event_types_upto(store, info.parent_run_id, info.parent_seq)
    kinds = [J.ENQUEUED, J.WAIT_RESOLVED, J.RUN_STARTED]
    for r in readable_records(store, run_id, 0, seq, kinds):
        if isinstance(r, Damaged):
            continue  # the history shows it where it belongs
        with contextlib.suppress(Exception):  # a damaged payload names no event
            note_event(r, r.data(), types)
    return types
