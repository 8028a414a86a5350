"""LlamaIndex's calls on the context a run was started with, from outside the steps:
``await ctx.running_steps()``, ``ctx.stream_events()``, and the deprecated ``get_result()``
and ``streaming_queue``; before the context's first run each raises ContextStateError."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from workflow import (
    Context,
    ContextStateError,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowRuntimeError,
    step,
)
from workflow.events import StepStateChanged

BOUND = 10.0  # seconds an await here may take at most (a bound, not a speed goal)


class Progress(Event):
    n: int


class Slow(Workflow):
    """Streams its progress; ``slow`` holds until the test lets it go."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.go = asyncio.Event()
        self.inside = asyncio.Event()

    @step
    async def slow(self, ctx: Context, ev: StartEvent) -> Progress:
        ctx.write_event_to_stream(Progress(n=1))
        self.inside.set()
        await self.go.wait()
        return Progress(n=2)

    @step
    async def finish(self, ev: Progress) -> StopEvent:
        return StopEvent(result=f"done at {ev.n}")


async def test_before_the_first_run_each_call_raises_context_state_error(tmp_path: Path) -> None:
    ctx = Context(Slow(store=tmp_path / "s.db"))
    first = r"call wf\.run\(ctx=ctx\) first"
    with pytest.raises(ContextStateError, match=first):
        await ctx.running_steps()
    with pytest.raises(ContextStateError, match=first):
        ctx.stream_events()
    with pytest.warns(DeprecationWarning, match="get_result"):  # noqa: SIM117
        with pytest.raises(ContextStateError, match=first):
            ctx.get_result()


async def test_running_steps_names_the_step_running_then_none(tmp_path: Path) -> None:
    wf = Slow(store=tmp_path / "s.db")
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    await asyncio.wait_for(wf.inside.wait(), BOUND)
    assert await ctx.running_steps() == ["slow"]
    with (
        pytest.warns(DeprecationWarning, match="get_result"),
        pytest.raises(WorkflowRuntimeError, match="is not complete"),
    ):
        ctx.get_result()
    wf.go.set()
    assert await asyncio.wait_for(handler, BOUND) == "done at 2"
    assert await ctx.running_steps() == []
    with pytest.warns(DeprecationWarning, match="get_result"):
        assert ctx.get_result() == "done at 2"


async def test_the_context_streams_the_run_with_the_engine_events(tmp_path: Path) -> None:
    wf = Slow(store=tmp_path / "s.db")
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    wf.go.set()
    async with asyncio.timeout(BOUND):
        seen = [ev async for ev in ctx.stream_events()]
    assert [e.n for e in seen if isinstance(e, Progress)] == [1]
    assert any(isinstance(e, StepStateChanged) for e in seen)
    assert isinstance(seen[-1], StopEvent)
    assert seen[-1].result == "done at 2"
    assert await handler == "done at 2"


async def test_the_streaming_queue_copies_the_stream_up_to_its_stop(tmp_path: Path) -> None:
    wf = Slow(store=tmp_path / "s.db")
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    with pytest.warns(DeprecationWarning, match="streaming_queue"):
        queue = ctx.streaming_queue
    wf.go.set()
    got: list[Event] = []
    async with asyncio.timeout(BOUND):
        while not got or not isinstance(got[-1], StopEvent):
            got.append(await queue.get())
    assert [e.n for e in got if isinstance(e, Progress)] == [1]
    assert await handler == "done at 2"


async def test_a_context_of_a_run_not_executed_here_says_so(tmp_path: Path) -> None:
    wf = Slow(store=tmp_path / "s.db")
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    wf.go.set()
    await asyncio.wait_for(handler, BOUND)
    restored = Context.from_dict(wf, ctx.to_dict())
    with pytest.raises(ContextStateError, match=f"run {handler.run_id!r} of this context"):
        await restored.running_steps()


async def test_the_run_stream_is_read_once_by_context_or_handler(tmp_path: Path) -> None:
    """As in LlamaIndex: read to its end through the context, the run's stream is
    consumed; the context or the handler reading it again is told so."""
    wf = Slow(store=tmp_path / "s.db")
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    wf.go.set()
    async with asyncio.timeout(BOUND):
        assert [ev async for ev in ctx.stream_events()]
    await handler
    with pytest.raises(WorkflowRuntimeError, match="already been consumed"):
        [ev async for ev in ctx.stream_events()]
    with pytest.raises(WorkflowRuntimeError, match="already been consumed"):
        [ev async for ev in handler.stream_events()]
    assert [ev async for ev in handler.stream_events(replay=True)]
