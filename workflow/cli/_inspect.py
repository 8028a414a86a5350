"""How the read commands show a run: values as text, records as lines, states as JSON.

What they show is computed by the read side (``workflow._read``: folds, statuses, event
types; ``workflow._compare``: what changed between two seqs), on the log's JSON form
(``Folded``, codec dumps), so no user code is needed; a :class:`Viewer` decides how values
become text (raw dumps, or decoded and repr'd when the user named the workflow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from eventstore import Codec, EventStore, NotAStoreError, PickleDisabledError, StoredRecord

from .. import _journal as J
from .._fold import Folded
from .._read import event_type, run_info
from ._render import Show, short_class, show_dump, show_typed

__all__ = [
    "Viewer",
    "describe",
    "error_json",
    "failed_attempts",
    "is_url",
    "open_store",
    "record_json",
    "state_json",
    "traceback_lines",
]


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
        except PickleDisabledError:
            return "<pickle: pass --allow-pickle to decode it> " + show_dump(dump, 40)
        except Exception:
            # One undecodable old value should not hide the rest of a run from its debugger.
            return "<undecodable> " + show_dump(dump, max(10, limit - 14))
        return show_typed(value, limit)


def is_url(db: str) -> bool:
    """Whether DB names a PostgreSQL database rather than a file."""
    return db.startswith(("postgresql://", "postgres://"))


def open_store(db: str, *, readonly: bool = True) -> EventStore:
    """Opens an existing store read-only (or, for commands that delete, writable): an SQLite
    file, or a PostgreSQL URL.

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
    store = EventStore(db, readonly=readonly)
    # Closed when the command ends, also when it runs in-process (tests, a shell):
    # a PostgreSQL store holds server connections.
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(store.close)
    return store


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
_LINES: Final[dict[str, _Line]] = {}
LineT = TypeVar("LineT", bound=_Line)


def _line(kind: str) -> Callable[[LineT], LineT]:
    """Makes the function the one-line text of ``kind``'s records."""

    def register(f: LineT) -> LineT:
        _LINES[kind] = f
        return f

    return register


@_line(J.RUN_STARTED)
def _run_started(p: J.RunStarted, show: Show, limit: int) -> str:
    parent = p.get("parent")
    start = p.get("start")
    text = f"{p.get('workflow', '')}"
    if start:
        text += f" start #{start.get('id')} {show(start.get('event'), limit)}"
    if parent:
        text += f" fork of {parent.get('run_id')} at seq {parent.get('seq')}"
    previous = p.get("previous")
    if previous:  # a run from a context: a link, not a parent
        text += f" context of {previous.get('run_id')} at seq {previous.get('seq')}"
    return text


@_line(J.ENQUEUED)
def _enqueued(p: J.Enqueued, show: Show, limit: int) -> str:
    return f"#{p.get('id')} {show(p.get('event'), limit)} {_src(p.get('src'))}"


@_line(J.DEQUEUED)
def _dequeued(p: J.Dequeued, show: Show, limit: int) -> str:
    return f"#{p.get('id')} worker {p.get('worker')}"


@_line(J.STEP_STARTED)
def _step_started(p: J.StepStarted, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')}"


@_line(J.STEP_FINISHED)
def _step_finished(p: J.StepFinished, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} emitted {_ids(p.get('emitted', []))}"


@_line(J.STEP_FAILED)
def _step_failed(p: J.StepFailed, show: Show, limit: int) -> str:
    retry = p.get("retry")
    then = f"retry in {p.get('delay')}s" if retry else "no retry"
    return (
        f"#{p.get('id')} attempt {p.get('attempt')} {p.get('error')}: {p.get('message')} ({then})"
    )


@_line(J.STEP_CONFLICTED)
def _step_conflicted(p: J.StepConflicted, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} stale keys {p.get('keys')}"


@_line(J.STATE_SET)
def _state_set(p: J.StateSet, show: Show, limit: int) -> str:
    if "value" in p:
        return f"{p.get('key')} = {show(p['value'], limit)}"
    return f"{p.get('key')} patched: {show_dump(p.get('patch'), limit)}"


@_line(J.STATE_DELETED)
def _state_deleted(p: J.StateDeleted, show: Show, limit: int) -> str:
    return f"del {p.get('key')}"


@_line(J.COLLECTED)
def _collected(p: J.Collected, show: Show, limit: int) -> str:
    put = p.get("put")
    take = p.get("take")
    text = f"buffer {p.get('buf')}"
    if put:
        text += f" put #{put.get('id')} {show(put.get('event'), limit)}"
    if take:
        text += f" took {', '.join(map(short_class, take))}"
    return text


@_line(J.WAITING)
def _waiting(p: J.Waiting, show: Show, limit: int) -> str:
    return (
        f"#{p.get('id')} attempt {p.get('attempt')} waits for "
        f"{short_class(str(p.get('awaited')))} (waiter {p.get('waiter')})"
    )


@_line(J.WAIT_RESOLVED)
def _wait_resolved(p: J.WaitResolved, show: Show, limit: int) -> str:
    if p.get("id") is None:
        return f"waiter {p.get('waiter')} timed out"
    return f"waiter {p.get('waiter')} answered by #{p.get('id')} {show(p.get('event'), limit)}"


@_line(J.STREAMED)
def _streamed(p: J.Streamed, show: Show, limit: int) -> str:
    return f"#{p.get('id')} attempt {p.get('attempt')} {show(p.get('event'), limit)}"


@_line(J.MEMOIZED)
def _memoized(p: J.Memoized, show: Show, limit: int) -> str:
    head = (
        f"#{p.get('id')} attempt {p.get('attempt')} {p.get('name')}() key {p.get('key')!r}"
        f" took {float(p.get('elapsed') or 0):.3f}s"
    )
    err = p.get("error")
    if err:
        return f"{head} raised {err.get('type')}: {err.get('message')}"
    return f"{head}, {p.get('size')} B: {show(p.get('result'), limit)}"


@_line(J.RUN_FINISHED)
def _run_finished(p: J.RunFinished, show: Show, limit: int) -> str:
    return f"result {show(p.get('result'), limit)}"


@_line(J.RUN_FAILED)
def _run_failed(p: J.RunFailed, show: Show, limit: int) -> str:
    return f"{p.get('error')}: {p.get('message')}"


@_line(J.RUN_RESUMED)
def _run_resumed(p: J.RunResumed, show: Show, limit: int) -> str:
    return f"epoch {p.get('epoch')}, was {p.get('previous')}"


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
