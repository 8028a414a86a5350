"""The same store contract on PostgreSQL (psycopg 3): schema, connections, the transaction.

``EventStore("postgresql://user@host/db?schema=name")`` keeps its tables in ``name`` (the
``schema`` parameter is ours; the rest of the URL goes to libpq). Seqs come from one row
locked for the whole write transaction, so they are assigned in commit order and a reader
never sees seq 14 before seq 13 commits (a PostgreSQL sequence would not promise that).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ._errors import NotAStoreError, SchemaVersionError, StoreUnavailableError
from ._sql import StandardWriteSQL

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

SCHEMA_VERSION: Final = 3
READ_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.DatabaseError,) if psycopg is not None else ()
)
APP_ID: Final = "durable-workflows/eventstore"
CONNECT_TIMEOUT_S: Final = "10"  # seconds, unless the URL says connect_timeout=
_IDENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

__all__ = ["PostgresBackend", "PostgresWriteSQL", "connect", "is_url", "open_database"]


def is_url(target: str) -> bool:
    """Whether a store location names a PostgreSQL database."""
    return target.startswith(("postgresql://", "postgres://"))


# A "%" that does not start an escape: libpq refuses it, and unquote() would keep it.
_BAD_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decoded(text: str, part: str) -> str:
    """One part of a URL percent-decoded once, as libpq does (``+`` is a plus sign).

    :raises ValueError: a ``%`` that starts no escape; the message names the part only,
        never its text (it may be a password).
    """
    if _BAD_ESCAPE.search(text):
        msg = (
            f"the PostgreSQL URL's {part} has a '%' that starts no percent-escape;"
            " write a literal '%' as %25"
        )
        raise ValueError(msg)
    return unquote(text)


def _params(url: str) -> tuple[dict[str, str], str]:
    """A store URL's libpq connection parameters, and the store's schema (ours).

    User and password are what precedes the last ``@`` (so an ``@`` in a password needs no
    escape); hosts may be a list (``h1:5432,[::1]:5433``); query parameters pass to libpq
    by name except ``schema``.
    """
    parts = urlsplit(url)
    params: dict[str, str] = {}
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if user:
            params["user"] = _decoded(user, "user name")
        if colon:
            params["password"] = _decoded(password, "password")
    hosts: list[str] = []
    ports: list[str] = []
    for item in hostinfo.split(",") if hostinfo else []:
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        hosts.append(_decoded(host, "host"))
        ports.append(port)
    if any(hosts):
        params["host"] = ",".join(hosts)
    if any(ports):
        params["port"] = ",".join(ports)
    if len(parts.path) > 1:
        params["dbname"] = _decoded(parts.path[1:], "database name")
    schema = "public"
    for item in parts.query.split("&") if parts.query else []:
        raw_key, _, raw_value = item.partition("=")
        key = _decoded(raw_key, "query")
        value = _decoded(raw_value, f"{key!r} parameter")
        if key == "schema":
            schema = value
        elif key:
            params[key] = value
    if not _IDENT.match(schema):
        msg = f"schema must be a plain identifier, not {schema!r}"
        raise ValueError(msg)
    # libpq waits as long as TCP does (minutes) for a host that does not answer: say so sooner.
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return params, schema


def _quoted(value: str) -> str:
    """A value as a libpq connection string writes it: in quotes, ``'`` and ``\\`` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _split(url: str) -> tuple[str, str]:
    """The libpq connection string a store URL stands for, and the store's schema."""
    params, schema = _params(url)
    return " ".join(f"{k}={_quoted(v)}" for k, v in params.items()), schema


def _require() -> None:
    if psycopg is None:
        msg = "PostgreSQL stores need psycopg: pip install 'durable-workflows[postgres]'"
        raise ImportError(msg)


def connect(target: str, *, readonly: bool, durability: str = "normal") -> Any:
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
    """The store's place for messages: host, database and schema, never a password."""
    params, schema = _params(target)
    return f"{params.get('host') or 'localhost'}/{params.get('dbname', '')} schema {schema}"


def open_database(path: str, *, readonly: bool) -> int:
    """Validates, creates or migrates the store's tables; foreign schemas are refused.

    Returns the schema version readers find (an older store opened read-only stays as it is).
    """
    _require()
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
                _migrate(conn, schema)
                version = SCHEMA_VERSION
            return version
        if readonly:
            raise NotAStoreError(where, "no store there (a read-only store is never created)")
        _create(conn, schema)
        return SCHEMA_VERSION
    finally:
        conn.close()


