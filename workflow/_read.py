"""The read side: a run's records by the checkpoint rule, its fold, its status.

Shared by :class:`Workflow` and the command line, which reads stores without user code:
the fold of a run at a seq (from its cached state, or a fork's parent's), the seqs one may
look at, the status a reader sees, the run list, commits, and a log read past its damaged
records. What the commits say about events (checkpoints, event classes) is
``_checkpoints``.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from eventstore import (
    EventStore,
    LogCorruptedError,
    RunInfo,
    Snapshot,
    SnapshotUnreadableError,
    StoredRecord,
)

from ._errors import (
    RunNotFoundError,
    SnapshotIgnoredWarning,
    WorkflowRuntimeError,
)
from ._fold import FOLD_VERSION, Folded, fold
from ._log_refs import as_fork, bind_refs
from ._ownership import LeaseOwners, Owners
from ._seqs import no_state_at
from ._snapshot import SnapshotError, load_folded

# Wraps the records a fold reads as they are read (a progress bar), yielding each of them.
Wrap = Callable[[Iterator[StoredRecord]], Iterator[StoredRecord]]

__all__ = [
    "Damaged",
    "RunSummary",
    "Wrap",
    "check_seq",
    "commits",
    "copied_upto",
    "fold_run",
    "lease_text",
    "live_status",
    "load_snapshot",
    "only_submitted",
    "readable_records",
    "records_upto",
    "refuse_cut",
    "run_info",
    "run_summaries",
    "shown_status",
    "snapshots",
    "start_state",
    "waits_of",
]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as ``wf.runs()`` lists it."""

    run_id: str
    status: str
    workflow: str
    created: int  # microseconds since the Unix epoch, UTC
    first_seq: int | None
    last_seq: int | None
    parent_run_id: str | None
    parent_seq: int | None
    waiting_for: tuple[str, ...] = ()  # a waiting run's awaited classes (qualified names)
    # An exported ancestor's: the seq its log was copied up to (where its child forked).
    # Such a run never runs here: recover, workers and resume leave it alone.
    copied_upto: int | None = None
    # A running run's lease (PostgreSQL): its holder and when it lapses unless renewed
    # (Unix seconds). Its holder may have died: the run is resumable once it lapses.
    lease: tuple[str, float] | None = None


def lease_text(lease: tuple[str, float]) -> str:
    """What a listing says of a running run's lease: that it holds the run, and until when
    (a resume is refused until then, also when its holder died)."""
    holder, lapses_at = lease
    when = time.strftime("%H:%M:%S", time.gmtime(lapses_at))
    return f"lease held until {when} UTC by {holder}"


def copied_upto(info: RunInfo) -> int | None:
    """The seq an exported ancestor's log was copied up to (``workflow export`` of a fork
    carries each ancestor only up to where its child forked), or None for a whole run."""
    upto = info.meta.get("copied_upto")
    return upto if isinstance(upto, int) and not isinstance(upto, bool) else None


def only_submitted(info: RunInfo) -> bool:
    """Whether a run was only ever submitted: recorded for a worker (``wf.submit``, or a
    fork the web UI left for workers: "submitted" in its row's meta) and never claimed since
    (a claim moves the epoch on from 1). No process died in it, though its log looks so."""
    return info.epoch == 1 and info.meta.get("submitted") is True


def refuse_cut(info: RunInfo) -> None:
    """Refuses to run an exported ancestor: its log ends where its child forked, so what it
    did next is not here, and running it would make up another past.

    :raises WorkflowRuntimeError: ``info`` is such an ancestor.
    """
    upto = copied_upto(info)
    if upto is not None:
        msg = (
            f"run {info.run_id!r} is an exported ancestor: its log was copied only up to"
            f" seq {upto}, where its fork began, so it does not run here; fork it at a seq"
            " up to that one, or resume it in the store it was exported from"
        )
        raise WorkflowRuntimeError(msg)


def run_info(store: EventStore, run_id: str) -> RunInfo:
    """The run's row. :raises RunNotFoundError: no such run in the store."""
    info = store.get_run(run_id)
    if info is None:
        where = store.path if store.kind == "sqlite" else f"the {store.kind} store"
        raise RunNotFoundError(run_id, where or "the store")
    return info


