"""LlamaIndex's batch fan-in: a step with a ``list[E]`` parameter takes the events of a
fan-out's stream (``-> list[E]``) together, once the stream closes (``workflow.collect``);
durably: a process killed mid-stream resumes with each member's work done once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest

from eventstore import EventStore
from tests.conftest import BACKENDS, new_location
from tests.support.stream_flows import Done, Item, Scatter
from workflow import (
    Context,
    ContextSerdeError,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowRuntimeError,
    WorkflowValidationError,
    step,
)
from workflow._read import fold_run
from workflow._snapshot import dump_folded, load_folded
from workflow._verify import verify
from workflow.collect import All, Collect, Take
from workflow.decorators import Collect as DecoratorsCollect
from workflow.events import CollectionReleaseEvent

ROOT = Path(__file__).parent.parent
BOUND = 20.0  # seconds a run here may take at most (a bound, not a speed goal)


class Fan(Workflow):
    """K items on four workers, a third of them dropped; the rest gathered as one list."""

    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(int(ev.get("k", 7)))]

    @step(num_workers=4)
    async def work(self, ev: Item) -> Done | None:
        await asyncio.sleep(0.002 * (5 - ev.i % 5))
        return None if ev.i % 3 == 2 else Done(i=ev.i)

    @step
    async def gather(self, ctx: Context, done: list[Done]) -> StopEvent:
        await ctx.store.set("batch", len(done))
        return StopEvent(result=[d.i for d in done])


async def test_the_collect_step_runs_once_with_what_reached_it(tmp_path: Path) -> None:
    wf = Fan(store=tmp_path / "f.db", timeout=BOUND)
    handler = wf.run(k=7)
    result = await handler
    assert sorted(result) == [0, 1, 3, 4, 6]  # in the order they arrived
    state = wf.state_at(handler.run_id)
    assert state.context["batch"] == 5
    kinds = [
        (r.kind, r.step)
        for r in wf.store.records(handler.run_id)
        if r.kind == "step_started" and r.step == "gather"
    ]
    assert len(kinds) == 1  # never run one member at a time


async def test_an_empty_fan_out_releases_an_empty_list(tmp_path: Path) -> None:
    assert await Fan(store=tmp_path / "f.db", timeout=BOUND).run(k=0) == []


class First(Workflow):
    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(6)]

    @step(num_workers=6)
    async def work(self, ev: Item) -> Done:
        await asyncio.sleep(0.01 * (6 - ev.i))
        return Done(i=ev.i)

    @step
    async def fastest(self, done: Annotated[list[Done], Collect(Take(2))]) -> StopEvent:
        return StopEvent(result=[d.i for d in done])


async def test_take_releases_at_the_nth_arrival() -> None:
    assert await First(timeout=BOUND).run() == [5, 4]


class Sub(Event):
    i: int
    j: int


class Part(Event):
    i: int
    n: int


class Nested(Workflow):
    """Each item splits into i + 1 parts: an inner stream per item, gathered per item, and
    the inner gathers' results gathered by the outer stream."""

    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(4)]

    @step(num_workers=4)
    async def split(self, ev: Item) -> list[Sub]:
        return [Sub(i=ev.i, j=j) for j in range(ev.i + 1)]

    @step
    async def inner(self, subs: list[Sub]) -> Part:
        return Part(i=subs[0].i, n=len(subs))

    @step
    async def outer(self, parts: Annotated[list[Part], Collect(All())]) -> StopEvent:
        return StopEvent(result=sorted((p.i, p.n) for p in parts))


async def test_nested_streams_release_level_by_level(tmp_path: Path) -> None:
    result = await Nested(store=tmp_path / "n.db", timeout=BOUND).run()
    assert result == [(0, 1), (1, 2), (2, 3), (3, 4)]


class Sends(Workflow):
    """What a step sends is not a member of a stream: the collect step never sees it."""

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> list[Item]:
        ctx.send_event(Done(i=99))
        return [Item(i=1), Item(i=2)]

    @step
    async def work(self, ev: Item) -> Done:
        return Done(i=ev.i)

    @step
    async def gather(self, done: list[Done]) -> StopEvent:
        return StopEvent(result=sorted(d.i for d in done))


async def test_a_sent_event_is_not_a_member() -> None:
    assert await Sends(timeout=BOUND).run() == [1, 2]


