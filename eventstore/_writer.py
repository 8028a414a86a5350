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

A backend either runs the rules' statements one by one for the writer (a
:class:`~._backend.WriteSQL`: SQLite, where a statement costs microseconds), or applies
these same rules itself, a whole batch in one statement (a
:class:`~._backend.ServerWriteSQL`: PostgreSQL, where each statement is a round trip to
the server and a transaction open across round trips holds every other host up). Then
the writer runs the hooks with the seqs it expects and corrects them from the replies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ._backend import Busy, PreparedCommit, Reply, Request, ServerWriteSQL, WriteSQL, now_us
from ._errors import (
    ConcurrencyError,
    RunNotFoundError,
    StoreUnavailableError,
    WriterFailedError,
)
from ._joined import Instead, JoinedAppends, RunKey, check_records, fenced, snapshot_of
from ._records import AppendResult, Commit, Seq

__all__ = ["BatchWriter", "Op", "ServerBatch"]

# One operation of a batch: it calls the writer's methods and returns what its caller gets.
Op = Callable[["BatchWriter"], Any]


class _Redo(Exception):
    """An op failed where the transaction may hold part of it: the batch runs without it."""

    def __init__(self, index: int, error: Exception, instead: Op | None = None) -> None:
        self.index = index
        self.error = error
        self.instead = instead
        super().__init__(f"op {index} failed after writing: {error!r}")


class _Pending:
    """What an op returns on a server-rules backend until the database replies."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _resolved(settled: list[tuple[bool, Any]], ok: bool, value: Any) -> tuple[bool, Any]:
    """An op's outcome once the database replied: its placeholders replaced by what they
    stood for (an op of several requests, such as ``submit_many``'s, returns a list of them;
    it fails with the first of its requests that failed)."""
    if not ok:
        return ok, value
    if isinstance(value, _Pending):
        return settled[value.index]
    if isinstance(value, list) and any(isinstance(v, _Pending) for v in value):
        out = []
        for v in value:
            if isinstance(v, _Pending):
                v_ok, v = settled[v.index]
                if not v_ok:
                    return False, v
            out.append(v)
        return True, out
    return ok, value


class ServerBatch:
    """A batch between its two halves on a server-rules backend: the requests to send,
    the seq each request's hooks were told, each op's outcome so far (placeholders for
    the replies), and the writer's last seq before the batch."""

    __slots__ = ("expected", "outcomes", "plan", "start")

    def __init__(
        self,
        plan: list[Request],
        expected: list[int],
        outcomes: list[tuple[bool, Any]],
        start: int,
    ) -> None:
        self.plan = plan
        self.expected = expected
        self.outcomes = outcomes
        self.start = start


