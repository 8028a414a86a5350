"""Memoized calls: a paid call made before a re-run is not paid again.

Each re-run that reuses recorded results is shown with a real process killed between two
memoized calls (SIGKILL, so nothing of it runs after): after a crash, after a
``wait_for_event``, after a conflict and after a retry policy's re-run. The calls are
counted in files, across processes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eventstore import EncodeError
from tests.support.memo_flows import FLOWS, calls
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    MemoizedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowCancelledError,
    WorkflowRuntimeError,
    memoized,
    step,
)
from workflow import _journal as J
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0


def killed_run(tmp_path: Path, flow: str, kill: str = "between") -> tuple[Path, Path]:
    """Runs ``flow`` in a process that kills itself at ``kill``; its store and counters."""
    db, counters = tmp_path / "runs.db", tmp_path / "counters"
    counters.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.memo_proc", str(db), flow, str(counters), kill],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    return db, counters


def resumed(db: Path, flow: str, counters: Path, before: Any = None) -> Any:
    async def go() -> Any:
        wf = FLOWS[flow](store=db, timeout=None, counters=counters)
        if before is not None:
            before(wf)
        try:
            return await asyncio.wait_for(wf.resume("agent"), BOUND)
        finally:
            wf.store.close()

    return asyncio.run(go())


def kinds(db: Path, flow: str, counters: Path) -> list[str]:
    wf = FLOWS[flow](store=db, counters=counters)
    try:
        return [r.kind for r in wf.store.records("agent")]
    finally:
        wf.store.close()


def test_a_crash_between_two_calls_pays_only_for_the_second(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "crash")
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 0)
    assert resumed(db, "crash", counters) == ["first(llamas)", "second(first(llamas))"]
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)


def test_the_rerun_after_a_wait_does_not_pay_again(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "wait", kill="waiting")
    assert calls(counters, "first") == 1

    def answer(wf: Workflow) -> None:
        wf.send("agent", HumanResponseEvent(response="yes"))

    assert resumed(db, "wait", counters, answer) == ["first(llamas)", "second(yes)"]
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)


def test_a_conflict_rerun_and_then_a_crash_pay_once(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "conflict")
    # The conflicted attempt paid for both calls (its conflict shows only as it commits);
    # its re-run reused "first", and the process died before "second".
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)
    assert J.STEP_CONFLICTED in kinds(db, "conflict", counters)
    assert resumed(db, "conflict", counters) == ["first(topic)", "second(first(topic))"]
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)


def test_a_retry_reuses_only_what_asks_to_be_reused(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "retry")
    # Attempt 1 failed; the retry reused "first" (reuse_on_retry) and paid "fresh" again.
    assert (calls(counters, "first"), calls(counters, "fresh")) == (1, 2)
    assert resumed(db, "retry", counters) == [
        "first(llamas)",
        "second(first(llamas)fresh(llamas))",
    ]
    # The crash re-run reused both, as the retry recorded them.
    assert (calls(counters, "first"), calls(counters, "fresh"), calls(counters, "second")) == (
        1,
        2,
        1,
    )


# ---------------------------------------------------------------------------- in process

PAID: list[str] = []


@memoized
async def llm(prompt: str) -> str:
    """A fake LLM: counted, then answered."""
    PAID.append(prompt)
    return f"<{prompt}>"


class Agent(Workflow):
    """Calls the fake LLM with a prompt made from context state; fails once when asked."""

    fail_once = False

    @step
    async def think(self, ctx: Context, ev: StartEvent) -> StopEvent:
        prompt = await ctx.store.get("prompt", default="plan")
        a = await llm(prompt)
        b = await llm(a)
        if self.fail_once:
            self.fail_once = False
            raise RuntimeError("a bug after two calls")
        return StopEvent(result=[a, b])


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, BOUND))


def test_a_resumed_failed_run_reuses_and_new_arguments_call_again(tmp_path: Path) -> None:
    PAID.clear()
    db = tmp_path / "runs.db"

    async def go() -> None:
        wf = Agent(store=db, timeout=None)
        wf.fail_once = True
        with pytest.raises(RuntimeError):
            await wf.run(run_id="r")
        assert PAID == ["plan", "<plan>"]
        # The bug fixed, the run resumed: nothing is paid again.
        assert await wf.resume("r") == ["<plan>", "<<plan>>"]
        assert PAID == ["plan", "<plan>"]
        # A fork from before the end whose prompt differs pays for what changed.
        start = next(c.seq for c in wf.checkpoints("r") if c.kind == J.STEP_STARTED)
        assert await wf.run_from(("r", start), {"prompt": "act"}) == ["<act>", "<<act>>"]
        assert PAID == ["plan", "<plan>", "act", "<act>"]
        wf.store.close()

    run(go())


class Errors(Workflow):
    cache = True
    tries = 0

    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        async def flaky() -> int:
            self.tries += 1
            raise KeyError("nope")

        try:
            await ctx.memo("flaky", flaky, cache_errors=self.cache)
        except MemoizedError as exc:
            return StopEvent(result=[exc.type_name, exc.message])
        return StopEvent(result="unreachable")


def test_errors_are_recorded_only_when_asked(tmp_path: Path) -> None:
    async def go() -> None:
        wf = Errors(store=tmp_path / "e.db", timeout=None)
        assert await wf.run(run_id="e") == ["KeyError", "'nope'"]
        rec = next(r for r in wf.store.records("e") if r.kind == J.MEMOIZED)
        assert rec.data()["error"] == {"type": "KeyError", "message": "'nope'"}
        nocache = Errors(store=tmp_path / "n.db", timeout=None)
        nocache.cache = False
        with pytest.raises(KeyError):
            await nocache.run(run_id="n")
        assert not [r for r in nocache.store.records("n") if r.kind == J.MEMOIZED]
        wf.store.close()
        nocache.store.close()

    run(go())


class Unstorable(Workflow):
    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.memo("obj", object)
        return StopEvent()


def test_a_result_the_log_cannot_hold_is_refused_at_the_call(tmp_path: Path) -> None:
    async def go() -> None:
        wf = Unstorable(store=tmp_path / "u.db", timeout=None)
        with pytest.raises(EncodeError, match="memoized call 'obj'"):
            await wf.run(run_id="u")
        wf.store.close()

    run(go())


def test_a_memoized_function_outside_a_step_says_so() -> None:
    with pytest.raises(WorkflowRuntimeError, match="inside a step"):
        run(llm("x"))


class Retried(Workflow):
    tries = 0

    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        async def shaky() -> str:
            self.tries += 1
            if self.tries < 3:
                raise ConnectionError("again")
            return "ok"

        policy = retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(5))
        return StopEvent(result=await ctx.memo("shaky", shaky, retry_policy=policy))


def test_the_called_function_takes_its_own_retry_policy(tmp_path: Path) -> None:
    async def go() -> None:
        wf = Retried(store=tmp_path / "r.db", timeout=None)
        assert await wf.run(run_id="r") == "ok"
        assert wf.tries == 3
        memos = [r.data() for r in wf.store.records("r") if r.kind == J.MEMOIZED]
        assert [(m["key"], m["name"], m["size"]) for m in memos] == [
            ("shaky", "Retried.s.<locals>.shaky", 4)
        ]
        wf.store.close()

    run(go())


# ---------------------------------------------------------------------------- durable sleep


def sleep_records(db: Path) -> tuple[float, int]:
    """The sleep's deadline (Unix time) and when its wait was resolved (µs since the epoch)."""
    wf = FLOWS["sleep"](store=db, counters=db.parent)
    try:
        records = list(wf.store.records("agent"))
    finally:
        wf.store.close()
    waiting: J.Waiting = next(r.data() for r in records if r.kind == J.WAITING)
    assert waiting["awaited"] == "workflow._timers:DurableSleep"
    assert waiting["deadline"] is not None
    resolved = next(r for r in records if r.kind == J.WAIT_RESOLVED)
    assert resolved.data()["id"] is None  # resolved by its deadline
    return waiting["deadline"], resolved.ts


