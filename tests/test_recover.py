"""recover(): what a service's startup does with the runs a dead process left behind.

The runs are left by a real process (tests/support/recover_proc.py) killed with SIGKILL in the
middle of a step, on a real SQLite file; ``workflow recover`` is tested here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner, Result

from eventstore import EventStore, LogCorruptedError
from tests.support.child import child
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    Recovery,
    RecoveryLimitError,
    RunOwnedError,
    StartEvent,
    StopEvent,
    Worker,
    Workflow,
    WorkflowChangedError,
    WorkflowRuntimeError,
    step,
)
from workflow.cli import cli

ROOT = Path(__file__).resolve().parent.parent


class Middle(Event):
    n: int


class Answer(HumanResponseEvent):
    response: str


def held(wf: Workflow) -> bool:
    """Whether the test holds the second step (while ``<db>.hold`` exists)."""
    return wf.store.path is not None and Path(str(wf.store.path) + ".hold").exists()


def let_go(db: Path) -> None:
    """Lets held second steps finish, in whichever process resumes them."""
    Path(str(db) + ".hold").unlink()


class Pipeline(Workflow):
    """Two steps; the first may wait for a human, the second stays busy while held."""

    @step
    async def first(self, ctx: Context[Any], ev: StartEvent) -> Middle:
        n = ev.get("n")
        await ctx.store.set("n", n)
        if ev.get("tag") is not None:
            await ctx.store.set("tag", ev.get("tag"))
        if ev.get("ask"):
            answer = await ctx.wait_for_event(Answer, waiter_event=InputRequiredEvent())
            return Middle(n=int(answer.response))
        return Middle(n=n)

    @step
    async def second(self, ev: Middle) -> StopEvent:
        # Another process holds the step through a file: no asyncio.Event can reach here.
        while held(self):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if ev.n == 13:
            msg = "13 is unlucky"
            raise ValueError(msg)
        return StopEvent(result=ev.n * 10)


class PipelineChanged(Workflow):
    """Pipeline after a refactor merged its second step into the first."""

    @step
    async def first(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        return StopEvent(result=ev.get("n") * 10)


# The same workflow as far as the log can tell: a new version of the class, not a new class.
PipelineChanged.__name__ = PipelineChanged.__qualname__ = "Pipeline"

BUSY = ["run-0", "run-1", "run-2"]


@contextlib.contextmanager
def left_behind(db: Path, *modes: str, kill: bool = True) -> Iterator[subprocess.Popen[str]]:
    """A real process that leaves runs in the middle of a step; SIGKILLed (unless told not
    to), then the steps it held are let go for whoever resumes them."""
    with child(
        [sys.executable, "-m", "tests.support.recover_proc", str(db), *modes],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "READY\n"
        if kill:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            let_go(db)
        yield proc


def last_seqs(db: Path) -> dict[str, int | None]:
    """Each run's last seq, to tell that nothing was written."""
    with EventStore(db, readonly=True) as store:
        return {r.run_id: r.last_seq for r in store.runs()}


def outcomes(found: list[Recovery]) -> list[tuple[str, str]]:
    return [(r.run_id, r.outcome) for r in found]


