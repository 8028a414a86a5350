"""A run travels: copied with the ancestors its fork needs into another store.

``workflow export DB RUN -o run.db`` writes the run into a new store file keeping every seq
and time, so the export reads exactly as the original (its states, checkpoints, snapshots);
``workflow import DB FILE`` adds the runs of such a file to a store, their seqs moved past
the store's last one when they would not fit after it. Needs no user code, and no key for
an encrypted run whose seqs need not move: its payloads are copied sealed, as they are.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from eventstore import Commit, EventStore, NewRun, Record, RunInfo, Snapshot, StoredRecord
from eventstore._encryption import EncryptedPayloadError, encrypted_error

from . import _journal as J
from ._errors import WorkflowRuntimeError
from ._fold import FOLD_VERSION, Folded
from ._folded import STATUS_OF_KIND
from ._read import commits, copied_upto, fold_run, records_upto, run_info, snapshots
from ._snapshot import SnapshotError, dump_folded, load_folded

__all__ = ["Part", "copy_runs", "export_run", "lineage"]


@dataclass(frozen=True, slots=True)
class Part:
    """A run to copy: all of it, or (an ancestor) its log up to the commit ending at ``upto``."""

    info: RunInfo
    upto: int | None = None


def lineage(store: EventStore, run_id: str) -> list[Part]:
    """The run and the ancestors its fork needs, oldest first: each parent up to the commit
    its child forked at.

    :raises RunNotFoundError: no such run (or a parent the store lacks).
    """
    parts = [Part(run_info(store, run_id))]
    while (info := parts[-1].info).parent_run_id is not None and info.parent_seq is not None:
        parent = run_info(store, info.parent_run_id)
        upto = _commit_end(store, parent.run_id, info.parent_seq)
        parts.append(Part(parent, upto))
    return parts[::-1]


def _commit_end(store: EventStore, run_id: str, seq: int) -> int:
    """The seq that ends the run's last commit begun at or before ``seq``."""
    last = seq
    for r in records_upto(store, run_id, seq, after=max(0, seq - 1)):
        last = r.seq
    return last


def export_run(store: EventStore, run_id: str, target: EventStore) -> list[str]:
    """Copies the run and its ancestors into ``target``, a new, empty store; returns their
    run ids, oldest first.

    :raises WorkflowRuntimeError: the target already holds records.
    """
    if target.head() != 0:
        msg = "an export goes into a new store; this one already holds records"
        raise WorkflowRuntimeError(msg)
    return copy_runs(store, lineage(store, run_id), target)


def copy_runs(store: EventStore, parts: list[Part], target: EventStore) -> list[str]:
    """Copies ``parts`` of ``store`` into ``target``, commit by commit in seq order.

    Seqs and times are kept when every copied seq comes after the target's last one, else
    all are moved by one offset (and the payloads that name seqs with them), which keeps
    their order; the runs' snapshots are copied (moved alike), their pending inbox entries
    posted again.

    :raises WorkflowRuntimeError: a run of ``parts`` is already in the target.
    :raises EncryptedPayloadError: seqs must move but a run's payloads are encrypted and
        ``store`` was opened without the key.
    """
    for part in parts:
        if target.get_run(part.info.run_id) is not None:
            msg = f"run {part.info.run_id!r} is already in the target store"
            raise WorkflowRuntimeError(msg)
    firsts = [p.info.first_seq for p in parts if p.info.first_seq is not None]
    head = target.head()
    offset = 0 if not firsts or min(firsts) > head else head + 1 - min(firsts)
    if offset:  # moving seqs rewrites payloads that name them: said before anything is written
        for part in parts:
            first = next(iter(store.records(part.info.run_id)), None)
            if first is not None and (sealed := encrypted_error(first)) is not None:
                raise sealed
    streams = [_tagged(store, part) for part in parts]
    created: set[str] = set()
    by_id = {p.info.run_id: p for p in parts}
    for run_id, commit in _merged(streams):
        part = by_id[run_id]
        create = None
        if run_id not in created:
            create = _new_run(store, part, offset)
            created.add(run_id)
        target.append_sync(
            Commit(
                run_id,
                [Record(r.kind, r.step, _moved(r, offset)) for r in commit],
                create=create,
                seq=commit[0].seq + offset,
                ts=commit[0].ts,
            )
        )
    for part in parts:
        _copy_snapshots(store, part, target, offset)
        if part.upto is None:
            for entry in store.inbox(part.info.run_id):
                target.post_sync(part.info.run_id, entry.payload, key=entry.key)
    return [p.info.run_id for p in parts]


