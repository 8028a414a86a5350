"""The fold: records -> the state of a run. Pure: no I/O, no clock, no randomness.

``fold(state, records)`` applies records in order to a :class:`Folded` state, which keeps
events and context values in their JSON form and decodes nothing; :func:`materialize` turns
it into a typed :class:`RunState` at the end, so that only what survives is decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import orjson

from eventstore import Codec, CodecError, LogCorruptedError, StoredRecord

from . import _journal as J
from ._events import StopEvent
from ._patch import apply_json
from ._state import TERMINAL, InProgress, RunState, Waiter

__all__ = [
    "SNAPSHOT_FORMAT",
    "Folded",
    "KeyLog",
    "SnapshotError",
    "dump_folded",
    "fold",
    "load_folded",
    "materialize",
]


@dataclass(slots=True)
class Ev:
    """An event as the log holds it: its id and codec dump."""

    id: int
    dump: Any
    seq: int = 0  # the record it came from: errors about it name this

    @property
    def type(self) -> str:
        d = self.dump
        return str(d.get("c", "")) if isinstance(d, dict) else ""


@dataclass(slots=True)
class Prog:
    ev: Ev
    attempt: int = 0
    failures: int = 0
    conflicts: int = 0

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
class KeyLog:
    """A context key's JSON value and how many patch bytes followed its last full write."""

    dump: Any
    full_bytes: int
    patch_bytes: int = 0
    seq: int = 0  # its last write


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
    next_id: int = 1
    exec_us: int = 0
    _prev_ts: int | None = None
    _paused: bool = False

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


def _run_started(s: Folded, r: StoredRecord, p: Any) -> None:
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


def _enqueued(s: Folded, r: StoredRecord, p: Any) -> None:
    ev = Ev(p["id"], p["event"], r.seq)
    s.next_id = max(s.next_id, ev.id + 1)
    if r.step is None:
        s.unclaimed[ev.id] = ev
    else:
        s.queues.setdefault(r.step, {})[ev.id] = ev


def _step_of(r: StoredRecord) -> str:
    if r.step is None:
        msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} names no step"
        raise LogCorruptedError(msg, seq=r.seq)
    return r.step


def _dequeued(s: Folded, r: StoredRecord, p: Any) -> None:
    step = _step_of(r)
    ev = s.queues.get(step, {}).pop(p["id"], None)
    if ev is None:
        msg = f"record seq {r.seq}: step {step!r} took event {p['id']}, which was not queued"
        raise LogCorruptedError(msg, seq=r.seq)
    s.in_progress.setdefault(step, {})[ev.id] = Prog(ev)


def _prog(s: Folded, r: StoredRecord, p: Any) -> Prog:
    step = _step_of(r)
    prog = s.in_progress.get(step, {}).get(p["id"])
    if prog is None:
        msg = f"record seq {r.seq} ({r.kind}): event {p['id']} is not in progress at {step!r}"
        raise LogCorruptedError(msg, seq=r.seq)
    return prog


def _step_started(s: Folded, r: StoredRecord, p: Any) -> None:
    _prog(s, r, p).attempt = p["attempt"]


def _step_finished(s: Folded, r: StoredRecord, p: Any) -> None:
    _prog(s, r, p)
    del s.in_progress[_step_of(r)][p["id"]]
    for wid in p.get("answers", ()):
        s.answers.pop(wid, None)


def _step_failed(s: Folded, r: StoredRecord, p: Any) -> None:
    _prog(s, r, p).failures += 1


def _step_conflicted(s: Folded, r: StoredRecord, p: Any) -> None:
    _prog(s, r, p).conflicts += 1


