"""The fold: records -> the state of a run. Pure: no I/O, no clock, no randomness.

``fold(state, records)`` applies records in order to a :class:`Folded` state, which keeps
events and context values in their JSON form and decodes nothing; :func:`to_run_state`
turns it into a typed :class:`RunState` at the end, which decodes only what is read.

One function a record kind, each reading its kind's payload type (``_journal``) in every
shape the log has written; ``_snapshot`` caches a folded state in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from eventstore import Codec, CodecError, LogCorruptedError, StoredRecord
from eventstore._encryption import encrypted_error

from . import _journal as J
from ._buffers import class_qualname, collect_key, taken
from ._events import StopEvent
from ._keylog import KeyLog
from ._state import TERMINAL, InProgress, LazyDict, LazyList, RunState, Waiter

__all__ = [
    "APPLY",
    "FOLD_VERSION",
    "Ev",
    "Failure",
    "Folded",
    "KeyLog",
    "MemoRec",
    "Prog",
    "WaitRec",
    "fold",
    "is_terminal",
    "payload_of",
    "result_of",
    "to_run_state",
]


# The version of what the fold makes of the log. A snapshot stores the version that folded
# it and is trusted only by this one: raise it whenever a change here would fold some log
# differently, so that the snapshots written before are ignored.
# 2: steps in progress keep their latest failure (durable retries) and events their
# lineage's @catch_error recovery counts.
FOLD_VERSION: Final = 2


@dataclass(slots=True)
class Ev:
    """An event as the log holds it: its id and codec dump."""

    id: int
    dump: Any
    seq: int = 0  # the record it came from: errors about it name this

    @property
    def type(self) -> str:
        d = self.dump
        # The class name without the version a tag may carry ("mod:Cls@2").
        return str(d.get("c", "")).partition("@")[0] if isinstance(d, dict) else ""


@dataclass(slots=True)
class Failure:
    """The latest failure of an event in progress, as its ``step_failed`` record says.

    ``retry_at`` is when the next attempt is due (None: at once, or not retried),
    ``elapsed`` the seconds since the first attempt began (None: a record written before
    it was recorded), ``failed_at`` when it failed (seconds since the epoch).
    """

    retry_at: float | None
    elapsed: float | None
    failed_at: float
    error: str  # the exception class's qualified name
    module: str
    message: str


@dataclass(slots=True)
class Prog:
    ev: Ev
    attempt: int = 0
    failures: int = 0
    conflicts: int = 0
    failure: Failure | None = None

    @property
    def crashes(self) -> int:
        """Attempts started that ended in neither a failure nor a conflict: the process died."""
        return self.attempt - self.failures - self.conflicts


@dataclass(slots=True)
class WaitRec:
    waiter_id: str
    step: str
    ev: Ev
    awaited: str
    requirements: Any
    deadline: float | None
    waiter_event: Any


@dataclass(slots=True)
class MemoRec:
    """A memoized call's recorded outcome, for the attempts at its input that follow.

    ``retried``: a retry policy re-ran the step since it was recorded, so only a call with
    ``reuse_on_retry=True`` reuses it.
    """

    digest: str
    result: Any  # the result's codec dump (None with an error)
    error: dict[str, str] | None
    attempt: int
    seq: int
    retried: bool = False


@dataclass(slots=True)
class Folded:
    """A run's state in JSON form, as the fold builds it."""

    run_id: str
    seq: int = 0
    first_seq: int | None = None
    status: str = "running"
    workflow: str = ""
    fingerprint: str = ""
    parent: tuple[str, int] | None = None
    result: Any = None  # the StopEvent's dump
    error: dict[str, Any] | None = None
    queues: dict[str, dict[int, Ev]] = field(default_factory=dict)
    in_progress: dict[str, dict[int, Prog]] = field(default_factory=dict)
    context: dict[str, KeyLog] = field(default_factory=dict)
    buffers: dict[str, dict[str, list[Ev]]] = field(default_factory=dict)
    waiters: dict[str, WaitRec] = field(default_factory=dict)
    answers: dict[str, Ev | None] = field(default_factory=dict)
    unclaimed: dict[int, Ev] = field(default_factory=dict)
    stream: list[Ev] = field(default_factory=list)
    # Event id -> how often each @catch_error handler took over along its lineage.
    recoveries: dict[int, dict[str, int]] = field(default_factory=dict)
    # Memoized calls of inputs not yet done: step -> event id -> key -> outcome.
    memos: dict[str, dict[int, dict[str, MemoRec]]] = field(default_factory=dict)
    next_id: int = 1
    exec_us: int = 0
    _prev_ts: int | None = None
    _paused: bool = False
    records: int = 0  # how many of the run's own records were folded in (a fork's: its own)

    def events(self, *, stream: bool = True) -> Iterator[Ev]:
        """Every event the state holds: queued, in progress, waiting, buffered, unclaimed,
        answers and (unless ``stream`` is False) the stream, whose ids are those of the
        streaming attempts' input events, not their own."""
        for q in self.queues.values():
            yield from q.values()
        for ps in self.in_progress.values():
            for p in ps.values():
                yield p.ev
        for w in self.waiters.values():
            yield w.ev
        for d in self.buffers.values():
            for es in d.values():
                yield from es
        yield from self.unclaimed.values()
        for a in self.answers.values():
            if a is not None:
                yield a
        if stream:
            yield from self.stream

    def only_waiters(self) -> bool:
        """Nothing queued or running, and someone waits: the run's clock is stopped."""
        return (
            bool(self.waiters)
            and not any(self.queues.values())
            and not any(self.in_progress.values())
        )


