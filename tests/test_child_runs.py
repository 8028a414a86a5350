"""Child runs (``ctx.run_workflow``): whose runs a workflow lists, a cancelled parent's
child, and the parent's timeout while it awaits a child."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore
from workflow import Context, StartEvent, StopEvent, Workflow, WorkflowCancelledError, step
from workflow.cli._operator import cancel_run

BOUND = 10.0  # seconds any await here may take at most (a bound, not a speed goal)


class Leaf(Workflow):
    """A child that sleeps ``ev.nap`` seconds, or forever without a ``nap``."""

    started: asyncio.Event | None = None

    @step
    async def work(self, ev: StartEvent) -> StopEvent:
        if self.started is not None:
            self.started.set()
        nap = ev.get("nap")
        if nap is None:
            await asyncio.Event().wait()
        await asyncio.sleep(nap)
        return StopEvent(result=f"slept {nap}")


class Trunk(Workflow):
    """A parent whose one step runs a ``Leaf`` child and returns its result."""

    def __init__(self, *args: Any, child_timeout: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.leaf = Leaf(store=self.store, timeout=child_timeout)

    @step
    async def grow(self, ctx: Context, ev: StartEvent) -> StopEvent:
        return StopEvent(result=await ctx.run_workflow(self.leaf, nap=ev.get("nap")))


def test_a_workflow_lists_its_own_runs_of_a_shared_store(tmp_path: Path) -> None:
    """``runs()`` lists every run of the store the parent and the child share (the named
    contract); ``runs(all_workflows=False)`` lists each workflow's own."""

    async def go() -> None:
        wf = Trunk(store=tmp_path / "s.db", timeout=None)
        handler = wf.run(nap=0)
        assert await asyncio.wait_for(handler, BOUND) == "slept 0"
        child_id = f"{handler.run_id}/grow/1/1"
        every = sorted([handler.run_id, child_id])
        assert sorted(r.run_id for r in wf.runs()) == every
        assert sorted(r.run_id for r in wf.leaf.runs()) == every
        assert [r.run_id for r in wf.runs(all_workflows=False)] == [handler.run_id]
        assert [r.run_id for r in wf.leaf.runs(all_workflows=False)] == [child_id]
        leaf = Leaf(store=wf.store)
        assert [r.run_id for r in leaf.runs(all_workflows=False)] == [child_id]

    asyncio.run(go())


async def child_cancelled(wf: Trunk, parent_id: str) -> str:
    """The id of the parent's child run, once it is cancelled (within BOUND seconds)."""
    child_id = f"{parent_id}/grow/1/1"
    for _ in range(int(BOUND / 0.01)):
        if wf.leaf.state_at(child_id).status == "cancelled":
            break
        await asyncio.sleep(0.01)
    assert wf.leaf.state_at(child_id).status == "cancelled"
    return child_id


def test_cancelling_a_parent_with_a_running_child_reports_nothing_to_asyncio(
    tmp_path: Path,
) -> None:
    """The cancelled child's outcome is not left for asyncio to report as an exception
    never retrieved: the child's log has it."""
    reported: list[dict[str, Any]] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, c: reported.append(c))
        wf = Trunk(store=tmp_path / "s.db", timeout=None)
        wf.leaf.started = asyncio.Event()
        handler = wf.run()
        await asyncio.wait_for(wf.leaf.started.wait(), BOUND)
        await handler.cancel_run()
        with pytest.raises(WorkflowCancelledError):
            await asyncio.wait_for(handler, BOUND)
        await child_cancelled(wf, handler.run_id)
        for _ in range(3):
            gc.collect()  # a Task's unretrieved exception is reported when it is collected
            await asyncio.sleep(0.01)

    asyncio.run(go())
    gc.collect()
    assert [c.get("message") for c in reported] == []


def test_a_parent_cancelled_from_another_process_cancels_its_child(tmp_path: Path) -> None:
    """`workflow cancel` of a parent awaiting a child (from another process: a store of
    its own here) ends the parent with its reason and cancels the child too, saying why."""
    db = tmp_path / "s.db"

    async def go() -> None:
        wf = Trunk(store=db, timeout=None)
        wf.leaf.started = asyncio.Event()
        handler = wf.run()
        await asyncio.wait_for(wf.leaf.started.wait(), BOUND)
        with EventStore(db) as other:
            cancel_run(other, handler.run_id, reason="stop")
        with pytest.raises(WorkflowCancelledError, match="was cancelled: stop"):
            await asyncio.wait_for(handler, BOUND)
        child_id = await child_cancelled(wf, handler.run_id)
        (rec,) = wf.store.records(child_id, kinds=["run_cancelled"])
        assert rec.data()["reason"] == f"its parent run {handler.run_id!r} was cancelled"
        assert rec.data()["via"] == "parent"
        wf.store.close()

    asyncio.run(go())


def test_the_parent_s_timeout_does_not_count_the_time_it_awaits_a_child(
    tmp_path: Path,
) -> None:
    """A parent of ``timeout=0.3`` awaits a child that works for 1 s: the child's time is
    the child's (its own timeout applies to it), so the parent finishes."""

    async def go() -> None:
        wf = Trunk(store=tmp_path / "s.db", timeout=0.3, child_timeout=None)
        assert await asyncio.wait_for(wf.run(nap=1.0), BOUND) == "slept 1.0"

    asyncio.run(go())


def test_a_child_is_held_to_its_own_timeout(tmp_path: Path) -> None:
    """The child's own timeout still applies: the parent's step gets the child's timeout
    error, so the parent fails with it."""
    from workflow import WorkflowTimeoutError

    async def go() -> None:
        wf = Trunk(store=tmp_path / "s.db", timeout=None, child_timeout=0.2)
        with pytest.raises(WorkflowTimeoutError):
            await asyncio.wait_for(wf.run(nap=5.0), BOUND)

    asyncio.run(go())