def records_upto(
    store: EventStore, run_id: str, seq: int | None, *, after: int = 0
) -> Iterator[StoredRecord]:
    """The run's records up to ``seq``, always whole commits (the checkpoint rule)."""
    last: StoredRecord | None = None
    for r in store.records(run_id, after=after, upto=seq):
        last = r
        yield r
    if last is not None and last.commit_seq > last.seq:
        yield from store.records(run_id, after=last.seq, upto=last.commit_seq)


def fold_run(
    store: EventStore,
    run_id: str,
    seq: int | None = None,
    *,
    cached: bool = True,
    wrap: Wrap | None = None,
) -> Folded:
    """The run's state in JSON form at ``seq``; a fork starts from its parent's state.

    With ``cached`` (the default) it starts from the run's nearest snapshot at or before
    ``seq`` and folds only the records after it, so a read costs about the same at any seq
    of any run; ``cached=False`` folds the whole log (the pure fold every snapshot must
    agree with). A snapshot that does not load or does not fit the log it covers is ignored
    with a :class:`SnapshotIgnoredWarning` (one of an older version silently) and the one
    before it is tried, down to the log itself. ``wrap`` sees the records of a whole-log
    fold as they are read (a progress bar).

    :raises RunNotFoundError: no such run.
    :raises CheckpointNotFoundError: ``seq`` is before the run's first record.
    :raises LogCorruptedError: a record of the run (or of its parent) is damaged.
    """
    info = run_info(store, run_id)
    if seq is not None and (info.first_seq is None or seq < info.first_seq):
        raise no_state_at(store, run_id, seq, info.first_seq)
    # The latest state is the log as the run's row was read: a snapshot another process
    # wrote since (its records not in ``info``) is not one to check against it.
    upto = seq if seq is not None else info.last_seq
    if cached and upto is not None:

        def unreadable(exc: SnapshotUnreadableError) -> None:
            # Told from inside _newest_first: two frames deeper than a call from here.
            _ignored(run_id, exc.seq, str(exc), deeper=2)

        for snap in _newest_first(store, run_id, upto, FOLD_VERSION, unreadable):
            state = _from_snapshot(store, info, snap, seq)
            if state is not None:
                return state
    state = start_state(store, info, cached=cached, wrap=wrap)
    records = records_upto(store, run_id, seq)
    return fold(state, records if wrap is None else wrap(records))


def start_state(
    store: EventStore, info: RunInfo, *, cached: bool = True, wrap: Wrap | None = None
) -> Folded:
    """The state a run's own records fold onto: a fork's parent's at the fork's seq (as
    :func:`fold_run` gives it), else the empty state."""
    if info.parent_run_id is None or info.parent_seq is None:
        return Folded(info.run_id)
    state = fold_run(store, info.parent_run_id, info.parent_seq, cached=cached, wrap=wrap)
    return as_fork(state, info.run_id)  # the fork's patches are in its own log


def load_snapshot(store: EventStore, info: RunInfo, snap: Snapshot) -> Folded:
    """The run's snapshot ``snap`` as a folded state, once it can be trusted.

    It must be of the current fold version, load (:func:`load_folded`), be the state of
    this run at its row's seq, and that seq must end one of the run's commits. What it
    holds beyond that only a full fold can check (``workflow check``).

    :raises SnapshotError: it does not load or does not fit; ``stale`` when it is only
        of another version.
    """
    at = snap.seq
    if snap.version != FOLD_VERSION:
        msg = f"it was folded by fold version {snap.version}, this is version {FOLD_VERSION}"
        raise SnapshotError(msg, stale=True)
    state = load_folded(snap.data)
    if state.run_id != info.run_id:
        msg = f"it is the state of run {state.run_id!r}"
        raise SnapshotError(msg)
    if state.seq != at:
        msg = f"it says seq {state.seq}, its row seq {at}"
        raise SnapshotError(msg)
    if info.first_seq is None or info.last_seq is None or not info.first_seq <= at <= info.last_seq:
        msg = f"seq {at} is outside the run's log (seqs {info.first_seq} to {info.last_seq})"
        raise SnapshotError(msg)
    if state.first_seq != info.first_seq:
        msg = f"it says the run begins at seq {state.first_seq}, its log at {info.first_seq}"
        raise SnapshotError(msg)
    ends = [r.commit_seq for r in store.records(info.run_id, after=at - 1, upto=at)]
    if ends != [at]:
        msg = f"seq {at} does not end a commit of the run"
        raise SnapshotError(msg)
    if snap.records is None:  # kept before stores counted: counted now
        ((count,),) = store.query(
            "SELECT count(*) FROM log WHERE rid = ? AND seq <= ?", (info.rid, at)
        )
        state.records = int(count)
    else:
        state.records = snap.records
    bind_refs(store, info, state)  # last: the seqs it checks against are the run's
    return state


