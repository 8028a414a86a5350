"""A worker whose commit delivers the next event to its own step takes it itself, waking
no other worker of the step only to find the queue empty: the log must not show it.

``tests/fixtures/step_handoff_golden.jsonl`` is the log these flows wrote before (kinds,
steps, payloads with the worker of each ``dequeued``, commit boundaries): a loop on one
step, and a fan-out to a ``num_workers=2`` step gathered by ``collect_events``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from eventstore import EventStore
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
from workflow._handler import executor_of
from workflow._step_queue import StepQueue

GOLDEN = Path(__file__).parent / "fixtures" / "step_handoff_golden.jsonl"
BOUND = 20.0  # seconds: only a hang comes near it


class Again(Event):
    i: int


class Job(Event):
    k: int


class Done(Event):
    k: int


class Loop(Workflow):
    """One step looping four times, appending to a list in the context."""

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i = ev.i if isinstance(ev, Again) else 0
        items = await ctx.store.get("items", default=[])
        items.append(i)
        await ctx.store.set("items", items)
        return Again(i=i + 1) if i + 1 < 4 else StopEvent(result=len(items))


class Fan(Workflow):
    """Five jobs for a step of two workers, gathered by a collector."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Job | None:
        for k in range(5):
            ctx.send_event(Job(k=k))
        return None

    @step(num_workers=2)
    async def work(self, ctx: Context, ev: Job) -> Done:
        await asyncio.sleep(0)
        return Done(k=ev.k)

    @step
    async def gather(self, ctx: Context, ev: Done) -> StopEvent | None:
        got = ctx.collect_events(ev, [Done] * 5)
        return None if got is None else StopEvent(result=sorted(e.k for e in got))


async def _log(wf_cls: type[Workflow], path: Path) -> list[Any]:
    store = EventStore(path)
    try:
        handler = wf_cls(store=store, timeout=None).run()
        await asyncio.wait_for(handler, BOUND)
        out: list[Any] = []
        for r in store.records(handler.run_id):
            payload = json.loads(r.payload) if r.payload else None
            if isinstance(payload, dict):  # where the flow's module is: not the engine's doing
                payload.pop("fingerprint", None)
                payload.pop("workflow", None)
            out.append([r.kind, r.step, payload, int(r.commit_seq) - int(r.seq)])
        return out
    finally:
        store.close()


async def test_the_log_is_the_golden_one(tmp_path: Path) -> None:
    """The loop and the fan-out write, record for record, the log they wrote before the
    hand-off: same workers dequeuing, same commits."""
    got = await _log(Loop, tmp_path / "loop.db") + await _log(Fan, tmp_path / "fan.db")
    golden = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    # The golden log's flows were defined in a script (``__main__``), these here.
    here = json.dumps(got, sort_keys=True).replace(f"{__name__}:", "__main__:")
    assert json.loads(here) == golden


async def test_a_loop_wakes_no_other_worker(tmp_path: Path) -> None:
    """In the loop each step's commit delivers the next event to the worker that made it:
    the step's other three workers are never woken (they were once a step, for nothing)."""
    store = EventStore(tmp_path / "log.db")
    try:
        handler = Loop(store=store, timeout=None).run()
        executor = executor_of(handler)
        assert executor is not None
        assert await asyncio.wait_for(handler, BOUND) == 4
        assert executor.steps.queues["loop"].wakes == 0
    finally:
        store.close()


async def test_step_queue_put_without_wake_leaves_waiters_asleep() -> None:
    """``put(wake=False)`` wakes nobody (the caller takes it); ``put`` wakes one waiter."""
    q: StepQueue[int] = StepQueue()
    got: list[int] = []

    async def waiter() -> None:
        got.append(await q.get())

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    q.put(1, wake=False)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert got == []
    assert q.qsize() == 1
    assert await q.get() == 1  # taken by the one that put it, at once
    q.put(2)
    await asyncio.wait_for(task, BOUND)
    assert got == [2]
    assert q.empty()


async def test_step_queue_a_cancelled_waiter_passes_its_wake_on() -> None:
    """A waiter woken for an item and cancelled before it took it wakes the next one."""
    q: StepQueue[int] = StepQueue()
    got: list[int] = []

    async def waiter() -> None:
        got.append(await q.get())

    first = asyncio.create_task(waiter())
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    q.put(1)  # wakes the first
    first.cancel()
    await asyncio.wait_for(second, BOUND)
    assert got == [1]
    assert first.cancelled()
