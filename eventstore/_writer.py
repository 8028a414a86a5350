"""The commit rules, written once for every backend: a batch of operations, one transaction.

The rules:

- Seqs are global, consecutive in commit order and never reused: a commit's records get
  the next ones, and each record carries the seq that ends its commit (``commit_seq``).
- A commit names its run; with ``create`` it creates the run (refused when the run
  exists), otherwise the run must exist.
- A commit whose ``epoch`` is not the run's is refused (the fence); a claim moves the
  epoch on. Then the commit's ``check`` runs, in seq order with every other commit, and may
  refuse it; ``on_written`` runs once it is written. ``status``, ``inbox_taken`` and
  ``snapshot`` are written with the records, in the same transaction.
- An operation is refused alone. One that fails before anything of it is written is left
  out; one that fails after (or inside the database, whose transaction may then be
  unusable) rolls the transaction back and the batch runs again without it.
- A failure that is the database's fault (disk full, I/O) fails the whole batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from ._backend import Busy, PreparedCommit, WriteSQL, now_us
from ._errors import ConcurrencyError, RunNotFoundError, WriterFailedError
from ._records import AppendResult, Commit, Seq, Snapshot

__all__ = ["BatchWriter", "Op"]

# One operation of a batch: it calls the writer's methods and returns what its caller gets.
Op = Callable[["BatchWriter"], Any]


class _Redo(Exception):
    """An op failed where the transaction may hold part of it: the batch runs without it."""

    def __init__(self, index: int, error: Exception) -> None:
        self.index = index
        self.error = error
        super().__init__(f"op {index} failed after writing: {error!r}")


class _Run:
    """What the writer knows of a run: its key in the store and its current epoch."""

    __slots__ = ("epoch", "rid")

    def __init__(self, rid: int, epoch: int) -> None:
        self.rid = rid
        self.epoch = epoch


class BatchWriter:
    """Runs batches of operations over one backend write connection, a transaction each.

    One thread at a time uses it. What it caches (the last seq, each run's key and epoch)
    only a write can change; the backend tells at the start of each transaction whether
    another connection may have written, and then the caches are read again.
    """

    def __init__(self, sql: WriteSQL) -> None:
        self.sql = sql
        self.last_seq = 0
        self._runs: dict[str, _Run] = {}
        self._wrote = False  # whether the op running now has written anything

    def close(self) -> None:
        self.sql.close()

    def run_batch(self, ops: Sequence[Op]) -> list[tuple[bool, Any]]:
        """Runs ``ops`` in one transaction; returns (ok, result or exception) per op.

        :raises Busy: the write lock could not be taken within the busy timeout.
        :raises WriterFailedError: the database failed; nothing of the batch was written.
        """
        refused: dict[int, Exception] = {}
        while True:
            try:
                return self._run_once(ops, refused)
            except _Redo as redo:
                refused[redo.index] = redo.error

    def _run_once(self, ops: Sequence[Op], refused: dict[int, Exception]) -> list[tuple[bool, Any]]:
        sql = self.sql
        try:
            last = sql.begin()
        except Busy:
            raise
        except Exception as exc:
            self._abort()
            msg = f"cannot start a write transaction: {exc}"
            raise WriterFailedError(msg) from exc
        try:
            if last is not None:
                self._runs.clear()
                self.last_seq = last
            outcomes: list[tuple[bool, Any]] = []
            for i, op in enumerate(ops):
                if i in refused:
                    outcomes.append((False, refused[i]))
                    continue
                self._wrote = False
                try:
                    result = op(self)
                except Exception as exc:
                    if sql.is_fatal(exc):
                        raise
                    if self._wrote or isinstance(exc, sql.errors):
                        raise _Redo(i, exc) from exc
                    outcomes.append((False, exc))
                    continue
                outcomes.append((True, result))
            sql.commit(self.last_seq)
        except _Redo:
            self._abort()
            raise
        except BaseException as exc:
            self._abort()
            msg = f"the write transaction failed: {exc}"
            raise WriterFailedError(msg) from exc
        return outcomes

    def _abort(self) -> None:
        self._runs.clear()
        with contextlib.suppress(Exception):  # the connection itself may be gone
            self.sql.rollback()

    # ------------------------------------------------------------------ runs

    def _find(self, run_id: str) -> _Run | None:
        run = self._runs.get(run_id)
        if run is None:
            found = self.sql.find_run(run_id)
            if found is None:
                return None
            run = self._runs[run_id] = _Run(*found)
        return run

    def _run(self, run_id: str) -> _Run:
        run = self._find(run_id)
        if run is None:
            raise RunNotFoundError(run_id, "the store (commits to a new run need create=)")
        return run

    # ------------------------------------------------------------------ operations

    def append(self, commit: Commit) -> AppendResult:
        """Writes one commit: fences and checks it, assigns its seqs, writes its records."""
        run_id, create = commit.run_id, commit.create
        if create is None:
            run = self._runs.get(run_id) or self._run(run_id)
            if commit.epoch is not None and commit.epoch != run.epoch:
                msg = (
                    f"run {run_id!r}: append under epoch {commit.epoch} refused, the run's"
                    f" epoch is {run.epoch}; another executor took the run over"
                )
                raise ConcurrencyError(msg, run_id=run_id)
        elif self._find(run_id) is not None:
            msg = f"run {run_id!r} already exists"
            raise ConcurrencyError(msg, run_id=run_id)
        if commit.check is not None:
            commit.check()
        records = commit.records
        for r in records:
            # Refused here, before anything of the commit is written.
            if not isinstance(r.kind, str) or not isinstance(r.payload, str):
                msg = f"a record needs a str kind and a JSON text payload, got {r!r}"
                raise TypeError(msg)
        if commit.seq is not None and commit.seq <= self.last_seq:
            msg = f"a commit cannot keep seq {commit.seq}: the log's last seq is {self.last_seq}"
            raise ValueError(msg)
        self._wrote = True
        if create is not None:
            epoch = commit.epoch or 0
            rid = self.sql.insert_run(run_id, epoch, create, create.created or now_us())
            self._runs[run_id] = _Run(rid, epoch)
        else:
            rid = run.rid
        first = self.last_seq + 1 if commit.seq is None else commit.seq
        last = first + len(records) - 1
        ts = now_us() if commit.ts is None else commit.ts
        rows = [
            (first + i, rid, r.kind, r.step, r.payload, last, ts) for i, r in enumerate(records)
        ]
        status = commit.status if create is None else None  # a new run's is in its row
        snap = commit.snapshot
        if snap is not None and not isinstance(snap, Snapshot):
            snap = Snapshot(*snap)
        self.sql.write(PreparedCommit(rid, rows, last, status, commit.inbox_taken, snap))
        self.last_seq = last
        if commit.on_written is not None:
            commit.on_written(Seq(last))
        return AppendResult(Seq(first), Seq(last), ts)

    def claim(self, run_id: str) -> int:
        """Takes the run over: bumps its epoch so that appends under older epochs fail."""
        run = self._run(run_id)
        epoch = run.epoch + 1
        self._wrote = True
        self.sql.set_epoch(run.rid, epoch)
        run.epoch = epoch
        return epoch

    def lease(self, run_id: str, owner: str, ttl_us: int, *, renew: bool) -> bool:
        """Takes (or renews) the run's lease for ``owner``; False if another owner holds it."""
        now = now_us()
        held = self.sql.lease_of(run_id)
        if held is not None and held[0] != owner and held[1] > now:
            return False
        if renew and (held is None or held[0] != owner):
            return False  # it lapsed and someone else took it meanwhile, or it was released
        self._wrote = True
        self.sql.put_lease(run_id, owner, now + ttl_us)
        return True

    def release(self, run_id: str, owner: str) -> None:
        """Gives the lease back (a no-op unless ``owner`` holds it)."""
        self._wrote = True
        self.sql.delete_lease(run_id, owner)

    def post(self, run_id: str, payload: str, key: str | None) -> tuple[int, bool]:
        """Adds an inbox entry; with a key already posted, returns the first entry's id."""
        if key is not None:
            found = self.sql.find_post(run_id, key)
            if found is not None:
                return found, False
        self._wrote = True
        return self.sql.insert_post(run_id, key, payload, now_us()), True