def _state_set(s: Folded, r: StoredRecord, p: Any) -> None:
    key = p["key"]
    if "value" in p:
        s.context[key] = KeyLog(p["value"], len(r.payload), 0, r.seq)
        return
    entry = s.context.get(key)
    if entry is None:
        msg = f"record seq {r.seq}: a patch of context key {key!r}, which has no value"
        raise LogCorruptedError(msg, seq=r.seq)
    entry.dump = apply_json(entry.dump, p["patch"])
    entry.patch_bytes += len(r.payload)
    entry.seq = r.seq


def _state_deleted(s: Folded, r: StoredRecord, p: Any) -> None:
    s.context.pop(p["key"], None)


def _collected(s: Folded, r: StoredRecord, p: Any) -> None:
    # Buffers and the events in them go by names without modules, in every payload shape:
    # a class is the same class under __main__ and under the module name it is imported as.
    key = J.collect_key(_step_of(r), p)
    buf = s.buffers.setdefault(key, {})
    put = p.get("put")
    if put is not None:
        ev = Ev(put["id"], put["event"], r.seq)
        buf.setdefault(J.class_qualname(ev.type), []).append(ev)
    for name in p.get("take") or ():
        t = J.class_qualname(name)
        events = buf.get(t)
        if events:
            events.pop(0)
            if not events:
                del buf[t]
    if not buf:
        del s.buffers[key]


def _waiting(s: Folded, r: StoredRecord, p: Any) -> None:
    step = _step_of(r)
    prog = _prog(s, r, p)
    del s.in_progress[step][p["id"]]
    s.waiters[p["waiter"]] = WaitRec(
        p["waiter"], step, prog.ev, p["awaited"], p["requirements"], p["deadline"], p["event"]
    )


def _wait_resolved(s: Folded, r: StoredRecord, p: Any) -> None:
    s.waiters.pop(p["waiter"], None)
    answer_id = p.get("id")
    if answer_id is None:
        s.answers[p["waiter"]] = None
        return
    s.unclaimed.pop(answer_id, None)
    s.answers[p["waiter"]] = Ev(answer_id, p["event"], r.seq)


def _streamed(s: Folded, r: StoredRecord, p: Any) -> None:
    s.stream.append(Ev(p["id"], p["event"], r.seq))


def _run_finished(s: Folded, r: StoredRecord, p: Any) -> None:
    s.status = "finished"
    s.result = p["result"]
    s.in_progress.clear()


def _run_failed(s: Folded, r: StoredRecord, p: Any) -> None:
    s.status = "failed"
    s.error = {"step": r.step, "error": p.get("error"), "message": p.get("message")}


def _status(status: str) -> Callable[[Folded, StoredRecord, Any], None]:
    def apply(s: Folded, r: StoredRecord, p: Any) -> None:
        s.status = status
        if status == "running":
            s.error = None

    return apply


_APPLY: dict[str, Callable[[Folded, StoredRecord, Any], None]] = {
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
    J.RUN_CANCELLED: _status("cancelled"),
    J.RUN_TIMED_OUT: _status("timed_out"),
    J.RUN_RESUMED: _status("running"),
    J.RUN_SUSPENDED: _status("waiting"),
}


def fold(state: Folded, records: Iterable[StoredRecord]) -> Folded:
    """Applies records, in seq order, to ``state`` and returns it.

    :raises LogCorruptedError: a record is malformed, of an unknown kind, or contradicts
        the records before it; the message names its seq. The fold never skips a record.
    """
    apply = _APPLY
    for r in records:
        fn = apply.get(r.kind)
        if fn is None:
            msg = f"record seq {r.seq} of run {r.run_id!r} has an unknown kind {r.kind!r}"
            raise LogCorruptedError(msg, seq=r.seq)
        try:
            fn(state, r, payload_of(r))
        except LogCorruptedError:
            raise
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
            msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} is malformed: {exc!r}"
            raise LogCorruptedError(msg, seq=r.seq) from exc
        if state.first_seq is None:
            state.first_seq = r.seq
        _clock(state, r)
        if r.seq == r.commit_seq:
            state.seq = r.seq
            state._paused = state.only_waiters()
    return state


