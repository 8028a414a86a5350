"""The PostgreSQL backend: refusals of foreign schemas, and workflows running on it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    NewRun,
    NotAStoreError,
    Record,
    SchemaVersionError,
)
from eventstore._postgres import SCHEMA_VERSION, PostgresWriteSQL
from eventstore._writer import BatchWriter
from tests.conftest import POSTGRES_URL, postgres_location, postgres_store
from tests.flows import Asker, ReportFlow
from tests.support.child import child
from tests.test_engine import Counter, FanOut, Linear
from workflow import HumanResponseEvent

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg() -> Iterator[EventStore]:
    """A store in a fresh PostgreSQL schema."""
    with postgres_store() as es:
        yield es


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema name, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_refuses_a_schema_of_another_application(schema: str) -> None:
    """A schema holding other tables is refused, and left as it was."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".people (name text)')
    with pytest.raises(NotAStoreError, match="without the event store's tables"):
        EventStore(f"{POSTGRES_URL}?schema={schema}")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
    assert tables == [("people",)]


def test_refuses_a_newer_schema_version(schema: str) -> None:
    """A store written by a newer schema version is refused."""
    EventStore(f"{POSTGRES_URL}?schema={schema}").close()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"UPDATE \"{schema}\".meta SET value = '7' WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError, match="schema version 7"):
        EventStore(f"{POSTGRES_URL}?schema={schema}")


def test_readonly_never_creates(schema: str) -> None:
    """A read-only store on an empty schema is refused and creates nothing."""
    with pytest.raises(NotAStoreError, match="never created"):
        EventStore(f"{POSTGRES_URL}?schema={schema}", readonly=True)


async def test_workflows_run_on_postgres(pg: EventStore) -> None:
    """Runs, fan-in, concurrent read-modify-writes and state_at work on PostgreSQL."""
    assert await Linear(store=pg).run(topic="pg") == "hello pg!"
    assert await FanOut(store=pg).run(n=5) == [0, 10, 20, 30, 40]
    wf = Counter(store=pg, timeout=60)
    h = wf.run(n=100)
    assert await h == sum(range(100))
    assert wf.state_at(h.run_id).context["total"] == sum(range(100))


async def test_resume_fork_and_wait_on_postgres(pg: EventStore) -> None:
    """The user report's resume, a fork and a durable wait work on PostgreSQL."""
    wf = ReportFlow(store=pg)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    assert await ReportFlow(store=pg).resume(h.run_id, updates={"var": 1}) == ("end: second: first")
    cp = wf.checkpoints(h.run_id, step="process")[-1]
    assert await wf.run_from(cp, updates={"var": 2}) == "end: second: first"
    asker = Asker(store=pg)
    ha = asker.run()
    await ha.wait_until_waiting(5)
    asker.send(ha.run_id, HumanResponseEvent(response="pg"))
    assert await asyncio.wait_for(ha, 10) == "hello pg"


def test_answer_from_another_host_continues_the_run_promptly(pg: EventStore) -> None:
    """A human's answer recorded by another process reaches the owner within a second."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert pg.path is not None
    with child(
        [sys.executable, "-m", "tests.flows", "asker", pg.path, "run"],
        cwd=root,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(root), "ASKER_STAYS": "1"},
    ) as proc:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().split()[1]
        wf = Asker(store=pg)
        deadline = time.monotonic() + 20
        while run_id not in {r.run_id for r in wf.runs()} or wf.state_at(run_id).status != (
            "waiting"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sent = time.monotonic()
        wf.send(run_id, HumanResponseEvent(response="from elsewhere"))
        out = proc.stdout.read()
        assert proc.wait(timeout=20) == 0
        assert "RESULT hello from elsewhere" in out
        assert time.monotonic() - sent < 5
        assert wf.state_at(run_id).status == "finished"


def test_posts_are_notified_to_listeners(pg: EventStore) -> None:
    """On PostgreSQL every inbox post is announced (LISTEN/NOTIFY) to the store's listeners."""
    import threading
    import time

    from eventstore import Commit, NewRun, Record

    pg.append_sync(Commit("r1", [Record("opened", None, "{}")], create=NewRun()))
    heard: list[str] = []
    got = threading.Event()

    def listener(run_id: str) -> None:
        heard.append(run_id)
        got.set()

    pg.on_post(listener)
    deadline = time.monotonic() + 10
    while not got.is_set():
        pg.post_sync("r1", '{"x": 1}')  # the listener may start listening a moment later
        got.wait(0.2)
        assert time.monotonic() < deadline
    assert "r1" in heard


FIXTURES = Path(__file__).with_name("fixtures")


def load_store(version: int, schema: str) -> str:
    """A committed store of an older schema version (tests/fixtures/postgres-vN-store.sql)
    in ``schema``; returns its URL."""
    text = (FIXTURES / f"postgres-v{version}-store.sql").read_text()
    script = text.replace(f"v{version}fixture", schema)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(script)
    return f"{POSTGRES_URL}?schema={schema}"