def _migrate(conn: Any, schema: str) -> None:
    """Brings an older schema up to :data:`SCHEMA_VERSION` (each step runs once)."""
    with conn.transaction():
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema()))")
        (current,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if int(current) >= SCHEMA_VERSION:
            return  # another process migrated it meanwhile
        # 2: leases, so that workers on several hosts take runs one at a time.
        conn.execute(
            "CREATE TABLE IF NOT EXISTS leases (run_id text PRIMARY KEY,"
            " owner text NOT NULL, expires bigint NOT NULL)"
        )
        if int(current) < 3:
            # 3: many snapshots a run, each with its version and count of records; those
            # kept before were derived by version 1.
            conn.execute(
                "ALTER TABLE snapshots ADD COLUMN version bigint NOT NULL DEFAULT 1,"
                " ADD COLUMN records bigint"
            )
            conn.execute(
                "UPDATE snapshots SET records = (SELECT count(*) FROM log"
                " WHERE log.rid = snapshots.rid AND log.seq <= snapshots.seq)"
            )
            conn.execute("ALTER TABLE snapshots DROP CONSTRAINT snapshots_pkey")
            conn.execute("ALTER TABLE snapshots ADD PRIMARY KEY (rid, seq)")
        conn.execute(
            "UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )


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
    "CREATE TABLE snapshots (rid bigint NOT NULL, seq bigint NOT NULL, version bigint NOT NULL,"
    " records bigint, data text NOT NULL, PRIMARY KEY (rid, seq))",
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


class _Connection:
    """A psycopg connection that takes ``?`` placeholders, as the shared SQL is written."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self.raw.execute(sql.replace("?", "%s"), parameters)

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), parameters)

    def close(self) -> None:
        self.raw.close()


class PostgresWriteSQL(StandardWriteSQL):
    """The write connection: one locked row of meta hands out seqs, in commit order."""

    errors = (psycopg.Error,) if psycopg is not None else ()
    # Locks the run's row until commit: a concurrent claim waits, then wins.
    FIND_RUN = StandardWriteSQL.FIND_RUN + " FOR SHARE"
    LEASE_OF = StandardWriteSQL.LEASE_OF + " FOR UPDATE"
    PUT_LEASE = (
        "INSERT INTO leases (run_id, owner, expires) VALUES (?, ?, ?) ON CONFLICT (run_id)"
        " DO UPDATE SET owner = excluded.owner, expires = excluded.expires"
    )

    def __init__(self, raw: Any) -> None:
        super().__init__(_Connection(raw))
        self._channel = _channel(raw)
        self._start = 0

    def begin(self) -> int:
        # Other hosts write between our transactions, so the writer's caches never hold:
        # they are read again, under the locks this transaction takes.
        self.conn.execute("BEGIN")
        # The allocation point: one locked row serialises writers in commit order.
        (last,) = self.conn.execute(
            "SELECT value FROM meta WHERE key = 'last_seq' FOR UPDATE"
        ).fetchone()
        self._start = int(last)
        return self._start

    def commit(self, last_seq: int) -> None:
        if last_seq != self._start:
            self.conn.execute("UPDATE meta SET value = ? WHERE key = 'last_seq'", (str(last_seq),))
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        self.conn.execute("ROLLBACK")

    def is_fatal(self, exc: BaseException) -> bool:
        return _fatal(exc)

    def insert(self, sql: str, params: Sequence[Any], key: str) -> int:
        return int(self.conn.execute(f"{sql} RETURNING {key}", params).fetchone()[0])

    def insert_post(self, run_id: str, key: str | None, payload: str, created: int) -> int:
        entry = super().insert_post(run_id, key, payload, created)
        # Delivered when the transaction commits: wakes the run's owner on any host.
        self.conn.execute("SELECT pg_notify(?, ?)", (self._channel, run_id))
        return entry


class PostgresBackend:
    """A store in a PostgreSQL schema, shared by every process and host that opens it."""

    kind = "postgres"
    where = "the postgres store"
    read_errors = READ_ERRORS
    writes_inline = False  # each write waits for the server: the event loop must not

    def __init__(self, url: str, *, readonly: bool, durability: str) -> None:
        self.schema_version = open_database(url, readonly=readonly)
        self._url = url
        self._durability = durability

    def reader(self) -> _Connection:
        return _Connection(connect(self._url, readonly=True, durability=self._durability))

    def write_sql(self, *, busy_timeout_ms: int | None = None) -> PostgresWriteSQL:
        # PostgreSQL waits for row locks itself; the loop never writes here, so no caller
        # asks for a bound.
        return PostgresWriteSQL(connect(self._url, readonly=False, durability=self._durability))

    def listen(self, callback: Callable[[str], None], stop: threading.Event) -> None:
        listen(self._url, callback, stop)

    def close(self) -> None:
        """Nothing to let go of: every connection belongs to a reader or a writer."""