async def test_recover_resumes_what_a_killed_process_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every run a SIGKILLed process left is resumed, reported and logged; all finish."""
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    wf = Pipeline(store=db)
    assert wf.pending_runs() == BUSY
    with caplog.at_level(logging.INFO, logger="workflow"):
        found = wf.recover()
    assert outcomes(found) == [(r, "resumed") for r in BUSY]
    assert all(r.error is None and r.handler is not None for r in found)
    assert [await r.handler for r in found if r.handler] == [0, 10, 20]
    assert wf.pending_runs() == []
    messages = [(rec.name, rec.levelname, rec.getMessage()) for rec in caplog.records]
    for run_id in BUSY:
        assert ("workflow", "INFO", f"recover: run {run_id} resumed") in messages
    assert (
        "workflow",
        "INFO",
        "recover: 3 pending run(s) of tests.test_recover:Pipeline: 3 resumed",
    ) in messages


async def test_recover_reports_a_resume_that_raises_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose resume raises is reported failed with the error, and logged; the others
    are still resumed, and the failed one is left as it was."""
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    with sqlite3.connect(db) as conn:
        # Damage run-1's last record (and drop the cache, which would skip reading it).
        rid = conn.execute("SELECT rid FROM runs WHERE run_id = 'run-1'").fetchone()[0]
        seq = conn.execute("SELECT max(seq) FROM log WHERE rid = ?", (rid,)).fetchone()[0]
        conn.execute("UPDATE log SET payload = '{\"id\": ' WHERE seq = ?", (seq,))
        conn.execute("DELETE FROM snapshots")
    before = last_seqs(db)
    wf = Pipeline(store=db)
    with caplog.at_level(logging.INFO, logger="workflow"):
        found = wf.recover()
    assert outcomes(found) == [("run-0", "resumed"), ("run-1", "failed"), ("run-2", "resumed")]
    bad = found[1]
    assert bad.handler is None
    assert isinstance(bad.error, LogCorruptedError)
    assert f"record seq {seq}" in str(bad.error)
    assert [await r.handler for r in found if r.handler] == [0, 20]
    assert last_seqs(db)["run-1"] == before["run-1"]
    logged = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert [rec.getMessage() for rec in logged] == [
        f"recover: run run-1 not resumed: LogCorruptedError: {bad.error}"
    ]
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[1] is bad.error


async def test_recover_leaves_stranded_work_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs whose stored work fits no step of the new code are reported stranded with the
    WorkflowChangedError and left as they were; the old code still resumes them."""
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    before = last_seqs(db)
    changed = PipelineChanged(store=db)
    with caplog.at_level(logging.INFO, logger="workflow"):
        found = changed.recover()
    assert outcomes(found) == [(r, "stranded") for r in BUSY]
    for r in found:
        assert r.handler is None
        assert isinstance(r.error, WorkflowChangedError)
        assert "is for step 'second', which no longer exists" in str(r.error)
    assert last_seqs(db) == before
    assert all(changed.state_at(r).status == "interrupted" for r in BUSY)
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 3
    assert warned[0].startswith("recover: run run-0 not resumed, stranded: WorkflowChangedError")
    found = Pipeline(store=db).recover()
    assert [await r.handler for r in found if r.handler] == [0, 10, 20]


async def test_recover_reports_a_class_that_does_not_resolve(tmp_path: Path) -> None:
    """A run whose context holds a class this program cannot resolve is stranded, with an
    error naming the class; the run is left as it was and the others are resumed."""
    assert "tests.recover_secret" not in sys.modules  # else the class would resolve
    db = tmp_path / "r.db"
    with left_behind(db, "secret"):
        pass
    before = last_seqs(db)
    found = Pipeline(store=db).recover()
    assert outcomes(found) == [(r, "resumed") for r in BUSY] + [("secret", "stranded")]
    assert found[3].handler is None
    assert "tests.recover_secret:Secret" in str(found[3].error)
    assert last_seqs(db)["secret"] == before["secret"]
    assert [await r.handler for r in found if r.handler] == [0, 10, 20]


async def test_recover_fails_a_run_past_its_recovery_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An input that was started max_recovery_attempts times is reported recovery_limit:
    the run is recorded as failed and its handler raises RecoveryLimitError."""
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    wf = Pipeline(store=db, max_recovery_attempts=1)  # one process died in each input
    with caplog.at_level(logging.INFO, logger="workflow"):
        found = wf.recover()
    assert outcomes(found) == [(r, "recovery_limit") for r in BUSY]
    for r in found:
        assert isinstance(r.error, RecoveryLimitError)
        assert r.error.step == "second"
        assert r.handler is not None
        with pytest.raises(RecoveryLimitError, match="max_recovery_attempts=1"):
            await r.handler
    assert [wf.state_at(r).status for r in BUSY] == ["failed"] * 3
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
    assert errors[0] == f"recover: run run-0 failed: RecoveryLimitError: {found[0].error}"
    assert wf.pending_runs() == []


class StalePipeline(Pipeline):
    """Pipeline whose pending runs were listed before another process took them."""

    stale: ClassVar[list[str]] = []

    def pending_runs(self) -> list[str]:
        return self.stale


