"""A folded state as readers see it: :func:`to_run_state` turns the JSON form the fold
builds (``_folded``) into a typed :class:`RunState`, decoding only what is read.

Apart from the fold (``_fold``, which re-exports these): the fold runs for every record
written and read, this once a read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventstore import Codec, CodecError, LogCorruptedError

from ._events import StopEvent
from ._folded import Ev, Folded, WaitRec, not_damage
from ._keylog import KeyLog
from ._state import TERMINAL, InProgress, LazyDict, LazyList, RunState, Waiter
from ._state_versions import upcast_values

__all__ = ["is_terminal", "result_of", "to_run_state"]


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
            not_damage(exc, f"the result of run {s.run_id!r}")
            msg = f"run {s.run_id!r} at seq {s.seq}: its result cannot be decoded: {exc}"
            raise LogCorruptedError(msg, seq=s.seq) from exc

    def waiter(w: WaitRec) -> Waiter:
        try:
            requirements = codec.load(w.requirements) or {}
            asked = None if w.waiter_event is None else codec.load(w.waiter_event)
        except CodecError as exc:
            not_damage(exc, f"record seq {w.ev.seq} of run {s.run_id!r}, wait {w.waiter_id!r}")
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
        context=_context(s, codec),
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
            not_damage(exc, f"record seq {e.seq} of run {s.run_id!r}, event {e.id}")
            msg = (
                f"record seq {e.seq} of run {s.run_id!r}: its event {e.id} ({e.type or '?'})"
                f" cannot be decoded: {exc}"
            )
            raise LogCorruptedError(msg, seq=e.seq) from exc

    return load


def _context(s: Folded, codec: Codec) -> LazyDict[str, Any]:
    """The context as read: decoded when read, or upcast first when it is in an older
    version of the typed state model than this program's (``_state_versions``)."""
    try:
        values = upcast_values(s, codec)
    except CodecError as exc:
        msg = (
            f"run {s.run_id!r} at seq {s.seq}: its context (state model {s.state}) cannot be"
            f" decoded: {exc}"
        )
        error = LogCorruptedError(msg, seq=s.seq)
        error.__cause__ = exc

        def refuse(key: str, entry: KeyLog) -> Any:
            raise error

        return LazyDict(s.context, refuse)  # its keys list; its values say why they cannot
    if values is None:
        return LazyDict(s.context, lambda k, v: _value(s, codec, k, v))
    return LazyDict(values, lambda k, v: v)


def _value(s: Folded, codec: Codec, key: str, entry: KeyLog) -> Any:
    try:
        return codec.load(entry.dump)
    except CodecError as exc:
        not_damage(exc, f"record seq {entry.seq} of run {s.run_id!r}, context key {key!r}")
        msg = (
            f"record seq {entry.seq} of run {s.run_id!r}: context key {key!r} cannot be"
            f" decoded: {exc}"
        )
        raise LogCorruptedError(msg, seq=entry.seq) from exc


def is_terminal(status: str) -> bool:
    """Whether a status ends the run (finished, failed, cancelled, timed out)."""
    return status in TERMINAL