def test_a_durable_sleep_survives_the_process_and_resumes_when_due(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "sleep", kill="waiting")
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 0)

    async def go() -> Any:
        wf = FLOWS["sleep"](store=db, timeout=None, counters=counters)
        try:
            # Not due yet: recover() leaves it; a resume by its owner wakes it when due.
            found = await wf.recover()
            outcomes = [r.outcome for r in found]
            result = await asyncio.wait_for(wf.resume("agent"), BOUND)
            return outcomes, result
        finally:
            wf.store.close()

    outcomes, result = asyncio.run(go())
    assert result == ["first(llamas)", "second(first(llamas))"]
    deadline, resolved_us = sleep_records(db)
    if outcomes == ["waiting"]:  # (a slow machine may have reached the deadline first)
        assert resolved_us >= deadline * 1e6
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)


def test_a_sleep_due_while_no_process_ran_is_taken_by_recover(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "sleep", kill="waiting")
    deadline = None

    async def go() -> Any:
        nonlocal deadline
        wf = FLOWS["sleep"](store=db, timeout=None, counters=counters)
        try:
            waiter = wf.state_at("agent").waiters[0]
            deadline = waiter.deadline
            assert deadline is not None
            while time.time() < deadline:  # noqa: ASYNC110 - the process is gone meanwhile
                await asyncio.sleep(0.05)
            found = await wf.recover()
            assert [r.outcome for r in found] == ["resumed"]
            handler = found[0].handler
            assert handler is not None
            return await asyncio.wait_for(handler, BOUND)
        finally:
            wf.store.close()

    assert asyncio.run(go()) == ["first(llamas)", "second(first(llamas))"]
    assert (calls(counters, "first"), calls(counters, "second")) == (1, 1)