async def test_recover_leaves_runs_another_live_process_holds(tmp_path: Path) -> None:
    """Runs a live process holds are not pending, and a run it took after it was listed is
    reported owned with the RunOwnedError; none is touched. Once it is killed, recover
    resumes them all."""
    db = tmp_path / "r.db"
    with left_behind(db, "ask", kill=False) as proc:
        before = last_seqs(db)
        wf = Pipeline(store=db)
        assert wf.recover() == []
        StalePipeline.stale = ["run-0", "ask"]
        found = StalePipeline(store=db).recover()
        assert outcomes(found) == [("run-0", "owned"), ("ask", "owned")]
        for r in found:
            assert r.handler is None
            assert isinstance(r.error, RunOwnedError)
            assert "another process" in str(r.error)
        assert proc.poll() is None
        assert last_seqs(db) == before
        assert wf.state_at("run-0").status == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        let_go(db)
    wf.send("ask", Answer(response="4"))  # answered: the waiting run has work now
    found = wf.recover()
    assert outcomes(found) == [(r, "resumed") for r in [*BUSY, "ask"]]
    assert [await r.handler for r in found if r.handler] == [0, 10, 20, 40]


async def test_recover_with_nothing_pending_reports_nothing() -> None:
    """A store without unfinished runs gives an empty report."""
    wf = Pipeline()
    await wf.run(n=1)
    assert wf.recover() == []


def test_recover_outside_async_code_says_so() -> None:
    """recover() resumes runs on the running event loop: without one it says where to call it."""
    with pytest.raises(WorkflowRuntimeError, match=r"wf.recover\(\) must be called inside async"):
        Pipeline().recover()


# ---------------------------------------------------------------------------- workflow recover


def recover_cli(db: Path, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["recover", str(db), "--workflow", "tests.test_recover:Pipeline", *args]
    )


def test_cli_recover_resumes_and_reports_each_run(tmp_path: Path) -> None:
    """`workflow recover` resumes every pending run here, waits, prints a line a run, exit 0."""
    db = tmp_path / "r.db"
    with left_behind(db, "ask"):
        pass
    result = recover_cli(db)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["run", "outcome", "result", "or", "error"]
    assert [ln.split(None, 1) for ln in lines[2:]] == [
        ["run-0", "resumed, finished  0"],
        ["run-1", "resumed, finished  10"],
        ["run-2", "resumed, finished  20"],
        ["ask", "waiting            for tests.test_recover:Answer"],
    ]
    assert "4 pending run(s): 3 resumed, 1 waiting" in result.stderr
    # The waiting run is left as it is, however often recover runs, until it is answered.
    before = last_seqs(db)["ask"]
    again = recover_cli(db)
    assert again.exit_code == 0
    assert [ln.split()[:3] for ln in again.stdout.splitlines()[2:]] == [["ask", "waiting", "for"]]
    assert last_seqs(db)["ask"] == before
    sent = CliRunner().invoke(
        cli,
        [
            "send",
            str(db),
            "ask",
            "--event",
            "tests.test_recover:Answer",
            "--data",
            '{"response": "4"}',
        ],
    )
    assert sent.exit_code == 0, sent.output
    answered = recover_cli(db)
    assert answered.exit_code == 0
    assert [ln.split(None, 1) for ln in answered.stdout.splitlines()[2:]] == [
        ["ask", "resumed, finished  40"]
    ]


def test_cli_recover_exits_1_when_a_run_fails(tmp_path: Path) -> None:
    """A run that fails after its resume is printed with its error and the exit status is 1."""
    db = tmp_path / "r.db"
    with left_behind(db, "unlucky"):
        pass
    result = recover_cli(db, "--json")
    assert result.exit_code == 1
    rows = {row["run_id"]: row for row in json.loads(result.stdout)}
    assert rows["unlucky"] == {
        "run_id": "unlucky",
        "outcome": "resumed",
        "status": "failed",
        "result": None,
        "error": "ValueError: 13 is unlucky",
        "waiting_for": [],
        "problems": [],
    }
    assert rows["run-2"]["status"] == "finished"
    assert rows["run-2"]["result"] == 20
    text = recover_cli(db)  # nothing is pending any more
    assert text.exit_code == 0
    assert "no pending runs" in text.stderr


