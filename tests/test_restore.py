"""Restore: resume, fork, crash recovery in another process, durable waits, ownership."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flows import (
    AlwaysDies,
    Asker,
    DiesOnce,
    EventA,
    EventB,
    ReportFlow,
    Sleeper,
    read_trace,
)
from tests.support.child import child
from workflow import (
    Checkpoint,
    CheckpointNotFoundError,
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    RecoveryLimitError,
    RunFinishedError,
    RunNotFoundError,
    RunOwnedError,
    RunSuspendedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowChangedError,
    step,
)

ROOT = Path(__file__).resolve().parent.parent
# On PostgreSQL a killed process's runs are free once its lease lapses (at once on SQLite,
# where the kernel frees them): the processes here lease for this long.
LEASE_S = 3.0


def run_flow(flow: str, db: str, *args: str, timeout: float = 60) -> tuple[int, str]:
    """Runs ``python -m tests.flows`` in a real subprocess; returns its exit code and output."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.flows", flow, str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DW_LEASE_TTL": str(LEASE_S)},
    )
    return proc.returncode, proc.stdout + proc.stderr


@contextlib.contextmanager
def started_flow(
    flow: str, db: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Starts ``python -m tests.flows`` (``env`` added to its environment) and yields the
    process and its run id once it printed it; killed if still alive, and reaped, after."""
    with child(
        [sys.executable, "-m", "tests.flows", flow, str(db), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DW_LEASE_TTL": str(LEASE_S), **(env or {})},
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("RUN "), line
        yield proc, line.split()[1]


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


async def test_user_report_second_scenario(location: str) -> None:
    """A failed finish is resumed with the missing value: only finish runs again."""
    db = location
    first = ReportFlow(store=db)
    handler = first.run()
    with pytest.raises(ValueError, match="var is not set"):
        await handler
    assert read_trace(db) == ["start", "process", "finish"]

    fresh = ReportFlow(store=db)
    assert fresh.state_at(handler.run_id).status == "failed"
    result = await fresh.resume(handler.run_id, updates={"var": "1"})
    assert result == "end: second: first"
    assert read_trace(db) == ["start", "process", "finish", "finish"]
    assert fresh.state_at(handler.run_id).status == "finished"


async def test_user_report_first_scenario_checkpoint_survives_json(location: str) -> None:
    """A checkpoint through JSON shows the middle event, of its exact class, queued."""
    wf = ReportFlow(store=location)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    cp = wf.checkpoints(h.run_id, event=EventA)[0]
    back = Checkpoint.model_validate(json.loads(json.dumps(cp.model_dump())))
    assert back == cp
    state = wf.state_at(back.run_id, back.seq)
    assert state.queues == {"process": [EventA(content="first")]}
    assert type(state.queues["process"][0]) is EventA
    forked = wf.run_from(back, updates={"var": "yes"})
    assert await forked == "end: second: first"


async def test_resume_finished_run_returns_stored_result(location: str) -> None:
    """Resuming a finished run runs nothing and returns its result; updates are refused."""
    db = location
    wf = ReportFlow(store=db)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    await wf.resume(h.run_id, updates={"var": 1})
    before = read_trace(db)
    assert await ReportFlow(store=db).resume(h.run_id) == "end: second: first"
    assert read_trace(db) == before
    with pytest.raises(RunFinishedError, match="run_from"):
        ReportFlow(store=db).resume(h.run_id, updates={"var": 2})


async def test_resume_unknown_run(location: str) -> None:
    """Resuming a run that does not exist names it."""
    with pytest.raises(RunNotFoundError, match="nope"):
        ReportFlow(store=location).resume("nope")


async def test_state_at_before_first_record(location: str) -> None:
    """A seq before the run's first record is a clear error."""
    wf = ReportFlow(store=location)
    h1 = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h1
    h2 = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h2
    first = wf.store.run(h2.run_id).first_seq
    assert first is not None
    assert wf.state_at(h2.run_id, first).seq == wf.checkpoints(h2.run_id)[0].seq
    with pytest.raises(CheckpointNotFoundError, match="no state at seq"):
        wf.state_at(h2.run_id, first - 1)


class Trio(Workflow):
    gate: asyncio.Event
    inside: int

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> EventA | None:
        for i in range(3):
            ctx.send_event(EventA(content=str(i)))
        return None

    @step(num_workers=3)
    async def work(self, ctx: Context, ev: EventA) -> EventB:
        self.inside += 1
        await self.gate.wait()
        return EventB(content=ev.content)

    @step
    async def join(self, ctx: Context, ev: EventB) -> StopEvent | None:
        got = ctx.collect_events(ev, [EventB] * 3)
        if got is None:
            return None
        return StopEvent(result=sorted(e.content for e in got))


async def test_fork_reruns_exactly_the_attempts_in_progress(location: str) -> None:
    """Forking where three attempts of a num_workers=3 step run re-runs exactly those."""
    wf = Trio(store=location)
    wf.gate, wf.inside = asyncio.Event(), 0
    h = wf.run()
    async with asyncio.timeout(5):
        while wf.inside < 3:  # noqa: ASYNC110 - polls the step's counter
            await asyncio.sleep(0.005)
    await wf.store.flush()
    mid = wf.state_at(h.run_id)
    assert sorted(p.event.content for p in mid.in_progress["work"]) == ["0", "1", "2"]
    wf.gate.set()
    assert await h == ["0", "1", "2"]

    wf.gate, wf.inside = asyncio.Event(), 0
    wf.gate.set()
    fork = wf.run_from((h.run_id, mid.seq))
    assert await fork == ["0", "1", "2"]
    fork_kinds = [(r.kind, r.step) for r in wf.store.records(fork.run_id)]
    assert fork_kinds.count(("step_started", "work")) == 3
    assert ("step_started", "start") not in fork_kinds
    assert wf.runs()[-1].parent_run_id == h.run_id


async def test_fork_leaves_parent_unchanged_and_forks_of_forks(location: str) -> None:
    """A fork copies nothing and never changes its parent; a fork of a fork works."""
    db = location
    wf = ReportFlow(store=db)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    parent_before = list(wf.store.records(h.run_id))
    cp = wf.checkpoints(h.run_id, step="start")[-1]
    f1 = wf.run_from(cp, updates={"var": 1})
    assert await f1 == "end: second: first"
    cp2 = next(c for c in wf.checkpoints(f1.run_id) if c.kind == "state_set")  # the update
    f2 = wf.run_from(cp2)
    assert await f2 == "end: second: first"
    assert list(wf.store.records(h.run_id)) == parent_before
    assert wf.state_at(f2.run_id).parent == (f1.run_id, cp2.seq)


def test_crash_in_third_step_resumes_in_another_process(location: str) -> None:
    """A process that dies in step three is resumed elsewhere without re-running 1 and 2."""
    db = location
    code, out = run_flow("dies_once", db, "run")
    assert code == 9, out
    run_id = out.split()[1]
    assert read_trace(db) == ["start", "process", "finish"]
    wait_for(lambda: DiesOnce(store=db).state_at(run_id).status == "interrupted", 2 * LEASE_S)
    code, out = run_flow("dies_once", db, "resume", run_id)
    assert code == 0, out
    assert "RESULT abc" in out
    assert read_trace(db) == ["start", "process", "finish", "finish"]
    state = DiesOnce(store=db).state_at(run_id)
    assert state.context == {"heavy": ["step one's result", "step two's result"]}


@pytest.mark.long  # a dozen processes, each killed: make test-long
def test_input_that_always_kills_is_counted(location: str) -> None:
    """An input that kills the process each time ends the run after max_recovery_attempts."""
    db = location
    code, out = run_flow("always_dies", db, "run")
    assert code == 9
    run_id = out.split()[1]
    codes: list[int] = []
    while len(codes) < 12:
        code, out = run_flow("always_dies", db, "resume", run_id)
        if "RunOwnedError" in out:  # the killed process's lease has not lapsed yet
            time.sleep(0.2)
            continue
        codes.append(code)
        if code != 9:
            break
    assert codes[-1] == 1
    assert "RecoveryLimitError" in out
    # The first run's start was not yet durable when it died; each resume's start is, so
    # ten resumes die and the eleventh refuses (max_recovery_attempts=10).
    assert len(codes) == 11
    assert AlwaysDies(store=db).state_at(run_id).status == "failed"
    error = AlwaysDies(store=db).state_at(run_id).error
    assert error is not None
    assert error["error"] == RecoveryLimitError.__name__


def test_live_owner_refuses_other_executors(location: str) -> None:
    """While a live process runs a run, resume elsewhere fails; once it is killed, it works."""
    db = location
    with started_flow("sleeper", db, "run") as (proc, run_id):
        wait_for(lambda: read_trace(db) == ["start"])

        async def try_resume() -> None:
            Sleeper(store=db).resume(run_id)

        with pytest.raises(RunOwnedError, match=run_id):
            asyncio.run(try_resume())
        proc.send_signal(signal.SIGSTOP)  # a stopped owner still owns its run
        with pytest.raises(RunOwnedError):
            asyncio.run(try_resume())
        assert Sleeper(store=db).state_at(run_id).status == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: Sleeper(store=db).state_at(run_id).status == "interrupted", 2 * LEASE_S)
        assert Sleeper(store=db).pending_runs() == [run_id]

        async def resume_short() -> str:
            wf = Sleeper(store=db)
            handler = wf.resume(run_id)
            assert handler._executor is not None  # the executor exists at once
            return str(await handler)

        # The re-delivered attempt sleeps its 60 s again: cancel after it started.
        async def resume_and_cancel() -> list[str]:
            wf = Sleeper(store=db)
            handler = wf.resume(run_id)
            await asyncio.sleep(0.2)
            await handler.cancel_run()
            with pytest.raises(Exception, match="cancelled"):
                await handler
            return read_trace(db)

        assert asyncio.run(resume_and_cancel()) == ["start", "start"]
        del resume_short