def version_of(schema: str) -> str:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'"
        ).fetchone()
    assert row is not None
    return str(row[0])


def write_function_of(schema: str) -> str:
    """The source of a store's ``dw_write``."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE p.proname = 'dw_write' AND n.nspname = %s",
            (schema,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def foreign_keys_of_log(schema: str) -> list[str]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid"
            " JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE c.contype = 'f' AND t.relname = 'log' AND n.nspname = %s",
            (schema,),
        ).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_an_older_store_is_read_as_it_is_and_migrated_when_written(
    schema: str, version: int
) -> None:
    """A store of an older schema (version 2: one snapshot a run, 3: many, both before the
    write function; 4: its first version, and a foreign key from the log to its runs; 5:
    the write function that locked the seq row with a SELECT, and a run of ReportFlow
    after run-1's records) reads unchanged read-only; opened for writing it migrates to
    the current version and goes on: same records, inbox, lease and snapshot, new commits
    fenced and numbered after the old ones, by the write function; the foreign key is
    gone."""
    url = load_store(version, schema)
    before = [
        (1, "run-1", "run_started", None, '{"n": 1}', 2),
        (2, "run-1", "step_started", "first", "{}", 2),
        (3, "run-1", "step_finished", "first", '{"out": "it\'s \\"quoted\\""}', 3),
    ]
    with EventStore(url, readonly=True) as ro:
        assert [tuple(r)[:6] for r in ro.records("run-1")] == before
        head = ro.head()  # 3, or (5) after the ReportFlow run's records
    assert version_of(schema) == str(version)
    assert foreign_keys_of_log(schema) == ([] if version >= 5 else ["log_rid_fkey"])
    with EventStore(url) as es:
        assert version_of(schema) == str(SCHEMA_VERSION)
        assert foreign_keys_of_log(schema) == []
        assert [tuple(r)[:6] for r in es.records("run-1")] == before
        assert es.run("run-1").status == "waiting"
        assert es.run("run-1").meta == {"workflow": "Old"}
        assert es.snapshot("run-1") == (3, '{"state": 1}')
        [entry] = es.inbox("run-1")
        assert es.post_sync("run-1", '{"again": 1}', key="k1") == entry.id
        assert es.lease_of("run-1") == ("old-host", 1796122867659524)  # long lapsed
        assert es.lease_sync("run-1", "new-host", 30.0)  # the old host's lapsed long ago
        assert not es.lease_sync("run-1", "old-host", 30.0)
        res = es.append_sync(
            Commit("run-1", [Record("step_started", "second", "{}")], epoch=0, status="running")
        )
        assert (res.first_seq, res.last_seq) == (head + 1, head + 1)
        assert es.claim_sync("run-1") == 1
        with pytest.raises(ConcurrencyError, match="epoch 0 refused"):
            es.append_sync(Commit("run-1", [Record("late", None, "{}")], epoch=0))
        es.append_sync(Commit("run-1", [Record("step_finished", "second", "{}")], epoch=1))
        es.append_sync(Commit("run-1", [], snapshot=(head + 2, '{"state": 2}')))
        assert [r.seq for r in es.records("run-1")] == [1, 2, 3, head + 1, head + 2]
        assert es.run("run-1").status == "running"
        assert es.snapshot("run-1") == (head + 2, '{"state": 2}')
    with EventStore(url) as again:  # opened once more: nothing left to migrate
        assert version_of(schema) == str(SCHEMA_VERSION)
        assert again.head() == head + 2
    with postgres_location() as fresh:  # the write function of a store this version makes
        EventStore(fresh).close()
        assert write_function_of(schema) == write_function_of(fresh.rpartition("=")[2])


async def test_a_run_of_a_version_5_store_folds_and_resumes_after_migration(schema: str) -> None:
    """A workflow's run written by version 5 (report-1, failed for want of 'var') folds the
    same after the migration, and resumes to its end, its new records after the old."""
    url = load_store(5, schema)
    with EventStore(url, readonly=True) as ro:  # read as it is, not migrated
        folded = ReportFlow(store=ro).state_at("report-1")
    assert version_of(schema) == "5"
    assert folded.status == "failed"
    wf = ReportFlow(store=url)
    try:
        assert version_of(schema) == str(SCHEMA_VERSION)
        assert wf.state_at("report-1") == folded
        assert [r.seq for r in wf.store.records("report-1")][-1] == 17
        assert await wf.resume("report-1", updates={"var": 1}) == "end: second: first"
        seqs = [r.seq for r in wf.store.records("report-1")]
        assert seqs == sorted(seqs)
        assert seqs[:14] == list(range(4, 18))
        assert seqs[14] == 18  # the first seq after the fixture's last
        assert wf.state_at("report-1").status == "finished"
    finally:
        wf.store.close()


def test_a_batch_is_one_statement(pg: EventStore) -> None:
    """A batch of many commits of many runs, claims, leases and posts is one call to the
    server (one round trip), and one failing op still leaves the others in."""
    writer = BatchWriter(pg._backend.write_sql())
    statements: list[str] = []
    server = cast("PostgresWriteSQL", writer.sql)
    raw = server.raw

    class Counted:
        def execute(self, sql: str, params: Any = ()) -> Any:
            statements.append(sql)
            return raw.execute(sql, params)

        def close(self) -> None:
            raw.close()

    server.raw = Counted()
    try:
        ops: list[Any] = []
        for i in range(10):
            run = f"r{i}"
            new = Commit(run, [Record("run_started", None, "{}")], epoch=0, create=NewRun())
            ops += [
                lambda w, c=new: w.append(c),
                lambda w, r=run: w.lease(r, "me", 10_000_000, renew=False),
                lambda w, r=run: w.post(r, '{"e": 1}', None),
                lambda w, r=run: w.claim(r),
                lambda w, r=run: w.append(Commit(r, [Record("a", "s", "{}")] * 2, epoch=1)),
            ]
        ops.insert(7, lambda w: w.post("r1", None, None))  # NOT NULL: refused alone
        out = writer.run_batch(ops)
    finally:
        writer.close()
    assert len(statements) == 1
    assert [ok for ok, _ in out].count(False) == 1
    assert isinstance(out[7][1], psycopg.errors.NotNullViolation)
    assert pg.head() == 30
    assert [r.seq for r in pg.records("r9")] == [28, 29, 30]
    assert all(pg.run(f"r{i}").epoch == 1 for i in range(10))


def test_seqs_reserved_for_refused_appends_go_to_the_next_ones(pg: EventStore) -> None:
    """A call reserves a seq for each of its records with the seq row's lock; appends
    refused among them (fenced, of a missing run) leave no gap: the next appends of the
    call and of the next call take the seqs they did not use."""
    pg.append_sync(Commit("r1", [Record("a", None, "{}")], epoch=0, create=NewRun()))
    assert pg.claim_sync("r1") == 1
    writer = BatchWriter(pg._backend.write_sql())
    two = [Record("b", None, "{}")] * 2
    try:
        out = writer.run_batch(
            [
                lambda w: w.append(Commit("r1", two, epoch=1)),
                lambda w: w.append(Commit("r1", two, epoch=0)),  # fenced
                lambda w: w.append(Commit("nobody", two)),  # no such run
                lambda w: w.append(Commit("r1", two, epoch=1)),
            ]
        )
        assert [ok for ok, _ in out] == [True, False, False, True]
        assert isinstance(out[1][1], ConcurrencyError)
        assert [(r.first_seq, r.last_seq) for ok, r in out if ok] == [(2, 3), (4, 5)]
        assert pg.head() == 5
        [(ok, res)] = writer.run_batch([lambda w: w.append(Commit("r1", two, epoch=1))])
        assert ok
        assert (res.first_seq, res.last_seq) == (6, 7)
    finally:
        writer.close()
    assert [r.seq for r in pg.records("r1")] == list(range(1, 8))


def test_the_writer_connects_again_after_its_connection_is_lost(pg: EventStore) -> None:
    """A writer whose server connection went away (here: ended by the server) refuses the
    batch it was writing, as in doubt, and writes the next one on a new connection; the
    store is not failed."""
    from eventstore import StoreUnavailableError

    pg.append_sync(Commit("r1", [Record("a", None, "{}")], create=NewRun()))
    writer = pg._committer.writer
    assert writer is not None
    session = cast("PostgresWriteSQL", writer.sql).raw.info.backend_pid
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (session,))
    with pytest.raises(StoreUnavailableError, match="connection to the database was lost"):
        pg.append_sync(Commit("r1", [Record("b", None, "{}")], epoch=0))
    res = pg.append_sync(Commit("r1", [Record("c", None, "{}")], epoch=0))
    assert pg.failed is None
    assert [r.kind for r in pg.records("r1")] == ["a", "c"]
    assert res.last_seq == 2


def test_a_reader_connects_again_after_its_connection_is_lost(pg: EventStore) -> None:
    """A read that meets a lost connection says the store cannot be read now (not that it
    is damaged); the next read works on a new connection."""
    from eventstore import StoreUnavailableError

    pg.append_sync(Commit("r1", [Record("a", None, "{}")], create=NewRun()))
    assert pg.head() == 1
    session = pg._reader().raw.info.backend_pid  # type: ignore[attr-defined]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (session,))
    with pytest.raises(StoreUnavailableError, match="cannot read the store now"):
        pg.head()
    assert pg.head() == 1
    assert [r.kind for r in pg.records("r1")] == ["a"]