def test_cli_recover_exits_1_on_stranded_runs(tmp_path: Path) -> None:
    """Runs the named code cannot continue are printed stranded with why; exit status 1."""
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    result = CliRunner().invoke(
        cli, ["recover", str(db), "--workflow", "tests.test_recover:PipelineChanged"]
    )
    assert result.exit_code == 1
    lines = result.stdout.splitlines()[2:]
    assert [ln.split()[:3] for ln in lines] == [
        [r, "stranded", "WorkflowChangedError:"] for r in BUSY
    ]
    assert "'second', which no longer exists" in lines[0]
    assert "3 pending run(s): 3 stranded" in result.stderr
    # Nothing was written: the right code recovers all of them.
    assert recover_cli(db).exit_code == 0


# ---------------------------------------------------------------------------- whose runs


class Twin(Workflow):
    """A workflow with the same name as one in another module (below)."""

    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="ours")


class OtherTwin(Workflow):
    """Another team's ``Twin``: same class name, another module, other steps."""

    @step
    async def theirs(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="theirs")


OtherTwin.__module__ = "billing.flows"
OtherTwin.__name__ = OtherTwin.__qualname__ = "Twin"


class ScriptTwin(Twin):
    """``Twin`` as ``python twin.py`` would record it: ``__main__:Twin``."""


ScriptTwin.__module__ = "__main__"
ScriptTwin.__name__ = ScriptTwin.__qualname__ = "Twin"


async def test_pending_runs_are_only_this_workflow_s(tmp_path: Path) -> None:
    """A same-named workflow class of another module is another workflow: its runs are not
    pending for this one, and recover() leaves them alone. A run recorded under
    ``__main__`` (a script's run of this workflow) is still this workflow's."""
    db = tmp_path / "r.db"
    ours = Twin(store=db)
    theirs = OtherTwin(store=db)
    ours.submit(run_id="ours")
    theirs.submit(run_id="theirs")
    ScriptTwin(store=db).submit(run_id="script")
    assert [r.workflow for r in ours.runs()] == [
        "tests.test_recover:Twin",
        "billing.flows:Twin",
        "__main__:Twin",
    ]
    assert ours.pending_runs() == ["ours", "script"]
    assert theirs.pending_runs() == ["theirs"]
    before = last_seqs(db)["theirs"]
    found = ours.recover()
    assert outcomes(found) == [("ours", "resumed"), ("script", "resumed")]
    assert [await r.handler for r in found if r.handler] == ["ours", "ours"]
    assert last_seqs(db)["theirs"] == before
    found = theirs.recover()
    assert outcomes(found) == [("theirs", "resumed")]
    assert found[0].handler is not None
    assert await found[0].handler == "theirs"


# ---------------------------------------------------------------------------- waiting runs


def test_runs_show_a_run_waiting_for_an_answer_as_waiting(tmp_path: Path) -> None:
    """A run whose process died while it waited for an answer is waiting, not interrupted:
    `wf.runs()` and `workflow runs` say so, and name the event it waits for; so does a run
    whose live owner is waiting."""
    db = tmp_path / "r.db"
    with left_behind(db, "ask", kill=False) as proc:
        live = CliRunner().invoke(cli, ["runs", str(db), "--json"])
        assert live.exit_code == 0, live.output
        shown = {row["run_id"]: row for row in json.loads(live.stdout)}
        assert shown["ask"]["status"] == "waiting"
        assert shown["run-0"]["status"] == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        let_go(db)
    wf = Pipeline(store=db)
    statuses = {r.run_id: (r.status, r.waiting_for) for r in wf.runs()}
    assert statuses["ask"] == ("waiting", ("tests.test_recover:Answer",))
    assert statuses["run-0"] == ("interrupted", ())
    text = CliRunner().invoke(cli, ["runs", str(db)])
    assert text.exit_code == 0, text.output
    rows = {ln.split()[0]: ln for ln in text.stdout.splitlines()[2:]}
    assert rows["ask"].split()[1:4] == ["waiting", "for", "Answer"]
    assert rows["run-0"].split()[1] == "interrupted"
    data = json.loads(CliRunner().invoke(cli, ["runs", str(db), "--json"]).stdout)
    shown = {row["run_id"]: row for row in data}
    assert shown["ask"]["status"] == "waiting"
    assert shown["ask"]["waiting_for"] == ["tests.test_recover:Answer"]
    assert shown["run-0"]["waiting_for"] == []