def payload_of(r: StoredRecord) -> Any:
    """A record's payload parsed, or :class:`LogCorruptedError` naming its seq."""
    try:
        return orjson.loads(r.payload)
    except orjson.JSONDecodeError as exc:
        msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} has a malformed payload: {exc}"
        raise LogCorruptedError(msg, seq=r.seq) from exc


def _run_started(s: Folded, r: StoredRecord, p: J.RunStarted) -> None:
    # A fork starts from its parent's state, but not from its parent's ending.
    s.status = "running"
    s.result = None
    s.error = None
    s.workflow = p.get("workflow", "")
    s.fingerprint = p.get("fingerprint", "")
    parent = p.get("parent")
    if parent:
        s.parent = (parent["run_id"], parent["seq"])
    start = p.get("start")
    if start:
        s.next_id = max(s.next_id, start["id"] + 1)


def _enqueued(s: Folded, r: StoredRecord, p: J.Enqueued) -> None:
    ev = Ev(p["id"], p["event"], r.seq)
    s.next_id = max(s.next_id, ev.id + 1)
    if r.step is None:
        s.unclaimed[ev.id] = ev
    else:
        s.queues.setdefault(r.step, {})[ev.id] = ev
    counts = p.get("recoveries")
    if counts is not None:
        s.recoveries[ev.id] = counts
    elif s.recoveries:  # only runs where a handler took over pay for the lineage
        src = p["src"]
        if type(src) is list:
            inherited = s.recoveries.get(src[0])
            if inherited is not None:
                s.recoveries[ev.id] = inherited


def _step_of(r: StoredRecord) -> str:
    if r.step is None:
        msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} names no step"
        raise LogCorruptedError(msg, seq=r.seq)
    return r.step


def _dequeued(s: Folded, r: StoredRecord, p: J.Dequeued) -> None:
    step = _step_of(r)
    ev = s.queues.get(step, {}).pop(p["id"], None)
    if ev is None:
        msg = f"record seq {r.seq}: step {step!r} took event {p['id']}, which was not queued"
        raise LogCorruptedError(msg, seq=r.seq)
    s.in_progress.setdefault(step, {})[ev.id] = Prog(ev)


def _prog(
    s: Folded,
    r: StoredRecord,
    p: J.OfAttempt,
) -> Prog:
    step = _step_of(r)
    prog = s.in_progress.get(step, {}).get(p["id"])
    if prog is None:
        msg = f"record seq {r.seq} ({r.kind}): event {p['id']} is not in progress at {step!r}"
        raise LogCorruptedError(msg, seq=r.seq)
    return prog