def snapshots(
    store: EventStore, run_id: str, unreadable: list[SnapshotUnreadableError] | None = None
) -> list[Snapshot]:
    """The run's snapshots, oldest first (for ``workflow check``, export and tests: reads
    all). One whose text cannot be read at all is passed over, told to ``unreadable``."""
    told = (lambda exc: None) if unreadable is None else unreadable.append
    out = list(_newest_first(store, run_id, None, None, told))
    out.reverse()
    return out


def _newest_first(
    store: EventStore,
    run_id: str,
    upto: int | None,
    version: int | None,
    unreadable: Callable[[SnapshotUnreadableError], None],
) -> Iterator[Snapshot]:
    """The run's snapshots at seqs up to ``upto`` (of ``version``), newest first, each read
    when the one after it is passed over; one whose text cannot be read at all is told to
    ``unreadable`` and passed over too."""
    below: int | None = None
    while True:
        try:
            snap = store.find_snapshot(run_id, upto, below=below, version=version)
        except SnapshotUnreadableError as exc:
            unreadable(exc)
            below = exc.seq
            continue
        if snap is None:
            return
        yield snap
        below = snap.seq


def _from_snapshot(
    store: EventStore, info: RunInfo, snap: Snapshot, seq: int | None
) -> Folded | None:
    """The state at ``seq`` folded on from the snapshot ``snap``; None if that is unfit."""
    try:
        state = load_snapshot(store, info, snap)
    except SnapshotError as exc:
        if not exc.stale:  # another version's snapshot is not damage, only of no use here
            _ignored(info.run_id, snap.seq, exc.reason)
        return None
    try:
        return fold(state, records_upto(store, info.run_id, seq, after=snap.seq))
    except LogCorruptedError as exc:
        # A damaged record after the snapshot fails the full fold too, which then raises;
        # if the full fold goes through, it was the snapshot that did not fit.
        full = fold_run(store, info.run_id, seq, cached=False)
        _ignored(info.run_id, snap.seq, f"the records after it do not fold onto it ({exc})")
        return full


def _ignored(run_id: str, seq: int, reason: str, *, deeper: int = 0) -> None:
    warnings.warn(SnapshotIgnoredWarning(run_id, seq, reason), stacklevel=4 + deeper)


def live_status(status: str, only_waiters: bool, owned: bool) -> str:
    """A folded status as a reader should see it: ``running`` needs a live owner."""
    if status not in ("running", "waiting"):
        return status
    if only_waiters or status == "waiting":
        return "waiting"
    return "running" if owned else "interrupted"


def commits(records: Iterable[StoredRecord]) -> Iterator[list[StoredRecord]]:
    """Groups records (in seq order) into their commits."""
    batch: list[StoredRecord] = []
    for r in records:
        batch.append(r)
        if r.seq == r.commit_seq:
            yield batch
            batch = []
    if batch:
        yield batch