class SendsByName(Sends):
    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> list[Item]:
        ctx.send_event(Done(i=99), step="gather")
        return [Item(i=1)]


async def test_an_event_sent_to_a_collect_step_by_name_fails_the_step() -> None:
    with pytest.raises(WorkflowRuntimeError, match="cannot receive targeted events"):
        await SendsByName(timeout=BOUND).run()


def _two_event_parameters() -> None:
    class Two(Workflow):
        @step
        async def fan(self, ev: StartEvent) -> list[Item]:
            return []

        @step
        async def gather(self, done: list[Done], item: Item) -> StopEvent:
            return StopEvent()


def _not_events() -> None:
    class NotEvents(Workflow):
        @step
        async def gather(self, ev: StartEvent, xs: list[int]) -> StopEvent:
            return StopEvent()


def test_collect_steps_are_checked_when_the_workflow_is_built() -> None:
    with pytest.raises(WorkflowValidationError, match="takes no other event parameter"):
        _two_event_parameters()
    with pytest.raises(WorkflowValidationError, match="names no Event class"):
        _not_events()
    with pytest.raises(ValueError, match="Take"):
        Take(0)
    with pytest.raises(TypeError, match="All\\(\\) or Take"):
        Collect(cardinality="all")  # type: ignore[arg-type]
    assert DecoratorsCollect is Collect
    assert CollectionReleaseEvent(events=[Done(i=1)]).events == [Done(i=1)]