def _step_started(s: Folded, r: StoredRecord, p: J.StepStarted) -> None:
    prog = _prog(s, r, p)
    prog.attempt = p["attempt"]
    if prog.failure is not None:
        prog.failure.retry_at = None  # the retry began: a resume does not wait for it again


def _step_finished(s: Folded, r: StoredRecord, p: J.StepFinished) -> None:
    _prog(s, r, p)
    step = _step_of(r)
    del s.in_progress[step][p["id"]]
    for wid in p.get("answers", ()):
        s.answers.pop(wid, None)
    _drop_memos(s, step, p["id"])


def _drop_memos(s: Folded, step: str, event_id: int) -> None:
    """An input is done: its memoized calls are never asked for again."""
    by_event = s.memos.get(step)
    if by_event is not None and by_event.pop(event_id, None) is not None and not by_event:
        del s.memos[step]


def _step_failed(s: Folded, r: StoredRecord, p: J.StepFailed) -> None:
    prog = _prog(s, r, p)
    prog.failures += 1
    delay = p["delay"]
    retry_at = p.get("retry_at")
    if retry_at is None and p["retry"] and delay is not None:
        retry_at = r.ts / 1e6 + delay  # written before retry_at: the commit's time is close
    failed_at = retry_at - delay if retry_at is not None and delay is not None else r.ts / 1e6
    prog.failure = Failure(
        retry_at, p.get("elapsed"), failed_at, p["error"], p["module"], p["message"]
    )
    if p["retry"]:
        # The retry policy re-runs it: recorded calls are reused only when asked to be.
        for m in s.memos.get(_step_of(r), {}).get(p["id"], {}).values():
            m.retried = True


def _memoized(s: Folded, r: StoredRecord, p: J.Memoized) -> None:
    _prog(s, r, p)
    err = p["error"]
    s.memos.setdefault(_step_of(r), {}).setdefault(p["id"], {})[p["key"]] = MemoRec(
        p["digest"],
        p["result"],
        None if err is None else {"type": err["type"], "message": err["message"]},
        p["attempt"],
        r.seq,
    )


def _step_conflicted(s: Folded, r: StoredRecord, p: J.StepConflicted) -> None:
    _prog(s, r, p).conflicts += 1


def _state_set(s: Folded, r: StoredRecord, p: J.StateSet) -> None:
    key = p["key"]
    if "value" in p:
        s.context[key] = KeyLog(p["value"], len(r.payload), 0, r.seq, r.seq)
        return
    entry = s.context.get(key)
    if entry is None:
        msg = f"record seq {r.seq}: a patch of context key {key!r}, which has no value"
        raise LogCorruptedError(msg, seq=r.seq)
    entry.patched(p["patch"], r.seq, len(r.payload))


def _state_deleted(s: Folded, r: StoredRecord, p: J.StateDeleted) -> None:
    s.context.pop(p["key"], None)


def _collected(s: Folded, r: StoredRecord, p: J.Collected) -> None:
    # Buffers and the events in them go by names without modules, in every payload shape:
    # a class is the same class under __main__ and under the module name it is imported as.
    key = collect_key(_step_of(r), p)
    buf = s.buffers.setdefault(key, {})
    put = p.get("put")
    if put is not None:
        ev = Ev(put["id"], put["event"], r.seq)
        buf.setdefault(class_qualname(ev.type), []).append(ev)
    for t, count in taken(p):
        events = buf.get(t)
        if events:
            del events[:count]
            if not events:
                del buf[t]
    if not buf:
        del s.buffers[key]


def _waiting(s: Folded, r: StoredRecord, p: J.Waiting) -> None:
    step = _step_of(r)
    prog = _prog(s, r, p)
    del s.in_progress[step][p["id"]]
    s.waiters[p["waiter"]] = WaitRec(
        p["waiter"], step, prog.ev, p["awaited"], p["requirements"], p["deadline"], p["event"]
    )


def _wait_resolved(s: Folded, r: StoredRecord, p: J.WaitResolved) -> None:
    s.waiters.pop(p["waiter"], None)
    answer_id = p.get("id")
    if answer_id is None:
        s.answers[p["waiter"]] = None
        return
    s.unclaimed.pop(answer_id, None)
    s.answers[p["waiter"]] = Ev(answer_id, p["event"], r.seq)


