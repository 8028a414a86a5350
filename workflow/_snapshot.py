"""The cached state: a folded state as JSON in the store, so that reads fold only what follows.

The executor keeps the fold of its own commits as it goes and now and then stores it as the
run's snapshot (:func:`dump_folded`); readers start from it (:func:`load_folded`) and fold
only the records after it. The cache is never trusted: what does not load exactly as it was
dumped is refused, and the fold of the log is always the truth.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import Any, Final, NoReturn

import orjson

from ._buffers import class_qualname, legacy_buffer_key
from ._fold import Ev, Failure, Folded, KeyLog, MemoRec, Prog, WaitRec

__all__ = ["SNAPSHOT_FORMAT", "SnapshotError", "dump_folded", "load_folded"]

# The "v" of dump_folded's output; 3: buffers keyed by buffer_key; 4: steps in progress
# carry their latest failure (durable retries), and the lineages' recovery counts; 5: the
# memoized calls of inputs not yet done; 6: context values' full-write seqs, and values
# built by patches kept by reference to the log; 7: the session's start, inputs' first
# starts and the typed state model's version; 8: the sessions that declared each patch
# deprecated.
SNAPSHOT_FORMAT: Final = 8
# Older formats still read: 2 (buffers keyed by module names, converted as they load), 3,
# 4 (no memoized calls: the code that wrote them recorded none), 5, 6 (no session or first
# starts: written by fold version 2, whose snapshots fold version 3 does not trust anyway),
# 7 (no declared patches: none, which refuses what it cannot tell; its fold version, 3, is
# not trusted by the readers of fold version 4 anyway).
_READ_FORMATS: Final = frozenset({2, 3, 4, 5, 6, 7, SNAPSHOT_FORMAT})

# A context value is kept by reference to the log (its last full write and the patches
# since, in the run's own log) once those records weigh REF_MIN_BYTES and at most
# REF_FACTOR times the value's JSON: reading it then costs about what decoding a copy
# would, and the snapshot does not copy what the log already holds. A value that grew by
# appends is the case: copied into each snapshot, its copies would outweigh the log (a
# list of N items, one appended a step). A small value patched often (the last 20
# messages) is copied: its patches outweigh it.
REF_MIN_BYTES: Final = 16 * 1024
REF_FACTOR: Final = 4
_REF: Final = "log"  # the last element of a context entry kept by reference


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
                    [
                        p.ev.id,
                        p.ev.dump,
                        p.attempt,
                        p.failures,
                        p.conflicts,
                        p.ev.seq,
                        _failure_dump(p.failure),
                    ]
                    for p in v.values()
                ]
                for k, v in s.in_progress.items()
            },
            "context": {k: _context_entry(s, v) for k, v in s.context.items()},
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
            "recoveries": {str(i): c for i, c in s.recoveries.items()},
            "memos": {
                step: {
                    str(i): {
                        k: [m.digest, m.result, m.error, m.attempt, m.seq, m.retried]
                        for k, m in by_key.items()
                    }
                    for i, by_key in by_event.items()
                }
                for step, by_event in s.memos.items()
            },
            "session": s.session,
            "state": s.state,
            "started": {step: {str(i): q for i, q in by.items()} for step, by in s.started.items()},
            "deprecated": s.deprecated,
            "next_id": s.next_id,
            "exec_us": s.exec_us,
            "prev_ts": s.prev_ts,
            "paused": s.paused,
            **_collections(s),
        }
    )


def _collections(s: Folded) -> dict[str, Any]:
    """The collection streams' state, only in a run that has some: the members kept are
    those of events still queued, running or held."""
    if not (s.streams or s.held or s.members):
        return {}
    live = {e.id for e in s.events(stream=False)}
    for held in s.held.values():
        live.update(held)
    return {
        "collections": {
            "streams": s.streams,
            "members": {str(i): sid for i, sid in s.members.items() if i in live},
            "held": {step: _evs(evs.values()) for step, evs in s.held.items()},
            "released": sorted(s.released),
        }
    }


def _context_entry(s: Folded, v: KeyLog) -> list[Any]:
    """A context value as a snapshot keeps it: its JSON, or a reference to the log.

    A reference names records of the run's own log only: a fork's log does not hold its
    parent's, so a value last written whole before the fork began is copied.
    """
    own = v.full_seq is not None and s.first_seq is not None and v.full_seq >= s.first_seq
    if v.is_unread and not v.moved and own:  # as its snapshot kept it: still a reference
        return [None, v.full_bytes, v.patch_bytes, v.seq, v.full_seq, _REF]
    history = v.full_bytes + v.patch_bytes
    if own and history >= REF_MIN_BYTES and history <= REF_FACTOR * v.json_size():
        return [None, v.full_bytes, v.patch_bytes, v.seq, v.full_seq, _REF]
    return [v.dump, v.full_bytes, v.patch_bytes, v.seq, v.full_seq]


def _legacy_buffers(raw: dict[str, dict[str, list[Ev]]]) -> dict[str, dict[str, list[Ev]]]:
    """Buffers of a cached state written before v3, keyed as the fold keys them now.

    Buffers that differed only by module names (``__main__`` and its imported name) are
    one buffer now: their events are merged in the order the log holds them.
    """
    out: dict[str, dict[str, list[Ev]]] = {}
    for b, by in raw.items():
        buf = out.setdefault(legacy_buffer_key(b), {})
        for t, es in by.items():
            buf.setdefault(class_qualname(t), []).extend(es)
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
    if "recoveries" in d or d["v"] >= 4:
        s.recoveries = {_id(k): _counts(c) for k, c in _typed(d, "recoveries", dict).items()}
    if d["v"] >= 5:
        s.memos = {
            step: {
                _event_id(i): {k: _memo(m) for k, m in _typed(by_event, i, dict).items()}
                for i in by_event
            }
            for step, by_event in _items(d, "memos", dict)
        }
    if d["v"] >= 7:
        s.session = _typed(d, "session", int)
        s.state = _typed(d, "state", str, none=True)
        s.started = {
            step: {_event_id(i): _typed(by, i, int) for i in by}
            for step, by in _items(d, "started", dict)
        }
    if d["v"] >= 8:
        s.deprecated = {pid: _marks(m) for pid, m in _items(d, "deprecated", list)}
    s.next_id = _typed(d, "next_id", int)
    s.exec_us = _typed(d, "exec_us", int)
    s.prev_ts = _typed(d, "prev_ts", int, none=True)
    s.paused = _typed(d, "paused", bool)
    if "collections" in d:
        c = _typed(d, "collections", dict)
        s.streams = {k: _list(v, "stream") for k, v in _typed(c, "streams", dict).items()}
        s.members = {_id(k): str(v) for k, v in _typed(c, "members", dict).items()}
        s.held = {
            step: {e.id: e for e in map(_ev, _list(evs, "held"))}
            for step, evs in _typed(c, "held", dict).items()
        }
        s.released = {str(k) for k in _typed(c, "released", list)}
    return s


def _id(key: str) -> int:
    if not key.isdigit():
        _bad_shape("recoveries", key)
    return int(key)


def _counts(c: Any) -> dict[str, int]:
    if type(c) is not dict or not all(_is_int(n) for n in c.values()):
        _bad_shape("recoveries", c)
    return c


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


def _failure_dump(f: Failure | None) -> list[Any] | None:
    if f is None:
        return None
    return [f.retry_at, f.elapsed, f.failed_at, f.error, f.module, f.message]


def _number_or_none(x: Any) -> bool:
    return x is None or type(x) in (int, float)


def _failure(e: Any) -> Failure | None:
    if e is None:
        return None
    if type(e) is list and len(e) == 6:
        retry_at, elapsed, failed_at, error, module, message = e
        if (
            _number_or_none(retry_at)
            and _number_or_none(elapsed)
            and type(failed_at) in (int, float)
            and type(error) is type(module) is type(message) is str
        ):
            return Failure(retry_at, elapsed, failed_at, error, module, message)
    _bad_shape("failure", e)


def _progress(e: Any) -> Prog:
    # Six fields up to format 3; format 4 adds the latest failure.
    if type(e) is list and len(e) in (6, 7):
        i, dump, attempt, failures, conflicts, seq = e[:6]
        if type(i) is type(attempt) is type(failures) is type(conflicts) is type(seq) is int:
            failure = _failure(e[6]) if len(e) == 7 else None
            return Prog(Ev(i, dump, seq), attempt, failures, conflicts, failure)
    _bad_shape("step", e)


def _keylog(e: Any) -> KeyLog:
    # Four fields up to format 5; format 6 adds the full write's seq, and a reference to
    # the log in place of the value.
    if type(e) is list and 4 <= len(e) <= 6:
        dump, full, patch, seq = e[:4]
        full_seq = e[4] if len(e) > 4 else None
        if type(full) is type(patch) is type(seq) is int and (
            full_seq is None or type(full_seq) is int
        ):
            if len(e) < 6:
                return KeyLog(dump, full, patch, seq, full_seq)
            if e[5] == _REF and dump is None and full_seq is not None and full_seq <= seq:
                return KeyLog.unread(full, patch, seq, full_seq)
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


def _event_id(text: str) -> int:
    if text.isdigit():
        return int(text)
    _bad_shape("memoized call's event", text)


def _marks(e: list[Any]) -> list[int]:
    """A patch's declaring sessions: their starts' and ends' seqs, ascending."""
    if all(type(q) is int for q in e) and all(a < b for a, b in pairwise(e)):
        return e
    _bad_shape("deprecated patch", e)


def _memo(e: Any) -> MemoRec:
    if type(e) is list and len(e) == 6:
        digest, result, error, attempt, seq, retried = e
        if (
            type(digest) is str
            and type(attempt) is type(seq) is int
            and type(retried) is bool
            and (error is None or type(error) is dict)
        ):
            return MemoRec(digest, result, error, attempt, seq, retried)
    _bad_shape("memoized call", e)
