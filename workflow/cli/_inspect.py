"""How the read commands show a run: values as text, records as lines, states as JSON.

What they show is computed by the read side (``workflow._read``: folds, statuses, event
types; ``workflow._compare``: what changed between two seqs), on the log's JSON form
(``Folded``, codec dumps), so no user code is needed; a :class:`Viewer` decides how values
become text (raw dumps, or decoded and repr'd when the user named the workflow).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from eventstore import Codec, EventStore, NotAStoreError, PickleDisabledError, StoredRecord
from eventstore._location import is_url  # the store's own test of a location

from .. import _journal as journal
from .._buffers import taken
from .._checkpoints import event_type
from .._fold import Folded
from .._read import run_info
from ._keys import cli_codec, encrypted_text
from ._render import Show, clip, short_class, show_dump, show_typed

__all__ = [
    "Viewer",
    "describe",
    "error_json",
    "failed_attempts",
    "is_url",
    "open_store",
    "record_json",
    "shown_location",
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


# The password of a URL's user (``postgresql://user:secret@host/db``).
_PASSWORD: Final = re.compile(r"://([^:/@]+):[^@]*@")


def shown_location(db: str) -> str:
    """DB as a command may print it: a URL's password masked."""
    return _PASSWORD.sub(r"://\1:***@", db)


def open_store(db: str, *, readonly: bool = True) -> EventStore:
    """Opens an existing store read-only (or, for commands that delete, writable): an SQLite
    file, or a PostgreSQL URL.

    :raises FileNotFoundError: no such file.
    :raises NotAStoreError: the file is not a store.
    """
    if not is_url(db):
        path = Path(db)
        if not path.exists():
            msg = f"{db}: no such file"
            raise FileNotFoundError(msg)
        if path.is_dir():
            raise NotAStoreError(db, "it is a directory")
    store = EventStore(db, readonly=readonly, payload_codec=cli_codec())
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

    def register(fn: LineT) -> LineT:
        _LINES[kind] = fn
        return fn

    return register


@_line(journal.RUN_TIMED_OUT)
def _run_timed_out(payload: Any, show: Show, limit: int) -> str:
    elapsed = payload.get("elapsed") if isinstance(payload, dict) else None
    if not isinstance(elapsed, int | float) or isinstance(elapsed, bool):
        return "" if payload == {} else show_dump(payload, limit)
    rest = {k: v for k, v in payload.items() if k != "elapsed"}
    return f"after {elapsed:.3f} s of execution" + (f" {show_dump(rest, limit)}" if rest else "")


@_line(journal.RUN_STARTED)
def _run_started(payload: journal.RunStarted, show: Show, limit: int) -> str:
    parent = payload.get("parent")
    start = payload.get("start")
    text = f"{payload.get('workflow', '')}"
    if start:
        text += f" start #{start.get('id')} {show(start.get('event'), limit)}"
    if parent:
        text += f" fork of {parent.get('run_id')} at seq {parent.get('seq')}"
    previous = payload.get("previous")
    if previous:  # a run from a context: a link, not a parent
        text += f" context of {previous.get('run_id')} at seq {previous.get('seq')}"
    return text + _state_of(payload) + _moves_of(payload)


def _moves_of(payload: journal.RunStarted | journal.RunResumed) -> str:
    """The moves of work under renamed steps a resume or a fork recorded (``renamed`` for
    steps, ``buffers`` for their collect buffers), old -> new."""
    steps = payload.get("renamed") or {}
    buffers = payload.get("buffers") or {}
    classes = payload.get("classes") or {}
    text = ""
    if steps:
        text += ", moved steps " + ", ".join(f"{o} -> {n}" for o, n in steps.items())
    if buffers:
        text += ", moved buffers " + ", ".join(f"{o} -> {n}" for o, n in buffers.items())
    if classes:
        text += ", renamed classes " + ", ".join(f"{o} -> {n}" for o, n in classes.items())
    return text


def _state_of(payload: journal.RunStarted | journal.RunResumed) -> str:
    """The typed state model (and version) a session writes the context in, if it names one,
    and the patches its code declares deprecated."""
    state = payload.get("state")
    text = f", state {state}" if state else ""
    deprecated = payload.get("deprecated_patches")
    if deprecated:  # the patches whose old branches this session's code no longer has
        text += ", deprecates patches " + ", ".join(deprecated)
    return text


@_line(journal.ENQUEUED)
def _enqueued(payload: journal.Enqueued, show: Show, limit: int) -> str:
    return f"#{payload.get('id')} {show(payload.get('event'), limit)} {_src(payload.get('src'))}"


@_line(journal.DEQUEUED)
def _dequeued(payload: journal.Dequeued, show: Show, limit: int) -> str:
    return f"#{payload.get('id')} worker {payload.get('worker')}"


@_line(journal.STEP_STARTED)
def _step_started(payload: journal.StepStarted, show: Show, limit: int) -> str:
    return f"#{payload.get('id')} attempt {payload.get('attempt')}"