def _tagged(store: EventStore, part: Part) -> Iterator[tuple[int, str, list[StoredRecord]]]:
    run_id = part.info.run_id
    for commit in commits(records_upto(store, run_id, part.upto)):
        yield commit[0].seq, run_id, commit


def _merged(
    streams: list[Iterator[tuple[int, str, list[StoredRecord]]]],
) -> Iterator[tuple[str, list[StoredRecord]]]:
    for _, run_id, commit in heapq.merge(*streams, key=lambda t: t[0]):
        yield run_id, commit


def _new_run(store: EventStore, part: Part, offset: int) -> NewRun:
    info = part.info
    meta: dict[str, Any] = dict(info.meta)
    status = info.status
    if part.upto is not None:  # an ancestor, copied up to where its child forked
        meta["copied_upto"] = part.upto + offset
        status = _status_at(store, part)
    elif offset and (upto := copied_upto(info)) is not None:  # an import of one: moved too
        meta["copied_upto"] = upto + offset
    parent_seq = None if info.parent_seq is None else info.parent_seq + offset
    return NewRun(meta, info.parent_run_id, parent_seq, status, info.created)


def _status_at(store: EventStore, part: Part) -> str | None:
    """The ancestor's status at the end of its copied part: its fold's, or, its payloads
    encrypted and read without the key, the one its records' kinds set."""
    try:
        return fold_run(store, part.info.run_id, part.upto).status
    except EncryptedPayloadError:
        status = part.info.status
        for r in records_upto(store, part.info.run_id, part.upto):
            status = STATUS_OF_KIND.get(r.kind, status)
        return status


def _moved(r: StoredRecord, offset: int) -> str:
    """The record's payload, the seqs it names moved by ``offset``.

    :raises EncryptedPayloadError: the payload names seqs to move but is encrypted and was
        read without the key (the error names its key id).
    """
    if not offset or r.kind not in (J.RUN_STARTED, J.STEP_FINISHED):
        return r.payload
    if (sealed := encrypted_error(r)) is not None:
        raise sealed
    p = orjson.loads(r.payload)
    if r.kind == J.RUN_STARTED:
        started: J.RunStarted = p
        parent = started.get("parent")
        if parent:
            parent["seq"] += offset
    else:
        finished: J.StepFinished = p
        if "base" in finished:
            finished["base"] += offset
    return orjson.dumps(p).decode()


def _copy_snapshots(store: EventStore, part: Part, target: EventStore, offset: int) -> None:
    run_id = part.info.run_id
    for snap in snapshots(store, run_id):
        if part.upto is not None and snap.seq > part.upto:
            break
        if snap.version != FOLD_VERSION:
            continue  # of no use to this version's readers
        data = snap.data
        if offset:
            try:
                data = dump_folded(_shift(load_folded(snap.data), offset)).decode()
            except SnapshotError:
                continue  # a damaged one is not copied: readers fold the log instead
        moved = Snapshot(snap.seq + offset, data, snap.version, snap.records)
        target.append_sync(Commit(run_id, [], snapshot=moved))


def _shift(s: Folded, offset: int) -> Folded:
    """A folded state with every seq it holds moved by ``offset``."""
    s.seq += offset
    if s.first_seq is not None:
        s.first_seq += offset
    if s.parent is not None:
        s.parent = (s.parent[0], s.parent[1] + offset)
    for e in s.events():
        e.seq += offset
    for entry in s.context.values():
        entry.seq += offset
        if entry.full_seq is not None:
            entry.full_seq += offset
    for by_event in s.memos.values():
        for by_key in by_event.values():
            for m in by_key.values():
                m.seq += offset
    if s.session:
        s.session += offset
    s.started = {k: {i: q + offset for i, q in by.items()} for k, by in s.started.items()}
    s.deprecated = {pid: [q + offset for q in marks] for pid, marks in s.deprecated.items()}
    return s
