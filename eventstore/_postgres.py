"""The same store contract on PostgreSQL (psycopg 3): schema, connections, the transaction.

``EventStore("postgresql://user@host/db?schema=name")`` keeps its tables in ``name`` (the
``schema`` parameter is ours; the rest of the URL goes to libpq). Seqs come from one row
locked for the whole write transaction, so they are assigned in commit order and a reader
never sees seq 14 before seq 13 commits (a PostgreSQL sequence would not promise that).

A batch of the writer is one call of the store's ``dw_write`` function (created by the
schema, version 4): the commit rules run inside the server, so a transaction is one round
trip and never waits for the client. A host cut off mid-call holds no lock past the call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import orjson

from ._backend import Reply, Request
from ._errors import NotAStoreError, SchemaVersionError, StoreUnavailableError
from ._records import Snapshot
from ._sql import delete_runs

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

SCHEMA_VERSION: Final = 4  # 2: leases; 3: many snapshots a run; 4: the dw_write function
READ_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.DatabaseError,) if psycopg is not None else ()
)
# A read that fails with one of these met a lost connection or an unreachable server.
UNAVAILABLE_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.OperationalError, psycopg.InterfaceError) if psycopg is not None else ()
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
        # 4: the write function, a batch of the writer in one call.
        conn.execute(_WRITE_FN)
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
        conn.execute(_WRITE_FN)
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


# The write function: a whole batch of the writer's operations, applied in order under the
# commit rules (eventstore/_writer.py), as one statement.
_WRITE_FN: Final = r"""
CREATE OR REPLACE FUNCTION dw_write(
    p_ops text[], p_run_ids text[], p_epochs bigint[], p_counts int[],
    p_kinds text[], p_steps text[], p_payloads text[], p_statuses text[],
    p_taken_counts int[], p_taken bigint[], p_snap_seqs bigint[], p_snap_data text[],
    p_creates boolean[], p_parents text[], p_parent_seqs bigint[], p_metas text[],
    p_texts text[], p_bodies text[], p_ats bigint[], p_ttls bigint[], p_renews boolean[],
    p_rec_ops int[], p_snap_versions bigint[], p_snap_records bigint[], p_seqs bigint[],
    p_created bigint[]
) RETURNS TABLE (code text, a bigint, b bigint, msg text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_n int := coalesce(array_length(p_ops, 1), 0);
    v_p int := 1;  -- the next op's first record
    v_t int := 1;  -- the next op's first taken inbox entry
    v_base bigint;
    v_last bigint;
    v_saved bigint;
    v_cnt int;
    v_tc int;
    v_rid bigint;
    v_epoch bigint;
    v_create boolean;
    v_got bigint;
    v_chan text := 'dw_inbox_' || current_schema();
    v_run text;  -- the run the last append went to, its rid and epoch: batches are runs
    v_run_rid bigint;
    v_run_epoch bigint;
    -- The appends written: their records go in with one INSERT at the end.
    w_op int[] := '{}';
    w_first bigint[] := '{}';
    w_rid bigint[] := '{}';
    w_last bigint[] := '{}';
    w_ts bigint[] := '{}';
    w_p int[] := '{}';
BEGIN
    -- The seq row's lock orders appends and claims: an append reads its run's epoch under
    -- it, so no claim can commit between that read and the append's commit (the fence).
    IF 'a' = ANY (p_ops) OR 'c' = ANY (p_ops) THEN
        SELECT value::bigint INTO v_last FROM meta WHERE key = 'last_seq' FOR UPDATE;
    END IF;
    v_base := v_last;
    FOR i IN 1..v_n LOOP
        v_cnt := coalesce(p_counts[i], 0);
        v_tc := coalesce(p_taken_counts[i], 0);
        v_create := coalesce(p_creates[i], false);
        v_saved := v_last;
        code := 'ok'; a := NULL; b := NULL; msg := NULL;
        BEGIN  -- each op alone: one that fails rolls back to here and the others go on
            IF p_ops[i] = 'a' THEN
                v_rid := NULL;
                IF v_create THEN
                    INSERT INTO runs AS r (run_id, epoch, status, created, parent_run_id,
                                           parent_seq, meta)
                    VALUES (p_run_ids[i], coalesce(p_epochs[i], 0), p_statuses[i],
                            coalesce(p_created[i], p_ats[i]), p_parents[i], p_parent_seqs[i],
                            p_metas[i])
                    ON CONFLICT (run_id) DO NOTHING RETURNING r.rid INTO v_rid;
                    IF v_rid IS NULL THEN
                        code := 'exists';
                    END IF;
                ELSE
                    IF p_run_ids[i] = v_run THEN
                        v_rid := v_run_rid; v_epoch := v_run_epoch;
                    ELSE
                        SELECT r.rid, r.epoch INTO v_rid, v_epoch FROM runs r
                        WHERE r.run_id = p_run_ids[i];
                    END IF;
                    IF v_rid IS NULL THEN
                        code := 'missing';
                    ELSIF p_epochs[i] IS NOT NULL AND p_epochs[i] <> v_epoch THEN
                        code := 'fenced'; a := v_epoch; v_rid := NULL;
                    END IF;
                END IF;
                IF v_rid IS NOT NULL AND p_seqs[i] IS NOT NULL THEN
                    -- A commit that keeps its seqs (an imported run): the log must be short
                    -- of them; the seqs between are never used.
                    IF p_seqs[i] <= v_last THEN
                        code := 'lowseq'; a := v_last;
                        RAISE EXCEPTION USING ERRCODE = 'DWLOW';
                    END IF;
                    v_last := p_seqs[i] - 1;
                END IF;
                IF v_rid IS NOT NULL THEN
                    IF v_create THEN
                        v_epoch := coalesce(p_epochs[i], 0);
                    END IF;
                    v_run := p_run_ids[i]; v_run_rid := v_rid; v_run_epoch := v_epoch;
                    a := v_last + 1;
                    v_last := v_last + v_cnt;
                    b := v_last;
                    IF NOT v_create AND p_statuses[i] IS NOT NULL THEN
                        UPDATE runs SET status = p_statuses[i] WHERE rid = v_rid;
                    END IF;
                    IF v_tc > 0 THEN
                        UPDATE inbox SET taken_seq = v_last
                        WHERE id = ANY (p_taken[v_t:v_t + v_tc - 1]) AND taken_seq IS NULL;
                    END IF;
                    IF p_snap_data[i] IS NOT NULL THEN  -- in place of one at the same seq
                        DELETE FROM snapshots WHERE rid = v_rid AND seq = p_snap_seqs[i];
                        INSERT INTO snapshots (rid, seq, version, records, data)
                        VALUES (v_rid, p_snap_seqs[i], coalesce(p_snap_versions[i], 0),
                                p_snap_records[i], p_snap_data[i]);
                    END IF;
                    IF v_cnt > 0 THEN
                        w_op := w_op || i; w_first := w_first || a; w_rid := w_rid || v_rid;
                        w_last := w_last || v_last; w_ts := w_ts || p_ats[i];
                        w_p := w_p || v_p;
                    END IF;
                END IF;
            ELSIF p_ops[i] = 'c' THEN
                UPDATE runs SET epoch = epoch + 1 WHERE run_id = p_run_ids[i]
                RETURNING epoch INTO v_got;
                IF p_run_ids[i] = v_run THEN
                    v_run_epoch := v_got;
                END IF;
                IF v_got IS NULL THEN
                    code := 'missing';
                END IF;
                a := v_got;
            ELSIF p_ops[i] = 'l' THEN
                v_got := NULL;
                IF coalesce(p_renews[i], false) THEN
                    UPDATE leases SET expires = p_ats[i] + coalesce(p_ttls[i], 0)
                    WHERE run_id = p_run_ids[i] AND owner = p_texts[i] RETURNING 1 INTO v_got;
                ELSE
                    -- Taken when free, lapsed or already ours: one statement, under the
                    -- row's lock, so two hosts never both take it.
                    INSERT INTO leases AS l (run_id, owner, expires)
                    VALUES (p_run_ids[i], p_texts[i], p_ats[i] + coalesce(p_ttls[i], 0))
                    ON CONFLICT (run_id) DO UPDATE
                        SET owner = excluded.owner, expires = excluded.expires
                        WHERE l.owner = excluded.owner OR l.expires <= p_ats[i]
                    RETURNING 1 INTO v_got;
                END IF;
                a := coalesce(v_got, 0);
            ELSIF p_ops[i] = 'r' THEN
                DELETE FROM leases WHERE run_id = p_run_ids[i] AND owner = p_texts[i];
            ELSE  -- 'p': a post
                v_got := NULL;
                IF p_texts[i] IS NOT NULL THEN
                    SELECT id INTO v_got FROM inbox
                    WHERE run_id = p_run_ids[i] AND key = p_texts[i];
                END IF;
                IF v_got IS NOT NULL THEN
                    a := v_got; b := 0;
                ELSE
                    INSERT INTO inbox (run_id, key, payload, created)
                    VALUES (p_run_ids[i], p_texts[i], p_bodies[i], p_ats[i])
                    RETURNING id INTO v_got;
                    -- Delivered on commit: wakes the run's owner on any host.
                    PERFORM pg_notify(v_chan, p_run_ids[i]);
                    a := v_got; b := 1;
                END IF;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            v_last := v_saved;
            v_run := NULL;  -- what the op wrote, a run it created included, was undone
            IF SQLSTATE <> 'DWLOW' THEN
                code := 'error'; a := NULL; b := NULL; msg := SQLSTATE || ' ' || SQLERRM;
            END IF;
        END;
        RETURN NEXT;
        v_p := v_p + v_cnt;
        v_t := v_t + v_tc;
    END LOOP;
    IF cardinality(w_op) > 0 THEN
        INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)
        SELECT w.first + (x.o - w.p), w.rid, x.k, x.s, x.pl, w.last, w.ts
        FROM unnest(p_kinds, p_steps, p_payloads, p_rec_ops) WITH ORDINALITY AS x(k, s, pl, op, o)
        JOIN unnest(w_op, w_first, w_rid, w_last, w_ts, w_p) AS w(op, first, rid, last, ts, p)
            ON w.op = x.op;
    END IF;
    IF v_last IS DISTINCT FROM v_base THEN
        UPDATE meta SET value = v_last::text WHERE key = 'last_seq';
    END IF;
    code := 'seq'; a := v_last; b := NULL; msg := NULL;
    RETURN NEXT;
END
$fn$
"""


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
        # The runs table is locked against new rows (a fork made meanwhile) for the
        # transaction; seqs are never reused, as meta's last_seq only grows.
        with self.raw.transaction():
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