def test_durable_wait_across_processes(location: str) -> None:
    """A waiting run survives its process; send records the answer; resume finishes it."""
    db = location
    code, out = run_flow("asker", db, "run")
    assert code == 0, out
    assert "SUSPENDED" in out
    run_id = out.split()[1]
    wf = Asker(store=db)
    state = wf.state_at(run_id)
    assert state.status == "waiting"
    assert [w.awaited.split(":")[-1] for w in state.waiters] == ["HumanResponseEvent"]
    assert state.stream[0].prefix == "name?"
    wf.send(run_id, HumanResponseEvent(response="ada"), idempotency_key="answer-1")
    wf.send(run_id, HumanResponseEvent(response="ada"), idempotency_key="answer-1")

    async def finish() -> tuple[str, list[Event]]:
        handler = Asker(store=db).resume(run_id)
        replayed = [ev async for ev in handler.stream_events(replay=True)]
        return str(await handler), replayed

    result, replayed = asyncio.run(finish())
    assert result == "hello ada"
    assert [type(e).__name__ for e in replayed] == ["InputRequiredEvent", "StopEvent"]
    assert replayed[0].prefix == "name?"


def test_resumed_consumer_is_asked_again(location: str) -> None:
    """A consumer of a resumed waiting run sees the pending question, without replay."""
    db = location
    code, out = run_flow("asker", db, "run")
    assert code == 0, out
    run_id = out.split()[1]

    async def consume() -> list[str]:
        wf = Asker(store=db)
        handler = wf.resume(run_id)
        seen = []
        async for ev in handler.stream_events():
            seen.append(type(ev).__name__)
            if isinstance(ev, InputRequiredEvent):
                await handler.send_event(HumanResponseEvent(response="kim"))
        assert await handler == "hello kim"
        return seen

    assert asyncio.run(consume()) == ["InputRequiredEvent", "StopEvent"]
    assert read_trace(db) == ["ask", "ask"]


