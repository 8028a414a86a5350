"""A write lock another connection keeps (a transaction left open in an SQLite shell or a
file browser) fails the writes waiting for it, loudly, instead of hanging the run."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import eventstore._lock_wait as lock_wait
import eventstore._sqlite as sqlite_mod
from eventstore import EventStore, StoreUnavailableError, WriterFailedError
from tests.test_cli import invoke, ok
from workflow import Context, StartEvent, StopEvent, Workflow, step


class Sets(Workflow):
    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("k", 1)
        return StopEvent(result="ok")


async def test_a_lock_held_elsewhere_fails_the_run_after_the_wait_and_the_store_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Shorter waits than a user's (10 s a try, 30 s in all), the same rule.
    monkeypatch.setattr(lock_wait, "WRITER_BUSY_MS", 100)
    monkeypatch.setattr(lock_wait, "LOCK_WAIT_S", 0.5)
    db = tmp_path / "runs.db"
    wf = Sets(store=db, timeout=None)
    assert await wf.run(run_id="before") == "ok"
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # someone else's transaction, left open
    try:
        with (
            caplog.at_level(logging.WARNING, logger="eventstore"),
            pytest.raises(StoreUnavailableError, match="held the write lock for") as err,
        ):
            await asyncio.wait_for(wf.run(run_id="during"), 30)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert str(db) in str(err.value)
    assert "nothing of this write was made" in str(err.value)
    waits = [
        r.getMessage() for r in caplog.records if "waiting for the write lock" in r.getMessage()
    ]
    assert waits, caplog.records
    assert all(str(db) in m for m in waits)
    # Nothing was lost and the store was not failed: the same workflow writes again.
    assert await wf.run(run_id="after") == "ok"
    assert {r.run_id for r in wf.store.runs()} >= {"before", "after"}
    wf.store.close()


async def test_a_file_this_process_may_not_write_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's "attempt to write a readonly database" (a file or folder this process may
    not write: its permissions, its owner) names the store and says what to look at."""
    db = tmp_path / "runs.db"
    first = Sets(store=db)
    assert await first.run(run_id="before") == "ok"
    first.store.close()
    real = sqlite_mod.connect

    def read_only(*args: Any, **kw: Any) -> sqlite3.Connection:
        conn = real(*args, **kw)
        conn.execute("PRAGMA query_only = 1")  # as SQLite refuses a file it cannot write
        return conn

    monkeypatch.setattr(sqlite_mod, "connect", read_only)
    wf = Sets(store=db)
    with pytest.raises(WriterFailedError) as err:
        await wf.run(run_id="during")
    message = str(err.value)
    assert message.startswith(f"{db}: "), message
    assert "attempt to write a readonly database" in message, message
    assert "check their permissions and owner" in message
    monkeypatch.undo()
    wf.store.close()
    with EventStore(db, readonly=True) as store:  # nothing already committed was lost
        assert [r.run_id for r in store.runs()] == ["before"]


def test_workflow_run_on_a_locked_store_says_the_run_was_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the shell the same refusal is one line that says what became of the run."""
    monkeypatch.setattr(lock_wait, "WRITER_BUSY_MS", 100)
    monkeypatch.setattr(lock_wait, "LOCK_WAIT_S", 0.5)
    db = tmp_path / "runs.db"
    ok("run", db, "--workflow", "tests.flows:EchoesTypes", "--run-id", "before")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        result = invoke("run", db, "--workflow", "tests.flows:EchoesTypes", "--run-id", "locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("run locked was not started: StoreUnavailableError: "), (
        result.stdout
    )
    assert "held the write lock" in result.stdout
