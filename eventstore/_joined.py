"""Commits of one run written as one statement: a step's records of work begun (a dequeue,
an attempt's start) with the commit that follows them (:meth:`JoinedAppends.append_all`).

The rules are :mod:`._writer`'s, applied to each commit in order as :meth:`append` would;
only the write is shared. Here too the rules that :meth:`append` applies the same way (the
fence's error, the records' check, a commit's snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ._backend import PreparedCommit, WriteSQL, now_us
from ._errors import ConcurrencyError
from ._records import AppendResult, Commit, Seq, Snapshot

__all__ = [
    "Instead",
    "JoinedAppends",
    "RunKey",
    "check_records",
    "fenced",
    "joinable",
    "snapshot_of",
]


# AppendResult's constructor given the seqs as the ints they are (``Seq(x)`` is a call of
# its own, twice a commit, for nothing at runtime).
_result: Callable[[int, int, int], AppendResult] = AppendResult  # type: ignore[assignment]


class Instead(Exception):
    """An op failed where the transaction may hold part of it, and names the op to run in
    its place when the batch runs again (rather than none)."""

    def __init__(self, error: Exception, op: Callable[[Any], Any]) -> None:
        self.error = error
        self.op = op
        super().__init__(f"op failed after writing: {error!r}")


class RunKey:
    """What the writer knows of a run: its key in the store and its current epoch."""

    __slots__ = ("epoch", "rid")

    def __init__(self, rid: int, epoch: int) -> None:
        self.rid = rid
        self.epoch = epoch


class JoinedAppends:
    """:class:`~._writer.BatchWriter`'s writes of several commits at once (a mixin: the
    attributes below are the writer's)."""

    last_seq: int
    _wrote: bool
    _plan: list[Any] | None
    _sql: WriteSQL
    _runs: dict[str, RunKey]

    def append(self, commit: Commit) -> AppendResult:
        raise NotImplementedError  # the writer's

    def _run(self, run_id: str) -> RunKey:
        raise NotImplementedError  # the writer's

    def append_all(
        self, commits: Sequence[Commit], *, last_alone: bool = False
    ) -> list[AppendResult | Exception]:
        """Writes commits in order, each a commit of its own (its seqs, its ``commit_seq``),
        as :meth:`append` one by one would; returns their results.

        All are written or none, unless ``last_alone``: then the last one may be refused
        alone (its check, its records, its write), the others written all the same, and the
        error that refused it takes its place in the results (an executor's records of work
        begun, which stay whatever becomes of the attempt's commit that they ride with).

        Commits of one existing run under one epoch whose hooks and extras are the last
        one's only are fenced and checked first, in order, then written as one statement
        for all their rows; any others go through :meth:`append` each.
        """
        if self._plan is not None or not joinable(commits):
            if not last_alone:
                return [self.append(c) for c in commits]
            out: list[AppendResult | Exception] = [self.append(c) for c in commits[:-1]]
            wrote, self._wrote = self._wrote, False
            plan, mark, seq = self._plan, len(self._plan or ()), self.last_seq
            try:
                out.append(self.append(commits[-1]))
            except Exception as exc:
                if plan is not None:  # a server's: what it asked of the database is taken back
                    del plan[mark:]
                    self.last_seq = seq
                elif self._wrote or isinstance(exc, self._sql.errors):
                    self._instead(exc, commits)
                out.append(exc)  # refused before anything of it was written
            finally:
                self._wrote = self._wrote or wrote
            return out
        last_c = commits[-1]
        run_id = last_c.run_id
        run = self._runs.get(run_id) or self._run(run_id)
        epoch, rid = run.epoch, run.rid
        ts = now_us()
        seq = self.last_seq + 1
        spans: list[tuple[int, int, Sequence[Any]]] = []  # each commit's first, last, records
        results: list[AppendResult | Exception] = []
        refused: Exception | None = None
        # One pass: each commit is fenced, checked and its rows made before the next one's
        # check runs. Only the last has an on_written, so each check sees what it would see
        # with the commits before it written: nothing of theirs is visible before it.
        for c in commits:
            records = c.records
            try:
                if c.epoch is not None and c.epoch != epoch:
                    raise fenced(run_id, c.epoch, epoch)
                if c.check is not None:
                    c.check()
                for r in records:
                    # Refused here, before anything of the commit is written.
                    if not (isinstance(r.kind, str) and isinstance(r.payload, str)):
                        _refuse_record(r)
            except Exception as exc:
                if not last_alone or c is not last_c:
                    raise
                refused = exc
                break
            last = seq + len(records) - 1
            spans.append((seq, last, records))
            results.append(_result(seq, last, ts))
            seq = last + 1
        last = seq - 1
        rows = [
            (first + i, rid, r.kind, r.step, r.payload, end, ts)
            for first, end, recs in spans
            for i, r in enumerate(recs)
        ]
        extras = last_c if refused is None else None
        self._wrote = True
        try:
            self._write(rid, rows, last, extras)
            self.last_seq = last
            if extras is not None and extras.on_written is not None:
                extras.on_written(Seq(last))
        except Exception as exc:
            if not last_alone or refused is not None:
                raise
            self._instead(exc, commits)
        if refused is not None:
            results.append(refused)
        return results

    def _instead(self, exc: Exception, commits: Sequence[Commit]) -> NoReturn:
        """The last of ``commits`` failed inside the database, where the transaction may
        hold part of it: the batch runs again with only the others in this op's place, and
        the error in the last one's."""
        if self._sql.is_fatal(exc):
            raise exc
        others = list(commits[:-1])
        raise Instead(exc, lambda w: [*w.append_all(others), exc]) from exc

    def _write(self, rid: int, rows: list[Any], last: int, extras: Commit | None) -> None:
        """Writes the rows of joined commits, with the status, inbox marks and snapshot of
        ``extras`` (the last of them) when it is written."""
        if extras is None:
            prepared = PreparedCommit(rid, rows, last, None, (), None)
        else:
            prepared = PreparedCommit(
                rid, rows, last, extras.status, extras.inbox_taken, snapshot_of(extras)
            )
        self._sql.write(prepared)