def run_summaries(
    store: EventStore,
    owners: Owners | LeaseOwners,
    *,
    owned: bool = True,
) -> list[RunSummary]:
    """Every run in the store with its status: ``waiting`` (for ``waiting_for``) when it
    has nothing to do but wait for an event, ``interrupted`` when it is unfinished with no
    live owner, ``submitted`` when it is so but no worker has taken it up yet
    (:func:`only_submitted`). With ``owned`` False, a run a live executor owns is only
    ``running`` (which saves folding it, for listings that skip owned runs anyway)."""
    out = []
    leases: dict[str, tuple[str, float]] = {}
    if isinstance(owners, LeaseOwners):
        leases = owners.leases_now()
        is_owned = owners.owned_now(leases)
    else:
        is_owned = owners.is_owned
    for info in store.runs():
        status = info.status or "running"
        waiting_for: tuple[str, ...] = ()
        unowned = status == "running" and not is_owned(info.run_id, info.rid)
        # A live owner may be waiting too; asking costs a fold, once per change of its log.
        if status == "waiting" or unowned or (status == "running" and owned):
            waits = waits_of(store, info)
            if waits:
                status = "waiting"
                waiting_for = tuple(dict.fromkeys(awaited for awaited, _ in waits))
            elif unowned:
                status = "submitted" if only_submitted(info) else "interrupted"
        out.append(
            RunSummary(
                info.run_id,
                status,
                str(info.meta.get("workflow", "")),
                info.created,
                info.first_seq,
                info.last_seq,
                info.parent_run_id,
                info.parent_seq,
                waiting_for,
                copied_upto(info),
                leases.get(info.run_id) if status == "running" else None,
            )
        )
    return out


# What each unfinished run waits for, by store, by run, at the seq it was folded at: a
# listing that polls (a worker's) folds a run again only once its log has grown.
_waits: weakref.WeakKeyDictionary[EventStore, dict[int, tuple[int, list[tuple[str, float | None]]]]]
_waits = weakref.WeakKeyDictionary()
_waits_lock = threading.Lock()


def waits_of(store: EventStore, info: RunInfo) -> list[tuple[str, float | None]]:
    """The waits of a run that has nothing else to do: (awaited class, deadline as Unix time
    or None) each; empty when it has queued or running work, no waits, or cannot be folded
    (a damaged run is reported where it is read)."""
    last = info.last_seq or 0
    with _waits_lock:
        known = _waits.setdefault(store, {}).get(info.rid)
    if known is not None and known[0] == last:
        return known[1]
    found: list[tuple[str, float | None]] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SnapshotIgnoredWarning)  # the fold is right anyway
            s = fold_run(store, info.run_id)
    except Exception:  # a listing shows a damaged run as not waiting
        s = None
    if s is not None and s.only_waiters() and s.status in ("running", "waiting"):
        found = [(w.awaited, w.deadline) for w in s.waiters.values()]
    with _waits_lock:
        _waits.setdefault(store, {})[info.rid] = (last, found)
    return found


# ------------------------------------------------------------------ seqs and statuses


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
        # Seqs are global: up to the store's head, a seq past the run's end is its latest
        # state; the run's own last seq is what the reader looks for.
        end = "has no records yet" if info.last_seq is None else f"ends at seq {info.last_seq}"
        msg = (
            f"seq {seq} is past the end of the log: run {run_id!r} {end}"
            f" (the store's last seq is {head})"
        )
        raise WorkflowRuntimeError(msg)
    if info.first_seq is None or seq < info.first_seq:
        raise no_state_at(store, run_id, seq, info.first_seq)
    return info


def shown_status(
    store: EventStore,
    s: Folded,
    owners: Owners | LeaseOwners,
    seq: int | None = None,
) -> str:
    """The status a run's state folded at ``seq`` shows a reader (``Workflow.state_at``,
    ``workflow state``, the web UI, the timeline); ``seq`` None is the latest state.

    At the run's latest commit, whether a live executor owns it tells ``running`` from
    ``interrupted`` (:func:`live_status`), and one no worker took up yet is ``submitted``,
    as :func:`run_summaries` says; an earlier state shows the status then."""
    info = run_info(store, s.run_id)
    if seq is not None and info.last_seq is not None and s.seq < info.last_seq:
        return s.status
    status = live_status(s.status, s.only_waiters(), owners.is_owned(s.run_id, info.rid))
    return "submitted" if status == "interrupted" and only_submitted(info) else status


# ------------------------------------------------------------------ damaged records


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
