"""The engine as a LlamaIndex Workflows user meets it: steps, routing, context, retries."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from eventstore import EncodeError, EventStore
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
    WorkflowValidationError,
    step,
)
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed


class Middle(Event):
    text: str


class Other(Event):
    n: int


class Linear(Workflow):
    @step
    async def start(self, ev: StartEvent) -> Middle:
        return Middle(text=f"hello {ev.topic}")

    @step
    async def finish(self, ev: Middle) -> StopEvent:
        return StopEvent(result=ev.text + "!")


async def test_linear_run_returns_the_result(store: EventStore) -> None:
    """A two-step run returns StopEvent.result; run kwargs become start event fields."""
    wf = Linear(store=store)
    handler = wf.run(topic="x")
    assert isinstance(handler.run_id, str)
    assert await handler == "hello x!"
    assert handler.is_done()


async def test_in_memory_store_by_default() -> None:
    """Without a store, runs are journaled to a private in-memory store."""
    wf = Linear()
    handler = wf.run(topic="m")
    assert await handler == "hello m!"
    kinds = [c.kind for c in wf.checkpoints(handler.run_id)]
    assert kinds[0] == "run_started"
    assert "step_finished" in kinds


async def test_journal_has_the_heart_kinds(store: EventStore) -> None:
    """Every enqueue, dequeue, step start and finish is in the log."""
    wf = Linear(store=store)
    h = wf.run(topic="x")
    await h
    kinds = [r.kind for r in wf.store.records(h.run_id)]
    for kind in (
        "run_started",
        "enqueued",
        "dequeued",
        "step_started",
        "step_finished",
        "run_finished",
    ):
        assert kind in kinds
    assert kinds.count("step_finished") == 2


class Done(StopEvent):
    value: int


class SubclassStop(Workflow):
    @step
    async def only(self, ev: StartEvent) -> Done:
        return Done(value=7)


async def test_stop_event_subclass_is_returned_whole() -> None:
    """Awaiting a run that ends with a StopEvent subclass returns the event itself."""
    res = await SubclassStop().run()
    assert isinstance(res, Done)
    assert res.value == 7


class Branchy(Workflow):
    @step
    async def start(self, ev: StartEvent) -> Middle | Other:
        return Middle(text="m") if ev.pick == "m" else Other(n=1)

    @step
    async def on_middle(self, ev: Middle) -> StopEvent:
        return StopEvent(result="middle")

    @step
    async def on_other(self, ev: Other) -> StopEvent:
        return StopEvent(result="other")


async def test_union_routing() -> None:
    """A step returning a union routes each event to the step that takes its class."""
    wf = Branchy()
    assert await wf.run(pick="m") == "middle"
    assert await wf.run(pick="o") == "other"


class Item(Event):
    i: int


class Summary(Event):
    pass


class FanOut(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        for i in range(ev.n):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def work(self, ctx: Context, ev: Item) -> Other:
        await asyncio.sleep(0.001)
        return Other(n=ev.i * 10)

    @step
    async def gather(self, ctx: Context, ev: Other) -> StopEvent | None:
        got = ctx.collect_events(ev, [Other] * 5)
        if got is None:
            return None
        return StopEvent(result=sorted(e.n for e in got))


async def test_fan_out_and_collect(store: EventStore) -> None:
    """send_event fans out; collect_events returns once every expected event is in."""
    assert await FanOut(store=store).run(n=5) == [0, 10, 20, 30, 40]


class Counter(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        await ctx.store.set("total", 0)
        for i in range(ev.n):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def add(self, ctx: Context, ev: Item) -> Other:
        total = await ctx.store.get("total")
        await asyncio.sleep(0)  # let other workers read the same total
        await ctx.store.set("total", total + ev.i)
        return Other(n=ev.i)

    @step
    async def done(self, ctx: Context, ev: Other) -> StopEvent | None:
        seen = await ctx.store.get("seen", default=0) + 1
        await ctx.store.set("seen", seen)
        if seen < 100:
            return None
        return StopEvent(result=await ctx.store.get("total"))


async def test_no_lost_updates_with_concurrent_workers(store: EventStore) -> None:
    """Four workers doing get/set of one key end with the exact sum; conflicts re-run."""
    wf = Counter(store=store, timeout=60)
    h = wf.run(n=100)
    assert await h == sum(range(100))
    kinds = [r.kind for r in wf.store.records(h.run_id)]
    assert "step_conflicted" in kinds


class Barrier(Workflow):
    inside: int  # set by the test
    all_in: asyncio.Event

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        for i in range(4):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def work(self, ctx: Context, ev: Item) -> Other:
        await ctx.store.set(f"k{ev.i}", ev.i)
        self.inside += 1
        if self.inside == 4:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 5)  # every worker must be inside at once
        return Other(n=ev.i)

    @step
    async def done(self, ctx: Context, ev: Other) -> StopEvent | None:
        got = ctx.collect_events(ev, [Other] * 4)
        if got is None:
            return None
        return StopEvent(result=[await ctx.store.get(f"k{i}") for i in range(4)])


async def test_writers_of_different_keys_run_in_parallel(store: EventStore) -> None:
    """Four attempts writing different keys are inside the step at the same time."""
    wf = Barrier(store=store, timeout=10)
    wf.inside = 0
    wf.all_in = asyncio.Event()
    assert await wf.run() == [0, 1, 2, 3]


class Flaky(Workflow):
    @step(retry_policy=retry_policy(wait=wait_fixed(0.01), stop=stop_after_attempt(3)))
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        n = self.calls = getattr(self, "calls", 0) + 1
        await ctx.store.set("calls_seen", n)
        if n < 3:
            msg = f"boom {n}"
            raise ValueError(msg)
        return StopEvent(result=n)


async def test_retry_policy_retries_then_succeeds(store: EventStore) -> None:
    """A failing step is retried by its policy; failed attempts leave no state behind."""
    wf = Flaky(store=store)
    h = wf.run()
    assert await h == 3
    kinds = [r.kind for r in wf.store.records(h.run_id)]
    assert kinds.count("step_failed") == 2
    state = wf.state_at(h.run_id)
    assert state.context == {"calls_seen": 3}


class Broken(Workflow):
    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        msg = "no luck"
        raise RuntimeError(msg)


async def test_step_error_propagates(store: EventStore) -> None:
    """Without a retry policy the step's exception propagates from await handler."""
    wf = Broken(store=store)
    h = wf.run()
    with pytest.raises(RuntimeError, match="no luck"):
        await h
    assert wf.state_at(h.run_id).status == "failed"


