"""The same store contract on PostgreSQL (psycopg 3): schema, the write batch, the reads.

``EventStore("postgresql://user@host/db?schema=name")`` keeps its tables in ``name`` (the
``schema`` parameter is ours; the rest of the URL goes to libpq). Seqs come from one row
locked for the whole write transaction, so they are assigned in commit order and a reader
never sees seq 14 before seq 13 commits (a PostgreSQL sequence would not promise that).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from ._errors import (
    ConcurrencyError,
    NotAStoreError,
    RunNotFoundError,
    SchemaVersionError,
    StoreUnavailableError,
    WriterFailedError,
)
from ._records import AppendResult, Commit, RunInfo, Seq, StoredRecord, run_info_from_row

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

SCHEMA_VERSION: Final = 2
READ_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.DatabaseError,) if psycopg is not None else ()
)
APP_ID: Final = "durable-workflows/eventstore"
PAGE_SIZE: Final = 2_000
_IDENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

__all__ = ["Writer", "connect", "is_url", "open_database"]


def is_url(target: str) -> bool:
    """Whether a store location names a PostgreSQL database."""
    return target.startswith(("postgresql://", "postgres://"))


def now_us() -> int:
    return time.time_ns() // 1000


class Busy(Exception):
    """Never raised: PostgreSQL waits for row locks itself."""


def _split(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    schema = "public"
    rest = []
    for k, v in query:
        if k == "schema":
            schema = v
        else:
            rest.append((k, v))
    if not _IDENT.match(schema):
        msg = f"schema must be a plain identifier, not {schema!r}"
        raise ValueError(msg)
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


def _require() -> None:
    if psycopg is None:
        msg = "PostgreSQL stores need psycopg: pip install 'durable-workflows[postgres]'"
        raise ImportError(msg)


def connect(
    target: str,
    *,
    uri: bool = True,
    readonly: bool,
    durability: str = "normal",
    memory: bool = False,
    busy_timeout_ms: int = 0,
) -> Any:
    """One autocommit connection with the store's schema first on the search path."""
    _require()
    url, schema = _split(target)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    if readonly:
        conn.execute("SET default_transaction_read_only = on")
    # "normal" may lose the last commits on a server crash, never a half commit.
    conn.execute(f"SET synchronous_commit = {'on' if durability == 'full' else 'off'}")
    return conn


def _where(target: str) -> str:
    url, schema = _split(target)
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}/{parts.path.lstrip('/')} schema {schema}"


def open_database(
    path: str | None, *, readonly: bool, durability: str, memory_name: str
) -> tuple[str, bool]:
    """Validates, creates or migrates the store's tables; foreign schemas are refused."""
    _require()
    assert path is not None
    url, schema = _split(path)
    where = _where(path)
    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        msg = f"cannot connect to PostgreSQL at {where}: {exc}"
        raise StoreUnavailableError(msg) from exc
    try:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        }
        if tables and "meta" not in tables:
            raise NotAStoreError(where, "a PostgreSQL schema without the event store's tables")
        if tables:
            rows: dict[str, str] = dict(
                conn.execute(f'SELECT key, value FROM "{schema}".meta').fetchall()
            )
            if rows.get("app") != APP_ID:
                raise NotAStoreError(where, "a schema made by another application")
            version = int(rows.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(where, version, SCHEMA_VERSION)
            if version < SCHEMA_VERSION and not readonly:
                with conn.transaction():
                    conn.execute(
                        f'CREATE TABLE IF NOT EXISTS "{schema}".leases (run_id text PRIMARY KEY,'
                        " owner text NOT NULL, expires bigint NOT NULL)"
                    )
                    conn.execute(
                        f"UPDATE \"{schema}\".meta SET value = %s WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION),),
                    )
        elif readonly:
            raise NotAStoreError(where, "no store there (a read-only store is never created)")
        else:
            _create(conn, schema)
    finally:
        conn.close()
    return path, True


def _create(conn: Any, schema: str) -> None:
    with conn.transaction():
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))")
        exists = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND"
            " table_name = 'meta'",
            (schema,),
        ).fetchone()
        if exists:
            return  # another process created it meanwhile
        for ddl in _DDL:
            conn.execute(ddl)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('app', %s), ('schema_version', %s),"
            " ('last_seq', '0')",
            (APP_ID, str(SCHEMA_VERSION)),
        )