@_line(journal.STEP_FINISHED)
def _step_finished(payload: journal.StepFinished, show: Show, limit: int) -> str:
    emitted = _ids(payload.get("emitted", []))
    return f"#{payload.get('id')} attempt {payload.get('attempt')} emitted {emitted}"


@_line(journal.STEP_FAILED)
def _step_failed(payload: journal.StepFailed, show: Show, limit: int) -> str:
    retry = payload.get("retry")
    then = f"retry in {payload.get('delay')}s" if retry else "no retry"
    error = f"{payload.get('error')}: {payload.get('message')}"
    return f"#{payload.get('id')} attempt {payload.get('attempt')} {error} ({then})"


@_line(journal.STEP_CONFLICTED)
def _step_conflicted(payload: journal.StepConflicted, show: Show, limit: int) -> str:
    return f"#{payload.get('id')} attempt {payload.get('attempt')} stale keys {payload.get('keys')}"


@_line(journal.STATE_SET)
def _state_set(payload: journal.StateSet, show: Show, limit: int) -> str:
    if "value" in payload:
        return f"{payload.get('key')} = {show(payload['value'], limit)}"
    return f"{payload.get('key')} patched: {show_dump(payload.get('patch'), limit)}"


@_line(journal.STATE_DELETED)
def _state_deleted(payload: journal.StateDeleted, show: Show, limit: int) -> str:
    return f"del {payload.get('key')}"


@_line(journal.COLLECTED)
def _collected(payload: journal.Collected, show: Show, limit: int) -> str:
    put = payload.get("put")
    take = taken(payload)
    text = f"buffer {payload.get('buf')}"
    if put:
        text += f" put #{put.get('id')} {show(put.get('event'), limit)}"
    if take:
        names = (short_class(n) if k == 1 else f"{k} x {short_class(n)}" for n, k in take)
        text += f" took {', '.join(names)}"
    return text


@_line(journal.WAITING)
def _waiting(payload: journal.Waiting, show: Show, limit: int) -> str:
    return (
        f"#{payload.get('id')} attempt {payload.get('attempt')} waits for "
        f"{short_class(str(payload.get('awaited')))} (waiter {payload.get('waiter')})"
    )


@_line(journal.WAIT_RESOLVED)
def _wait_resolved(payload: journal.WaitResolved, show: Show, limit: int) -> str:
    if payload.get("id") is None:
        return f"waiter {payload.get('waiter')} timed out"
    answer = f"#{payload.get('id')} {show(payload.get('event'), limit)}"
    return f"waiter {payload.get('waiter')} answered by {answer}"


@_line(journal.STREAMED)
def _streamed(payload: journal.Streamed, show: Show, limit: int) -> str:
    return (
        f"#{payload.get('id')} attempt {payload.get('attempt')} {show(payload.get('event'), limit)}"
    )


@_line(journal.MEMOIZED)
def _memoized(payload: journal.Memoized, show: Show, limit: int) -> str:
    head = (
        f"#{payload.get('id')} attempt {payload.get('attempt')}"
        f" {payload.get('name')}() key {payload.get('key')!r}"
        f" took {float(payload.get('elapsed') or 0):.3f}s"
    )
    err = payload.get("error")
    if err:
        return f"{head} raised {err.get('type')}: {err.get('message')}"
    return f"{head}, {payload.get('size')} B: {show(payload.get('result'), limit)}"


@_line(journal.RUN_FINISHED)
def _run_finished(payload: journal.RunFinished, show: Show, limit: int) -> str:
    return f"result {show(payload.get('result'), limit)}"


@_line(journal.RUN_FAILED)
def _run_failed(payload: journal.RunFailed, show: Show, limit: int) -> str:
    return f"{payload.get('error')}: {payload.get('message')}"


# How a resume says the run's status before it: an ended run "had failed", not "was failed".
_ENDED_AS: Final = {
    "failed": "had failed",
    "timed_out": "had timed out",
    "finished": "had finished",
}


@_line(journal.RUN_RESUMED)
def _run_resumed(payload: journal.RunResumed, show: Show, limit: int) -> str:
    previous = str(payload.get("previous"))
    was = _ENDED_AS.get(previous) or f"was {previous}"
    return f"epoch {payload.get('epoch')}, {was}" + _state_of(payload) + _moves_of(payload)


@_line(journal.RUN_CANCELLED)
def _run_cancelled(payload: journal.RunCancelled, show: Show, limit: int) -> str:
    # Records of earlier versions carry nothing: the kind alone says it all then.
    text = " ".join(f"{k} {payload[k]}" for k in ("by", "via") if k in payload)
    reason = payload.get("reason")
    if reason:
        text += f": {clip(reason, limit)}" if text else clip(reason, limit)
    return text


