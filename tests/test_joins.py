"""Joins: LlamaIndex's heterogeneous fan-in, a step with several event parameters.

A step ``async def assemble(self, h: Header, b: Body)`` runs once an event of each of its
parameters' classes has come, each bound by its class (two of one class by their order of
arrival), then again for the next full set. Its inputs wait in a buffer of the step's own,
kept in the log as ``collect_events`` keeps its buffers: a join left half full goes on
after a resume, and an attempt that fails gives its inputs back for the retry.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from eventstore import Commit, EventStore, LogCorruptedError, NewRun, Record
from workflow import Context, StartEvent, StopEvent, Workflow, WorkflowValidationError, step
from workflow import _journal as J
from workflow._read import fold_run
from workflow.errors import WorkflowTimeoutError
from workflow.events import Event, HumanResponseEvent, InputRequiredEvent
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed

BOUND = 10.0


class Header(Event):
    value: str


class Body(Event):
    value: str


class Footer(Event):
    value: str


class Assemble(Workflow):
    """Sends a footer, a header and a body, in that order; one step takes all three."""

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | Body | Footer | None:
        ctx.send_event(Footer(value="F"))
        ctx.send_event(Header(value="H"))
        ctx.send_event(Body(value="B"))
        return None

    @step
    async def assemble(self, ctx: Context, h: Header, b: Body, f: Footer) -> StopEvent:
        await ctx.store.set("joined", h.value + b.value + f.value)
        return StopEvent(result=await ctx.store.get("joined"))


async def test_a_join_binds_each_parameter_by_its_class(tmp_path: Path) -> None:
    """Whatever order they come in, each parameter gets the event of its class, and the
    step runs once; its partial inputs were committed as puts to its own buffer."""
    store = EventStore(tmp_path / "s.db")
    wf = Assemble(store=store, timeout=BOUND)
    handler = wf.run()
    assert await handler == "HBF"
    finished = [
        r for r in store.records(handler.run_id, kinds=[J.STEP_FINISHED]) if r.step == "assemble"
    ]
    assert len(finished) == 3  # two attempts only buffered their input, one ran the code
    collected = list(store.records(handler.run_id, kinds=[J.COLLECTED]))
    assert {r.step for r in collected} == {"assemble"}
    store.close()


class Pairs(Workflow):
    """Four headers, joined two by two by a plain (thread) step."""

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | None:
        for value in "abcd":
            ctx.send_event(Header(value=value))
        return None

    @step
    def pair(self, first: Header, second: Header) -> Body:
        return Body(value=first.value + second.value)

    @step
    async def finish(self, ctx: Context, ev: Body) -> StopEvent | None:
        got = ctx.collect_events(ev, [Body, Body])
        return None if got is None else StopEvent(result=sorted(b.value for b in got))


async def test_a_join_of_one_class_binds_by_arrival_batch_after_batch(tmp_path: Path) -> None:
    """Two parameters of one class take the events in the order they came, and a join
    runs again for each full set."""
    wf = Pairs(store=EventStore(tmp_path / "s.db"), timeout=BOUND)
    assert await wf.run() == ["ab", "cd"]
    wf.store.close()


class Late(Workflow):
    """The header comes at once; the body only once a human answers (separate steps)."""

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | InputRequiredEvent | None:
        ctx.send_event(Header(value="h"))
        return InputRequiredEvent(prefix="body?")

    @step
    async def answer(self, ev: HumanResponseEvent) -> Body:
        return Body(value=ev.response)

    @step
    async def join(self, h: Header, b: Body) -> StopEvent:
        return StopEvent(result=h.value + b.value)


async def test_a_half_full_join_goes_on_after_a_resume(tmp_path: Path) -> None:
    """The header waits in the join's buffer in the log: the run times out waiting for the
    body, another workflow object resumes it with the answer, and the join runs with the
    header of the first session."""
    db = tmp_path / "s.db"
    wf = Late(store=db, timeout=0.5)
    with pytest.raises(WorkflowTimeoutError):
        await wf.run(run_id="r")
    wf.store.close()
    again = Late(store=db, timeout=BOUND)
    again.send("r", HumanResponseEvent(response="b"))
    async with asyncio.timeout(BOUND):
        assert await again.resume("r") == "hb"
    again.store.close()


class Flaky(Workflow):
    """A join that fails at its first attempt and is retried."""

    calls: ClassVar[list[str]] = []

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | Body | None:
        ctx.send_event(Header(value="h"))
        ctx.send_event(Body(value="b"))
        return None

    @step(retry_policy=retry_policy(stop=stop_after_attempt(2), wait=wait_fixed(0.01)))
    async def join(self, h: Header, b: Body) -> StopEvent:
        Flaky.calls.append(h.value + b.value)
        if len(Flaky.calls) == 1:
            raise RuntimeError("first attempt")
        return StopEvent(result=h.value + b.value)


async def test_a_failed_join_gives_its_inputs_back_to_its_retry(tmp_path: Path) -> None:
    """The failed attempt's take is undone, so its retry joins the same events."""
    Flaky.calls = []
    wf = Flaky(store=EventStore(tmp_path / "s.db"), timeout=BOUND)
    assert await wf.run() == "hb"
    assert Flaky.calls == ["hb", "hb"]
    wf.store.close()


