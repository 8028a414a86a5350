"""Fan-out by return: a step annotated ``-> list[E]`` (LlamaIndex 2.26) emits each element
of the list it returns as an event of its own, in order, in its commit, as ``send_event``
would; ``[]`` emits nothing. A ``list[E]`` parameter (LlamaIndex's batch fan-in) is refused
by name when the class is made.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eventstore import EventStore
from workflow import Context, StartEvent, StopEvent, Workflow, WorkflowValidationError, step
from workflow import _journal as J
from workflow.errors import WorkflowRuntimeError, WorkflowTimeoutError
from workflow.events import Event

BOUND = 10.0


class Task(Event):
    n: int


class Done(Event):
    n: int


class Parallel(Workflow):
    """LlamaIndex's fan-out, gathered with collect_events."""

    @step
    async def fan_out(self, ctx: Context, ev: StartEvent) -> list[Task] | StopEvent:
        n = int(ev.n)
        await ctx.store.set("n", n)
        if n == 0:
            return StopEvent(result=[])
        return [Task(n=i) for i in range(n)]

    @step(num_workers=5)
    async def work(self, ev: Task) -> Done:
        await asyncio.sleep(0.01 * (5 - ev.n % 5))
        return Done(n=ev.n)

    @step
    async def fan_in(self, ctx: Context, ev: Done) -> StopEvent | None:
        got = ctx.collect_events(ev, [Done] * await ctx.store.get("n"))
        return None if got is None else StopEvent(result=sorted(d.n for d in got))


async def test_a_returned_list_fans_out_one_event_per_element(tmp_path: Path) -> None:
    """Each element is an event of the producer's commit, in the list's order, and
    every one reaches a worker; the union's other member is returned as usual."""
    store = EventStore(tmp_path / "s.db")
    wf = Parallel(store=store, timeout=BOUND)
    handler = wf.run(n=7)
    assert await handler == list(range(7))
    enqueued = [
        r.data() for r in store.records(handler.run_id, kinds=[J.ENQUEUED]) if r.step == "work"
    ]
    assert [p["event"]["v"]["n"] for p in enqueued] == list(range(7))
    assert len({tuple(p["src"]) for p in enqueued}) == 1  # one attempt of fan_out sent them
    assert await Parallel(store=store, timeout=BOUND).run(n=0) == []
    store.close()


class Empty(Workflow):
    """A fan-out of nothing: the step completes and nothing fires."""

    @step
    async def fan_out(self, ev: StartEvent) -> list[Task]:
        return []

    @step
    async def work(self, ev: Task) -> StopEvent:
        return StopEvent(result="fired")


async def test_an_empty_list_emits_nothing() -> None:
    """``return []`` commits the step with nothing emitted: the run has nothing left to
    do, and times out as LlamaIndex's does."""
    store = EventStore()
    handler = Empty(store=store, timeout=0.5).run()
    with pytest.raises(WorkflowTimeoutError):
        await handler
    finished = list(store.records(handler.run_id, kinds=[J.STEP_FINISHED]))
    assert [r.data()["emitted"] for r in finished] == [[]]


class Wrong(Workflow):
    """Returns a list holding something that is not an event, or a list undeclared."""

    @step
    async def fan_out(self, ev: StartEvent) -> list[Task]:
        return [Task(n=1), "oops"]  # type: ignore[list-item]

    @step
    async def work(self, ev: Task) -> StopEvent:
        return StopEvent()


class Undeclared(Workflow):
    @step
    async def start(self, ev: StartEvent) -> Task:
        return [Task(n=1)]  # type: ignore[return-value]

    @step
    async def work(self, ev: Task) -> StopEvent:
        return StopEvent()


@pytest.mark.parametrize(
    ("flow", "message"),
    [
        (Wrong, "fan_out returned a list holding str, not events"),
        (Undeclared, r"start returned a list; annotate it -> list\[...\]"),
    ],
)
async def test_a_wrong_list_fails_the_step_by_name(flow: type[Workflow], message: str) -> None:
    """A list with a non-event in it, or from a step not annotated to return one, is the
    step's failure, naming it; nothing of the list is sent."""
    with pytest.raises(WorkflowRuntimeError, match=message):
        await flow(timeout=BOUND).run()


def test_a_list_parameter_in_a_union_is_refused() -> None:
    """A ``list[E]`` parameter (a collect step, ``workflow.collect``) is the parameter's
    whole annotation: in a union it is refused when the class is made, naming it."""
    with pytest.raises(WorkflowValidationError, match=r"parameter 'evs'.*in a union"):

        class Batch(Workflow):
            @step
            async def fan_out(self, ev: StartEvent) -> list[Done]:
                return []

            @step
            async def gather(self, evs: list[Done] | Done) -> StopEvent:
                return StopEvent()