class Slow(Workflow):
    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        await asyncio.sleep(5)
        return StopEvent()


async def test_timeout_raises() -> None:
    """A run longer than its timeout raises WorkflowTimeoutError and records it."""
    wf = Slow(timeout=0.2)
    h = wf.run()
    with pytest.raises(WorkflowTimeoutError):
        await h
    assert wf.state_at(h.run_id).status == "timed_out"


async def test_verbose_prints_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """verbose=True prints each attempt, what it produced and the result, as LlamaIndex."""
    await Linear(verbose=True).run(topic="v")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "[start:0] started from StartEvent",
        "[start:0] complete with Middle",
        "[finish:0] started from Middle",
        "[finish:0] complete with StopEvent",
        "[result] StopEvent(result='hello v!')",
    ]


async def test_verbose_goes_to_its_logger_when_that_is_enabled(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """With the ``workflow.verbose`` logger at INFO, verbose lines are logged, not printed."""
    with caplog.at_level(logging.INFO, logger="workflow.verbose"):
        await Linear(verbose=True).run(topic="v")
    assert "[start:0] started from StartEvent" in caplog.messages
    assert capsys.readouterr().out == ""


class Streamer(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        for i in range(3):
            ctx.write_event_to_stream(Other(n=i))
        return StopEvent(result="done")


async def test_stream_events_live_then_stop(store: EventStore) -> None:
    """stream_events yields streamed events, then the stop event."""
    wf = Streamer(store=store)
    h = wf.run()
    got = [ev async for ev in h.stream_events()]
    assert [type(e).__name__ for e in got] == ["Other", "Other", "Other", "StopEvent"]
    assert h.origin(got[0]) == ("start", 1, 1)
    assert all("_origin" not in r.payload for r in wf.store.records(h.run_id))
    assert await h == "done"
    assert len(wf.state_at(h.run_id).stream) == 3


async def test_concurrent_runs_share_a_store(store: EventStore) -> None:
    """Several runs of one workflow run at once against one store."""
    wf = Linear(store=store)
    results = await asyncio.gather(*(wf.run(topic=str(i)) for i in range(20)))
    assert results == [f"hello {i}!" for i in range(20)]
    assert len(wf.runs()) == 20


def test_validation_no_start_step() -> None:
    """A workflow without a step taking StartEvent is refused when built."""

    class NoStart(Workflow):
        @step
        async def a(self, ev: Middle) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="no @step that accepts StartEvent"):
        NoStart()


def test_validation_no_stop() -> None:
    """A workflow without a step returning StopEvent is refused."""

    class NoStop(Workflow):
        @step
        async def a(self, ev: StartEvent) -> None:
            return None

    with pytest.raises(WorkflowValidationError, match="StopEvent"):
        NoStop()


def test_validation_produced_not_consumed() -> None:
    """An event produced but never consumed names the step and the event."""

    class Leak(Workflow):
        @step
        async def a(self, ev: StartEvent) -> Middle | StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="step 'a' produces Middle"):
        Leak().validate()