def test_each_parameter_of_a_join_names_one_event_class() -> None:
    """A union in a join: refused as the workflow class is made, by name."""
    with pytest.raises(WorkflowValidationError, match=r"'b' .* single event type, not Body"):

        class Union(Workflow):
            @step
            async def emit(self, ev: StartEvent) -> Header | None:
                return None

            @step
            async def join(self, h: Header, b: Body | Footer) -> StopEvent:
                return StopEvent()


class Overtaken(Pairs):
    """Pairs whose first pair's attempt commits last: its take of a and b is written
    after the puts of c and d, and the take of those."""

    @step(num_workers=4)
    async def pair(self, first: Header, second: Header) -> Body:  # type: ignore[override]
        if first.value == "a":
            await asyncio.sleep(0.2)
        return Body(value=first.value + second.value)


async def test_the_log_folds_to_what_the_live_buffer_took(tmp_path: Path) -> None:
    """A take records the events it took: the fold takes those, not the first of each
    class in the order the puts were written (which would leave b, already joined with a,
    in the buffer, and lose c, had the run stopped there)."""
    store = EventStore(tmp_path / "s.db")
    wf = Overtaken(store=store, timeout=BOUND)
    handler = wf.run()
    assert await handler == ["ab", "cd"]
    takes = [
        r
        for r in store.records(handler.run_id, kinds=[J.COLLECTED])
        if r.step == "pair" and r.data().get("takes")
    ]
    assert [r.data()["ids"] for r in takes] == [[[4, 5]], [[2, 3]]]  # c, d first, then a, b
    between = fold_run(store, handler.run_id, takes[0].commit_seq)
    ((left,),) = [list(b.values()) for k, b in between.buffers.items() if k.startswith("pair:")]
    assert [e.id for e in left] == [2]  # a waits for b's commit, as it did live
    assert not fold_run(store, handler.run_id).buffers
    store.close()


@pytest.mark.parametrize(
    "ids",
    [[[0, 10**12]], [[3, 2]], [["a", "b"]], [[2, 3]]],
    ids=["a-billion", "backwards", "not-ids", "more-than-counted"],
)
def test_a_take_whose_ids_do_not_fit_is_refused_by_seq(tmp_path: Path, ids: list[Any]) -> None:
    """A damaged take (ids that do not fit its counts) is refused naming its seq, without
    expanding its runs."""
    put = {"id": 2, "event": {"$t": "model", "c": "m:Header", "v": {"value": "a"}}}
    payloads = [
        {"buf": "b", "put": put, "take": None, "v": 2},
        {"buf": "b", "put": None, "take": None, "v": 2, "takes": {"Header": 1}, "ids": ids},
    ]
    with EventStore(tmp_path / "s.db") as store:
        records = [Record(J.COLLECTED, "pair", orjson.dumps(p).decode()) for p in payloads]
        store.append_sync(Commit("r", records, create=NewRun()))
        with pytest.raises(LogCorruptedError, match=r"record seq 2"):
            fold_run(store, "r", cached=False)