def _clock(s: Folded, r: StoredRecord) -> None:
    # Execution time: from a session's first record to its last, without the time the run
    # spent with nothing to do but wait, nor the time between sessions.
    if r.kind in (J.RUN_STARTED, J.RUN_RESUMED):
        s._prev_ts = r.ts
        return
    if s._prev_ts is not None and not s._paused:
        s.exec_us += max(0, r.ts - s._prev_ts)
    s._prev_ts = r.ts


def result_of(stop: Any) -> Any:
    """What awaiting a run returns: ``StopEvent.result``, or the event for a subclass."""
    if type(stop) is StopEvent:
        return stop.result
    return stop


def materialize(s: Folded, codec: Codec, status: str | None = None) -> RunState:
    """Decodes a folded state into a typed :class:`RunState`.

    :raises LogCorruptedError: a stored event or value cannot be decoded here (its class
        is unknown or not allowed); the message says which and why.
    """
    try:
        return _materialize(s, codec, status)
    except CodecError as exc:
        msg = f"run {s.run_id!r} at seq {s.seq}: a stored event or value cannot be decoded: {exc}"
        raise LogCorruptedError(msg, seq=s.seq) from exc


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


def _materialize(s: Folded, codec: Codec, status: str | None) -> RunState:
    ev = _decoder(s, codec)
    load = codec.load
    result = None
    if s.result is not None:
        result = result_of(load(s.result))
    return RunState(
        run_id=s.run_id,
        seq=s.seq,
        status=status or s.status,  # type: ignore[arg-type]
        result=result,
        error=s.error,
        queues={k: [ev(e) for e in q.values()] for k, q in s.queues.items() if q},
        in_progress={
            k: [InProgress(ev(p.ev), p.attempt, p.failures, p.ev.id) for p in v.values()]
            for k, v in s.in_progress.items()
            if v
        },
        context={k: _value(s, codec, k, v) for k, v in s.context.items()},
        collected={
            b: {t: [ev(e) for e in es] for t, es in d.items()} for b, d in s.buffers.items()
        },
        waiters=[
            Waiter(
                w.waiter_id,
                w.step,
                ev(w.ev),
                w.awaited,
                load(w.requirements) or {},
                w.deadline,
                None if w.waiter_event is None else load(w.waiter_event),
                w.ev.id,
            )
            for w in s.waiters.values()
        ],
        stream=[ev(e) for e in s.stream],
        workflow=s.workflow,
        fingerprint=s.fingerprint,
        parent=s.parent,
    )


def is_terminal(status: str) -> bool:
    """Whether a status ends the run (finished, failed, cancelled, timed out)."""
    return status in TERMINAL


# ------------------------------------------------------------------ the cached state
#
# The executor keeps the fold of its own commits as it goes and now and then stores it as
# the run's snapshot; readers start from the snapshot and fold only the records after it.


SNAPSHOT_FORMAT: Final = 3  # the "v" of dump_folded's output; 3: buffers keyed by J.buffer_key
# Older formats still read: 2 (buffers keyed by module names, converted as they load).
_READ_FORMATS: Final = frozenset({2, SNAPSHOT_FORMAT})


def _evs(evs: Iterable[Ev]) -> list[Any]:
    return [[e.id, e.dump, e.seq] for e in evs]