def test_answer_from_another_process_wakes_the_owner(location: str) -> None:
    """An answer sent by another process reaches the live owner's waiting run promptly."""
    db = location
    with started_flow("asker", db, "run", env={"ASKER_STAYS": "1"}) as (proc, run_id):
        wf = Asker(store=db)
        wait_for(lambda: run_id in {r.run_id for r in wf.runs()})
        wait_for(lambda: wf.state_at(run_id).status == "waiting")
        sent = time.monotonic()
        wf.send(run_id, HumanResponseEvent(response="zoe"))
        assert proc.stdout is not None
        out = proc.stdout.read()
        assert proc.wait(timeout=10) == 0
        assert "RESULT hello zoe" in out
        assert time.monotonic() - sent < 5


async def test_wait_answered_within_one_process() -> None:
    """A wait answered by handler.send_event continues the run in the same process."""
    wf = Asker(store=None)
    h = wf.run()
    questions = []
    async for ev in h.stream_events():
        questions.append(ev)
        if ev.get("prefix") == "name?":
            await h.send_event(HumanResponseEvent(response="bob"))
    assert await h == "hello bob"
    assert questions[0].prefix == "name?"


async def test_suspend_leaves_a_resumable_waiting_run(location: str) -> None:
    """Awaiting a suspended handler says so; the run stays waiting and resumable."""
    wf = Asker(store=location)
    h = wf.run()
    await h.wait_until_waiting(5)
    await h.suspend()
    with pytest.raises(RunSuspendedError):
        await h
    assert wf.state_at(h.run_id).status == "waiting"
    assert wf.pending_runs() == [h.run_id]
    wf.send(h.run_id, HumanResponseEvent(response="eve"))
    found = wf.recover()
    assert [(r.run_id, r.outcome) for r in found] == [(h.run_id, "resumed")]
    assert [await r.handler for r in found if r.handler] == ["hello eve"]


