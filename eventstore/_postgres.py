"""The same store contract on PostgreSQL (psycopg 3): the backend and its write connection.

A batch of the writer is one call of the store's ``dw_write`` function (:mod:`._pg_schema`):
the commit rules run inside the server, so a transaction is one round trip and never waits
for the client. A host cut off mid-call holds no lock past the call. URLs and connecting
are :mod:`._pg_connect`'s, LISTEN/NOTIFY :mod:`._pg_listen`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from ._backend import Reply, Request
from ._pg_connect import READ_ERRORS, UNAVAILABLE_ERRORS, connect, is_url, psycopg, split, where
from ._pg_listen import listen
from ._pg_schema import SCHEMA_VERSION, open_database
from ._records import Snapshot
from ._sql import delete_runs

if psycopg is not None:
    from psycopg import errors as pg_errors

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
_OPS: Final = {"append": "a", "claim": "c", "lease": "l", "release": "r", "post": "p"}
# How long the server lets a write session sit inside a transaction: a batch never
# leaves one open across round trips, so only a client gone mid-transaction meets it.
IDLE_IN_TRANSACTION_MS: Final = 2_000


def _texts(values: Sequence[str | None]) -> str | None:
    """A text[] literal (NULL when every value is: the server parses nothing then).

    Adapting a list is psycopg's slowest path (~6 us a list, a third of a call).
    """
    if not any(v is not None for v in values):
        return None
    return "{" + ",".join("NULL" if v is None else _item(v) for v in values) + "}"


def _item(v: str) -> str:
    """One element of an array literal: in double quotes, ``"`` and ``\\`` escaped."""
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ints(values: Sequence[int | bool | None], *, none: object = None) -> str | None:
    """A bigint[], int[] or boolean[] literal (NULL when every value is ``none``)."""
    if all(v is none for v in values):
        return None
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


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

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        raw.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")

    def close(self) -> None:
        self.raw.close()

    @property
    def broken(self) -> bool:
        """Whether the connection is gone (the server may be fine: a new one may write)."""
        return bool(self.raw.broken or self.raw.closed)

    def is_fatal(self, exc: BaseException) -> bool:
        return _fatal(exc)

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
        ops: list[str] = []
        run_ids: list[str] = []
        epochs: list[int | None] = []
        counts: list[int] = []
        kinds: list[str] = []
        steps: list[str | None] = []
        payloads: list[str] = []
        statuses: list[str | None] = []
        taken_counts: list[int] = []
        taken: list[int] = []
        snap_seqs: list[int | None] = []
        snap_data: list[str | None] = []
        snap_versions: list[int | None] = []
        snap_records: list[int | None] = []
        seqs: list[int | None] = []
        created: list[int | None] = []
        creates: list[bool] = []
        parents: list[str | None] = []
        parent_seqs: list[int | None] = []
        metas: list[str | None] = []
        texts: list[str | None] = []
        bodies: list[str | None] = []
        ats: list[int] = []
        ttls: list[int] = []
        renews: list[bool] = []
        rec_ops: list[int] = []  # each record's op, counted from 1
        for n, req in enumerate(requests, 1):
            ops.append(_OPS[req.op])
            run_ids.append(req.run_id)
            ats.append(req.at)
            texts.append(req.text)
            bodies.append(req.body)
            ttls.append(req.ttl_us)
            renews.append(req.renew)
            c = req.commit
            if c is None:
                epochs.append(None)
                counts.append(0)
                statuses.append(None)
                taken_counts.append(0)
                snap_seqs.append(None)
                snap_data.append(None)
                snap_versions.append(None)
                snap_records.append(None)
                seqs.append(None)
                created.append(None)
                creates.append(False)
                parents.append(None)
                parent_seqs.append(None)
                metas.append(None)
                continue
            records = c.records
            counts.append(len(records))
            rec_ops.extend([n] * len(records))
            for r in records:
                kinds.append(r.kind)
                steps.append(r.step)
                payloads.append(r.payload)
            taken_counts.append(len(c.inbox_taken))
            taken.extend(c.inbox_taken)
            snap = c.snapshot
            if snap is not None and not isinstance(snap, Snapshot):
                snap = Snapshot(*snap)
            snap_seqs.append(None if snap is None else snap.seq)
            snap_data.append(None if snap is None else snap.data)
            snap_versions.append(None if snap is None else snap.version)
            snap_records.append(None if snap is None else snap.records)
            seqs.append(c.seq)
            new = c.create
            creates.append(new is not None)
            if new is None:
                epochs.append(c.epoch)
                statuses.append(c.status)
                parents.append(None)
                parent_seqs.append(None)
                metas.append(None)
                created.append(None)
            else:
                epochs.append(c.epoch or 0)
                statuses.append(new.status)
                parents.append(new.parent_run_id)
                parent_seqs.append(new.parent_seq)
                metas.append(orjson.dumps(dict(new.meta)).decode())
                created.append(new.created)
        # Counts, flags and TTLs of 0 (False) may go as NULL: the function reads them so.
        t, i = _texts, _ints
        params = (
            t(ops), t(run_ids), i(epochs), i(counts, none=0), t(kinds), t(steps),
            t(payloads), t(statuses), i(taken_counts, none=0), i(taken), i(snap_seqs),
            t(snap_data), i(creates, none=False), t(parents), i(parent_seqs), t(metas),
            t(texts), t(bodies), i(ats), i(ttls, none=0), i(renews, none=False),
            i(rec_ops), i(snap_versions), i(snap_records), i(seqs), i(created),
        )  # fmt: skip
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
        self.schema_version = open_database(url, readonly=readonly)
        self._url = url
        self._durability = durability

    def reader(self) -> _Connection:
        def new() -> Any:
            return connect(self._url, readonly=True, durability=self._durability)

        return _Connection(new(), reconnect=new)

    def write_sql(self, *, busy_timeout_ms: int | None = None) -> PostgresWriteSQL:
        # PostgreSQL waits for row locks itself; the loop never writes here, so no caller
        # asks for a bound. Each call is its own (implicit) transaction.
        return PostgresWriteSQL(connect(self._url, readonly=False, durability=self._durability))

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
        """Nothing to let go of: every connection belongs to a reader or a writer."""