class Naps(Workflow):
    """Short sleeps just wait; a bad duration is refused."""

    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.sleep(0.01)
        try:
            await ctx.sleep(float("nan"))
        except WorkflowRuntimeError as exc:
            return StopEvent(result=str(exc))
        return StopEvent(result="slept nan")


def test_a_short_sleep_records_nothing_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    async def go() -> Any:
        wf = Naps(store=tmp_path / "n.db", timeout=None)
        try:
            result = await wf.run(run_id="n")
            return result, [r.kind for r in wf.store.records("n")]
        finally:
            wf.store.close()

    result, got = asyncio.run(go())
    assert "finite, non-negative number of seconds" in result
    assert J.WAITING not in got


# ---------------------------------------------------------------------------- determinism

STAMP = [0]


class Stamped(Workflow):
    """Memoizes a call whose argument changes from one process (here: one call) to the next,
    when ``drift`` is set; its result is not used, so only the memo check can see it."""

    drift = False

    @step
    async def s(self, ctx: Context, ev: StartEvent) -> StopEvent:
        STAMP[0] += 1
        arg = f"at {STAMP[0]}" if self.drift else "fixed"
        await ctx.memo("ask", llm, arg)
        return StopEvent(result="done")


class Drifting(Stamped):
    drift = True


def test_replay_check_flags_memoized_calls_whose_arguments_drift() -> None:
    from workflow.testing import assert_replay_deterministic

    asyncio.run(assert_replay_deterministic(Stamped))
    with pytest.raises(AssertionError, match=r"memo key 'ask'.*not deterministic"):
        asyncio.run(assert_replay_deterministic(Drifting))


def test_verify_reexecutes_memoized_calls_from_the_log(tmp_path: Path) -> None:
    from workflow._verify import verify

    db = tmp_path / "v.db"

    async def record() -> None:
        wf = Stamped(store=db, timeout=None)
        await wf.run(run_id="v")
        wf.store.close()

    asyncio.run(record())
    PAID.clear()
    same = Stamped(store=db)
    assert verify(same, reexecute=True).ok
    assert PAID == []  # verify never pays: the result came from the log
    same.store.close()
    changed = Drifting(store=db)
    report = verify(changed, ["v"], reexecute=True)
    changed.store.close()
    assert not report.ok
    assert "memoized call 'ask'" in str(report.problems[0])
    assert PAID == []


# ---------------------------------------------------------------------------- failure grace


class Branch(Event):
    """One branch of a fan-out."""

    name: str


class Joined(Event):
    """A branch is done."""