_DDL: Final = (
    "CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE runs (rid bigserial PRIMARY KEY, run_id text NOT NULL UNIQUE,"
    " epoch bigint NOT NULL DEFAULT 0, status text, created bigint NOT NULL,"
    " parent_run_id text, parent_seq bigint, meta text NOT NULL DEFAULT '{}')",
    "CREATE TABLE log (seq bigint PRIMARY KEY, rid bigint NOT NULL REFERENCES runs (rid),"
    " kind text NOT NULL, step text, payload text NOT NULL, commit_seq bigint NOT NULL,"
    " ts bigint NOT NULL)",
    "CREATE INDEX log_rid_seq ON log (rid, seq)",
    "CREATE TABLE inbox (id bigserial PRIMARY KEY, run_id text NOT NULL, key text,"
    " payload text NOT NULL, created bigint NOT NULL, taken_seq bigint)",
    "CREATE UNIQUE INDEX inbox_run_key ON inbox (run_id, key)",
    "CREATE INDEX inbox_run_taken ON inbox (run_id, taken_seq)",
    "CREATE TABLE snapshots (rid bigint PRIMARY KEY, seq bigint NOT NULL, data text NOT NULL)",
    "CREATE TABLE leases (run_id text PRIMARY KEY, owner text NOT NULL, expires bigint NOT NULL)",
    "CREATE VIEW records AS SELECT log.seq, runs.run_id, log.kind, log.step, log.payload,"
    " log.commit_seq, log.ts FROM log JOIN runs ON runs.rid = log.rid",
)


def _channel(conn: Any) -> str:
    """The notification channel of a store: one per schema, so stores never cross-talk."""
    (schema,) = conn.execute("SELECT current_schema()").fetchone()
    return f"dw_inbox_{schema}"


def listen(target: str, callback: Callable[[str], None], stop: Any) -> None:
    """Calls ``callback(run_id)`` for every inbox post to the store until ``stop`` is set.

    Runs in a thread of its own: LISTEN needs a connection that waits for the server.
    """
    conn = connect(target, readonly=True)
    try:
        conn.execute(f'LISTEN "{_channel(conn)}"')
        while not stop.is_set():
            for note in conn.notifies(timeout=0.5):
                callback(note.payload)
    except psycopg.Error:
        return  # the server went away: owners still poll their inbox
    finally:
        conn.close()


def _fatal(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.OperationalError | pg_errors.DiskFull | psycopg.InterfaceError)


class _Redo(Exception):
    def __init__(self, index: int, error: Exception) -> None:
        self.index = index
        self.error = error
        super().__init__(repr(error))


Op = Callable[["Writer"], Any]