def test_a_take_written_before_a_put_it_took_keeps_the_run_readable(tmp_path: Path) -> None:
    """Two attempts that each took what the other put commit as they come, so a take may
    name an event whose put is written after it: the fold takes what the buffer holds of
    it and goes on (the put, written later, stays in the buffer, as before ids)."""
    put_a = {"id": 2, "event": {"$t": "model", "c": "m:Header", "v": {"value": "a"}}}
    put_b = {"id": 3, "event": {"$t": "model", "c": "m:Header", "v": {"value": "b"}}}
    payloads = [
        {"buf": "b", "put": put_a, "take": None, "v": 2},
        {"buf": "b", "put": None, "take": None, "v": 2, "takes": {"Header": 2}, "ids": [[2, 3]]},
        {"buf": "b", "put": put_b, "take": None, "v": 2},
    ]
    with EventStore(tmp_path / "s.db") as store:
        records = [Record(J.COLLECTED, "pair", orjson.dumps(p).decode()) for p in payloads]
        store.append_sync(Commit("r", records, create=NewRun()))
        folded = fold_run(store, "r", cached=False)
        assert [e.id for e in folded.buffers["pair:b"]["Header"]] == [3]


def test_a_join_of_two_classes_of_one_name_is_refused() -> None:
    """A join's buffer holds events by class name without module (as collect_events'
    does): two parameters whose classes share a name are refused by name."""
    first = type("Part", (Event,), {"__module__": "m1", "__annotations__": {"x": int}})
    second = type("Part", (Event,), {"__module__": "m2", "__annotations__": {"x": int}})

    async def join(self: Workflow, a: Any, b: Any) -> StopEvent:
        return StopEvent()

    join.__annotations__ = {"a": first, "b": second, "return": StopEvent}
    with pytest.raises(WorkflowValidationError, match="Part names classes of several modules"):

        class Clash(Workflow):
            @step
            async def emit(self, ev: StartEvent) -> None:
                return None

            joined = step(join)


class HeaderChild(Header):
    """A header of a more particular kind."""


class BodyChild(Body):
    """A body of a more particular kind."""


class Subclasses(Workflow):
    """A join taking subclasses: a HeaderChild fills ``h``, a BodyChild ``b``."""

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | Body | None:
        ctx.send_event(BodyChild(value="B"))
        ctx.send_event(HeaderChild(value="H"))
        return None

    @step(accept_event_subclasses=True)
    async def assemble(self, h: Header, b: Body) -> StopEvent:
        return StopEvent(result=f"{h.value}{b.value}:{type(h).__name__},{type(b).__name__}")


class Overlapping(Workflow):
    """Two slots a HeaderChild could fill: the parent's event fills the parent's slot,
    the child's its own, in either order of arrival."""

    order: ClassVar[tuple[str, str]] = ("parent", "child")

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | HeaderChild | None:
        for which in self.order:
            ctx.send_event(Header(value=which) if which == "parent" else HeaderChild(value=which))
        return None

    @step(accept_event_subclasses=True)
    async def assemble(self, parent: Header, child: HeaderChild) -> StopEvent:
        return StopEvent(result=f"{parent.value},{child.value}")


class ChildFirst(Overlapping):
    order = ("child", "parent")


class TwoChildren(Workflow):
    """Events that could fill either slot go to the parameters in their order of arrival;
    one only a slot takes is given it, the others the rest (LlamaIndex 2.26.1's results)."""

    order: ClassVar[tuple[str, ...]] = ("C1", "C2")

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | HeaderChild | None:
        for v in self.order:
            ctx.send_event(Header(value=v) if v == "P" else HeaderChild(value=v))
        return None

    @step(accept_event_subclasses=True)
    async def assemble(self, parent: Header, child: HeaderChild) -> StopEvent:
        return StopEvent(result=f"{parent.value},{child.value}")


class ChildParentChild(TwoChildren):
    order = ("C1", "P", "C2")


class ChildChildParent(TwoChildren):
    order = ("C1", "C2", "P")