def _streamed(s: Folded, r: StoredRecord, p: J.Streamed) -> None:
    s.stream.append(Ev(p["id"], p["event"], r.seq))


def _run_finished(s: Folded, r: StoredRecord, p: J.RunFinished) -> None:
    s.status = "finished"
    s.result = p["result"]
    s.in_progress.clear()
    s.memos.clear()


def _run_failed(s: Folded, r: StoredRecord, p: J.RunFailed) -> None:
    s.status = "failed"
    s.error = {"step": r.step, "error": p.get("error"), "message": p.get("message")}


def _status(status: str) -> Callable[[Folded, StoredRecord, Any], None]:
    def apply(s: Folded, r: StoredRecord, p: Any) -> None:
        s.status = status
        if status == "running":
            s.error = None

    return apply


def rename_steps(s: Folded, renamed: Mapping[str, str]) -> None:
    """Moves pending work (queued, in progress, waiting) from steps' old names to new ones."""
    for old, new in renamed.items():
        if old == new:
            continue
        for part in (s.queues, s.in_progress):
            moved: Any = part.pop(old, None)
            if moved:
                part.setdefault(new, {}).update(moved)
        for w in s.waiters.values():
            if w.step == old:
                w.step = new


def _run_resumed(s: Folded, r: StoredRecord, p: J.RunResumed) -> None:
    s.status = "running"
    s.error = None
    if p.get("previous") == "timed_out":
        s.exec_us = 0  # resuming a timed-out run starts a fresh timeout budget
    renamed = p.get("renamed")
    if renamed:
        rename_steps(s, renamed)


# What each record kind does to the state: one entry per kind of ``_journal.PAYLOADS``.
APPLY: Final[dict[str, Callable[[Folded, StoredRecord, Any], None]]] = {
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
    J.MEMOIZED: _memoized,
    J.RUN_FINISHED: _run_finished,
    J.RUN_FAILED: _run_failed,
    J.RUN_CANCELLED: _status("cancelled"),
    J.RUN_TIMED_OUT: _status("timed_out"),
    J.RUN_RESUMED: _run_resumed,
    J.RUN_SUSPENDED: _status("waiting"),
}


def fold(state: Folded, records: Iterable[StoredRecord]) -> Folded:
    """Applies records, in seq order, to ``state`` and returns it.

    :raises LogCorruptedError: a record is malformed, of an unknown kind, or contradicts
        the records before it; the message names its seq. The fold never skips a record.
    """
    # The loop every read and every commit goes through: what each record changes in
    # the state beyond its kind's function (the count, the clock) is kept in locals.
    apply = APPLY
    loads = orjson.loads
    starts = _SESSION_STARTS
    n = 0
    prev_ts, paused, exec_us = state._prev_ts, state._paused, state.exec_us
    try:
        for r in records:
            kind = r.kind
            fn = apply.get(kind)
            if fn is None:
                msg = f"record seq {r.seq} of run {r.run_id!r} has an unknown kind {kind!r}"
                raise LogCorruptedError(msg, seq=r.seq)
            start = kind in starts
            if start:  # a session's start may reset the clock (a timed-out run resumed)
                state.exec_us = exec_us
            try:
                fn(state, r, loads(r.payload))
            except orjson.JSONDecodeError as exc:
                msg = (
                    f"record seq {r.seq} ({kind}) of run {r.run_id!r} has a malformed"
                    f" payload: {exc}"
                )
                raise LogCorruptedError(msg, seq=r.seq) from exc
            except LogCorruptedError:
                raise
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
                if (sealed := encrypted_error(r)) is not None:  # read without the key
                    raise sealed from None
                msg = f"record seq {r.seq} ({kind}) of run {r.run_id!r} is malformed: {exc!r}"
                raise LogCorruptedError(msg, seq=r.seq) from exc
            n += 1
            if start:
                exec_us = state.exec_us
            seq = r.seq
            if state.first_seq is None:
                state.first_seq = seq
            # Execution time: from a session's first record to its last, without the time
            # the run spent with nothing to do but wait, nor the time between sessions.
            ts = r.ts
            if not start and prev_ts is not None and not paused and ts > prev_ts:
                exec_us += ts - prev_ts
            prev_ts = ts
            if seq == r.commit_seq:
                state.seq = seq
                paused = state.only_waiters()
    finally:
        state.records += n
        state._prev_ts, state._paused, state.exec_us = prev_ts, paused, exec_us
    return state