def dump_folded(s: Folded) -> bytes:
    """The folded state as JSON, for the snapshot cache."""
    return orjson.dumps(
        {
            "v": SNAPSHOT_FORMAT,
            "run_id": s.run_id,
            "seq": s.seq,
            "first_seq": s.first_seq,
            "status": s.status,
            "workflow": s.workflow,
            "fingerprint": s.fingerprint,
            "parent": list(s.parent) if s.parent else None,
            "result": s.result,
            "error": s.error,
            "queues": {k: _evs(q.values()) for k, q in s.queues.items()},
            "in_progress": {
                k: [
                    [p.ev.id, p.ev.dump, p.attempt, p.failures, p.conflicts, p.ev.seq]
                    for p in v.values()
                ]
                for k, v in s.in_progress.items()
            },
            "context": {
                k: [v.dump, v.full_bytes, v.patch_bytes, v.seq] for k, v in s.context.items()
            },
            "buffers": {b: {t: _evs(es) for t, es in d.items()} for b, d in s.buffers.items()},
            "waiters": [
                [
                    w.waiter_id,
                    w.step,
                    w.ev.id,
                    w.ev.dump,
                    w.awaited,
                    w.requirements,
                    w.deadline,
                    w.waiter_event,
                    w.ev.seq,
                ]
                for w in s.waiters.values()
            ],
            "answers": {
                k: None if a is None else [a.id, a.dump, a.seq] for k, a in s.answers.items()
            },
            "unclaimed": _evs(s.unclaimed.values()),
            "stream": _evs(s.stream),
            "next_id": s.next_id,
            "exec_us": s.exec_us,
            "prev_ts": s._prev_ts,
            "paused": s._paused,
        }
    )


def _legacy_buffers(raw: dict[str, dict[str, list[Ev]]]) -> dict[str, dict[str, list[Ev]]]:
    """Buffers of a cached state written before v3, keyed as the fold keys them now.

    Buffers that differed only by module names (``__main__`` and its imported name) are
    one buffer now: their events are merged in the order the log holds them.
    """
    out: dict[str, dict[str, list[Ev]]] = {}
    for b, by in raw.items():
        buf = out.setdefault(J.legacy_buffer_key(b), {})
        for t, es in by.items():
            buf.setdefault(J.class_qualname(t), []).extend(es)
    for buf in out.values():
        for es in buf.values():
            es.sort(key=lambda e: e.seq)
    return out


class SnapshotError(ValueError):
    """A cached state that cannot be used; ``stale`` when it is only of another format."""

    def __init__(self, reason: str, *, stale: bool = False) -> None:
        self.reason = reason
        self.stale = stale
        super().__init__(reason)


def load_folded(data: str | bytes) -> Folded:
    """A folded state back from :func:`dump_folded`, checked shape by shape.

    The cache is never trusted: whatever is not exactly what :func:`dump_folded` writes is
    refused rather than turned into a state that only looks right.

    :raises SnapshotError: the text is not JSON, not a cached state, or one of another
        format (``stale``: an older version of the library wrote it).
    """
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        msg = f"it is not JSON ({exc})"
        raise SnapshotError(msg) from exc
    version = d.get("v") if isinstance(d, dict) else None
    if not _is_int(version):
        msg = f"it is not a cached state (JSON {_clip(d)})"
        raise SnapshotError(msg)
    if version not in _READ_FORMATS:
        msg = f"it is in format {version}, this version reads formats {sorted(_READ_FORMATS)}"
        raise SnapshotError(msg, stale=True)
    try:
        return _load(d)
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = f"it does not have the shape of a cached state ({exc!r})"
        raise SnapshotError(msg) from exc


