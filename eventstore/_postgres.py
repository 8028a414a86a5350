"""The same store contract on PostgreSQL (psycopg 3): the backend and its write connection.

A batch of the writer is one call of the store's ``dw_write`` function (:mod:`._pg_schema`):
the commit rules run inside the server, so a transaction is one round trip and never waits
for the client. A host cut off mid-call holds no lock past the call. URLs and connecting
are :mod:`._pg_connect`'s, LISTEN/NOTIFY :mod:`._pg_listen`'s.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from ._backend import Reply, Request
from ._pg_connect import (
    READ_ERRORS,
    UNAVAILABLE_ERRORS,
    connect,
    is_url,
    pg_errors,
    psycopg,
    reply_spin_s,
    split,
    where,
)
from ._pg_listen import listen
from ._pg_schema import SCHEMA_VERSION, open_database
from ._records import Snapshot
from ._sql import delete_runs

# Older names, kept for the tests and tools that import them from here.
_split = split
_where = where

__all__ = ["SCHEMA_VERSION", "PostgresBackend", "PostgresWriteSQL", "connect", "is_url"]


def _fatal(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | pg_errors.DiskFull | psycopg.InterfaceError)


class _Connection:
    """A psycopg connection that takes ``?`` placeholders, as the shared SQL is written.

    With ``reconnect``, a connection the server or the network lost is replaced by a new
    one at the next statement (the statement that met the loss fails): a reader's.
    """

    __slots__ = ("_closed", "_reconnect", "raw")

    def __init__(self, raw: Any, reconnect: Callable[[], Any] | None = None) -> None:
        self.raw = raw
        self._reconnect = reconnect
        self._closed = False

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        if self._reconnect is not None and not self._closed and self.raw.broken:
            self.raw.close()
            self.raw = self._reconnect()
        return self.raw.execute(sql.replace("?", "%s"), parameters)

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), parameters)

    def close(self) -> None:
        self._closed = True
        self.raw.close()


# One call of the write function: a batch, as parallel arrays (one entry per op; the records,
# the taken inbox entries flattened in op order).
_CALL: Final = (
    "SELECT code, a, b, msg FROM dw_write(%s::text[], %s::text[], %s::bigint[], %s::int[],"
    " %s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[], %s::bigint[],"
    " %s::text[], %s::boolean[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[],"
    " %s::bigint[], %s::bigint[], %s::boolean[], %s::int[], %s::bigint[], %s::bigint[],"
    " %s::bigint[], %s::bigint[])"
)
# The same call as a statement prepared on each write connection (``$1``..``$26``), sent
# without blocking by a writer on the event loop: no parse or plan per batch.
_PREPARED: Final = b"dw_write_batch"
_PREPARED_SQL: Final = "".join(
    f"${i}{part}" if i else part for i, part in enumerate(_CALL.split("%s"))
).encode()
_OPS: Final = {"append": "a", "claim": "c", "lease": "l", "release": "r", "post": "p"}
# How long the server lets a write session sit inside a transaction: a batch never
# leaves one open across round trips, so only a client gone mid-transaction meets it.
IDLE_IN_TRANSACTION_MS: Final = 2_000


def _texts(values: Sequence[str | None]) -> str | None:
    """A text[] literal (NULL when every value is: the server parses nothing then).

    Adapting a list is psycopg's slowest path (~6 us a list, a third of a call); a list
    comprehension, not a generator, and no call per element: this runs 26 times a batch.
    """
    if values.count(None) == len(values):
        return None
    return (
        "{"
        + ",".join(
            [
                "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
                for v in values
            ]
        )
        + "}"
    )


def _ints(values: Sequence[int | bool | None], *, none: object = None) -> str | None:
    """A bigint[], int[] or boolean[] literal (NULL when every value equals ``none``;
    booleans go as ``True``/``False``, which PostgreSQL reads)."""
    if values.count(none) == len(values):
        return None
    return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"


# What an op that carries no commit (a claim, lease, release or post) has in each of the
# commit's columns: epoch, count, status, taken count, snapshot (seq, data, version,
# records), seq, created, create, parent, parent seq, meta.
_NO_COMMIT: Final = (None, 0, None, 0, None, None, None, None, None, None, False, None, None, None)


def _plain_params(requests: Sequence[Request]) -> tuple[str | None, ...] | None:
    """:func:`_call_params` for a batch of plain appends (to runs that exist, at the
    next seqs, with no inbox entries taken or snapshot: a step's commits, most batches),
    or None for any other batch. Ten of the 26 columns, the others NULL: half the
    client's time of the general path."""
    run_ids: list[str] = []
    epochs: list[int | None] = []
    counts: list[int] = []
    statuses: list[str | None] = []
    ats: list[int] = []
    kinds: list[str] = []
    steps: list[str | None] = []
    payloads: list[str] = []
    rec_ops: list[int] = []
    for n, req in enumerate(requests, 1):
        c = req.commit
        if (
            c is None
            or c.create is not None
            or c.seq is not None
            or c.snapshot is not None
            or c.inbox_taken
        ):
            return None
        records = c.records
        run_ids.append(req.run_id)
        epochs.append(c.epoch)
        counts.append(len(records))
        statuses.append(c.status)
        ats.append(req.at)
        rec_ops += [n] * len(records)
        for r in records:
            kinds.append(r.kind)
            steps.append(r.step)
            payloads.append(r.payload)
    ops = "{" + ",".join(['"a"'] * len(requests)) + "}"
    t, i = _texts, _ints
    return (
        ops, t(run_ids), i(epochs), i(counts, none=0), t(kinds), t(steps), t(payloads),
        t(statuses), None, None, None, None, None, None, None, None, None, None, i(ats),
        None, None, i(rec_ops), None, None, None, None,
    )  # fmt: skip


def _call_params(requests: Sequence[Request]) -> tuple[str | None, ...]:
    """The write function's arguments for a batch: array literals, one entry per op (the
    records and the taken inbox entries flattened in op order)."""
    if requests[0].op == "append" and (plain := _plain_params(requests)) is not None:
        return plain
    return _any_params(requests)


def _any_params(requests: Sequence[Request]) -> tuple[str | None, ...]:
    """:func:`_call_params` for any batch.

    Each op is one tuple of its columns, turned into columns by ``zip``: a few list
    operations an op, where appending to 26 lists cost a third of the client's time.
    """
    per_op: list[tuple[Any, ...]] = []
    kinds: list[str] = []
    steps: list[str | None] = []
    payloads: list[str] = []
    rec_ops: list[int] = []  # each record's op, counted from 1
    taken: list[int] = []
    for n, req in enumerate(requests, 1):
        head = (_OPS[req.op], req.run_id, req.at, req.text, req.body, req.ttl_us, req.renew)
        c = req.commit
        if c is None:
            per_op.append(head + _NO_COMMIT)
            continue
        records = c.records
        rec_ops += [n] * len(records)
        for r in records:
            kinds.append(r.kind)
            steps.append(r.step)
            payloads.append(r.payload)
        taken += c.inbox_taken
        snap = c.snapshot
        if snap is None:
            snap_cols: tuple[Any, ...] = (None, None, None, None)
        else:
            if not isinstance(snap, Snapshot):
                snap = Snapshot(*snap)
            snap_cols = (snap.seq, snap.data, snap.version, snap.records)
        new = c.create
        if new is None:
            per_op.append(
                (*head, c.epoch, len(records), c.status, len(c.inbox_taken), *snap_cols,
                 c.seq, None, False, None, None, None)
            )  # fmt: skip
        else:
            meta = orjson.dumps(dict(new.meta)).decode()
            per_op.append(
                (*head, c.epoch or 0, len(records), new.status, len(c.inbox_taken), *snap_cols,
                 c.seq, new.created, True, new.parent_run_id, new.parent_seq, meta)
            )  # fmt: skip
    (ops, run_ids, ats, texts, bodies, ttls, renews, epochs, counts, statuses, taken_counts,
     snap_seqs, snap_data, snap_versions, snap_records, seqs, created, creates, parents,
     parent_seqs, metas) = zip(*per_op, strict=True)  # fmt: skip
    # Counts, flags and TTLs of 0 (False) may go as NULL: the function reads them so.
    t, i = _texts, _ints
    return (
        t(ops), t(run_ids), i(epochs), i(counts, none=0), t(kinds), t(steps),
        t(payloads), t(statuses), i(taken_counts, none=0), i(taken), i(snap_seqs),
        t(snap_data), i(creates, none=False), t(parents), i(parent_seqs), t(metas),
        t(texts), t(bodies), i(ats), i(ttls, none=0), i(renews, none=False),
        i(rec_ops), i(snap_versions), i(snap_records), i(seqs), i(created),
    )  # fmt: skip


_BAD: Final = psycopg.pq.ConnStatus.BAD if psycopg is not None else None


def _replies(results: Sequence[Any]) -> tuple[list[Reply], int | None]:
    """What a prepared call of ``dw_write`` answered, from its libpq results (text
    columns code, a, b, msg; the last row the seq): as :meth:`PostgresWriteSQL.apply`'s.

    :raises psycopg.Error: the server refused the call as a whole.
    """
    for res in results:
        if res.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(res)
    (res,) = results
    replies: list[Reply] = []
    value = res.get_value
    for i in range(res.ntuples - 1):
        code = value(i, 0).decode()
        if code == "error":
            replies.append(_error(value(i, 3).decode()))
            continue
        a, b = value(i, 1), value(i, 2)
        replies.append((code, None if a is None else int(a), None if b is None else int(b)))
    last = value(res.ntuples - 1, 1)
    return replies, None if last is None else int(last)


def _error(msg: str) -> BaseException:
    """The driver's error for a reply that refused one op (``SQLSTATE message``)."""
    state, _, text = msg.partition(" ")
    try:
        cls = pg_errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(text)


class PostgresWriteSQL:
    """The write connection: a batch is one call of ``dw_write``, which applies the commit
    rules under the server's locks (the seq row, each run's row, each lease's row)."""

    errors = (psycopg.Error,) if psycopg is not None else ()

    def __init__(self, raw: Any, *, reply_spin_s: float = 0.0) -> None:
        self.raw = raw
        self.reply_spin_s = reply_spin_s
        self._prepared = False
        self._results: list[Any] = []  # of the call in flight, read so far
        raw.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")

    def close(self) -> None:
        self.raw.close()

    @property
    def broken(self) -> bool:
        """Whether the connection is gone (the server may be fine: a new one may write)."""
        raw = self.raw
        return bool(raw.closed or raw.broken or raw.pgconn.status == _BAD)

    def is_fatal(self, exc: BaseException) -> bool:
        return _fatal(exc)

    def warm(self) -> None:
        """Calls dw_write with nothing to do: the server compiles the function for this
        session now (milliseconds), not in the first batch; and prepares the call that
        :meth:`send` makes."""
        self.raw.execute(_CALL, (None,) * _CALL.count("%s")).fetchall()
        self._prepare()

    def _prepare(self) -> None:
        if self._prepared:
            return
        res = self.raw.pgconn.prepare(_PREPARED, _PREPARED_SQL)
        if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
            raise pg_errors.error_from_result(res)
        self._prepared = True

    # ------------------------------------------------------------------ without blocking

    def fileno(self) -> int:
        """The connection's socket, to wait on for :meth:`poll` and :meth:`flush`."""
        return int(self.raw.pgconn.socket)

    def send(self, requests: Sequence[Request]) -> bool:
        """Sends the batch as one call of ``dw_write`` without waiting for the server;
        its reply comes from :meth:`poll`. Returns False when part of the call is still
        to be sent (:meth:`flush` it once the socket is writable).

        :raises psycopg.Error: the connection cannot send (it is lost).
        """
        self._prepare()
        params = [None if p is None else p.encode() for p in _call_params(requests)]
        pgconn = self.raw.pgconn
        pgconn.send_query_prepared(_PREPARED, params)
        return self.flush()

    def flush(self) -> bool:
        """Sends more of the call :meth:`send` began; True once all of it went."""
        return bool(self.raw.pgconn.flush() == 0)

    def poll(self) -> tuple[list[Reply], int | None] | None:
        """Reads what the server sent: the batch's reply once all of it came, else None.

        :raises psycopg.Error: the call failed (``broken`` says whether the connection
            is lost; otherwise nothing of the batch was written).
        """
        pgconn = self.raw.pgconn
        pgconn.consume_input()
        results = self._results
        while not pgconn.is_busy():
            res = pgconn.get_result()
            if res is None:
                self._results = []
                return _replies(results)
            results.append(res)
        return None

    def discard_input(self) -> None:
        """Reads what the server sent between calls (a notice; the end of a connection
        it closed, which then raises), so that the socket is not readable for nothing."""
        pgconn = self.raw.pgconn
        pgconn.consume_input()
        while not pgconn.is_busy() and pgconn.get_result() is not None:
            pass

    def wait(self) -> tuple[list[Reply], int | None]:
        """Blocks until the reply of the call in flight has come (closing a store)."""
        fd = self.fileno()
        sent = self.flush()
        while True:
            if sent and (got := self.poll()) is not None:
                return got
            select.select([fd], [] if sent else [fd], [])
            sent = sent or self.flush()

    def delete_runs(self, runs: Mapping[str, int | None], now: int) -> list[str]:
        # The seq row first, as dw_write takes it: no append is in flight while the runs
        # are looked at and deleted (the log has no foreign key to refuse an append to a
        # run deleted meanwhile). Then the runs table is locked against new rows (a fork
        # made meanwhile). Seqs are never reused, as meta's last_seq only grows.
        with self.raw.transaction():
            self.raw.execute("SELECT 1 FROM meta WHERE key = 'last_seq' FOR UPDATE")
            self.raw.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
            return delete_runs(_Connection(self.raw), runs, now)

    def apply(self, requests: Sequence[Request]) -> tuple[list[Reply], int | None]:
        params = _call_params(requests)
        rows = self.raw.execute(_CALL, params).fetchall()
        replies: list[Reply] = [
            _error(msg) if code == "error" else (code, a, b) for code, a, b, msg in rows[:-1]
        ]
        return replies, rows[-1][1]


class PostgresBackend:
    """A store in a PostgreSQL schema, shared by every process and host that opens it."""

    kind = "postgres"
    where = "the postgres store"
    read_errors = READ_ERRORS
    unavailable_errors = UNAVAILABLE_ERRORS
    writes_inline = False  # each write waits for the server: the event loop must not

    def __init__(self, url: str, *, readonly: bool, durability: str) -> None:
        self._reply_spin_s = reply_spin_s(url)  # a bad value is refused before connecting
        self.schema_version = open_database(url, readonly=readonly)
        self._url = url
        self._durability = durability
        # A reader's and (writable stores) the writer's connections are made now, while
        # the store opens, not by the first read or batch of the first run: connecting
        # and the server's first compile of dw_write in a session cost more than a
        # hundred steps (tens of ms). Unused, they are closed with the store.
        self._spare_reader: Any = None
        self._spare_writer: PostgresWriteSQL | None = None
        with contextlib.suppress(psycopg.Error):  # then they are made when needed
            self._spare_reader = self._connect_reader()
            if not readonly:
                self._spare_writer = self._new_writer()
                self._spare_writer.warm()

    def _connect_reader(self) -> Any:
        return connect(self._url, readonly=True, durability=self._durability)

    def _new_writer(self) -> PostgresWriteSQL:
        raw = connect(self._url, readonly=False, durability=self._durability)
        return PostgresWriteSQL(raw, reply_spin_s=self._reply_spin_s)

    def loop_write_sql(self) -> PostgresWriteSQL | None:
        """The write connection made at opening, for a writer on the event loop's thread
        (which must not wait to connect); None when there is none ready."""
        sql, self._spare_writer = self._spare_writer, None
        if sql is not None and sql.broken:
            with contextlib.suppress(psycopg.Error):
                sql.close()
            return None
        return sql

    def reader(self) -> _Connection:
        raw, self._spare_reader = self._spare_reader, None
        return _Connection(raw or self._connect_reader(), reconnect=self._connect_reader)

    def write_sql(self, *, busy_timeout_ms: int | None = None) -> PostgresWriteSQL:
        # PostgreSQL waits for row locks itself; the loop never writes here, so no caller
        # asks for a bound. Each call is its own (implicit) transaction.
        sql, self._spare_writer = self._spare_writer, None
        if sql is not None and not sql.broken:
            return sql
        return self._new_writer()

    def listen(self, callback: Callable[[str], None], stop: threading.Event) -> None:
        listen(self._url, callback, stop)

    def reclaim(self) -> None:
        # VACUUM cannot run in a transaction: the connection is in autocommit mode.
        conn = connect(self._url, readonly=False, durability=self._durability)
        try:
            conn.execute("VACUUM log, snapshots, inbox, leases, runs")
        finally:
            conn.close()

    def close(self) -> None:
        """Closes the connections made at opening that no reader or writer took."""
        raw, self._spare_reader = self._spare_reader, None
        sql, self._spare_writer = self._spare_writer, None
        for conn in (raw, sql):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