_SESSION_STARTS: Final = frozenset({J.RUN_STARTED, J.RUN_RESUMED})


def result_of(stop: Any) -> Any:
    """What awaiting a run returns: ``StopEvent.result``, or the event for a subclass."""
    if type(stop) is StopEvent:
        return stop.result
    return stop


def to_run_state(s: Folded, codec: Codec, status: str | None = None) -> RunState:
    """A typed :class:`RunState` of a folded state, decoded as it is read.

    The result is decoded here; context values, queues, events in progress, collect
    buffers, waiters and stream events when first read, so that a state costs what its
    reader looks at.

    :raises LogCorruptedError: the result cannot be decoded here (and, when read, any other
        stored event or value: its class is unknown or not allowed); the message names the
        event or key and the seq of its record.
    """
    ev = _decoder(s, codec)
    result = None
    if s.result is not None:
        try:
            result = result_of(codec.load(s.result))
        except CodecError as exc:
            msg = f"run {s.run_id!r} at seq {s.seq}: its result cannot be decoded: {exc}"
            raise LogCorruptedError(msg, seq=s.seq) from exc

    def waiter(w: WaitRec) -> Waiter:
        try:
            requirements = codec.load(w.requirements) or {}
            asked = None if w.waiter_event is None else codec.load(w.waiter_event)
        except CodecError as exc:
            msg = (
                f"record seq {w.ev.seq} of run {s.run_id!r}: the wait {w.waiter_id!r}"
                f" cannot be decoded: {exc}"
            )
            raise LogCorruptedError(msg, seq=w.ev.seq) from exc
        return Waiter(
            w.waiter_id, w.step, ev(w.ev), w.awaited, requirements, w.deadline, asked, w.ev.id
        )

    return RunState(
        run_id=s.run_id,
        seq=s.seq,
        status=status or s.status,  # type: ignore[arg-type]
        result=result,
        error=s.error,
        queues=LazyDict(
            {k: list(q.values()) for k, q in s.queues.items() if q},
            lambda _, q: [ev(e) for e in q],
        ),
        in_progress=LazyDict(
            {k: list(v.values()) for k, v in s.in_progress.items() if v},
            lambda _, v: [
                InProgress(
                    ev(p.ev),
                    p.attempt,
                    p.failures,
                    p.ev.id,
                    None if p.failure is None else p.failure.retry_at,
                )
                for p in v
            ],
        ),
        context=LazyDict(s.context, lambda k, v: _value(s, codec, k, v)),
        collected=LazyDict(
            {b: {t: list(es) for t, es in d.items()} for b, d in s.buffers.items()},
            lambda _, d: {t: [ev(e) for e in es] for t, es in d.items()},
        ),
        waiters=LazyList(s.waiters.values(), waiter),
        stream=LazyList(s.stream, ev),
        workflow=s.workflow,
        fingerprint=s.fingerprint,
        parent=s.parent,
    )


def _decoder(s: Folded, codec: Codec) -> Callable[[Ev], Any]:
    def load(e: Ev) -> Any:
        try:
            return codec.load(e.dump)
        except CodecError as exc:
            msg = (
                f"record seq {e.seq} of run {s.run_id!r}: its event {e.id} ({e.type or '?'})"
                f" cannot be decoded: {exc}"
            )
            raise LogCorruptedError(msg, seq=e.seq) from exc

    return load


def _value(s: Folded, codec: Codec, key: str, entry: KeyLog) -> Any:
    try:
        return codec.load(entry.dump)
    except CodecError as exc:
        msg = (
            f"record seq {entry.seq} of run {s.run_id!r}: context key {key!r} cannot be"
            f" decoded: {exc}"
        )
        raise LogCorruptedError(msg, seq=entry.seq) from exc


def is_terminal(status: str) -> bool:
    """Whether a status ends the run (finished, failed, cancelled, timed out)."""
    return status in TERMINAL