class Writer:
    """The write batch on PostgreSQL: the same semantics as the SQLite writer."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.last_seq = 0
        self._rids: dict[str, int] = {}

    def run_batch(self, ops: Sequence[Op]) -> list[tuple[bool, Any]]:
        refused: dict[int, Exception] = {}
        while True:
            try:
                return self._run_once(ops, refused)
            except _Redo as redo:
                refused[redo.index] = redo.error

    def _run_once(self, ops: Sequence[Op], refused: dict[int, Exception]) -> list[tuple[bool, Any]]:
        conn = self.conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN")
            # The allocation point: one locked row serialises writers in commit order.
            (last,) = conn.execute(
                "SELECT value FROM meta WHERE key = 'last_seq' FOR UPDATE"
            ).fetchone()
            self.last_seq = start = int(last)
            for i, op in enumerate(ops):
                if i in refused:
                    outcomes.append((False, refused[i]))
                    continue
                before = self.last_seq
                conn.execute("SAVEPOINT op")
                try:
                    result = op(self)
                except Exception as exc:
                    if _fatal(exc):
                        raise
                    # PostgreSQL aborts the transaction on any error: back to the savepoint.
                    conn.execute("ROLLBACK TO SAVEPOINT op")
                    self._rids.clear()
                    self.last_seq = before
                    outcomes.append((False, exc))
                    continue
                conn.execute("RELEASE SAVEPOINT op")
                outcomes.append((True, result))
            if self.last_seq != start:
                conn.execute(
                    "UPDATE meta SET value = %s WHERE key = 'last_seq'", (str(self.last_seq),)
                )
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the connection itself may be gone
                conn.execute("ROLLBACK")
            self._rids.clear()
            msg = f"the write transaction failed: {exc}"
            raise WriterFailedError(msg) from exc
        return outcomes

    def _rid(self, run_id: str) -> int:
        rid = self._rids.get(run_id)
        if rid is None:
            found = self.conn.execute(
                "SELECT rid FROM runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            if found is None:
                raise RunNotFoundError(run_id, "the store (commits to a new run need create=)")
            rid = self._rids[run_id] = int(found[0])
        return rid

    def create_run(self, commit: Commit) -> int:
        assert commit.create is not None
        spec = commit.create
        try:
            (rid,) = self.conn.execute(
                "INSERT INTO runs (run_id, epoch, status, created, parent_run_id, parent_seq,"
                " meta) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING rid",
                (
                    commit.run_id,
                    commit.epoch or 0,
                    spec.status,
                    now_us(),
                    spec.parent_run_id,
                    spec.parent_seq,
                    orjson.dumps(dict(spec.meta)).decode(),
                ),
            ).fetchone()
        except pg_errors.UniqueViolation:
            msg = f"run {commit.run_id!r} already exists"
            raise ConcurrencyError(msg, run_id=commit.run_id) from None
        self._rids[commit.run_id] = int(rid)
        return int(rid)

    def append(self, commit: Commit) -> AppendResult:
        rid = self.create_run(commit) if commit.create is not None else self._rid(commit.run_id)
        if commit.epoch is not None:
            # Locks the run's row until commit: a concurrent claim waits, then wins.
            (epoch,) = self.conn.execute(
                "SELECT epoch FROM runs WHERE rid = %s FOR SHARE", (rid,)
            ).fetchone()
            if epoch != commit.epoch:
                msg = (
                    f"run {commit.run_id!r}: append under epoch {commit.epoch} refused, the"
                    f" run's epoch is {epoch}; another executor took the run over"
                )
                raise ConcurrencyError(msg, run_id=commit.run_id)
        if commit.check is not None:
            commit.check()
        n = len(commit.records)
        first = self.last_seq + 1
        last = self.last_seq + n
        ts = now_us()
        if n:
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [
                        (first + i, rid, r.kind, r.step, r.payload, last, ts)
                        for i, r in enumerate(commit.records)
                    ],
                )
            self.last_seq = last
        if commit.status is not None and commit.create is None:
            self.conn.execute("UPDATE runs SET status = %s WHERE rid = %s", (commit.status, rid))
        if commit.inbox_taken:
            with self.conn.cursor() as cur:
                cur.executemany(
                    "UPDATE inbox SET taken_seq = %s WHERE id = %s AND taken_seq IS NULL",
                    [(last, i) for i in commit.inbox_taken],
                )
        if commit.snapshot is not None:
            self.conn.execute(
                "INSERT INTO snapshots (rid, seq, data) VALUES (%s, %s, %s)"
                " ON CONFLICT (rid) DO UPDATE SET seq = excluded.seq, data = excluded.data",
                (rid, commit.snapshot[0], commit.snapshot[1]),
            )
        if commit.on_written is not None:
            commit.on_written(Seq(last))
        return AppendResult(Seq(first), Seq(last), ts)

    def claim(self, run_id: str) -> int:
        rid = self._rid(run_id)
        (epoch,) = self.conn.execute(
            "UPDATE runs SET epoch = epoch + 1 WHERE rid = %s RETURNING epoch", (rid,)
        ).fetchone()
        return int(epoch)

    def lease(self, run_id: str, owner: str, ttl_us: int, *, renew: bool) -> bool:
        """Takes (or renews) the run's lease for ``owner``; False if another owner holds it."""
        now = now_us()
        row = self.conn.execute(
            "SELECT owner, expires FROM leases WHERE run_id = %s FOR UPDATE", (run_id,)
        ).fetchone()
        if row is not None and row[0] != owner and row[1] > now:
            return False
        if renew and (row is None or row[0] != owner):
            return False
        self.conn.execute(
            "INSERT INTO leases (run_id, owner, expires) VALUES (%s, %s, %s) ON CONFLICT"
            " (run_id) DO UPDATE SET owner = excluded.owner, expires = excluded.expires",
            (run_id, owner, now + ttl_us),
        )
        return True

    def release(self, run_id: str, owner: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE run_id = %s AND owner = %s", (run_id, owner))

    def post(self, run_id: str, payload: str, key: str | None) -> tuple[int, bool]:
        if key is not None:
            found = self.conn.execute(
                "SELECT id FROM inbox WHERE run_id = %s AND key = %s", (run_id, key)
            ).fetchone()
            if found is not None:
                return int(found[0]), False
        (entry,) = self.conn.execute(
            "INSERT INTO inbox (run_id, key, payload, created) VALUES (%s, %s, %s, %s)"
            " RETURNING id",
            (run_id, key, payload, now_us()),
        ).fetchone()
        # Delivered when the transaction commits: wakes the run's owner on any host.
        self.conn.execute("SELECT pg_notify(%s, %s)", (_channel(self.conn), run_id))
        return int(entry), True


# --------------------------------------------------------------------------- the read side

_RUN_COLS: Final = (
    "run_id, status, epoch, created,"
    " coalesce((SELECT ts FROM log WHERE log.rid = runs.rid ORDER BY seq DESC LIMIT 1), created),"
    " (SELECT min(seq) FROM log WHERE log.rid = runs.rid),"
    " (SELECT max(seq) FROM log WHERE log.rid = runs.rid),"
    " parent_run_id, parent_seq, meta, rid"
)


def read_run(conn: Any, run_id: str) -> RunInfo | None:
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else run_info_from_row(row)


def read_runs(conn: Any) -> list[RunInfo]:
    return [
        run_info_from_row(r) for r in conn.execute(f"SELECT {_RUN_COLS} FROM runs ORDER BY rid")
    ]


def head(conn: Any) -> Seq:
    row = conn.execute("SELECT max(seq) FROM log").fetchone()
    return Seq(row[0] or 0)


def iter_records(
    connect_reader: Callable[[], Any],
    run_id: str | None,
    *,
    after: int,
    upto: int | None,
    kinds: Sequence[str] | None,
    page: int,
) -> Iterator[StoredRecord]:
    conn = connect_reader()
    rid: int | None = None
    if run_id is not None:
        found = conn.execute("SELECT rid FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        if found is None:
            raise RunNotFoundError(run_id, "the store")
        rid = found[0]
    where = ["log.seq > %s"]
    if rid is not None:
        where.append("log.rid = %s")
    if upto is not None:
        where.append("log.seq <= %s")
    if kinds:
        where.append("log.kind = ANY(%s)")
    sql = (
        "SELECT log.seq, runs.run_id, log.kind, log.step, log.payload, log.commit_seq, log.ts"
        f" FROM log JOIN runs ON runs.rid = log.rid WHERE {' AND '.join(where)}"
        " ORDER BY log.seq LIMIT %s"
    )
    cursor = after
    while True:
        params: list[Any] = [cursor]
        if rid is not None:
            params.append(rid)
        if upto is not None:
            params.append(upto)
        if kinds:
            params.append(list(kinds))
        params.append(page)
        rows = connect_reader().execute(sql, params).fetchall()
        yield from map(StoredRecord._make, rows)
        if len(rows) < page:
            return
        cursor = rows[-1][0]


def read_inbox(conn: Any, run_id: str) -> list[tuple[int, str, str | None]]:
    rows = conn.execute(
        "SELECT id, payload, key FROM inbox WHERE run_id = %s AND taken_seq IS NULL ORDER BY id",
        (run_id,),
    ).fetchall()
    return [tuple(r) for r in rows]


def read_lease(conn: Any, run_id: str) -> tuple[str, int] | None:
    row = conn.execute("SELECT owner, expires FROM leases WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def read_snapshot(conn: Any, run_id: str) -> tuple[Seq, str] | None:
    row = conn.execute(
        "SELECT snapshots.seq, snapshots.data FROM snapshots JOIN runs USING (rid)"
        " WHERE runs.run_id = %s",
        (run_id,),
    ).fetchone()
    return None if row is None else (Seq(row[0]), row[1])


def query(conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Runs a read query written with ``?`` placeholders, as on SQLite."""
    return [tuple(r) for r in conn.execute(sql.replace("?", "%s"), params).fetchall()]