class FanOut(Workflow):
    """Two branches: ``bad`` fails the run while ``good`` is still making its paid call."""

    broken = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.good_started = asyncio.Event()
        self.good_calls = 0

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Branch:
        ctx.send_event(Branch(name="good"))
        return Branch(name="bad")

    @step(num_workers=2)
    async def branch(self, ctx: Context, ev: Branch) -> Joined:
        if ev.name == "bad":
            if self.broken:
                await self.good_started.wait()
                raise RuntimeError("the bad branch broke")
            return Joined()
        self.good_started.set()
        await asyncio.sleep(0.2)  # still working when the other branch fails the run
        self.good_calls += 1
        await ctx.store.set("good", "paid once")
        return Joined()

    @step
    async def join(self, ctx: Context, ev: Joined) -> StopEvent | None:
        if ctx.collect_events(ev, [Joined, Joined]) is None:
            return None
        return StopEvent(result=await ctx.store.get("good"))


def test_a_failure_lets_running_siblings_commit_before_the_run_fails(tmp_path: Path) -> None:
    async def go() -> None:
        wf = FanOut(store=tmp_path / "f.db", timeout=None)
        with pytest.raises(RuntimeError, match="bad branch"):
            await asyncio.wait_for(wf.run(run_id="f"), BOUND)
        assert wf.good_calls == 1
        got = [r.kind for r in wf.store.records("f")]
        assert got.index(J.STEP_FINISHED, got.index(J.STEP_FAILED)) < got.index(J.RUN_FAILED)
        wf.broken = False
        assert await asyncio.wait_for(wf.resume("f"), BOUND) == "paid once"
        assert wf.good_calls == 1  # the resume re-ran only the failed branch
        wf.store.close()

    asyncio.run(go())


class LockedFanOut(FanOut):
    """FanOut's branches, but ``bad`` edits the state (from then on its attempt holds the
    run's state lock) and fails while ``good`` waits to edit the state too."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.bad_holds = asyncio.Event()

    @step(num_workers=2)
    async def branch(self, ctx: Context, ev: Branch) -> Joined:
        if ev.name == "bad":
            async with ctx.store.edit_state() as state:
                state["bad"] = "edited"
            self.bad_holds.set()
            await asyncio.sleep(0.05)  # good waits for the lock meanwhile
            raise RuntimeError("the bad branch broke")
        await self.bad_holds.wait()
        async with ctx.store.edit_state() as state:
            state["good"] = "edited once the lock was free"
        return Joined()

    @step
    async def join(self, ctx: Context, ev: Joined) -> StopEvent | None:
        if ctx.collect_events(ev, [Joined, Joined]) is None:
            return None
        return StopEvent(result="joined")


def test_a_failed_step_lets_go_of_the_state_lock_before_the_grace_period(
    tmp_path: Path,
) -> None:
    """A failing attempt that edited the state frees the lock once its failure is
    recorded: a sibling waiting to edit the state commits within the grace period (it
    was cancelled when the grace ran out, the lock still held)."""

    async def go() -> None:
        wf = LockedFanOut(store=tmp_path / "l.db", timeout=None)
        with pytest.raises(RuntimeError, match="bad branch"):
            await asyncio.wait_for(wf.run(run_id="l"), BOUND)
        got = [r.kind for r in wf.store.records("l")]
        assert got.index(J.STEP_FINISHED, got.index(J.STEP_FAILED)) < got.index(J.RUN_FAILED)
        state = wf.state_at("l")
        assert state.context["good"] == "edited once the lock was free"
        wf.store.close()

    asyncio.run(go())


class LockedRetry(LockedFanOut):
    """The same, but ``bad`` is retried after a second (and then succeeds)."""

    @step(num_workers=2, retry_policy=retry_policy(wait=wait_fixed(1), stop=stop_after_attempt(2)))
    async def branch(self, ctx: Context, ev: Branch) -> Joined:
        if ev.name == "bad" and self.bad_holds.is_set():
            return Joined()  # the retry
        return await LockedFanOut.branch(self, ctx, ev)


def test_a_step_waiting_to_retry_does_not_hold_the_state_lock(tmp_path: Path) -> None:
    """Its sibling edits the state during the retry's wait, not after it."""

    async def go() -> None:
        wf = LockedRetry(store=tmp_path / "r.db", timeout=None)
        assert await asyncio.wait_for(wf.run(run_id="r"), BOUND) == "joined"
        records = list(wf.store.records("r"))
        failed = next(i for i, r in enumerate(records) if r.kind == J.STEP_FAILED)
        again = next(i for i, r in enumerate(records) if i > failed and r.kind == J.STEP_STARTED)
        finished = [i for i, r in enumerate(records) if r.kind == J.STEP_FINISHED]
        assert any(failed < i < again for i in finished)  # good's, before bad's retry
        wf.store.close()

    asyncio.run(go())


