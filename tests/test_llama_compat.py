"""LlamaIndex 2.26 public behaviours that its own users rely on, checked here in our words:
``workflow.context.state_store.DictState``, ``ctx.store.clear()``, the error of a missing
context value, ``handler.cancel()``."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, PrivateAttr

from workflow import (
    Context,
    ContextKeyError,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.context.state_store import DictState, InMemoryStateStore, StateStore

BOUND = 10.0  # seconds an await here may take at most (a bound, not a speed goal)


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
    # LlamaIndex's words first, as its tests match them.
    assert str(got.value) == "Path 'nope' not found in state: the context has no value at 'nope'"
    assert await ctx.store.get("nope", default=None) is None


class Held(Event):
    pass


class Hold(Workflow):
    """Writes a value, then holds its second step until the test opens the gate."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    @step
    async def first(self, ctx: Context, ev: StartEvent) -> Held:
        await ctx.store.set("k", 1)
        return Held()

    @step
    async def second(self, ctx: Context, ev: Held) -> StopEvent:
        self.started.set()
        await self.gate.wait()
        return StopEvent(result=await ctx.store.get("k"))


async def test_handler_cancel_leaves_the_run_resumable(tmp_path: Path) -> None:
    """LlamaIndex's deprecated ``handler.cancel()`` (a hard cancel): it warns, the handler
    is cancelled at once, nothing is recorded (the run is ``interrupted``), and a dict of
    its context taken before restores and finishes the same run."""
    wf = Hold(store=tmp_path / "h.db")
    handler = wf.run()
    await asyncio.wait_for(wf.started.wait(), BOUND)
    data = handler.ctx.to_dict()
    with pytest.warns(DeprecationWarning, match="cancel_run"):
        assert handler.cancel() is True
    await handler.cancel_run()  # a no-op once the handler is cancelled
    assert handler.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert [r.status for r in wf.runs()] == ["interrupted"]
    wf.gate.set()
    again = wf.run(ctx=Context.from_dict(wf, data))
    assert await asyncio.wait_for(again, BOUND) == 1
    assert again.run_id == handler.run_id
    with pytest.warns(DeprecationWarning, match="deprecated"):
        assert again.cancel() is False  # the run had ended


class Handle(StartEvent):
    """A start event carrying a live object in a private attribute, as LlamaIndex users do
    (pydantic never serializes private attributes)."""

    topic: str = "t"
    _lock: threading.Lock | None = PrivateAttr(default=None)
    _note: str = PrivateAttr(default="")


class UsesHandle(Workflow):
    @step
    async def go(self, ev: Handle) -> StopEvent:
        return StopEvent(result=(ev._lock is not None, ev._note, ev.topic))


async def test_a_private_attribute_the_log_cannot_hold_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The run takes the event as it is (the step sees the lock); the log records the event
    without that attribute (logged once), keeps the private attributes it can hold, and
    the event read back has the left-out one at its default."""
    wf = UsesHandle(store=tmp_path / "h.db")
    start = Handle(topic="x")
    start._lock = threading.Lock()
    start._note = "kept"
    with caplog.at_level(logging.WARNING, logger="eventstore.codec"):
        handler = wf.run(start_event=start)
        assert await handler == (True, "kept", "x")
        data = handler.ctx.to_dict()
    assert [r.getMessage().split(" ")[0] for r in caplog.records] == ["Handle._lock"]
    stored = wf.checkpoints(handler.run_id)[0]
    assert stored.event_types
    back = UsesHandle(store=tmp_path / "h.db").state_at(handler.run_id, stored.seq)
    (queued,) = back.queues["go"]
    assert (queued._lock, queued._note, queued.topic) == (None, "kept", "x")
    assert Context.from_dict(wf, data)


async def test_in_memory_state_store_names_the_store_of_every_context() -> None:
    """LlamaIndex's ``InMemoryStateStore`` imports and names ``ctx.store``'s class (before,
    during and after a run)."""
    wf = Notes(timeout=BOUND)
    ctx = Context(wf)
    assert isinstance(ctx.store, InMemoryStateStore)
    handler = wf.run(ctx=ctx)
    await handler
    assert isinstance(handler.ctx.store, InMemoryStateStore)
