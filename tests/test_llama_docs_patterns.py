"""LlamaIndex's documented patterns that differed here, each checked as its docs write it
(and as LlamaIndex 2.26.1 behaves): a stream left with ``break`` and read again, a step
reading the context of a workflow it ran, a stop event ending what runs next."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from workflow import (
    Context,
    ContextKeyError,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    RunSuspendedError,
    StartEvent,
    StopEvent,
    WaitTimeoutError,
    Workflow,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
    step,
)
from workflow._verify import verify
from workflow.cli._running import _settle as settle_outcome
from workflow.testing import assert_replay_deterministic

BOUND = 10.0


class Asked(InputRequiredEvent):
    """A question; the answer is the prefix's."""

    prefix: str


class Answered(HumanResponseEvent):
    """An answer to an :class:`Asked`."""

    response: str


class TwoQuestions(Workflow):
    """Asks two questions in turn, with ``wait_for_event``, and returns the answers."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        answers = []
        for prefix in ("q1", "q2"):
            got = await ctx.wait_for_event(
                Answered, waiter_event=Asked(prefix=prefix), waiter_id=prefix
            )
            answers.append(got.response)
        return StopEvent(result=answers)


async def test_a_stream_left_with_break_goes_on_where_it_stopped(tmp_path: Path) -> None:
    """The docs' human-in-the-loop loop: break at the question, answer, stream again. The
    second stream starts after the question the first took (it replayed the stream from
    its start, so the first question was answered twice and the second never)."""
    handler = TwoQuestions(store=tmp_path / "s.db", timeout=BOUND).run()
    asked: list[str] = []
    async for ev in handler.stream_events():
        if isinstance(ev, Asked):
            asked.append(ev.prefix)
            break
    handler.ctx.send_event(Answered(response="answer-to-" + asked[-1]))
    async for ev in handler.stream_events():
        if isinstance(ev, Asked):
            asked.append(ev.prefix)
            handler.ctx.send_event(Answered(response="answer-to-" + ev.prefix))
    assert await asyncio.wait_for(handler, BOUND) == ["answer-to-q1", "answer-to-q2"]
    assert asked == ["q1", "q2"]


class Counted(Event):
    """One of the events the counting run streams."""

    n: int


class Streams(Workflow):
    """Streams four events, then stops."""

    @step
    async def go(self, ctx: Context, ev: StartEvent) -> StopEvent:
        for n in range(4):
            ctx.write_event_to_stream(Counted(n=n))
        return StopEvent(result="done")


async def test_each_event_of_the_stream_is_read_once_across_consumers(tmp_path: Path) -> None:
    handler = Streams(store=tmp_path / "s.db", timeout=BOUND).run()
    first: list[Any] = []
    gen = handler.stream_events()
    async for ev in gen:
        first.append(ev.n)
        if len(first) == 2:
            break
    await gen.aclose()
    rest = [getattr(ev, "n", type(ev).__name__) async for ev in handler.stream_events()]
    assert first == [0, 1]
    assert rest == [2, 3, "StopEvent"]
    assert await handler == "done"
    # With replay the whole recorded stream is read again.
    again = [getattr(ev, "n", None) async for ev in handler.stream_events(replay=True)]
    assert again == [0, 1, 2, 3, None]


class Inner(Workflow):
    """Keeps ``x`` in its context."""

    @step
    async def keep(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("inner_key", ev.x)
        return StopEvent(result=ev.x)


class Outer(Workflow):
    """Runs :class:`Inner` from a step, then reads and writes that run's context."""

    def __init__(self, inner: Inner, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = inner

    @step
    async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("outer_key", "o")
        handler = self.inner.run(x=3)
        await handler
        seen: dict[str, Any] = {"inner": await handler.ctx.store.get("inner_key")}
        try:
            seen["outer"] = await handler.ctx.store.get("outer_key")
        except ContextKeyError:
            seen["outer"] = "missing"
        seen["inner_state"] = (await handler.ctx.store.get_state()).to_dict()
        await handler.ctx.store.set("inner_note", "from outer")
        seen["own"] = await ctx.store.get("outer_key")
        seen["own_note"] = await ctx.store.get("inner_note", default="none")
        return StopEvent(result=seen)


async def test_a_step_reads_the_context_of_a_run_it_made_not_its_own(tmp_path: Path) -> None:
    """``handler.ctx`` of another run, inside a step, is that run's context (it acted on
    the calling attempt: reads gave the outer run's values, writes failed)."""
    inner = Inner(store=tmp_path / "inner.db", timeout=BOUND)
    outer = Outer(inner, store=tmp_path / "outer.db", timeout=BOUND)
    seen = await asyncio.wait_for(outer.run(), BOUND)
    assert seen["inner"] == 3
    assert seen["outer"] == "missing"
    assert seen["inner_state"] == {"inner_key": 3}
    assert seen["own"] == "o"
    assert seen["own_note"] == "none"  # the write went to the inner run's context
    assert inner.runs()[0].run_id != outer.runs()[0].run_id


class Sends(Workflow):
    """A step that sends an event into another (live) run from inside its own step."""

    def __init__(self, other: TwoQuestions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.other = other

    @step
    async def drive(self, ctx: Context, ev: StartEvent) -> StopEvent:
        handler = self.other.run()
        async for got in handler.stream_events():
            if isinstance(got, Asked):
                handler.ctx.send_event(Answered(response="from-step-" + got.prefix))
        return StopEvent(result=await handler)


async def test_a_step_answers_another_runs_question_through_its_context(tmp_path: Path) -> None:
    """``handler.ctx.send_event`` on another run from inside a step reaches that run (it
    was taken as the calling step's own send, routed in the wrong workflow)."""
    other = TwoQuestions(store=tmp_path / "other.db", timeout=BOUND)
    wf = Sends(other, store=tmp_path / "s.db", timeout=BOUND)
    assert await asyncio.wait_for(wf.run(), BOUND) == ["from-step-q1", "from-step-q2"]


class Query(Event):
    """One query for the serial worker."""

    query: str


LOG: list[str] = []


class Serial(Workflow):
    """Three queries to a one-worker step, the first of which stops the run."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Query | None:
        for q in ("Query 1", "Query 2", "Query 3"):
            ctx.send_event(Query(query=q))
        return None

    @step(num_workers=1)
    async def work(self, ev: Query) -> StopEvent:
        LOG.append("start " + ev.query)
        await asyncio.sleep(0.01)
        LOG.append("end " + ev.query)
        return StopEvent(result=ev.query)


@pytest.mark.parametrize("store", ["file", "memory"])
async def test_no_attempt_starts_after_the_stop_event(tmp_path: Path, store: str) -> None:
    """The docs' concurrency example with one worker: the first query's stop ends the run;
    the next query's attempt began (and ran to its first await) after it."""
    LOG.clear()
    wf = Serial(store=tmp_path / "s.db" if store == "file" else None, timeout=BOUND)
    assert await asyncio.wait_for(wf.run(), BOUND) == "Query 1"
    await asyncio.sleep(0.05)
    assert LOG == ["start Query 1", "end Query 1"]


class Untyped(Workflow):
    """Keeps two keys in an untyped state and returns how ``get_state`` dumps it."""

    @step
    async def keep(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("a", 1)
        await ctx.store.set("b", [1, 2])
        state = await ctx.store.get_state()
        return StopEvent(result=(state.model_dump(), state.to_dict(), state.a))


async def test_an_untyped_state_dumps_as_llamaindex_dict_state(tmp_path: Path) -> None:
    """``get_state()`` of an untyped state is a ``DictState``: ``model_dump()`` gives
    LlamaIndex's ``{"_data": {...}}``, ``to_dict()`` the plain dict (a copy)."""
    dumped, plain, a = await Untyped(store=tmp_path / "s.db", timeout=BOUND).run()
    assert dumped == {"_data": {"a": 1, "b": [1, 2]}}
    assert plain == {"a": 1, "b": [1, 2]}
    assert type(plain) is dict
    assert a == 1


class Unanswered(Workflow):
    """Asks a question nobody answers, within the wait's own short timeout."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        got = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="?"), timeout=0.05
        )
        return StopEvent(result=got.response)


async def test_a_wait_that_times_out_fails_its_step_not_the_runs_clock(tmp_path: Path) -> None:
    """As in LlamaIndex: the wait's timeout raises a ``TimeoutError`` in the step; uncaught,
    the step fails and the stream ends with ``WorkflowFailedEvent`` (it said the run had
    timed out, ``WorkflowTimedOutEvent``, though its own timeout was far off)."""
    wf = Unanswered(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    names = [type(ev).__name__ async for ev in handler.stream_events()]
    assert names == ["InputRequiredEvent", "WorkflowFailedEvent"]
    with pytest.raises(TimeoutError, match="Timed out waiting for HumanResponseEvent") as info:
        await handler
    assert isinstance(info.value, WaitTimeoutError)
    assert isinstance(info.value, WorkflowTimeoutError)  # what code written for ours catches
    assert wf.state_at(handler.run_id).status == "failed"


class Ticks(Workflow):
    """Streams six events, one per short sleep, then stops."""

    @step
    async def go(self, ctx: Context, ev: StartEvent) -> StopEvent:
        for n in range(6):
            ctx.write_event_to_stream(Counted(n=n))
            await asyncio.sleep(0.005)
        return StopEvent(result="done")


async def _read(stream: Any) -> list[Any]:
    return [getattr(ev, "n", type(ev).__name__) async for ev in stream]


async def test_two_consumers_at_once_take_turns_and_never_split_the_stream(
    tmp_path: Path,
) -> None:
    """As with LlamaIndex's stream lock: the second consumer waits for the first, which
    reads everything; then the second finds the stream consumed (they split it: each got
    every other event, and one ended without the stop event)."""
    handler = Ticks(store=tmp_path / "s.db", timeout=BOUND).run()
    first = asyncio.create_task(_read(handler.stream_events()))
    second = asyncio.create_task(_read(handler.ctx.stream_events()))
    done, _ = await asyncio.wait([first, second], timeout=BOUND)
    assert len(done) == 2
    assert first.result() == [0, 1, 2, 3, 4, 5, "StopEvent"]
    with pytest.raises(WorkflowRuntimeError, match="already been consumed"):
        second.result()
    assert await handler == "done"


async def test_consumers_of_a_suspended_run_all_end(tmp_path: Path) -> None:
    """A run left waiting (``suspend``) ends every consumer's stream, one after another
    (the one end marker went to one of them; the others waited for ever)."""
    wf = TwoQuestions(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    readers = [
        asyncio.create_task(_read(handler.stream_events())),
        asyncio.create_task(_read(handler.ctx.stream_events())),
    ]
    await handler.wait_until_waiting(BOUND)
    await handler.suspend()
    done, _ = await asyncio.wait(readers, timeout=BOUND)
    assert len(done) == 2
    seen = sorted((r.result() for r in readers), key=len)
    assert seen == [[], ["Asked"]]  # the question, to one of them
    with pytest.raises(RunSuspendedError):
        await handler


async def test_a_replay_read_leaves_the_live_stream_where_it_was(tmp_path: Path) -> None:
    handler = Streams(store=tmp_path / "s.db", timeout=BOUND).run()
    gen = handler.stream_events()
    async for ev in gen:
        assert ev.n == 0
        break
    await gen.aclose()
    assert await handler == "done"
    assert await _read(handler.stream_events(replay=True)) == [0, 1, 2, 3, "StopEvent"]
    assert await _read(handler.stream_events()) == [1, 2, 3, "StopEvent"]


class Deep(BaseModel):
    """A state model."""

    a: int = 0


class Deeper(Deep):
    """A subclass of it, with a field more."""

    b: int = 0


class Subclassed(Workflow):
    """Sets a subclass of its state model in one step, reads it in the next."""

    @step
    async def first(self, ctx: Context[Deep], ev: StartEvent) -> Query:
        await ctx.store.set_state(Deeper(a=3, b=4))
        return Query(query="next")

    @step
    async def second(self, ctx: Context[Deep], ev: Query) -> StopEvent:
        state = await ctx.store.get_state()
        await ctx.store.set("a", state.a + 1)
        return StopEvent(result=(type(state).__name__, state.a, await ctx.store.get("b")))


async def test_a_run_takes_a_subclass_state_field_by_field(tmp_path: Path) -> None:
    """In a run, ``set_state`` of a subclass of the state model writes each of its
    fields (it failed on the subclass's own) and the state keeps the workflow's model, as
    a resume reads it back (a model switched in memory was lost on resume)."""
    wf = Subclassed(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    assert await asyncio.wait_for(handler, BOUND) == ("Deep", 3, 4)
    assert wf.state_at(handler.run_id).context == {"a": 4, "b": 4}


class AsksItsContext(Workflow):
    """A step that finds its context through ``Context.get_step_context()``."""

    @step
    async def go(self, ev: StartEvent) -> StopEvent:
        ctx = Context.get_step_context()
        await ctx.store.set("seen", True)
        return StopEvent(result="ok")


async def test_verify_reexecutes_a_step_that_asks_for_its_context(tmp_path: Path) -> None:
    wf = AsksItsContext(store=tmp_path / "s.db", timeout=BOUND)
    assert await wf.run() == "ok"
    report = verify(wf, reexecute=True)
    assert report.ok, report.problems


async def test_replay_determinism_takes_a_waits_timeout_as_the_runs_outcome() -> None:
    """A run that ends with a wait's ``WaitTimeoutError`` (a ``TimeoutError``) is checked
    like any failed run (it was taken for the checker's own deadline passing)."""
    report = await assert_replay_deterministic(Unanswered)
    assert "Timed out waiting for HumanResponseEvent" in report.outcome


async def test_the_command_line_says_a_waits_timeout_failed_the_run(tmp_path: Path) -> None:
    """``workflow run``/``resume`` report how a run ended: a wait's timeout failed it (it
    said the run timed out, resumable with a fresh timeout, while the log says failed)."""
    handler = Unanswered(store=tmp_path / "s.db", timeout=BOUND).run()
    status, exc = await settle_outcome(handler)
    assert (status, type(exc)) == ("failed", WaitTimeoutError)


class Work(Event):
    """A request another step answers."""

    n: int


class Done(Event):
    """Its answer."""

    n: int


class SendsThenWaits(Workflow):
    """Sends a request, then waits for its answer in the same step."""

    @step
    async def boss(self, ctx: Context, ev: StartEvent) -> StopEvent | Work:
        ctx.send_event(Work(n=1))
        got = await ctx.wait_for_event(Done, timeout=0.1)
        return StopEvent(result=got.n)

    @step
    async def worker(self, ctx: Context, ev: Work) -> None:
        ctx.send_event(Done(n=ev.n))


async def test_a_wait_after_a_send_says_the_send_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What a waiting attempt sent is dropped (attempts are atomic); an answer that needs
    it never comes: the wait says so in the log instead of only timing out."""
    wf = SendsThenWaits(store=tmp_path / "s.db", timeout=BOUND, disable_validation=True)
    with caplog.at_level(logging.WARNING, logger="workflow"), pytest.raises(WaitTimeoutError):
        await wf.run()
    (said,) = {r.getMessage() for r in caplog.records if "after ctx.send_event" in r.getMessage()}
    assert "step 'boss' waits for Done after ctx.send_event of Work" in said


async def test_a_stream_left_but_still_referenced_does_not_hold_the_next_one(
    tmp_path: Path,
) -> None:
    """``gen = handler.stream_events()``, a ``break``, and ``gen`` still referenced (so not
    closed): the next ``stream_events()`` goes on where it stopped (LlamaIndex's stream
    lock waits for ``gen`` for ever); ``gen``, read again, says another took over."""
    handler = TwoQuestions(store=tmp_path / "s.db", timeout=BOUND).run()
    gen = handler.stream_events()
    async for ev in gen:
        assert isinstance(ev, Asked)
        break
    handler.ctx.send_event(Answered(response="a1"))
    asked = []
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, Asked):
                asked.append(ev.prefix)
                handler.ctx.send_event(Answered(response="a2"))
    assert asked == ["q2"]
    assert await handler == ["a1", "a2"]
    with pytest.raises(WorkflowRuntimeError, match="took this run's stream over"):
        await gen.__anext__()