def _killed(db: Path, counters: Path, kill: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.stream_proc", str(db), str(counters), kill],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


def _resume(db: Path, counters: Path) -> Any:
    async def go() -> Any:
        wf = Scatter(store=db, timeout=BOUND, counters=counters)
        try:
            return await asyncio.wait_for(wf.resume("scatter"), BOUND)
        finally:
            wf.store.close()

    return asyncio.run(go())


def _finished(db: Path, step: str) -> list[int]:
    """The items (``i``) whose ``step`` attempt committed (for ``gather``: one per run)."""
    store = EventStore(db)
    try:
        records = list(store.records("scatter"))
    finally:
        store.close()
    items = {
        r.data()["id"]: r.data()["event"]["v"].get("i", -1)
        for r in records
        if r.kind == "enqueued" and r.step == step
    }
    return [items[r.data()["id"]] for r in records if r.kind == "step_finished" and r.step == step]


@pytest.mark.parametrize("kill", ["work-5", "gather", "release"])
def test_a_killed_run_resumes_each_member_once_and_releases_once(tmp_path: Path, kill: str) -> None:
    """Killed as a member runs, as the collect step runs, or between the stream's last
    member and its release: the resumed run releases the stream once, with every member,
    and no member that committed runs again."""
    db, counters = tmp_path / "s.db", tmp_path / "counters"
    counters.mkdir()
    _killed(db, counters, kill)
    before = sorted(_finished(db, "work"))
    assert _resume(db, counters) == [0, 1, 2, 3, 4, 5, 7]
    after = _finished(db, "work")
    assert sorted(after) == sorted(set(after))  # each member's work committed once
    assert len(after) == 8
    assert set(before) <= set(after)
    for i in range(8):  # what committed before the kill never runs again
        runs = (counters / f"work-{i}").read_text()
        assert runs == "x" if i in before else runs in ("x", "xx"), (i, runs)
    if kill.startswith("work-"):
        assert (counters / kill).read_text() == "xx"
    assert len(_finished(db, "gather")) == 1
    assert (counters / "gather").read_text() == ("xx" if kill == "gather" else "x")


async def test_a_snapshot_keeps_what_the_collect_step_holds(tmp_path: Path) -> None:
    """The fold of a run cut off while members are held, through a snapshot and back, is
    the same state (the members' streams, the held events, what is open)."""
    db, counters = tmp_path / "s.db", tmp_path / "counters"
    counters.mkdir()
    await asyncio.to_thread(_killed, db, counters, "work-5")
    store = EventStore(db)
    try:
        folded = fold_run(store, "scatter")
    finally:
        store.close()
    assert folded.streams
    assert folded.held["gather"]
    back = load_folded(dump_folded(folded))
    assert back.streams == folded.streams
    assert back.released == folded.released
    assert {k: list(v) for k, v in back.held.items()} == {
        k: list(v) for k, v in folded.held.items()
    }
    live = {e.id for e in folded.events(stream=False)} | set(folded.held["gather"])
    assert back.members == {i: s for i, s in folded.members.items() if i in live}


class Gated(Workflow):
    """A fan-out whose items wait for the test to open the gate."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.gate = asyncio.Event()
        self.all_in = asyncio.Event()
        self.waiting = 0

    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(3)]

    @step(num_workers=3)
    async def work(self, ev: Item) -> Done:
        self.waiting += 1
        if self.waiting == 3:
            self.all_in.set()
        await self.gate.wait()
        return Done(i=ev.i)

    @step
    async def gather(self, done: list[Done]) -> StopEvent:
        return StopEvent(result=sorted(d.i for d in done))


async def test_a_context_dict_taken_mid_stream_is_not_imported_elsewhere(tmp_path: Path) -> None:
    """Its stream's held events cannot move to another store: from_dict says so there,
    and the dict restores where the run is."""
    wf = Gated(store=tmp_path / "a.db", timeout=BOUND)
    handler = wf.run()
    await asyncio.wait_for(wf.all_in.wait(), BOUND)
    data = handler.ctx.to_dict()
    wf.gate.set()
    assert await handler == [0, 1, 2]
    with pytest.raises(ContextSerdeError, match="middle of a fan-out's stream"):
        Context.from_dict(Gated(store=tmp_path / "b.db"), data)
    assert Context.from_dict(wf, data).run_id == handler.run_id


async def test_verify_replays_a_run_with_a_stream(tmp_path: Path) -> None:
    wf = Fan(store=tmp_path / "f.db", timeout=BOUND)
    handler = wf.run(k=5)
    await handler
    for reexecute in (False, True):
        report = verify(wf, [handler.run_id], reexecute=reexecute)
        assert report.problems == [], report.problems


class Lonely(Workflow):
    @step
    async def work(self, ev: StartEvent) -> Done:
        return Done(i=1)

    @step
    async def gather(self, done: list[Done]) -> StopEvent:
        return StopEvent(result=done)


def test_a_collect_step_no_stream_reaches_is_refused() -> None:
    """It could never run (the run would sit until its timeout): refused, naming it."""
    with pytest.raises(WorkflowValidationError, match="'gather' takes a list of events"):
        Lonely().validate()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_streams_on_each_backend(backend: str, tmp_path: Path) -> None:
    """A fan-in, a nested one and a Take on each store backend; a resumed fan-in of a run
    whose process stopped mid-stream (its executor closed) finishes with every member."""
    with new_location(backend, tmp_path) as where:
        assert sorted(await Fan(store=where, timeout=BOUND).run(k=9)) == [0, 1, 3, 4, 6, 7]
        assert await Nested(store=where, timeout=BOUND).run() == [(0, 1), (1, 2), (2, 3), (3, 4)]
        wf = Gated(store=where, timeout=BOUND)
        handler = wf.run()
        await asyncio.wait_for(wf.all_in.wait(), BOUND)
        with pytest.warns(DeprecationWarning, match="leaves the run unfinished"):
            handler.cancel()  # this process lets go of the run, as if it stopped here
        with contextlib.suppress(asyncio.CancelledError):
            await handler
        again = Gated(store=where, timeout=BOUND)
        again.gate.set()
        assert await asyncio.wait_for(again.resume(handler.run_id), BOUND) == [0, 1, 2]


class BareReturn(Workflow):
    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return Item(i=1)  # type: ignore[return-value]

    @step
    async def work(self, ev: Item) -> Done:
        return Done(i=ev.i)

    @step
    async def gather(self, done: list[Done]) -> StopEvent:
        return StopEvent(result=done)


async def test_a_bare_event_from_a_list_annotation_fails_the_step() -> None:
    """Declared only inside a list, a bare event would open no stream (the collect step
    would never run): the step fails saying to return a one-element list."""
    with pytest.raises(WorkflowRuntimeError, match=r"returned a bare Item.*one-element list"):
        await BareReturn(timeout=BOUND).run()


def _collect_on_one_event() -> None:
    class Marked(Workflow):
        @step
        async def fan(self, ev: StartEvent) -> list[Item]:
            return []

        @step
        async def gather(self, done: Annotated[Item, Collect(Take(1))]) -> StopEvent:
            return StopEvent()


def test_a_collect_marker_goes_on_a_list_parameter() -> None:
    with pytest.raises(WorkflowValidationError, match=r"Collect\(\.\.\.\) marker goes on a list"):
        _collect_on_one_event()
