"""LlamaIndex 2.26 public behaviours that its own users rely on, checked here in our words:
``workflow.context.state_store.DictState``, ``ctx.store.clear()``, the error of a missing
context value, a cancelled handler's run restored from its dict at once."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from workflow import (
    Context,
    ContextKeyError,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.context.state_store import DictState, StateStore


class Noted(Event):
    pass


class Notes(Workflow):
    """Writes two keys, then (in the next step) clears them and writes one back."""

    @step
    async def write(self, ctx: Context[DictState], ev: StartEvent) -> Noted:
        async with ctx.store.edit_state() as state:
            assert isinstance(state, DictState)
            state.a = 1
            state["b"] = 2
        return Noted()

    @step
    async def reset(self, ctx: Context[DictState], ev: Noted) -> StopEvent:
        before = dict(await ctx.store.get_state())
        await ctx.store.clear()
        after_clear = dict(await ctx.store.get_state())
        await ctx.store.set("c", 3)
        return StopEvent(result=(before, after_clear))


async def test_dict_state_is_the_untyped_state_and_clear_empties_it() -> None:
    """``Context[DictState]`` is the untyped state (a dict with attribute access); clear()
    in a step removes every key, committed with the attempt."""
    wf = Notes()
    handler = wf.run()
    before, after = await handler
    assert before == {"a": 1, "b": 2}
    assert after == {}
    assert wf.state_at(handler.run_id).context == {"c": 3}
    assert isinstance(handler.ctx.store, StateStore)
    state = DictState(x=1)
    state.y = 2
    assert state == {"x": 1, "y": 2}
    assert state.x == 1


class Counts(BaseModel):
    n: int = 5
    tags: list[str] = []
    name: str


class Typed(Workflow):
    @step
    async def bump(self, ctx: Context[Counts], ev: StartEvent) -> StopEvent:
        await ctx.store.set("n", 7)
        await ctx.store.set("tags", ["x"])
        await ctx.store.set("name", "kept?")
        await ctx.store.clear()
        return StopEvent(result=await ctx.store.get("n"))


async def test_clear_resets_a_typed_state_to_its_defaults() -> None:
    """With a typed state, clear() puts each field back to its default; a required field
    has none, so it is removed."""
    wf = Typed()
    handler = wf.run()
    assert await handler == 5
    assert wf.state_at(handler.run_id).context == {"n": 5, "tags": []}


async def test_clear_on_an_idle_context_opens_the_next_run_empty() -> None:
    """On a context between runs, clear() is kept on it and opens its next run."""
    wf = Notes()
    ctx = Context(wf)
    await ctx.store.set("old", 1)
    await ctx.store.clear()
    assert await ctx.store.get("old", default=None) is None
    handler = wf.run(ctx=ctx)
    await handler
    assert "old" not in wf.state_at(handler.run_id).context


async def test_a_missing_value_is_a_key_error_and_a_value_error() -> None:
    """get() of a missing path without a default raises ContextKeyError, which is both the
    KeyError of a mapping and the ValueError LlamaIndex raises; the message names it."""
    ctx = Context(Notes())
    with pytest.raises(ValueError, match="no value at 'nope'"):
        await ctx.store.get("nope")
    with pytest.raises(KeyError):
        await ctx.store.get("nope.deeper")
    with pytest.raises(ContextKeyError) as got:
        await ctx.store.get("nope")
    assert str(got.value) == "context has no value at 'nope'"
    assert await ctx.store.get("nope", default=None) is None