def describe(record: StoredRecord, payload: Any, view: Viewer, limit: int = 200) -> str:
    """A record's payload as one short line: what happened, with ids and values."""
    sealed = encrypted_text(record.payload)  # read without its key: what can be said of it
    if sealed is not None:
        return sealed
    line = _LINES.get(record.kind)
    if line is not None:
        return line(payload, view.show, limit)
    # A kind that carries nothing (``run_cancelled``, ``run_suspended``) is said by its kind
    # alone: an empty ``{}`` beside it reads as a value that went missing.
    return "" if payload == {} else show_dump(payload, limit)


def record_json(record: StoredRecord) -> dict[str, Any]:
    """A record as JSON-native data (the payload parsed, never decoded)."""
    t = event_type(record)
    return {
        "seq": record.seq,
        "commit_seq": record.commit_seq,
        "ts": record.ts,
        "kind": record.kind,
        "step": record.step,
        "event_type": t,
        "payload": record.data(),
    }


def traceback_lines(payload: Any, indent: str) -> list[str]:
    """A ``step_failed`` payload's stored traceback as indented lines (all of it)."""
    tb = payload.get("traceback") if isinstance(payload, dict) else None
    if not tb:
        return [f"{indent}(no traceback recorded)"]
    return [f"{indent}{line}".rstrip() for line in str(tb).rstrip("\n").split("\n")]


# ---------------------------------------------------------------------------- state


def _failure(record: StoredRecord, payload: journal.StepFailed) -> dict[str, Any]:
    return {
        "step": record.step,
        "event_id": payload.get("id"),
        "attempt": payload.get("attempt"),
        "seq": record.seq,
        "error": payload.get("error"),
        "module": payload.get("module"),
        "message": payload.get("message"),
        "retry": payload.get("retry"),
        "traceback": payload.get("traceback"),
    }


def failed_attempts(store: EventStore, folded: Folded) -> list[dict[str, Any]]:
    """The last failed attempt of each event still in progress at ``s.seq``, oldest first:
    its step, event id, attempt, seq, error and stored traceback.

    Only the log after the oldest such event was enqueued is read (and a fork's parent's,
    for events it was given by its parent), so the cost is that of the failures' stretch.
    """
    # Each event's enqueue seq (global, so it bounds the parent's log too): its failures follow.
    missing = {
        (step, i): payload.ev.seq
        for step, ps in folded.in_progress.items()
        for i, payload in ps.items()
        if payload.failures
    }
    found: dict[tuple[str, int], dict[str, Any]] = {}
    run_id, upto = folded.run_id, folded.seq
    while missing:
        after = max(0, min(missing.values()) - 1)
        here: dict[tuple[str, int], dict[str, Any]] = {}
        for record in store.records(run_id, after=after, upto=upto, kinds=[journal.STEP_FAILED]):
            payload: journal.StepFailed = record.data()
            key = (record.step or "", payload.get("id") if isinstance(payload, dict) else None)
            if key in missing:
                here[key] = _failure(
                    record, payload
                )  # a later failure of the same event replaces it
        found.update(here)
        for key in here:
            del missing[key]
        info = run_info(store, run_id)
        if not missing or info.parent_run_id is None or info.parent_seq is None:
            break
        # Events a fork was given in progress may have failed in its parent.
        run_id, upto = info.parent_run_id, info.parent_seq
    return sorted(found.values(), key=lambda f: f["seq"])


def error_json(folded: Folded, failed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's error with the traceback of the attempt that failed it, when one did."""
    if folded.error is None:
        return None
    tb = None
    for f in failed:
        same = (f["error"], f["message"]) == (
            folded.error.get("error"),
            folded.error.get("message"),
        )
        if f["step"] == folded.error.get("step") and same:
            tb = f["traceback"]
    return {**folded.error, "traceback": tb}


def state_json(
    folded: Folded, status: str, inbox: int = 0, failed: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The folded state as JSON, shaped like ``RunState.to_json()`` plus event ids and,
    given them, the failed attempts (with tracebacks) of the events in progress."""
    failed = failed or []
    return {
        "run_id": folded.run_id,
        "seq": folded.seq,
        "status": status,
        "result": folded.result,
        "error": error_json(folded, failed),
        "failed_attempts": failed,
        "queues": {k: [e.dump for e in q.values()] for k, q in folded.queues.items() if q},
        "queue_ids": {k: list(q) for k, q in folded.queues.items() if q},
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
            for k, v in folded.in_progress.items()
            if v
        },
        "context": {k: v.dump for k, v in folded.context.items()},
        "collected": {
            buffer_id: {name: [e.dump for e in events] for name, events in by_class.items()}
            for buffer_id, by_class in folded.buffers.items()
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
            for w in folded.waiters.values()
        ],
        "unclaimed": [e.dump for e in folded.unclaimed.values()],
        "stream": [e.dump for e in folded.stream],
        "workflow": folded.workflow,
        "fingerprint": folded.fingerprint,
        "parent": list(folded.parent) if folded.parent else None,
        "pending_inbox": inbox,
    }
