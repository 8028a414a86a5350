"""The state store's rules as LlamaIndex 2.26.1 keeps them: no writer inside one's own
``edit_state()`` block, ``clear()`` to the state's current model, ``is_running`` in a step
deprecated, and the messages its tests match on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from workflow import (
    Context,
    ContextSerdeError,
    ContextStateError,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.context.state_store import DictState, InMemoryStateStore

BOUND = 10.0


async def _writers_refused(store: Any) -> list[str]:
    """Calls each writer inside an ``edit_state()`` block of ``store``; the messages."""
    refused: list[str] = []
    async with store.edit_state() as state:
        state["touched"] = True
        writers: list[Awaitable[Any]] = [
            store.set("foo", 1),
            store.set("", 1),
            store.set_state(DictState()),
            store.clear(),
            store.delete("touched"),
        ]
        for call in writers:
            with pytest.raises(RuntimeError, match="writer called inside edit_state") as info:
                await call
            refused.append(str(info.value))
        with pytest.raises(RuntimeError, match="edit_state"):
            async with store.edit_state():
                pass
        assert await store.get("touched", default=None) in (True, None)  # reads go on
    return refused


async def test_a_standalone_store_refuses_writers_inside_its_edit() -> None:
    store = InMemoryStateStore(DictState())
    refused = await _writers_refused(store)
    assert "ctx.store.set() in an edit_state() block" in refused[0]
    assert await store.get("touched") is True  # the block's own edit is written
    assert await store.get("foo", default="none") == "none"
    # After the block, writers work again.
    await store.set("foo", 2)
    assert await store.get("foo") == 2


class Edits(Workflow):
    """Edits the state in a step and calls each writer inside the block."""

    @step
    async def edit(self, ctx: Context, ev: StartEvent) -> StopEvent:
        refused = await _writers_refused(ctx.store)
        await ctx.store.set("after", 1)  # the block is over: a writer again
        return StopEvent(result=(len(refused), await ctx.store.get("touched")))


async def test_a_step_and_an_operator_get_the_same_refusal(tmp_path: Path) -> None:
    wf = Edits(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    assert await asyncio.wait_for(handler, BOUND) == (5, True)
    state = wf.state_at(handler.run_id).context
    assert (state["touched"], state["after"]) == (True, 1)
    assert "foo" not in state
    # Outside the steps (the run ended: its idle context) the same rule.
    ctx = handler.ctx
    await _writers_refused(ctx.store)
    assert await ctx.store.get("touched") is True


async def test_other_tasks_write_while_one_edits() -> None:
    """The refusal is the editing task's own: another task's writer is not refused."""
    store = InMemoryStateStore(DictState())
    inside = asyncio.Event()
    go_on = asyncio.Event()

    async def edit() -> None:
        async with store.edit_state() as state:
            state["x"] = 1
            inside.set()
            await go_on.wait()

    task = asyncio.create_task(edit())
    await inside.wait()
    await store.set("y", 2)
    go_on.set()
    await task
    assert (await store.get("x"), await store.get("y")) == (1, 2)


class Parent(BaseModel):
    a: int = 0


class Child(Parent):
    b: int = 0


async def test_clear_resets_to_the_states_current_model() -> None:
    store = InMemoryStateStore(Parent())
    await store.set_state(Child(a=1, b=7))
    assert await store.get_state() == Child(a=1, b=7)
    assert await store.get("b") == 7
    await store.clear()
    state = await store.get_state()
    assert isinstance(state, Child)
    assert (state.a, state.b) == (0, 0)


class Checks(Workflow):
    @step
    async def check(self, ctx: Context, ev: StartEvent) -> StopEvent:
        return StopEvent(result=ctx.is_running)


async def test_is_running_inside_a_step_is_true_and_deprecated(tmp_path: Path) -> None:
    ctx = Context(Checks(store=tmp_path / "s.db", timeout=BOUND))
    assert not ctx.is_running
    with pytest.warns(DeprecationWarning, match="is_running called from within a step"):
        assert await Checks(store=tmp_path / "s.db", timeout=BOUND).run() is True


async def test_calls_before_the_first_run_say_so_in_llamaindex_words(tmp_path: Path) -> None:
    ctx = Context(Checks(store=tmp_path / "s.db", timeout=BOUND))
    with pytest.raises(ContextStateError, match=r"send_event.*called before workflow started"):
        ctx.send_event(Event())
    with pytest.raises(ContextStateError, match="requires a running workflow"):
        await ctx.running_steps()
    with pytest.raises(ContextStateError, match="requires a running workflow"):
        ctx.stream_events()


def test_a_dict_of_another_store_type_is_named() -> None:
    sql = {"store_type": "sql", "run_id": "run-1", "state_type": "DictState"}
    with pytest.raises(ValueError, match="Cannot parse store_type 'sql'") as info:
        InMemoryStateStore.from_dict(sql)
    assert isinstance(info.value, ContextSerdeError)


class SnapshotsInside(Workflow):
    """The docs' "snapshot after each document" step: ``ctx.to_dict()`` inside the step."""

    @step
    async def convert(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("converted", ["a"])
        try:
            ctx.to_dict()
        except ContextStateError as exc:
            return StopEvent(result=str(exc))
        return StopEvent(result="no error")


async def test_to_dict_inside_a_step_is_refused_as_in_llamaindex(tmp_path: Path) -> None:
    """Inside a step the dict would lack what the attempt wrote (not committed yet): a
    restore from it did the step's work again, silently. LlamaIndex refuses the call."""
    wf = SnapshotsInside(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    said = await asyncio.wait_for(handler, BOUND)
    assert said.startswith("to_dict is only available from handler code")
    assert handler.ctx.to_dict()["seq"] > 0  # from outside the steps, as before


def test_a_missing_attribute_of_the_untyped_state_is_named_as_llamaindex_names_it() -> None:
    state = DictState(x=1)
    assert state.x == 1
    with pytest.raises(AttributeError, match="'DictState' object has no attribute 'missing'"):
        _ = state.missing
    assert not hasattr(state, "missing")


class Seeds(Workflow):
    @step
    async def pass_through(self, ctx: Context, ev: StartEvent) -> StopEvent:
        return StopEvent(result="done")


class Reads(Workflow):
    @step
    async def check(self, ctx: Context, ev: StartEvent) -> StopEvent:
        return StopEvent(result=f"{await ctx.store.get('existing')}-{await ctx.store.get('added')}")


async def test_a_finished_runs_state_carries_over_to_another_workflow(tmp_path: Path) -> None:
    """As in LlamaIndex: ``Context.from_dict(other_wf, ctx.to_dict())`` of a finished run
    (or of a context that never ran) takes its values into the other workflow's next run."""
    wf = Seeds(store=tmp_path / "s.db", timeout=BOUND)
    ctx = Context(wf)
    await ctx.store.set("existing", "orig")
    assert await wf.run(ctx=ctx) == "done"
    reader = Reads(store=tmp_path / "s.db", timeout=BOUND)
    restored = Context.from_dict(reader, ctx.to_dict())
    await restored.store.set("added", "new")
    assert await reader.run(ctx=restored) == "orig-new"
    never_ran = Context(Seeds(store=tmp_path / "s.db"))
    await never_ran.store.set("existing", "seeded")
    again = Context.from_dict(reader, never_ran.to_dict())
    await again.store.set("added", "too")
    assert await reader.run(ctx=again) == "seeded-too"


class Fails(Workflow):
    @step
    async def fail(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("existing", "x")
        raise ValueError("not ok")


async def test_an_unfinished_runs_dict_stays_with_its_workflow(tmp_path: Path) -> None:
    wf = Fails(store=tmp_path / "s.db", timeout=BOUND)
    ctx = Context(wf)
    with pytest.raises(ValueError, match="not ok"):
        await wf.run(ctx=ctx)
    with pytest.raises(ContextSerdeError, match="only the state of a finished run"):
        Context.from_dict(Reads(store=tmp_path / "s.db"), ctx.to_dict())


class EditsFromATask(Workflow):
    """A step whose edit_state block starts a task that writes the state."""

    @step
    async def edit(self, ctx: Context, ev: StartEvent) -> StopEvent:
        async with ctx.store.edit_state() as state:
            state["b"] = 1
            try:
                await asyncio.wait_for(ctx.store.set("b", 2), BOUND)
            except RuntimeError as exc:
                said = str(exc)
            else:
                said = "no error"
        return StopEvent(result=(said, await ctx.store.get("b")))


async def test_a_task_of_the_editing_step_is_refused_too(tmp_path: Path) -> None:
    """A task the block starts writes as its attempt: refused like the block's own code
    (the block's end wrote its state over the task's write, silently; LlamaIndex blocks
    such a writer until the block ends)."""
    said, b = await EditsFromATask(store=tmp_path / "s.db", timeout=BOUND).run()
    assert said.startswith("writer called inside edit_state")
    assert b == 1