def test_validation_consumed_not_produced() -> None:
    """An event consumed but never produced names the step and the event."""

    class Orphan(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

        @step
        async def b(self, ev: Other) -> StopEvent:
            return StopEvent()

    wf = Orphan()  # built, as in LlamaIndex: the graph is checked when it first runs
    with pytest.raises(WorkflowValidationError, match="step 'b' consumes Other"):
        wf.validate()


def test_run_outside_async_code_is_refused() -> None:
    """run() names the problem when called without an event loop."""
    with pytest.raises(WorkflowRuntimeError, match="inside async code"):
        Linear().run()


class Unencodable(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("bad", {"a": [1, 2, object()]})
        return StopEvent()


async def test_set_refuses_unencodable_value_naming_the_key() -> None:
    """A value the codec cannot encode is refused at set(), naming key and path."""
    h = Unencodable().run()
    with pytest.raises(EncodeError, match=r"bad\['a'\]\[2\]"):
        await h


class Profile(BaseModel):
    name: str = ""
    tags: list[str] = []
    visits: int = 0


class Typed(Workflow):
    @step
    async def start(self, ctx: Context[Profile], ev: StartEvent) -> StopEvent:
        async with ctx.store.edit_state() as state:
            state.name = ev.name
            state.tags.append("new")
            state.visits += 1
        return StopEvent(result=await ctx.store.get("tags"))


async def test_typed_state_with_edit_state(store: EventStore) -> None:
    """Context[Model] types the state; edit_state writes back what changed."""
    wf = Typed(store=store)
    h = wf.run(name="ada")
    assert await h == ["new"]
    assert wf.state_at(h.run_id).context == {"name": "ada", "tags": ["new"], "visits": 1}


class Appender(Workflow):
    n: int  # set by the test

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item:
        await ctx.store.set("items", [])
        return Item(i=0)

    @step
    async def loop(self, ctx: Context, ev: Item) -> Item | StopEvent:
        items = await ctx.store.get("items")
        items.append("x" * 100)
        await ctx.store.set("items", items)
        if ev.i + 1 >= self.n:
            return StopEvent(result=len(items))
        return Item(i=ev.i + 1)


async def test_appends_cost_the_change_in_bytes(store: EventStore) -> None:
    """Appending to a growing list writes patches about the size of the item."""
    wf = Appender(store=store)
    wf.n = 300
    h = wf.run()
    assert await h == 300
    sizes = [len(r.payload) for r in wf.store.records(h.run_id, kinds=["state_set"])]
    patches = sorted(sizes)[: len(sizes) // 2]
    assert max(patches) < 300
    assert sum(sizes) < 300 * 100 * 4  # linear, not quadratic
    assert wf.state_at(h.run_id).context["items"] == ["x" * 100] * 300


async def test_shared_event_store_object(tmp_path: Path) -> None:
    """An EventStore passed in is used as is, and shared between workflows."""
    with EventStore(tmp_path / "s.db") as es:
        a, b = Linear(store=es), Branchy(store=es)
        assert await a.run(topic="1") == "hello 1!"
        assert await b.run(pick="m") == "middle"
        assert len(a.runs()) == 2


class Dotted(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("user", {"name": "ada", "langs": ["py"]})
        await ctx.store.set("user.name", "grace")
        await ctx.store.set("user.langs.0", "cobol")
        missing = await ctx.store.get("user.age", default=-1)
        return StopEvent(result=(await ctx.store.get("user.name"), missing))


async def test_dotted_paths(store: EventStore) -> None:
    """ctx.store.get/set take dotted paths into nested values, as in LlamaIndex."""
    wf = Dotted(store=store)
    h = wf.run()
    assert await h == ("grace", -1)
    assert wf.state_at(h.run_id).context == {"user": {"name": "grace", "langs": ["cobol"]}}


class Impatient(Workflow):
    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        try:
            await ctx.wait_for_event(HumanResponseEvent, timeout=0.05)
        except WorkflowTimeoutError:
            return StopEvent(result="nobody answered")
        return StopEvent(result="answered")


async def test_wait_for_event_times_out() -> None:
    """A wait past its own deadline raises WorkflowTimeoutError in the re-run step."""
    assert await Impatient().run() == "nobody answered"


async def test_run_state_renders_to_json(store: EventStore) -> None:
    """RunState.to_json() is JSON-native and names each event's class."""
    import json

    wf = FanOut(store=store)
    h = wf.run(n=5)
    await h
    mid = wf.checkpoints(h.run_id, step="start")[-1]
    data = json.loads(json.dumps(wf.state_at(h.run_id, mid.seq).to_json()))
    assert data["queues"]["work"][0]["c"].endswith(":Item")
    assert data["status"] == "finished" or data["seq"] == mid.seq


class Operator(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.wait_for_event(HumanResponseEvent)
        return StopEvent(result=await ctx.store.get("note", default=None))


async def test_handler_ctx_writes_are_operator_updates(store: EventStore) -> None:
    """Writing through handler.ctx records an operator update the run then reads."""
    wf = Operator(store=store)
    h = wf.run()
    await h.wait_until_waiting(5)
    await h.ctx.store.set("note", "from outside")
    assert await h.ctx.store.get("note") == "from outside"
    await h.send_event(HumanResponseEvent(response="go"))
    assert await h == "from outside"
    kinds = [(r.kind, r.step) for r in wf.store.records(h.run_id)]
    assert ("state_set", None) in kinds


class AnyContext(Workflow):
    @step
    async def start(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        await ctx.store.set("k", 1)
        return StopEvent(result=await ctx.store.get("k"))


async def test_context_of_any_is_untyped_state() -> None:
    """Context[Any] is an untyped context, not a state class."""
    assert await AnyContext().run() == 1


class Orphaned(Workflow):
    """Step ``b`` takes an event no step produces: a graph that does not check out."""

    @step
    async def a(self, ev: StartEvent) -> StopEvent:
        return StopEvent()

    @step
    async def b(self, ev: Other) -> StopEvent:
        return StopEvent()


async def test_a_bad_graph_builds_and_fails_its_first_run(tmp_path: Path) -> None:
    """As in LlamaIndex 2.26: a workflow whose graph does not check out can be built (to
    inspect or draw it); ``run()`` raises the graph's error before any run is made."""

    wf = Orphaned(store=tmp_path / "o.db")
    assert sorted(wf._get_steps()) == ["a", "b"]
    with pytest.raises(WorkflowValidationError, match="step 'b' consumes Other"):
        await wf.run()
    with pytest.raises(WorkflowValidationError, match="step 'b' consumes Other"):
        await wf.run()  # every run, until the steps are fixed
    assert wf.store.runs() == []


def test_a_bad_graph_is_not_submitted(tmp_path: Path) -> None:
    """``submit`` checks the graph before it records the run a worker would take."""

    wf = Orphaned(store=tmp_path / "o.db")
    with pytest.raises(WorkflowValidationError, match="step 'b' consumes Other"):
        wf.submit()
    assert wf.store.runs() == []
