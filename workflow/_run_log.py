"""What one executor writes to its run's log, and its copy of the log's fold.

Every commit of the executor is made here (:meth:`RunLog.commit`): fenced by its epoch, and
guarded in the writer so that nothing follows a commit that ends the run. Durable commits are
kept to be folded lazily into the executor's copy of the folded state (only snapshots and
recovery read it), and a snapshot of that state is written once the log since the last one
weighs ``snapshot_factor`` times its size (``workflow._runner.SNAPSHOT_FACTOR``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    NewRun,
    Record,
    Seq,
    Snapshot,
    StoredRecord,
)

from ._fold import FOLD_VERSION, Folded, fold
from ._snapshot import dump_folded

__all__ = ["ENDING", "RunLog", "Sealed"]

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
        self._unfolded: list[tuple[list[Record], Any]] = []  # durable, not folded yet
        self._fold_state = folded if folded is not None else Folded(run_id)
        self._since_snapshot = 0
        self._snapshot_bytes = 0

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

        # Once a commit that ends the run is written, nothing of this executor may follow
        # it: the guard runs in the writer, in seq order, so no commit in flight can.
        def guard() -> None:
            if self._sealed:
                raise Sealed(run_id)
            if check is not None:
                check()

        sealing = status in ENDING
        written = on_written

        def seal(seq: Any) -> None:
            self._sealed = True
            if written is not None:
                written(seq)

        return Commit(
            run_id,
            records,
            epoch=self.epoch,
            status=status,
            check=guard,
            on_written=seal if sealing else on_written,
            inbox_taken=inbox_taken or (),
            create=create,
        )

    def submit(
        self, records: list[Record], *, lazy: bool = False, **kw: Any
    ) -> asyncio.Future[Any]:
        """Submits a commit of ``records`` (``kw``: :meth:`commit`'s); its future resolves
        once it is durable."""

        def absorb(ok: bool, res: Any) -> None:
            """Keeps a durable commit to fold into the executor's copy of the folded state.

            Folded lazily (:attr:`folded`): only a snapshot and recovery read that copy, so
            a commit costs its fold once per snapshot's worth of records, not a fold each.
            """
            if ok:
                self._keep(records, res)

        # Absorbed in seq order, before the code that waits for the commit goes on.
        return self._store.submit(self.commit(records, **kw), lazy=lazy, then=absorb)

    def lazy(self, records: list[Record]) -> None:
        """Submits a commit nobody awaits (it rides with the next one); a failure of it is
        told to ``on_failure``."""

        def done(ok: bool, res: Any) -> None:
            if ok:
                self._keep(records, res)
            else:
                self._on_failure(res)

        self._store.submit(self.commit(records), lazy=True, then=done)

    def lazy_pair(self, first: list[Record], second: list[Record]) -> None:
        """Two commits that only say work began (a dequeue, an attempt's start), submitted
        as one operation: one future and one callback for both."""

        def done(ok: bool, res: Any) -> None:
            if not ok:
                self._on_failure(res)
                return
            a, b = res
            self._keep(first, a)
            self._keep(second, b)

        self._store.submit_many([self.commit(first), self.commit(second)], lazy=True, then=done)

    def _keep(self, records: list[Record], res: Any) -> None:
        self._unfolded.append((records, res))
        self._since_snapshot += sum(len(r.payload) for r in records)
        if self._since_snapshot >= max(self._min_bytes, self._factor * self._snapshot_bytes):
            self.write_snapshot()

    @property
    def folded(self) -> Folded:
        """The folded state of every durable commit of this executor's run."""
        pending = self._unfolded
        if pending:
            self._unfolded = []
            run_id, stored = self.run_id, list[StoredRecord]()
            for records, res in pending:
                first, last, ts = int(res.first_seq), Seq(int(res.last_seq)), res.ts
                stored.extend(
                    StoredRecord(Seq(first + i), run_id, r.kind, r.step, r.payload, last, ts)
                    for i, r in enumerate(records)
                )
            fold(self._fold_state, stored)
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