async def test_recover_leaves_a_waiting_run_without_an_answer_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that waits for an answer nobody sent is reported waiting and left as it is,
    however often recover runs: nothing is claimed, written or run again. Once its answer
    is in the inbox, recover resumes it and it takes the answer."""
    db = tmp_path / "r.db"
    with left_behind(db, "ask"):
        pass
    wf = Pipeline(store=db)
    found = wf.recover()
    assert outcomes(found) == [(r, "resumed") for r in BUSY] + [("ask", "waiting")]
    assert found[3].handler is None
    assert found[3].error is None
    assert [await r.handler for r in found if r.handler] == [0, 10, 20]
    before = last_seqs(db)["ask"]
    with caplog.at_level(logging.INFO, logger="workflow"):
        for _ in range(3):
            assert outcomes(wf.recover()) == [("ask", "waiting")]
    assert last_seqs(db)["ask"] == before
    messages = [rec.getMessage() for rec in caplog.records]
    assert "recover: run ask left waiting for tests.test_recover:Answer" in messages
    wf.send("ask", Answer(response="4"))
    found = wf.recover()
    assert outcomes(found) == [("ask", "resumed")]
    assert found[0].handler is not None
    assert await found[0].handler == 40


class Deadline(Workflow):
    """Waits a moment for an answer, then says it got none."""

    @step
    async def ask(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        try:
            answer = await ctx.wait_for_event(Answer, timeout=0.2)
        except TimeoutError:
            return StopEvent(result="no answer")
        return StopEvent(result=answer.response)


async def test_recover_resumes_a_waiting_run_whose_deadline_passed(tmp_path: Path) -> None:
    """A wait whose deadline passed while nobody ran it has something to do (time out):
    recover resumes it."""
    db = tmp_path / "r.db"
    wf = Deadline(store=db)
    handler = wf.run(run_id="late")
    await handler.wait_until_waiting()
    await handler.suspend()
    with contextlib.suppress(Exception):
        await handler
    assert [(r.run_id, r.status) for r in wf.runs()] == [("late", "waiting")]
    waits = wf.state_at("late").waiters
    assert waits[0].deadline is not None
    await asyncio.sleep(max(0.0, waits[0].deadline - time.time()) + 0.05)
    found = Deadline(store=db).recover()
    assert outcomes(found) == [("late", "resumed")]
    assert found[0].handler is not None
    assert await found[0].handler == "no answer"


async def test_recover_is_awaitable_as_well(tmp_path: Path) -> None:
    """`await wf.recover()` (how async code calls it) gives the same report as the plain
    call; the run is resumed once either way."""
    db = tmp_path / "r.db"
    wf = Twin(store=db)
    wf.submit(run_id="a")
    found = await wf.recover()
    assert outcomes(found) == [("a", "resumed")]
    assert found[0].handler is not None
    assert await found[0].handler == "ours"
    assert await wf.recover() == []
    wf.submit(run_id="b")
    plain = wf.recover()
    assert outcomes(plain) == [("b", "resumed")]
    assert await plain is plain  # awaiting a report that was not awaited yet: the same


async def test_a_worker_takes_a_waiting_run_once_its_deadline_passed(tmp_path: Path) -> None:
    """A worker leaves a run that only waits alone until its wait's deadline passes, then
    takes it (the wait times out)."""
    db = tmp_path / "r.db"
    wf = Deadline(store=db)
    handler = wf.run(run_id="late")
    await handler.wait_until_waiting()
    await handler.suspend()
    with contextlib.suppress(Exception):
        await handler
    worker = Worker(Deadline(store=db), poll_interval=0.05)
    assert worker._candidates() == []  # waiting, unanswered, before its deadline
    deadline = wf.state_at("late").waiters[0].deadline
    assert deadline is not None
    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.05)
    assert worker._candidates() == ["late"]
    task = asyncio.create_task(worker.run())
    while wf.state_at("late").status != "finished":  # noqa: ASYNC110 - polls the log
        await asyncio.sleep(0.02)
    worker.stop()
    assert await task == 1
    assert wf.state_at("late").result == "no answer"
