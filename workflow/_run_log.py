"""What one executor writes to its run's log, and its copy of the log's fold.

Every commit of the executor is made here (:meth:`RunLog.commit`): fenced by its epoch, and
guarded in the writer so that nothing follows a commit that ends the run. Durable commits are
kept to be folded lazily into the executor's copy of the folded state (only snapshots and
recovery read it), and a snapshot of that state is written once the log since the last one
weighs ``snapshot_factor`` times its size (``workflow._runner.SNAPSHOT_FACTOR``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, Final

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    EventStoreError,
    NewRun,
    Record,
    Snapshot,
    StoredRecord,
)
from eventstore._committer import LAZY_FLUSH_S

from ._fold import FOLD_VERSION, Folded, fold
from ._log_refs import deferred_writes
from ._snapshot import dump_folded

__all__ = ["ENDING", "RunLog", "Sealed"]

# A durable record as the executor keeps it to fold: StoredRecord's fields, in order.
_Row = tuple[int, str, str, str | None, str, int, int]

# The statuses of commits that end the run (nothing of the executor may follow them).
ENDING: Final = frozenset({"finished", "failed", "cancelled", "timed_out", "waiting"})


class Sealed(ConcurrencyError):
    """A commit refused because a commit that ended the run was written before it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} has ended; nothing more is recorded", run_id=run_id)