def test_without_a_grace_period_the_sibling_is_cancelled(tmp_path: Path) -> None:
    async def go() -> None:
        wf = FanOut(store=tmp_path / "g.db", timeout=None)
        wf.failure_grace = 0
        with pytest.raises(RuntimeError, match="bad branch"):
            await asyncio.wait_for(wf.run(run_id="g"), BOUND)
        assert wf.good_calls == 0
        wf.broken = False
        assert await asyncio.wait_for(wf.resume("g"), BOUND) == "paid once"
        assert wf.good_calls == 1
        wf.store.close()

    asyncio.run(go())


# ---------------------------------------------------------------------------- child runs


def test_a_child_run_survives_its_parents_crash_and_is_not_duplicated(tmp_path: Path) -> None:
    db, counters = killed_run(tmp_path, "parent", kill="in_child")
    assert (calls(counters, "first"), calls(counters, "child_call")) == (1, 1)
    assert resumed(db, "parent", counters) == [
        "first(llamas)",
        "child_call(first(llamas))",
    ]
    assert (calls(counters, "first"), calls(counters, "child_call")) == (1, 1)
    wf = FLOWS["parent"](store=db, counters=counters)
    try:
        runs = sorted(r.run_id for r in wf.store.runs())
        assert runs == ["agent", "agent/agent/1/1"]
        assert wf.state_at("agent/agent/1/1").status == "finished"
        memo = [r.data() for r in wf.store.records("agent") if r.kind == J.MEMOIZED]
        assert [m["key"] for m in memo] == ["first", "run_workflow:ChildFlow"]
    finally:
        wf.store.close()


def test_cancelling_the_parent_cancels_the_child(tmp_path: Path) -> None:
    from tests.support.memo_flows import ParentFlow

    async def go() -> None:
        counters = tmp_path / "c"
        counters.mkdir()
        wf = ParentFlow(store=tmp_path / "p.db", timeout=None, counters=counters)
        wf.child.gate = asyncio.Event()  # the child never ends by itself
        handler = wf.run(run_id="p", topic="x")
        while calls(counters, "child_call") == 0:  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.01)
        await handler.cancel_run()
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handler, BOUND)
        for _ in range(500):
            if wf.state_at("p/agent/1/1").status == "cancelled":
                break
            await asyncio.sleep(0.01)
        assert wf.state_at("p/agent/1/1").status == "cancelled"
        wf.store.close()

    asyncio.run(go())


def test_workflow_runs_shows_the_child_under_its_parent(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from workflow.cli import cli

    db, counters = killed_run(tmp_path, "parent", kill="in_child")
    resumed(db, "parent", counters)
    out = CliRunner().invoke(cli, ["runs", str(db)])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if "agent" in line]
    assert lines[0].startswith("agent ")
    assert lines[1].startswith("└ agent/agent/1/1")
    got = CliRunner().invoke(cli, ["runs", str(db), "--json"])
    rows = json.loads(got.output)
    assert [(r["run_id"], r.get("child_of")) for r in rows] == [
        ("agent", None),
        ("agent/agent/1/1", "agent"),
    ]


@pytest.mark.postgres
def test_memoized_calls_and_child_runs_on_postgres(tmp_path: Path) -> None:
    from tests.conftest import postgres_store
    from tests.support.memo_flows import ParentFlow

    PAID.clear()

    async def go(pg: Any, counters: Path) -> None:
        wf = Agent(store=pg, timeout=None)
        wf.fail_once = True
        with pytest.raises(RuntimeError):
            await wf.run(run_id="r")
        assert await wf.resume("r") == ["<plan>", "<<plan>>"]
        assert PAID == ["plan", "<plan>"]
        parent = ParentFlow(store=pg, timeout=None, counters=counters)
        assert await parent.run(run_id="p", topic="pg") == ["first(pg)", "child_call(first(pg))"]
        assert sorted(r.run_id for r in pg.runs() if r.run_id.startswith("p")) == [
            "p",
            "p/agent/1/1",
        ]

    with postgres_store() as pg:
        asyncio.run(go(pg, tmp_path))
