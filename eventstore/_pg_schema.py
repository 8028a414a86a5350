"""The tables of a PostgreSQL store: creating them, migrating older versions, ``dw_write``.

Seqs come from one row locked for the whole write transaction, so they are assigned in
commit order and a reader never sees seq 14 before seq 13 commits (a PostgreSQL sequence
would not promise that). A batch of the writer is one call of the store's ``dw_write``
function (created by the schema, version 4): the commit rules run inside the server, so a
transaction is one round trip and never waits for the client.
"""

from __future__ import annotations

from typing import Any, Final

from ._errors import NotAStoreError, SchemaVersionError, StoreUnavailableError
from ._pg_connect import psycopg, require, split, where

# 2: leases; 3: many snapshots a run; 4: the dw_write function; 5: dw_write without a
# savepoint for plain appends, and the log's rows without a foreign key check each;
# 6: dw_write locks the seq row and reserves its seqs in one UPDATE.
SCHEMA_VERSION: Final = 6
APP_ID: Final = "durable-workflows/eventstore"

__all__ = ["APP_ID", "SCHEMA_VERSION", "open_database"]


def open_database(path: str, *, readonly: bool) -> int:
    """Validates, creates or migrates the store's tables; foreign schemas are refused.

    Returns the schema version readers find (an older store opened read-only stays as it is).
    """
    require()
    url, schema = split(path)
    place = where(path)
    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        msg = f"cannot connect to PostgreSQL at {place}: {exc}"
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
            raise NotAStoreError(place, "a PostgreSQL schema without the event store's tables")
        if tables:
            rows: dict[str, str] = dict(
                conn.execute(f'SELECT key, value FROM "{schema}".meta').fetchall()
            )
            if rows.get("app") != APP_ID:
                raise NotAStoreError(place, "a schema made by another application")
            version = int(rows.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(place, version, SCHEMA_VERSION)
            if version < SCHEMA_VERSION and not readonly:
                _migrate(conn, schema)
                version = SCHEMA_VERSION
            return version
        if readonly:
            raise NotAStoreError(place, "no store there (a read-only store is never created)")
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
        # 4: the write function, a batch of the writer in one call; 5 and 6: its faster
        # versions (the same arguments and replies: a process of version 5 still running
        # calls the new one, which takes the same seq row's lock).
        conn.execute(_WRITE_FN)
        # 5: no foreign key from the log to its run. Its check cost a query of the run's
        # row per record, a fifth of a write; only dw_write inserts records, with the key
        # of a run it holds under the seq lock, and deleting runs takes that lock too.
        # (SQLite declares the key and never enforces it.)
        for (name,) in conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'log'::regclass AND contype = 'f'"
        ).fetchall():
            conn.execute(f'ALTER TABLE log DROP CONSTRAINT "{name}"')
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
    "CREATE TABLE log (seq bigint PRIMARY KEY, rid bigint NOT NULL,"
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


# An append's part of the write function: finding its run and fencing it (``v_rid`` is then
# the run's key, or NULL and ``code`` says why), then writing it (seqs, status, inbox,
# snapshot; its records are inserted with the others at the end).
_APPEND_LOOKUP: Final = """
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
"""
_APPEND_WRITES: Final = """
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
"""

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
    v_base bigint;  -- the last seq reserved
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
    -- One UPDATE takes the lock and reserves a seq for every record of the call (6; a
    -- locking SELECT, then an UPDATE at the end, wrote the row twice); it is written
    -- again at the end only when the call used other seqs (an op refused, kept seqs).
    IF 'a' = ANY (p_ops) OR 'c' = ANY (p_ops) THEN
        v_base := coalesce(cardinality(p_rec_ops), 0);
        UPDATE meta SET value = (value::bigint + v_base)::text WHERE key = 'last_seq'
        RETURNING value::bigint - v_base, value::bigint INTO v_last, v_base;
    END IF;
    FOR i IN 1..v_n LOOP
        v_cnt := coalesce(p_counts[i], 0);
        v_tc := coalesce(p_taken_counts[i], 0);
        v_create := coalesce(p_creates[i], false);
        v_saved := v_last;
        code := 'ok'; a := NULL; b := NULL; msg := NULL;
        IF p_ops[i] = 'a' AND NOT v_create AND p_seqs[i] IS NULL THEN
            -- An append to a run that exists, at the next seqs (most ops): nothing of it
            -- can fail on a constraint, as what it writes is keyed by rows this call holds
            -- locked, so it goes without a savepoint (a subtransaction costs a fifth of a
            -- call). A failure of the server's own fails the whole call.
            v_rid := NULL;
@LOOKUP@
@WRITES@
        ELSE
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
@LOOKUP@
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
@WRITES@
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
        END IF;
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
    IF v_last IS DISTINCT FROM v_base THEN  -- not the seqs reserved
        UPDATE meta SET value = v_last::text WHERE key = 'last_seq';
    END IF;
    code := 'seq'; a := v_last; b := NULL; msg := NULL;
    RETURN NEXT;
END
$fn$
""".replace("@LOOKUP@", _APPEND_LOOKUP).replace("@WRITES@", _APPEND_WRITES)
