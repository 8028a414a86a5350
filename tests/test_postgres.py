"""The PostgreSQL backend: refusals of foreign schemas, and workflows running on it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from eventstore import EventStore, NotAStoreError, SchemaVersionError
from tests.conftest import POSTGRES_URL, postgres_store
from tests.flows import Asker, ReportFlow
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.flows", "asker", pg.path, "run"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "ASKER_STAYS": "1"},
    )
    try:
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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


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