def fenced(run_id: str, epoch: int | None, current: int | None) -> ConcurrencyError:
    """The refusal of a commit under an epoch that is not the run's."""
    msg = (
        f"run {run_id!r}: append under epoch {epoch} refused, the run's"
        f" epoch is {current}; another executor took the run over"
    )
    return ConcurrencyError(msg, run_id=run_id)


def snapshot_of(commit: Commit) -> Snapshot | None:
    """The commit's snapshot, as a :class:`Snapshot` (it may be given as a pair)."""
    snap = commit.snapshot
    if snap is not None and not isinstance(snap, Snapshot):
        snap = Snapshot(*snap)
    return snap


def joinable(commits: Sequence[Commit]) -> bool:
    """Whether :meth:`JoinedAppends.append_all` may write ``commits`` as one write."""
    if len(commits) < 2:
        return False
    last = commits[-1]
    run_id = last.run_id
    for c in commits:
        if c.run_id != run_id or c.create is not None or c.seq is not None or c.ts is not None:
            return False
        if c is not last and (
            c.status is not None
            or c.inbox_taken
            or c.snapshot is not None
            or c.on_written is not None
        ):
            return False
    return True


def check_records(records: Sequence[Any]) -> None:
    """Refuses records that are not a str kind and a JSON text payload."""
    for r in records:
        # Refused here, before anything of the commit is written.
        if not (isinstance(r.kind, str) and isinstance(r.payload, str)):
            _refuse_record(r)


def _refuse_record(r: Any) -> NoReturn:
    msg = f"a record needs a str kind and a JSON text payload, got {r!r}"
    raise TypeError(msg)
