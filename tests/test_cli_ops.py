"""The operating commands: ``workflow verify`` and ``workflow worker``, on an SQLite file and
on PostgreSQL (the shared ``location`` fixture; marker ``postgres``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.flows import ReportFlow
from tests.support.child import child
from tests.test_workers import Doubler
from workflow.cli import cli

ROOT = Path(__file__).resolve().parent.parent


async def recorded(db: str) -> str:
    wf = ReportFlow(store=db)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    await wf.resume(h.run_id, updates={"var": 1})
    wf.store.close()
    return h.run_id


def test_run_makes_the_store_where_none_is_yet(location: str) -> None:
    """``workflow run`` creates a missing store (its help says so), a new PostgreSQL schema
    as a new file, and the run in it is there to list."""
    spec = "tests.flows:Sleeper"
    result = CliRunner().invoke(
        cli, ["run", location, "--workflow", spec, "--data", '{"seconds": 0}', "--run-id", "r1"]
    )
    assert result.exit_code == 0, result.output
    assert "slept" in result.output
    listed = CliRunner().invoke(cli, ["runs", location, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [r["run_id"] for r in json.loads(listed.output)] == ["r1"]


async def test_verify_passes_for_today_s_code(location: str) -> None:
    """verify with the code that recorded the run passes and exits 0."""
    db = location
    run_id = await recorded(db)
    result = CliRunner().invoke(
        cli, ["verify", db, run_id, "--workflow", "tests.flows:ReportFlow", "--reexecute"]
    )
    assert result.exit_code == 0, result.output
    assert "verified 1 run(s)" in result.output
    assert result.output.strip().endswith(": ok")


async def test_verify_reports_divergence_and_fails(location: str) -> None:
    """verify with changed code lists the divergence and exits 1; --json says the same."""
    db = location
    run_id = await recorded(db)
    spec = "tests.test_verify:NewProcess"
    result = CliRunner().invoke(cli, ["verify", db, run_id, "--workflow", spec, "--reexecute"])
    assert result.exit_code == 1
    assert "[divergence]" in result.output
    assert "process" in result.output
    as_json = CliRunner().invoke(
        cli, ["verify", db, run_id, "--workflow", spec, "--reexecute", "--json"]
    )
    data = json.loads(as_json.output)
    assert data["ok"] is False
    assert data["problems"][0]["kind"] == "divergence"


def test_worker_command_runs_submitted_runs_and_stops_on_sigterm(location: str) -> None:
    """`workflow worker` executes submitted runs and exits cleanly on SIGTERM."""
    db = location
    wf = Doubler(store=db, timeout=None)
    ids = [wf.submit(n=i) for i in range(10)]
    with child(
        [
            sys.executable,
            "-m",
            "workflow",
            "worker",
            "--store",
            db,
            "--workflow",
            "tests.test_workers:Doubler",
            "--poll",
            "0.05",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
    ) as proc:
        # A hang guard, not a speed check: the worker process starts Python and imports the
        # engine first, which alone takes up to 8 s with both cores of a 2-core machine busy.
        deadline = time.monotonic() + 120
        while {r.status for r in wf.runs()} != {"finished"}:
            assert time.monotonic() < deadline, "runs not finished in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "worker stopped after 10 run(s)" in err
    assert [wf.state_at(i).result for i in ids] == [2 * n for n in range(10)]


async def test_verify_checks_only_the_named_workflow_s_runs(location: str) -> None:
    """Without run ids, verify checks the runs of the workflow it was given, not others."""
    db = location
    await recorded(db)
    other = Doubler(store=db)
    other.submit(n=1)
    other.store.close()
    result = CliRunner().invoke(cli, ["verify", db, "--workflow", "tests.flows:ReportFlow"])
    assert result.exit_code == 0, result.output
    assert "verified 1 run(s)" in result.output


def test_a_location_is_shown_without_its_password() -> None:
    """What ``workflow worker`` and ``workflow serve`` print of a PostgreSQL URL masks its
    password; a file path is shown as it is."""
    from workflow.cli._inspect import shown_location

    assert (
        shown_location("postgresql://app:s3cret@db:5432/runs")
        == "postgresql://app:***@db:5432/runs"
    )
    assert shown_location("postgres://app@db/runs") == "postgres://app@db/runs"
    assert shown_location("runs.db") == "runs.db"