class BatchWriter(JoinedAppends):
    """Runs batches of operations over one backend write connection, a transaction each.

    One thread at a time uses it. What it caches (the last seq, each run's key and epoch)
    only a write can change; the backend tells at the start of each transaction whether
    another connection may have written, and then the caches are read again.
    """

    def __init__(self, sql: WriteSQL | ServerWriteSQL) -> None:
        self.sql = sql
        self.last_seq = 0
        self._runs: dict[str, RunKey] = {}
        self._wrote = False  # whether the op running now has written anything
        # On a server-rules backend, the batch's requests while its ops run; else None.
        self._plan: list[Request] | None = None
        server = hasattr(sql, "apply")
        self._server = cast("ServerWriteSQL", sql) if server else None
        self._sql = cast("WriteSQL", sql)  # used only when the backend is not a server's

    def close(self) -> None:
        self.sql.close()

    def run_batch(self, ops: Sequence[Op]) -> list[tuple[bool, Any]]:
        """Runs ``ops`` in one transaction; returns (ok, result or exception) per op.

        :raises Busy: the write lock could not be taken within the busy timeout.
        :raises WriterFailedError: the database failed; nothing of the batch was written.
        :raises StoreUnavailableError: the connection to a server was lost (a new one may
            write); the batch may or may not have been written.
        """
        if self._server is not None:
            return self._run_on_server(self._server, ops)
        refused: dict[int, Exception] = {}
        while True:
            try:
                return self._run_once(ops, refused)
            except _Redo as redo:
                if redo.instead is None:
                    refused[redo.index] = redo.error
                else:
                    ops = [*ops[: redo.index], redo.instead, *ops[redo.index + 1 :]]

    def _run_on_server(self, sql: ServerWriteSQL, ops: Sequence[Op]) -> list[tuple[bool, Any]]:
        """The batch as one statement: the ops queue requests (running the hooks with the
        seqs expected), the database applies them, the replies settle each op."""
        batch = self.plan_on_server(ops)
        if not batch.plan:
            return batch.outcomes
        try:
            result = sql.apply(batch.plan)
        except Exception as exc:
            return self.finish_on_server(sql, batch, exc)
        return self.finish_on_server(sql, batch, result)

    def plan_on_server(self, ops: Sequence[Op]) -> ServerBatch:
        """The first half of a batch on a server-rules backend: runs the ops, which queue
        their requests; the batch's ``plan`` is then sent (``apply``, or without blocking)
        and its reply given to :meth:`finish_on_server`. Nothing else may run on this
        writer in between."""
        plan: list[Request] = []
        self._plan = plan
        expected: list[int] = []  # per request: the last seq its hooks were told
        outcomes: list[tuple[bool, Any]] = []
        start = self.last_seq
        try:
            for op in ops:
                mark, seq = len(plan), self.last_seq
                try:
                    result = op(self)
                except Exception as exc:
                    del plan[mark:]  # refused before anything of it was sent
                    self.last_seq = seq
                    outcomes.append((False, exc))
                    continue
                expected.extend([0] * (len(plan) - len(expected)))
                if len(plan) > mark and plan[-1].op == "append":
                    expected[-1] = self.last_seq
                outcomes.append((True, result))
        finally:
            self._plan = None
        return ServerBatch(plan, expected, outcomes, start)

    def finish_on_server(
        self,
        sql: ServerWriteSQL,
        batch: ServerBatch,
        result: tuple[list[Reply], int | None] | Exception,
    ) -> list[tuple[bool, Any]]:
        """The second half: each op's outcome from what the database answered to the
        batch's plan (``result``: its replies and last seq, or the error that refused or
        failed the whole batch).

        :raises WriterFailedError: the database failed; nothing of the batch was written.
        :raises StoreUnavailableError: the connection was lost; the batch is in doubt.
        """
        outcomes = batch.outcomes
        if isinstance(result, Exception):
            exc = result
            self.last_seq = batch.start
            if getattr(sql, "broken", False):
                msg = (
                    f"the connection to the database was lost during a write ({exc});"
                    " what the batch wrote, if anything, is in the log"
                )
                raise StoreUnavailableError(msg) from exc
            if sql.is_fatal(exc):
                msg = f"the write transaction failed: {exc}"
                raise WriterFailedError(msg) from exc
            # The batch as a whole was refused (nothing written): each op is told why.
            return [(False, exc) if ok else (ok, value) for ok, value in outcomes]
        replies, last = result
        if last is not None:
            self.last_seq = last
        settled = [
            self._settle(req, reply, seq)
            for req, reply, seq in zip(batch.plan, replies, batch.expected, strict=True)
        ]
        return [_resolved(settled, ok, value) for ok, value in outcomes]

    def _settle(self, req: Request, reply: Reply, expected: int) -> tuple[bool, Any]:
        """The outcome of one request from the database's reply."""
        if isinstance(reply, BaseException):
            return False, reply
        code, first, second = reply  # their meaning is the code's: see Reply
        run_id = req.run_id
        if code == "missing":
            where = (
                "the store (commits to a new run need create=)"
                if req.op == "append"
                else "the store"
            )
            return False, RunNotFoundError(run_id, where)
        if code == "exists":
            return False, ConcurrencyError(f"run {run_id!r} already exists", run_id=run_id)
        if code == "fenced":
            assert req.commit is not None
            return False, fenced(run_id, req.commit.epoch, first)
        if code == "lowseq":
            assert req.commit is not None
            assert req.commit.seq is not None
            assert first is not None
            return False, _low_seq(req.commit.seq, first)
        if req.op == "append":
            commit = req.commit
            assert commit is not None
            assert first is not None
            assert second is not None
            if second != expected and commit.on_written is not None:
                commit.on_written(Seq(second))  # told the seq expected; now the one assigned
            return True, AppendResult(Seq(first), Seq(second), req.at)
        if req.op == "claim":
            return True, first
        if req.op == "lease":
            return True, bool(first)
        if req.op == "post":
            return True, (first, bool(second))
        return True, None

    def _request(self, req: Request) -> _Pending:
        plan = self._plan
        assert plan is not None
        plan.append(req)
        return _Pending(len(plan) - 1)

    def _run_once(self, ops: Sequence[Op], refused: dict[int, Exception]) -> list[tuple[bool, Any]]:
        sql = self._sql
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
                except Instead as instead:
                    raise _Redo(i, instead.error, instead.op) from instead.error
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
            self._sql.rollback()

    # ------------------------------------------------------------------ runs

    def _find(self, run_id: str) -> RunKey | None:
        run = self._runs.get(run_id)
        if run is None:
            found = self._sql.find_run(run_id)
            if found is None:
                return None
            run = self._runs[run_id] = RunKey(*found)
        return run

    def _run(self, run_id: str) -> RunKey:
        run = self._find(run_id)
        if run is None:
            raise RunNotFoundError(run_id, "the store (commits to a new run need create=)")
        return run

    # ------------------------------------------------------------------ operations

    def append(self, commit: Commit) -> AppendResult:
        """Writes one commit: fences and checks it, assigns its seqs, writes its records."""
        if self._plan is not None:
            return self._append_on_server(commit)  # type: ignore[return-value]
        run_id, create = commit.run_id, commit.create
        if create is None:
            run = self._runs.get(run_id) or self._run(run_id)
            if commit.epoch is not None and commit.epoch != run.epoch:
                raise fenced(run_id, commit.epoch, run.epoch)
        elif self._find(run_id) is not None:
            msg = f"run {run_id!r} already exists"
            raise ConcurrencyError(msg, run_id=run_id)
        if commit.check is not None:
            commit.check()
        records = commit.records
        check_records(records)
        if commit.seq is not None and commit.seq <= self.last_seq:
            raise _low_seq(commit.seq, self.last_seq)
        self._wrote = True
        if create is not None:
            epoch = commit.epoch or 0
            rid = self._sql.insert_run(run_id, epoch, create, create.created or now_us())
            self._runs[run_id] = RunKey(rid, epoch)
        else:
            rid = run.rid
        first = self.last_seq + 1 if commit.seq is None else commit.seq
        last = first + len(records) - 1
        ts = now_us() if commit.ts is None else commit.ts
        rows = [
            (first + i, rid, r.kind, r.step, r.payload, last, ts) for i, r in enumerate(records)
        ]
        status = commit.status if create is None else None  # a new run's is in its row
        self._sql.write(
            PreparedCommit(rid, rows, last, status, commit.inbox_taken, snapshot_of(commit))
        )
        self.last_seq = last
        if commit.on_written is not None:
            commit.on_written(Seq(last))
        return AppendResult(Seq(first), Seq(last), ts)

    def _append_on_server(self, commit: Commit) -> _Pending:
        # The fence and the run's existence are the database's to check, under its locks.
        if commit.check is not None:
            commit.check()
        check_records(commit.records)
        ts = now_us() if commit.ts is None else commit.ts
        pending = self._request(Request("append", commit.run_id, commit, ts))
        if commit.seq is not None:  # kept by the database unless the log is past it
            self.last_seq = max(self.last_seq, commit.seq - 1)
        self.last_seq += len(commit.records)
        if commit.on_written is not None:
            commit.on_written(Seq(self.last_seq))
        return pending

    def claim(self, run_id: str) -> int:
        """Takes the run over: bumps its epoch so that appends under older epochs fail."""
        if self._plan is not None:
            return self._request(Request("claim", run_id))  # type: ignore[return-value]
        run = self._run(run_id)
        epoch = run.epoch + 1
        self._wrote = True
        self._sql.set_epoch(run.rid, epoch)
        run.epoch = epoch
        return epoch

    def lease(self, run_id: str, owner: str, ttl_us: int, *, renew: bool) -> bool:
        """Takes (or renews) the run's lease for ``owner``; False if another owner holds it."""
        now = now_us()
        if self._plan is not None:
            req = Request("lease", run_id, at=now, text=owner, ttl_us=ttl_us, renew=renew)
            return self._request(req)  # type: ignore[return-value]
        held = self._sql.lease_of(run_id)
        if held is not None and held[0] != owner and held[1] > now:
            return False
        if renew and (held is None or held[0] != owner):
            return False  # it lapsed and someone else took it meanwhile, or it was released
        self._wrote = True
        self._sql.put_lease(run_id, owner, now + ttl_us)
        return True

    def release(self, run_id: str, owner: str) -> None:
        """Gives the lease back (a no-op unless ``owner`` holds it)."""
        if self._plan is not None:
            return self._request(Request("release", run_id, text=owner))  # type: ignore[return-value]
        self._wrote = True
        self._sql.delete_lease(run_id, owner)
        return None

    def delete_runs(self, runs: Mapping[str, int | None]) -> list[str]:
        """Deletes whole runs (every table's rows of each); returns those deleted.

        ``runs`` maps each run to the last seq its caller saw; a run changed since, held by
        a live lease, or the parent of a run kept is kept (:func:`._sql.delete_runs`). On a
        server-rules backend the deletion is a transaction of its own, run at once.
        """
        if self._server is not None:
            return self._server.delete_runs(runs, now_us())
        self._wrote = True
        gone = self._sql.delete_runs(runs, self.last_seq, now_us())
        for run_id in gone:
            self._runs.pop(run_id, None)
        return gone

    def post(self, run_id: str, payload: str, key: str | None) -> tuple[int, bool]:
        """Adds an inbox entry; with a key already posted, returns the first entry's id."""
        if self._plan is not None:
            req = Request("post", run_id, at=now_us(), text=key, body=payload)
            return self._request(req)  # type: ignore[return-value]
        if key is not None:
            found = self._sql.find_post(run_id, key)
            if found is not None:
                return found, False
        self._wrote = True
        return self._sql.insert_post(run_id, key, payload, now_us()), True


def _low_seq(seq: int, last: int) -> ValueError:
    return ValueError(f"a commit cannot keep seq {seq}: the log's last seq is {last}")