def _load(d: dict[str, Any]) -> Folded:
    s = Folded(_typed(d, "run_id", str))
    s.seq = _typed(d, "seq", int)
    s.first_seq = _typed(d, "first_seq", int, none=True)
    s.status = _typed(d, "status", str)
    s.workflow = _typed(d, "workflow", str)
    s.fingerprint = _typed(d, "fingerprint", str)
    parent = _typed(d, "parent", list, none=True)
    if parent is not None:
        if len(parent) != 2 or not isinstance(parent[0], str) or not _is_int(parent[1]):
            msg = f"its parent {_clip(parent)} is not [run_id, seq]"
            raise SnapshotError(msg)
        s.parent = (parent[0], parent[1])
    s.result = d["result"]
    s.error = _typed(d, "error", dict, none=True)
    s.queues = {k: {e.id: e for e in map(_ev, q)} for k, q in _items(d, "queues", list)}
    s.in_progress = {
        k: {p.ev.id: p for p in map(_progress, v)} for k, v in _items(d, "in_progress", list)
    }
    s.context = {k: _keylog(v) for k, v in _items(d, "context", list)}
    s.buffers = {
        b: {t: [_ev(e) for e in _list(es, "buffer")] for t, es in by.items()}
        for b, by in _items(d, "buffers", dict)
    }
    if d["v"] < 3:
        s.buffers = _legacy_buffers(s.buffers)
    s.waiters = {w.waiter_id: w for w in map(_waiter, _typed(d, "waiters", list))}
    s.answers = {k: None if a is None else _ev(a) for k, a in _typed(d, "answers", dict).items()}
    s.unclaimed = {e.id: e for e in map(_ev, _typed(d, "unclaimed", list))}
    s.stream = [_ev(e) for e in _typed(d, "stream", list)]
    s.next_id = _typed(d, "next_id", int)
    s.exec_us = _typed(d, "exec_us", int)
    s._prev_ts = _typed(d, "prev_ts", int, none=True)
    s._paused = _typed(d, "paused", bool)
    return s


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _clip(x: Any) -> str:
    text = orjson.dumps(x).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _typed(d: dict[str, Any], key: str, kind: type, *, none: bool = False) -> Any:
    """``d[key]``, refused unless it is a ``kind`` (or None, with ``none``)."""
    x = d[key]
    if x is None and none:
        return None
    ok = _is_int(x) if kind is int else isinstance(x, kind)
    if not ok:
        msg = f"its {key!r} is {_clip(x)}, not a {kind.__name__}"
        raise SnapshotError(msg)
    return x


def _list(x: Any, what: str) -> list[Any]:
    if not isinstance(x, list):
        msg = f"a {what} entry {_clip(x)} is not a list"
        raise SnapshotError(msg)
    return x


def _items(d: dict[str, Any], key: str, kind: type) -> list[tuple[str, Any]]:
    """The entries of the object ``d[key]``, each value refused unless it is a ``kind``."""
    obj = _typed(d, key, dict)
    return [(k, _typed(obj, k, kind)) for k in obj]


def _bad_shape(what: str, e: Any) -> NoReturn:
    msg = f"a {what} entry {_clip(e)} does not have the shape dump_folded writes"
    raise SnapshotError(msg)


# The entries are checked with `type(x) is ...` (no bools for ints): a state of thousands of
# events loads at about the cost of building it.


def _ev(e: Any) -> Ev:
    if type(e) is list and len(e) == 3:
        i, dump, seq = e
        if type(i) is int and type(seq) is int:
            return Ev(i, dump, seq)
    _bad_shape("event", e)


def _progress(e: Any) -> Prog:
    if type(e) is list and len(e) == 6:
        i, dump, attempt, failures, conflicts, seq = e
        if type(i) is type(attempt) is type(failures) is type(conflicts) is type(seq) is int:
            return Prog(Ev(i, dump, seq), attempt, failures, conflicts)
    _bad_shape("step", e)


def _keylog(e: Any) -> KeyLog:
    if type(e) is list and len(e) == 4:
        dump, full, patch, seq = e
        if type(full) is type(patch) is type(seq) is int:
            return KeyLog(dump, full, patch, seq)
    _bad_shape("context", e)


def _waiter(e: Any) -> WaitRec:
    if type(e) is list and len(e) == 9:
        wid, step, i, dump, awaited, req, deadline, event, seq = e
        if (
            type(wid) is type(step) is type(awaited) is str
            and type(i) is type(seq) is int
            and (deadline is None or type(deadline) in (int, float))
        ):
            return WaitRec(wid, step, Ev(i, dump, seq), awaited, req, deadline, event)
    _bad_shape("waiter", e)
