"""Is the store whole? SQLite's integrity check and a full fold of each run (``workflow check``).

The fold of the log is the truth and the snapshots only a cache of it, so each run is folded
from its first record, without the cache; at the seq of each of the run's snapshots, the fold
must equal it (its count of records too). Needs no user code: events and values stay in
their JSON form. A run whose payloads are encrypted, checked without the key, gets what
can be checked without their values (seqs in order, known kinds, well-formed envelopes) and
is listed as not fully checked, with the key id that would check the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from eventstore import (
    EventStore,
    EventStoreError,
    LogCorruptedError,
    RunInfo,
    SnapshotUnreadableError,
    StoredRecord,
)
from eventstore._encryption import sealed_key_id

from ._errors import WorkflowError
from ._fold import APPLY, Folded, fold
from ._read import load_snapshot, records_upto, run_info, snapshots, start_state
from ._snapshot import SnapshotError, dump_folded

__all__ = ["Problem", "Report", "check_store"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the store: where (run, seq), what (a category) and the error."""

    what: str  # integrity, run, record, snapshot, parent
    run_id: str | None
    seq: int | None
    error: str  # the error's class
    message: str

    def __str__(self) -> str:
        where = [f"run {self.run_id}"] if self.run_id is not None else []
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        head = ": ".join([*where, self.what]) if where else self.what
        return f"{head}: {self.error}: {self.message}"


@dataclass(slots=True)
class Report:
    """What :func:`check_store` found; ``ok`` when it found nothing wrong."""

    integrity: list[str] = field(default_factory=list)
    runs: int = 0
    records: int = 0
    problems: list[Problem] = field(default_factory=list)
    # Runs whose payloads are encrypted and were checked without the key: run id to the
    # key id their payloads need. Only their structure was checked; not a problem.
    unchecked: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems


def check_store(store: EventStore, run_id: str | None = None) -> Report:
    """Checks the store's file (SQLite's integrity check) and every run, or only ``run_id``.

    :raises RunNotFoundError: ``run_id`` is not a run of the store.
    """
    report = Report()
    if store.kind == "sqlite":
        try:
            report.integrity = [str(row[0]) for row in store.query("PRAGMA integrity_check")]
        except EventStoreError as exc:
            report.integrity = [str(exc)]
        if report.integrity != ["ok"]:
            report.problems += [
                Problem("integrity", None, None, "SQLite", line) for line in report.integrity
            ]
    infos = [run_info(store, run_id)] if run_id is not None else store.runs()
    for info in infos:
        report.runs += 1
        kid = None if store.payload_codec is not None else _sealed(store, info)
        if kid is None:
            _check_run(store, info, report)
        else:
            report.unchecked[info.run_id] = kid
            _check_structure(store, info, report)
    return report


def _sealed(store: EventStore, info: RunInfo) -> str | None:
    """The key id of the first encrypted payload of the run or of an ancestor its fork
    folds (None: all plain, or unreadable), for a store opened without the key."""
    run: RunInfo | None = info
    try:
        while run is not None:
            for r in store.records(run.run_id):
                if (kid := sealed_key_id(r.payload)) is not None:
                    return kid
            parent = run.parent_run_id
            run = None if parent is None else store.get_run(parent)
    except EventStoreError:  # a record that cannot be read: the full check names it
        return None
    return None


def _check_structure(store: EventStore, info: RunInfo, report: Report) -> None:
    """What can be checked of a run without its payloads' values: each record of a known
    kind, in seq order, its payload an envelope or plain JSON, and its fork's parent there."""
    run = info.run_id

    def problem(what: str, seq: int | None, exc: BaseException) -> None:
        report.problems.append(Problem(what, run, seq, type(exc).__name__, str(exc)))

    if info.parent_run_id is not None and store.get_run(info.parent_run_id) is None:
        msg = f"run {run!r} is a fork of run {info.parent_run_id!r}, which the store lacks"
        problem("parent", None, LogCorruptedError(msg))
    last = 0
    try:
        for r in records_upto(store, run, None):
            report.records += 1
            if r.seq <= last:
                msg = f"record seq {r.seq} of run {run!r} comes after seq {last}"
                problem("record", r.seq, LogCorruptedError(msg, seq=r.seq))
            last = max(last, r.seq)
            if r.kind not in APPLY:
                msg = f"record seq {r.seq} of run {run!r} has an unknown kind {r.kind!r}"
                problem("record", r.seq, LogCorruptedError(msg, seq=r.seq))
            elif sealed_key_id(r.payload) is None:
                try:
                    orjson.loads(r.payload)
                except orjson.JSONDecodeError as exc:
                    msg = f"record seq {r.seq} ({r.kind}) of run {run!r} has a malformed payload"
                    problem("record", r.seq, LogCorruptedError(f"{msg}: {exc}", seq=r.seq))
    except EventStoreError as exc:
        problem("run", getattr(exc, "seq", None), exc)


def _check_run(store: EventStore, info: RunInfo, report: Report) -> None:
    run = info.run_id

    def problem(what: str, seq: int | None, exc: BaseException) -> None:
        report.problems.append(Problem(what, run, seq, type(exc).__name__, str(exc)))

    def counted(records: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
        for r in records:
            report.records += 1
            yield r

    try:
        state = start_state(store, info, cached=False)
    except (EventStoreError, WorkflowError) as exc:
        seq = getattr(exc, "seq", None)
        problem("parent", seq, exc)
        return
    unreadable: list[SnapshotUnreadableError] = []
    try:
        snaps = snapshots(store, run, unreadable)
    except EventStoreError as exc:
        problem("snapshot", None, exc)
        snaps = []
    for damaged in unreadable:
        problem("snapshot", damaged.seq, damaged)
    after = 0
    try:
        for snap in snaps:
            try:
                cached = load_snapshot(store, info, snap)
            except SnapshotError as exc:
                if not exc.stale:  # an older version's snapshot: not used, not damage
                    problem("snapshot", snap.seq, exc)
                continue
            except EventStoreError as exc:  # the record the snapshot names cannot be read
                problem("record", getattr(exc, "seq", None), exc)
                continue
            fold(state, counted(records_upto(store, run, cached.seq, after=after)))
            after = state.seq
            differs = _differences(cached, state)
            if cached.records != state.records:
                differs.append(f"its count of records ({cached.records}, not {state.records})")
            if differs:
                msg = f"it differs from the fold of the log in {', '.join(differs)}"
                problem("snapshot", cached.seq, SnapshotError(msg))
        fold(state, counted(records_upto(store, run, None, after=after)))
    except EventStoreError as exc:
        seq = getattr(exc, "seq", None)
        problem("run" if seq is None else "record", seq, exc)


def _differences(cached: Folded, folded: Folded) -> list[str]:
    """The fields in which two folded states differ, as their cached JSON tells."""
    a: dict[str, Any] = orjson.loads(dump_folded(cached))
    b: dict[str, Any] = orjson.loads(dump_folded(folded))
    return [k for k in a if a[k] != b.get(k)]