class ReportFlowV2(Workflow):
    """ReportFlow after a refactor that removed the 'finish' step."""

    @step
    async def start(self, ev: StartEvent) -> EventA:
        return EventA(content="first")

    @step
    async def process(self, ev: EventA) -> StopEvent:
        return StopEvent(result="v2")


async def test_changed_workflow_refuses_to_strand_work(location: str) -> None:
    """Resuming work for a step that no longer exists lists it, unless told to proceed."""
    db = location
    h = ReportFlow(store=db).run()
    with pytest.raises(ValueError, match="var"):
        await h
    with pytest.raises(WorkflowChangedError, match="'finish', which no longer exists"):
        ReportFlowV2(store=db).resume(h.run_id)
    handler = ReportFlowV2(store=db, timeout=0.5).resume(h.run_id, allow_stranded=True)
    with pytest.raises(TimeoutError):
        await handler


class Twice(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await asyncio.sleep(0.45)  # under the 0.5 s budget alone, over it after 0.2 s spent
        return StopEvent(result="ok")


async def test_timeout_counts_across_resumes(location: str) -> None:
    """Execution time is summed across resumes: a resumed run keeps its spent budget."""
    db = location
    wf = Twice(store=db, timeout=0.5)
    h = wf.run()
    await asyncio.sleep(0.2)
    await h.cancel_run()
    with pytest.raises(Exception, match="cancelled"):
        await h
    h2 = Twice(store=db, timeout=0.5).resume(h.run_id, cancelled=True)
    with pytest.raises(TimeoutError):
        await h2
    assert Twice(store=db).state_at(h.run_id).status == "timed_out"


async def test_run_id_starts_a_run_once(location: str) -> None:
    """run(run_id=...) of an existing run starts nothing new."""
    db = location
    wf = Twice(store=db)
    assert await wf.run(run_id="job-1") == "ok"
    assert await wf.run(run_id="job-1") == "ok"
    assert [r.run_id for r in wf.runs()] == ["job-1"]


_ = (EventB, StopEvent)
