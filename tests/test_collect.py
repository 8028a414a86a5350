"""collect_events on live buffers: collectors never conflict, and a put or take of an attempt
that does not commit is undone (DESIGN.md, "No lost updates"; issue 17)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eventstore import EventStore
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
from workflow import _journal as J
from workflow._buffers import taken
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed


class Item(Event):
    i: int


class Done(Event):
    i: int


class FanIn(Workflow):
    """K items handled on 4 workers, gathered by a collector on 4 workers."""

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> Item | None:
        await ctx.store.set("k", int(ev.k))
        for i in range(int(ev.k)):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def work(self, ev: Item) -> Done:
        await asyncio.sleep(0)
        return Done(i=ev.i)

    @step(num_workers=4)
    async def gather(self, ctx: Context, ev: Done) -> StopEvent | None:
        k = await ctx.store.get("k")
        got = ctx.collect_events(ev, [Done] * k)
        if got is None:
            return None
        return StopEvent(result=sorted(d.i for d in got))


def _kinds(store: EventStore, run_id: str, step: str | None = None) -> list[str]:
    return [r.kind for r in store.records(run_id) if step is None or r.step == step]


async def test_three_hundred_collectors_never_conflict(tmp_path: Path) -> None:
    """K=300 through 4 collector workers: no step_conflicted, one attempt per event, and
    each collected record is small (a short buffer id, not the K class names)."""
    store = EventStore(tmp_path / "log.db")
    try:
        handler = FanIn(store=store, timeout=60).run(k=300)
        assert await handler == list(range(300))
        await store.flush()
        records = list(store.records(handler.run_id))
        assert "step_conflicted" not in [r.kind for r in records]
        started = [r for r in records if r.kind == "step_started" and r.step == "gather"]
        assert len(started) == 300
        assert {r.data()["attempt"] for r in started} == {1}
        puts = [r for r in records if r.kind == "collected" and r.data()["put"] is not None]
        assert len(puts) == 300
        assert max(len(r.payload) for r in puts) < 200
        (take,) = [r for r in records if r.kind == "collected" and r.data()["put"] is None]
        assert take.data()["takes"] == {"Done": 300}
        assert len(take.payload) < 100  # counted, not the 300 names
        assert FanIn(store=store).state_at(handler.run_id).collected == {}
    finally:
        store.close()


class Undone(Workflow):
    """Two collectors: the first puts its event, then fails once after the second has taken
    both; the second must not commit a take of a put that was undone."""

    failed = False

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> Item | None:
        ctx.send_event(Item(i=0))
        ctx.send_event(Item(i=1))
        return None

    @step(
        num_workers=2, retry_policy=retry_policy(wait=wait_fixed(0.01), stop=stop_after_attempt(3))
    )
    async def gather(self, ctx: Context, ev: Item) -> StopEvent | None:
        got = ctx.collect_events(ev, [Item, Item])
        if ev.i == 0 and not type(self).failed:
            await asyncio.sleep(0.05)  # the other attempt takes both meanwhile
            type(self).failed = True
            msg = "after the put"
            raise RuntimeError(msg)
        if got is None:
            return None
        return StopEvent(result=sorted(e.i for e in got))


async def test_a_put_of_an_attempt_that_fails_is_undone(tmp_path: Path) -> None:
    """The failed attempt's put is undone; the attempt that took it re-runs instead of
    committing; the retry puts again and the set completes once, with each event once."""
    store = EventStore(tmp_path / "log.db")
    Undone.failed = False
    try:
        wf = Undone(store=store, timeout=10)
        handler = wf.run()
        assert await handler == [0, 1]
        await store.flush()
        kinds = _kinds(store, handler.run_id, "gather")
        assert kinds.count("step_failed") == 1
        assert kinds.count("step_conflicted") == 1  # the take that could not stand
        state = wf.state_at(handler.run_id)
        assert state.collected == {}
        assert state.status == "finished"
    finally:
        store.close()


class Twice(Workflow):
    """A collector whose attempts fail once after taking: the take is undone."""

    fails = 0

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> Item | None:
        for i in range(3):
            ctx.send_event(Item(i=i))
        return None

    @step(retry_policy=retry_policy(wait=wait_fixed(0.01), stop=stop_after_attempt(3)))
    async def gather(self, ctx: Context, ev: Item) -> StopEvent | None:
        got = ctx.collect_events(ev, [Item] * 3)
        if got is None:
            return None
        if type(self).fails < 1:
            type(self).fails += 1
            msg = "after the take"
            raise RuntimeError(msg)
        return StopEvent(result=sorted(e.i for e in got))


async def test_a_take_of_an_attempt_that_fails_is_undone(tmp_path: Path) -> None:
    """A failed attempt's take puts the events back, its own put is removed, and its retry
    completes the set with each event once; the log folds to no leftover buffer."""
    store = EventStore(tmp_path / "log.db")
    Twice.fails = 0
    try:
        wf = Twice(store=store, timeout=10)
        handler = wf.run()
        assert await handler == [0, 1, 2]
        await store.flush()
        assert _kinds(store, handler.run_id, "gather").count("step_failed") == 1
        assert wf.state_at(handler.run_id).collected == {}
    finally:
        store.close()


class Exclusive(Workflow):
    """A collector holding the state lock (edit_state) takes an event whose putter, still
    running, needs that lock to commit."""

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> Item | None:
        ctx.send_event(Item(i=0))
        ctx.send_event(Item(i=1))
        return None

    @step(num_workers=2)
    async def gather(self, ctx: Context, ev: Item) -> StopEvent | None:
        if ev.i == 0:
            got = ctx.collect_events(ev, [Item, Item])
            await asyncio.sleep(0.05)  # the other attempt takes both meanwhile
            await ctx.store.set("first", True)  # so this commit waits for the lock
        else:
            await asyncio.sleep(0.01)
            async with ctx.store.edit_state() as state:
                state["second"] = True
                got = ctx.collect_events(ev, [Item, Item])
        if got is None:
            return None
        return StopEvent(result=sorted(e.i for e in got))


async def test_a_collector_holding_the_lock_does_not_wait_for_a_putter(tmp_path: Path) -> None:
    """The lock holder's take of an uncommitted put is refused (a conflict: it runs again)
    instead of waiting for an attempt that waits for the lock: the run ends, each event
    taken once."""
    store = EventStore(tmp_path / "log.db")
    try:
        wf = Exclusive(store=store, timeout=10)
        handler = wf.run()
        assert await handler == [0, 1]
        await store.flush()
        assert _kinds(store, handler.run_id, "gather").count("step_conflicted") >= 1
        state = wf.state_at(handler.run_id)
        assert state.collected == {}
        assert state.context == {"first": True, "second": True}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        pytest.param(
            {"buf": "b", "put": None, "take": None, "v": 2, "takes": {"Done": 3, "A": 1}},
            [("Done", 3), ("A", 1)],
            id="counted",
        ),
        pytest.param(
            {"buf": "b", "put": None, "take": ["Done", "A", "Done"], "v": 2},
            [("Done", 2), ("A", 1)],
            id="names-v2",
        ),
        pytest.param(
            {"buf": "s:m:Done,m:A", "put": None, "take": ["m:Done", "m:A", "m:Done"]},
            [("Done", 2), ("A", 1)],
            id="names-with-modules",
        ),
        pytest.param({"buf": "b", "put": None, "take": None, "v": 2}, [], id="a-put"),
    ],
)
def test_a_take_reads_in_every_shape(payload: J.Collected, want: list[tuple[str, int]]) -> None:
    """What a collected record took, counted per class, whatever shape wrote it."""
    assert taken(payload) == want
