"""The small operator commands: ``workflow cancel``, ``workflow --version`` and the
``workflow runs`` filters (``--status``, ``--workflow``, ``--since``, ``--parent``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.flows import Asker, ReportFlow
from tests.support.ui_server import waiting_asker
from tests.test_cli import invoke, ok, run_to_end
from workflow import WorkflowCancelledError
from workflow.cli._filters import RunFilter, parse_since, parse_statuses

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A store with a failed ReportFlow run 'rep', its fork 'fork' (finished) and a waiting
    Asker run 'ask'."""
    db = tmp_path / "mixed.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")

    async def more() -> None:
        wf = ReportFlow(store=db, timeout=None)
        at = next(c.seq for c in wf.checkpoints("rep") if c.step == "process")
        h = wf.run_from(("rep", at), updates={"var": 1})
        await h
        wf.store.close()

    asyncio.run(more())
    waiting_asker(db, "ask")
    return db


def run_ids(db: Path, *args: str) -> list[str]:
    return [r["run_id"] for r in json.loads(ok("runs", db, "--json", *args))]


def fork_id(db: Path) -> str:
    (row,) = [r for r in json.loads(ok("runs", db, "--json")) if r["parent_run_id"] == "rep"]
    return str(row["run_id"])


def test_version() -> None:
    """`workflow --version` names the installed package's version."""
    out = ok("--version")
    assert out.strip() == f"workflow, version {version('durable-workflows')}"


def test_runs_filters(mixed: Path) -> None:
    """Each filter keeps only the runs it names, alone and combined; the table says when
    nothing matched."""
    child = fork_id(mixed)
    assert sorted(run_ids(mixed)) == sorted(["rep", child, "ask"])
    assert run_ids(mixed, "--status", "failed") == ["rep"]
    assert sorted(run_ids(mixed, "--status", "failed,waiting")) == ["ask", "rep"]
    assert sorted(run_ids(mixed, "--workflow", "tests.flows:ReportFlow")) == sorted(["rep", child])
    assert run_ids(mixed, "--workflow", "Asker") == ["ask"]
    assert run_ids(mixed, "--workflow", "tests.flows:Nope") == []
    assert run_ids(mixed, "--parent", "rep") == [child]
    assert sorted(run_ids(mixed, "--since", "1h")) == sorted(["rep", child, "ask"])
    assert run_ids(mixed, "--since", "2999-01-01") == []
    assert run_ids(mixed, "--status", "finished", "--workflow", "ReportFlow") == [child]
    result = invoke("runs", mixed, "--status", "timed_out")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no runs match" in result.stderr
    table = ok("runs", mixed, "--status", "waiting")
    assert "ask" in table
    assert "waiting for HumanResponseEvent" in table
    assert "rep" not in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "done"], "unknown status done: use running, waiting, interrupted"),
        (["--since", "yesterday"], "'yesterday' is neither a duration ago (30m, 2h, 7d)"),
        (["--since", "5 parsecs"], "is neither a duration ago"),
    ],
)
def test_runs_filters_refuse_bad_values(mixed: Path, args: list[str], message: str) -> None:
    """A bad filter value is one line naming it, exit code 2, nothing listed."""
    result = invoke("runs", mixed, *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_filter_parsing() -> None:
    """Durations count back from now; ISO times without a zone are UTC."""
    now = 1_800_000_000.0
    assert parse_since("30m", now) == int((now - 1800) * 1e6)
    assert parse_since("2h", now) == int((now - 7200) * 1e6)
    assert parse_since("1.5d", now) == int((now - 1.5 * 86400) * 1e6)
    assert parse_since("1970-01-02") == 86400 * 1_000_000
    assert parse_since("1970-01-01T01:00+01:00") == 0
    assert parse_statuses("failed, finished") == {"failed", "finished"}
    with pytest.raises(ValueError, match="unknown status"):
        parse_statuses(",")
    assert RunFilter(parent="rep") != RunFilter()


def test_cancel_a_waiting_run_then_resume_it(mixed: Path) -> None:
    """A waiting run is cancelled (it then lists as cancelled) and `resume --cancelled`
    continues it: the waiter is still there to answer."""
    out = ok("cancel", mixed, "ask")
    assert out.startswith("cancelled run ask (run_cancelled at seq ")
    assert run_ids(mixed, "--status", "cancelled") == ["ask"]
    last = json.loads(ok("history", mixed, "ask", "--json"))[-1]
    assert last["kind"] == "run_cancelled"

    async def go() -> None:
        wf = Asker(store=mixed, timeout=None)
        with pytest.raises(Exception, match="cancelled"):
            wf.resume("ask")
        h = wf.resume("ask", cancelled=True)
        await h.wait_until_waiting(30)
        assert h.is_done() is False
        await h.cancel_run()
        with pytest.raises(WorkflowCancelledError):
            await h
        wf.store.close()

    asyncio.run(go())


def test_cancel_refuses_ended_and_unknown_runs(mixed: Path) -> None:
    """Cancelling a run that ended, or one that does not exist, is one line, exit 1, and
    writes nothing."""
    before = json.loads(ok("history", mixed, "rep", "--json"))
    result = invoke("cancel", mixed, "rep")
    assert result.exit_code == 1
    assert "run 'rep' has already failed; there is nothing to cancel" in result.stderr
    assert json.loads(ok("history", mixed, "rep", "--json")) == before
    result = invoke("cancel", mixed, "nope")
    assert result.exit_code == 1
    assert "nope" in result.stderr
    result = invoke("cancel", mixed.parent / "missing.db", "rep")
    assert result.exit_code == 1
    assert "no such file" in result.stderr
    assert not (mixed.parent / "missing.db").exists()


GATED = """
import asyncio, sys
from pathlib import Path
from workflow import StartEvent, StopEvent, Workflow, step

class Gated(Workflow):
    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        Path(sys.argv[2]).write_text("started")
        while not Path(sys.argv[3]).exists():
            await asyncio.sleep(0.02)
        return StopEvent(result="went through")

async def main() -> None:
    h = Gated(store=sys.argv[1], timeout=None).run(run_id="live")
    try:
        print("RESULT", await h, flush=True)
    except Exception as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)

asyncio.run(main())
"""


def test_cancel_a_run_another_process_executes(tmp_path: Path) -> None:
    """A run executing in another process is cancelled from outside: the step it was in
    finishes afterwards, but its commit never lands, and that process's handler raises
    WorkflowCancelledByUser, as for a cancel of its own (not "lost the run")."""
    db, started, gate = tmp_path / "live.db", tmp_path / "started", tmp_path / "gate"
    script = tmp_path / "gated.py"
    script.write_text(GATED)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), str(started), str(gate)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        out = ok("cancel", db, "live")
        assert "cancelled run live" in out
        gate.write_text("go")
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stdout.startswith("ERROR WorkflowCancelledByUser"), (stdout, stderr)
    assert "was cancelled" in stdout
    kinds = [r["kind"] for r in json.loads(ok("history", db, "live", "--json"))]
    assert kinds[-1] == "run_cancelled"
    assert "step_finished" not in kinds
    assert "run_finished" not in kinds
    assert run_ids(db, "--status", "cancelled") == ["live"]
