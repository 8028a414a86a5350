"""Context values a snapshot keeps by reference to its run's log (``_snapshot``'s format 6):
bound to the store they are built from, checked as a snapshot loads, built when read.

A reference names records of the run's own log only: a fork's log does not hold its
parent's records (it names its parent and folds onto the parent's state at the fork's seq,
:func:`as_fork`), so a state that goes on as a fork's builds every value it holds by
reference to the parent's log first, and a fork's snapshot never refers to a seq before the
fork's first record. Snapshots that earlier versions wrote so are refused as they load
(:func:`bind_refs`): the reader folds the log instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import orjson

from eventstore import EventStore, LogCorruptedError, RunInfo, StoredRecord

from . import _journal as J
from . import _snapshot
from ._fold import Folded, KeyLog, payload_of
from ._patch import apply_json
from ._snapshot import SnapshotError

__all__ = ["as_fork", "bind_refs", "build_refs", "deferred_writes", "rebuild"]


def build_refs(state: Folded) -> None:
    """Builds every context value ``state`` keeps by reference to its run's log.

    Once ``state`` goes on as another run's (a fork's), the records after it are that run's
    and the references would name seqs its log does not hold.

    :raises LogCorruptedError: a record a value is built from is damaged.
    """
    for entry in state.context.values():
        if entry.is_unread:
            entry.dump  # noqa: B018 - built from the log its source reads, where its patches are


def as_fork(state: Folded, run_id: str) -> Folded:
    """``state`` (a parent's fold at the fork's seq) made the state run ``run_id``'s own
    records fold onto: its values built (:func:`build_refs`), its own log not begun yet."""
    build_refs(state)
    state.run_id = run_id
    state.first_seq = None  # the fork's own first record sets it
    state.records = 0
    return state


def bind_refs(store: EventStore, info: RunInfo, state: Folded) -> None:
    """Binds the values a loaded snapshot of run ``info`` keeps by reference to its log, once
    each reference is seen to fit it: a full write of its key in the run's own log, at or
    after its first record, and no later than the snapshot.

    Only the full write is read (one record a value); its patches are read when the value is.

    :raises SnapshotError: a reference does not fit (a fork's snapshot that earlier versions
        wrote naming its parent's records, or a damaged one).
    """
    for key, entry in state.context.items():
        if not entry.is_unread:
            continue
        full_seq = entry.full_seq
        assert full_seq is not None  # an unread entry has one
        if info.first_seq is None or full_seq < info.first_seq or entry.seq > state.seq:
            msg = (
                f"context key {key!r} is kept by reference to seqs {full_seq} to {entry.seq},"
                f" outside the run's log from seq {info.first_seq} to the snapshot's {state.seq}"
            )
            raise SnapshotError(msg)
        if not _is_full_write(store, info.run_id, key, full_seq):
            msg = f"context key {key!r} is kept by reference to seq {full_seq}, not its full write"
            raise SnapshotError(msg)
        entry.source = functools.partial(rebuild, store, info.run_id, key)


def deferred_writes(store: EventStore, run_id: str) -> Callable[[Folded, StoredRecord], bool]:
    """A fold's ``defer`` for the executor's copy of its own run's log, in ``store``: a
    large value written whole is kept as a reference to its record, built from the log
    only if it is read (a snapshot keeps it by reference, and a loop's growing value is
    rewritten whole as often as its patches weigh it). Its patches then only move it.

    Decoding each such write was most of the executor's fold for an agent's growing
    memory (a list of message dicts: about 15 us a step at 1,000 steps), and the decoded
    copy doubled the objects the garbage collector scans.
    """

    def defer(state: Folded, r: StoredRecord) -> bool:
        # The executor's records, as this code's journal writes them: {"key":K,"value":V}.
        # K is a JSON string, in which '","' cannot occur (a quote in it is escaped), so
        # the first '","value":' ends it.
        payload = r.payload
        if len(payload) < _snapshot.REF_MIN_BYTES:
            return False  # a snapshot may copy it: decoded as any other
        end = payload.find(_VALUE_AFTER_KEY) if payload.startswith(_KEY_FIRST) else -1
        if end < 0 or payload.find(_PATCH_AFTER_KEY, 0, end) >= 0:
            return False
        key = orjson.loads(payload[len(_KEY_FIRST) - 1 : end + 1])
        source = functools.partial(rebuild, store, run_id, key)
        state.context[key] = KeyLog.deferred(len(payload), r.seq, source)
        return True

    return defer


_KEY_FIRST: Final = '{"key":"'
_VALUE_AFTER_KEY: Final = '","value":'
_PATCH_AFTER_KEY: Final = '","patch":'


def _is_full_write(store: EventStore, run_id: str, key: str, seq: int) -> bool:
    """Whether the run's record at ``seq`` writes context key ``key`` whole."""
    for r in store.records(run_id, after=seq - 1, upto=seq, kinds=[J.STATE_SET]):
        try:
            p = payload_of(r)
        except LogCorruptedError:  # the full fold meets it and names it
            return False
        return r.seq == seq and p.get("key") == key and "value" in p
    return False


def rebuild(store: EventStore, run_id: str, key: str, entry: KeyLog) -> Any:
    """The value of a context key a snapshot keeps by reference to the log: its full write
    at ``entry.full_seq`` and its patches after it, up to ``entry.seq``.

    :raises LogCorruptedError: those records are not there as the reference says, or one
        of them is damaged (naming the key and the record's seq).
    """
    assert entry.full_seq is not None  # an unread entry has one
    value: Any = _NOTHING
    kinds = [J.STATE_SET, J.STATE_DELETED]
    for r in store.records(run_id, after=entry.full_seq - 1, upto=entry.seq, kinds=kinds):
        try:
            p = payload_of(r)
        except LogCorruptedError as exc:  # it may be one of the key's: the value is unknown
            msg = f"context key {key!r} cannot be built from the log: {exc}"
            raise LogCorruptedError(msg, seq=r.seq) from exc
        if p.get("key") != key:
            continue
        first = value is _NOTHING  # the full write, then only patches: else not this value
        if (
            r.kind == J.STATE_DELETED
            or first != (r.seq == entry.full_seq)
            or first != ("value" in p)
        ):
            value = _NOTHING
            break
        try:
            value = p["value"] if "value" in p else apply_json(value, p["patch"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            msg = (
                f"record seq {r.seq} of run {run_id!r}: the patch of context key {key!r}"
                f" does not apply to its value ({exc!r})"
            )
            raise LogCorruptedError(msg, seq=r.seq) from exc
    if value is _NOTHING:
        msg = (
            f"run {run_id!r}: context key {key!r} is kept by its snapshot as its write at seq"
            f" {entry.full_seq} and patches up to seq {entry.seq}, which the log does not hold"
        )
        raise LogCorruptedError(msg, seq=entry.seq)
    return value


_NOTHING: Final = object()