@pytest.mark.parametrize(
    ("flow", "want"),
    [(TwoChildren, "C1,C2"), (ChildParentChild, "P,C1"), (ChildChildParent, "C1,C2")],
)
async def test_events_fitting_several_slots_are_assigned_as_llamaindex_does(
    flow: type[Workflow], want: str, tmp_path: Path
) -> None:
    assert await flow(store=tmp_path / "s.db", timeout=BOUND).run() == want


async def test_a_join_taking_subclasses_fills_each_slot_as_llamaindex_does(
    tmp_path: Path,
) -> None:
    """As LlamaIndex 2.26.1 runs them: each event fills a slot of its class or of a base,
    one of its exact class first; the log folds to the same buffers."""
    wf = Subclasses(store=tmp_path / "s.db", timeout=BOUND)
    handler = wf.run()
    assert await handler == "HB:HeaderChild,BodyChild"
    assert await Overlapping(store=tmp_path / "s.db", timeout=BOUND).run() == "parent,child"
    assert await ChildFirst(store=tmp_path / "s.db", timeout=BOUND).run() == "parent,child"
    state = fold_run(wf.store, handler.run_id)
    assert state.buffers == {}  # every put was taken, by the slots it was put in


class HalfSubclass(Workflow):
    """A join taking subclasses left half full: the HeaderChild waits in the ``h`` slot
    while the body waits for a human."""

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | InputRequiredEvent | None:
        ctx.send_event(HeaderChild(value="h"))
        return InputRequiredEvent(prefix="body?")

    @step
    async def answer(self, ev: HumanResponseEvent) -> BodyChild:
        return BodyChild(value=ev.response)

    @step(accept_event_subclasses=True)
    async def join(self, h: Header, b: Body) -> StopEvent:
        return StopEvent(result=h.value + b.value + ":" + type(h).__name__)


async def test_a_half_full_join_of_subclasses_goes_on_after_a_resume(tmp_path: Path) -> None:
    """The slot a subclass's event fills is in the log (``collected.slot``): a resume in
    another workflow object finds the HeaderChild in the ``h`` slot and joins it."""
    db = tmp_path / "s.db"
    wf = HalfSubclass(store=db, timeout=0.5)
    with pytest.raises(WorkflowTimeoutError):
        await wf.run(run_id="r")
    puts = [
        orjson.loads(r.payload)
        for r in wf.store.records("r")
        if r.kind == J.COLLECTED and orjson.loads(r.payload).get("put")
    ]
    assert [p.get("slot") for p in puts] == ["*"]  # waiting, unassigned, for a full set
    (buffer,) = fold_run(wf.store, "r").buffers.values()
    assert list(buffer) == ["*"]  # the fold keeps it where the live buffer did
    wf.store.close()
    again = HalfSubclass(store=db, timeout=BOUND)
    again.send("r", HumanResponseEvent(response="b"))
    async with asyncio.timeout(BOUND):
        assert await again.resume("r") == "hb:HeaderChild"
    again.store.close()


class FlakySubclass(Workflow):
    """A join taking subclasses that fails once: its retry gets the same slots back."""

    calls: ClassVar[list[str]] = []

    @step
    async def emit(self, ctx: Context, ev: StartEvent) -> Header | Body | None:
        ctx.send_event(HeaderChild(value="h"))
        ctx.send_event(BodyChild(value="b"))
        return None

    @step(
        accept_event_subclasses=True,
        retry_policy=retry_policy(stop=stop_after_attempt(2), wait=wait_fixed(0.01)),
    )
    async def join(self, h: Header, b: Body) -> StopEvent:
        FlakySubclass.calls.append(h.value + b.value)
        if len(FlakySubclass.calls) == 1:
            raise RuntimeError("first attempt")
        return StopEvent(result=h.value + b.value)


async def test_a_failed_join_of_subclasses_gives_its_slots_back(tmp_path: Path) -> None:
    FlakySubclass.calls = []
    wf = FlakySubclass(store=EventStore(tmp_path / "s.db"), timeout=BOUND)
    assert await wf.run() == "hb"
    assert FlakySubclass.calls == ["hb", "hb"]
    wf.store.close()