class RunLog:
    """The commits of one executor of a run, and the fold of those that are durable.

    ``epoch`` is the executor's hold on the run (its commits are refused once another
    executor claims it); ``on_failure`` is told when a commit nobody awaits fails. A
    snapshot is written once the log since the last weighs ``snapshot_factor`` times its
    size, and at least ``snapshot_min_bytes``.
    """

    def __init__(
        self,
        store: EventStore,
        run_id: str,
        epoch: int,
        folded: Folded | None,
        on_failure: Callable[[Any], None],
        *,
        snapshot_factor: int,
        snapshot_min_bytes: int,
    ) -> None:
        self._factor = snapshot_factor
        self._min_bytes = snapshot_min_bytes
        self._store = store
        self.run_id = run_id
        self.epoch = epoch
        self._on_failure = on_failure
        self._sealed = False
        # Durable records not folded yet, as plain tuples of StoredRecord's fields.
        self._unfolded: list[_Row] = []
        self._fold_state = folded if folded is not None else Folded(run_id)
        self._defer = deferred_writes(store, run_id)
        self._since_snapshot = 0
        self._snapshot_bytes = 0
        # Commits of work begun (:meth:`begun`) waiting to ride with the next commit.
        self._starts: list[list[Record]] = []
        self._starts_due: asyncio.TimerHandle | None = None
        self._unhold = store.hold(self.flush_begun)  # a flush of the store writes them

    def commit(
        self,
        records: list[Record],
        *,
        status: str | None = None,
        check: Callable[[], None] | None = None,
        on_written: Callable[[Any], None] | None = None,
        inbox_taken: list[int] | None = None,
        create: NewRun | None = None,
    ) -> Commit:
        """A commit of ``records`` by this executor (``status``: the run's status it sets)."""
        run_id = self.run_id
        guard = self._unsealed
        if check is not None:
            unsealed = guard

            # Once a commit that ends the run is written, nothing of this executor may
            # follow it: the guard runs in the writer, in seq order, so no commit in flight
            # can.
            def guard() -> None:
                unsealed()
                check()

        if status in ENDING:
            written = on_written

            def seal(seq: Any) -> None:
                self._sealed = True
                if written is not None:
                    written(seq)

            on_written = seal
        return Commit(
            run_id,
            records,
            epoch=self.epoch,
            status=status,
            check=guard,
            on_written=on_written,
            inbox_taken=inbox_taken or (),
            create=create,
        )

    def _unsealed(self) -> None:
        """Refuses a commit once a commit that ended the run was written (in the writer)."""
        if self._sealed:
            raise Sealed(self.run_id)

    def submit(
        self, records: list[Record], *, lazy: bool = False, **kw: Any
    ) -> asyncio.Future[Any]:
        """Submits a commit of ``records`` (``kw``: :meth:`commit`'s); its future resolves
        once it is durable, with its :class:`~eventstore.AppendResult`.

        Records of work begun (:meth:`begun`) that wait go first, each its own commit, in
        the same operation: one submission, one future and one callback for them all.
        """
        starts = self._starts
        if not starts:

            def absorb(ok: bool, res: Any) -> None:
                """Keeps a durable commit to fold into the executor's copy of the state.

                Folded lazily (:attr:`folded`): only a snapshot and recovery read that copy,
                so a commit costs its fold once per snapshot's worth of records, not a fold
                each.
                """
                if ok:
                    self._keep(records, res)

            # Absorbed in seq order, before the code that waits for the commit goes on.
            return self._store.submit(self.commit(records, **kw), lazy=lazy, then=absorb)
        self._starts = []
        # As commit() makes them: fenced by the epoch, refused once the run has ended.
        run_id, epoch, guard = self.run_id, self.epoch, self._unsealed
        commits = [Commit(run_id, s, epoch=epoch, check=guard) for s in starts]
        commits.append(self.commit(records, **kw))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def absorb_all(ok: bool, res: Any) -> None:
            # The future resolves whatever keeping the commits meets (a snapshot that
            # fails is reported, as from any ``then``): its caller never waits forever.
            if not ok:
                # Nothing was written: the run ended, or is another executor's now; as for
                # records of work begun on their own, ``on_failure`` is told.
                try:
                    self._on_failure(res)
                finally:
                    if not fut.done():
                        fut.set_exception(res)
                        fut.exception()  # told to on_failure: not an unretrieved exception
                return
            last = res[-1]
            refused = isinstance(last, Exception)  # refused alone: the others stay written
            try:
                written = list(zip(starts, res, strict=False))
                if not refused:
                    written.append((records, last))
                self._keep_all(written)
            finally:
                if not fut.done():
                    if refused:
                        fut.set_exception(last)
                    else:
                        fut.set_result(last)

        # The commit may be refused alone (a conflict): what began stays written before it.
        self._store.submit_many(commits, lazy=lazy, then=absorb_all, last_alone=True)
        return fut

    def begun(self, *commits: list[Record]) -> None:
        """Records that only say work began (a dequeue, an attempt's start), one commit
        each, to ride with the run's next commit (:meth:`submit`), or to be written on
        their own within ``LAZY_FLUSH_S`` when none comes; nobody awaits them, and a failure
        of theirs alone is told to ``on_failure``."""
        self._starts.extend(commits)
        self._arm()

    def _arm(self) -> None:
        # Armed once and left to run out (not cancelled by the commits before it), as the
        # committer's timer for lazy commits: at most one wake-up per LAZY_FLUSH_S.
        if self._starts_due is None:
            self._starts_due = asyncio.get_running_loop().call_later(LAZY_FLUSH_S, self._flush_due)

    def _flush_due(self) -> None:
        self._starts_due = None
        self.flush_begun()

    def close(self) -> None:
        """The executor lets go of the run: what began and waits is submitted now, and
        the timer that would have submitted it is let go (its handle would keep this log,
        and through it the workflow, alive until it ran out)."""
        self._unhold()
        due, self._starts_due = self._starts_due, None
        if due is not None:
            due.cancel()
        self.flush_begun()

    def flush_begun(self) -> None:
        """Submits the records of work begun that wait, on their own (the run ends, or no
        commit came for them in time)."""
        starts = self._starts
        if not starts:
            return
        self._starts = []

        def done(ok: bool, res: Any) -> None:
            if not ok:
                self._on_failure(res)
                return
            self._keep_all(list(zip(starts, res, strict=True)))

        try:
            self._store.submit_many([self.commit(s) for s in starts], then=done)
        except EventStoreError as exc:  # closed, read-only, failed: as a failed commit
            self._on_failure(exc)

    def _keep(self, records: list[Record], res: Any) -> None:
        self._keep_all([(records, res)])

    def _keep_all(self, written: list[tuple[list[Record], Any]]) -> None:
        """Keeps durable commits (records, result) to fold; a snapshot once the log since
        the last one weighs enough.

        Kept as plain tuples of strings and numbers, which the garbage collector stops
        tracking at its first pass: kept Record objects (tracked, held for a snapshot's
        worth of steps) made it run, and once they reached the old generation, scan the
        whole heap, a fifth of a loop step's time.
        """
        pending = self._unfolded
        run_id = self.run_id
        size = self._since_snapshot
        for recs, res in written:
            seq, last, ts = int(res.first_seq), int(res.last_seq), res.ts
            for r in recs:
                payload = r.payload
                pending.append((seq, run_id, r.kind, r.step, payload, last, ts))
                size += len(payload)
                seq += 1
        self._since_snapshot = size
        if size >= self._min_bytes and size >= self._factor * self._snapshot_bytes:
            self.write_snapshot()

    @property
    def folded(self) -> Folded:
        """The folded state of every durable commit of this executor's run."""
        pending = self._unfolded
        if pending:
            self._unfolded = []
            fold(self._fold_state, _stored(pending), defer=self._defer)
        return self._fold_state

    def restart(self, folded: Folded) -> None:
        """Goes on from ``folded``, a newer fold of the log."""
        self._unfolded = []
        self._fold_state = folded

    @property
    def unsnapshotted(self) -> bool:
        """Whether commits were made since the last snapshot."""
        return self._since_snapshot > 0

    def write_snapshot(
        self, *, lazy: bool = True, last: bool = False
    ) -> asyncio.Future[Any] | None:
        """Writes a snapshot of the folded state (lazily: it rides with the next commit).

        One is written only once the log since the last weighs ``snapshot_factor`` times
        its size, unless it is the ``last`` of this executor's (the next reader of the
        latest state then folds nothing).
        """
        s = self.folded
        data = dump_folded(s).decode()
        self._snapshot_bytes = len(data)
        if not last and self._since_snapshot < self._factor * len(data):
            return None  # the state grew faster than its log: the next one waits for more log
        self._since_snapshot = 0
        snap = Snapshot(s.seq, data, FOLD_VERSION, s.records)
        commit = Commit(self.run_id, [], epoch=self.epoch, snapshot=snap)
        fut = self._store.submit(commit, lazy=lazy)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut


def _stored(rows: list[_Row]) -> Iterator[StoredRecord]:
    """Kept rows as the log's records."""
    # tuple.__new__ builds each named tuple without its Python-level __new__ (the fields
    # are given in order): this runs for every record the executor writes.
    new, cls = tuple.__new__, StoredRecord
    for row in rows:
        yield new(cls, row)
