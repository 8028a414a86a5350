"""``StateConflictError``: an operator's read-modify-write of a live run's state that a
step's commit overtook is refused whole, instead of silently undoing the step's write.

The operator is the code holding the handler (``handler.ctx.store.edit_state()`` outside
any step). Inside steps a conflict never reaches user code: the attempt runs again.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from eventstore import EventStore
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StateConflictError,
    StopEvent,
    Workflow,
    WorkflowError,
    step,
)

BOUND = 20.0  # seconds: only a hang comes near it


class Again(Event):
    """Ask once more."""


class Tally(Workflow):
    """Counts the answers it is given in ``count``; ``stop`` ends it with the count."""

    @step
    async def begin(self, ctx: Context, ev: StartEvent) -> Again:
        await ctx.store.set("count", 0)
        return Again()

    @step
    async def ask(self, ctx: Context, ev: Again) -> Again | StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="more?")
        )
        count = await ctx.store.get("count") + 1
        await ctx.store.set("count", count)
        return StopEvent(result=count) if answer.response == "stop" else Again()


async def _count_is(wf: Workflow, run_id: str, value: int) -> None:
    """Waits until the run's committed count is ``value``."""
    async with asyncio.timeout(BOUND):
        while wf.state_at(run_id).context.get("count") != value:  # noqa: ASYNC110 - polls the log
            await asyncio.sleep(0.01)


async def test_an_operator_edit_overtaken_by_a_step_is_refused_whole(store: EventStore) -> None:
    """A step commits ``count`` while the operator's edit of it is open: leaving the edit
    raises StateConflictError naming the key, and nothing of the edit is written."""
    wf = Tally(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()

    async def overtaken_edit() -> None:
        async with handler.ctx.store.edit_state() as state:
            assert state["count"] == 0
            handler.ctx.send_event(HumanResponseEvent(response="more"))
            await _count_is(wf, handler.run_id, 1)
            state["count"] = 100
            state["note"] = "operator"

    with pytest.raises(StateConflictError, match="count") as info:
        await overtaken_edit()
    assert info.value.keys == ["count"]
    assert isinstance(info.value, WorkflowError)
    assert wf.state_at(handler.run_id).context == {"count": 1}
    handler.ctx.send_event(HumanResponseEvent(response="stop"))
    async with asyncio.timeout(BOUND):
        assert await handler == 2


async def test_an_operator_edit_nobody_overtook_is_written(store: EventStore) -> None:
    """Without a step's commit in between, the operator's edit is written and the run
    goes on from it."""
    wf = Tally(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    async with handler.ctx.store.edit_state() as state:
        state["count"] = 41
    assert wf.state_at(handler.run_id).context == {"count": 41}
    handler.ctx.send_event(HumanResponseEvent(response="stop"))
    async with asyncio.timeout(BOUND):
        assert await handler == 42


async def test_a_blind_operator_write_never_conflicts(store: EventStore) -> None:
    """``handler.ctx.store.set`` reads nothing, so a step's commit before it is no conflict:
    the operator's value is written over it."""
    wf = Tally(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    handler.ctx.send_event(HumanResponseEvent(response="more"))
    await _count_is(wf, handler.run_id, 1)
    await handler.ctx.store.set("count", 7)
    assert wf.state_at(handler.run_id).context == {"count": 7}
    handler.ctx.send_event(HumanResponseEvent(response="stop"))
    async with asyncio.timeout(BOUND):
        assert await handler == 8


class Counts(BaseModel):
    """A typed state: the answers so far."""

    count: int = 0


class TypedTally(Workflow):
    """Tally over a typed state (``Context[Counts]``)."""

    @step
    async def begin(self, ctx: Context[Counts], ev: StartEvent) -> Again:
        return Again()

    @step
    async def ask(self, ctx: Context[Counts], ev: Again) -> Again | StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="more?")
        )
        async with ctx.store.edit_state() as state:
            state.count += 1
        return StopEvent(result=state.count) if answer.response == "stop" else Again()


async def test_a_typed_state_edit_overtaken_by_a_step_is_refused(store: EventStore) -> None:
    """The same for a typed state: the edit's fields were read, a step changed one."""
    wf = TypedTally(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()

    async def overtaken_edit() -> None:
        async with handler.ctx.store.edit_state() as state:
            handler.ctx.send_event(HumanResponseEvent(response="more"))
            await _count_is(wf, handler.run_id, 1)
            state.count = 100

    with pytest.raises(StateConflictError, match="count"):
        await overtaken_edit()
    assert wf.state_at(handler.run_id).context["count"] == 1
    handler.ctx.send_event(HumanResponseEvent(response="stop"))
    async with asyncio.timeout(BOUND):
        assert await handler == 2
