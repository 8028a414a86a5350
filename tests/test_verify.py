"""verify: recorded runs checked against today's code, with and without re-execution."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.flows import EventA, EventB, Replies, ReportFlow
from tests.test_collect import FanIn
from tests.test_engine import Appender, Counter
from tests.test_human_in_the_loop import Approvals
from tests.test_joins import Assemble, Overtaken
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow._verify import verify
from workflow.cli import cli


async def recorded_report(db: Path) -> str:
    wf = ReportFlow(store=db)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    await wf.resume(h.run_id, updates={"var": 1})
    return h.run_id


async def test_unchanged_code_verifies(tmp_path: Path) -> None:
    """Runs recorded by today's code pass, also when re-executed."""
    db = tmp_path / "v.db"
    run_id = await recorded_report(db)
    wf = Appender(store=tmp_path / "a.db")
    wf.n = 50
    h = wf.run()
    await h
    report = verify(ReportFlow(store=db), [run_id], reexecute=True)
    assert report.ok, report.problems
    assert report.attempts_reexecuted >= 3
    wf2 = Appender(store=tmp_path / "a.db")
    wf2.n = 50
    report2 = verify(wf2, reexecute=True)
    assert report2.ok, report2.problems
    assert report2.attempts_reexecuted == 51


class ReportFlowRenamed(Workflow):
    """The finish step was renamed and now returns a different event."""

    @step
    async def start(self, ev: StartEvent) -> EventA:
        return EventA(content="first")

    @step
    async def process(self, ev: EventA) -> EventB | StopEvent:
        return StopEvent(result="changed")

    @step
    async def complete(self, ctx: Context, ev: EventB) -> StopEvent:
        return StopEvent(result="x")


async def test_changed_graph_and_outputs_are_reported(tmp_path: Path) -> None:
    """A renamed step and changed return types are listed without running anything."""
    db = tmp_path / "v.db"
    run_id = await recorded_report(db)
    report = verify(ReportFlowRenamed(store=db), [run_id])
    kinds = {(p.kind, p.step) for p in report.problems}
    assert ("graph", "finish") in kinds
    assert ("graph", "complete") in kinds
    assert ("graph", "process") in kinds
    assert not report.ok


class NewProcess(Workflow):
    @step
    async def start(self, ev: StartEvent) -> EventA:
        return EventA(content="first")

    @step
    async def process(self, ev: EventA) -> EventB:
        return EventB(content="different: " + ev.content)

    @step
    async def finish(self, ctx: Context, ev: EventB) -> StopEvent:
        return StopEvent(result="end: " + ev.content)


async def test_reexecution_finds_the_first_divergence(tmp_path: Path) -> None:
    """A step whose output changed is reported at its seq with expected and got."""
    db = tmp_path / "v.db"
    run_id = await recorded_report(db)
    assert verify(NewProcess(store=db), [run_id]).ok  # statically nothing changed
    report = verify(NewProcess(store=db), [run_id], reexecute=True)
    divergent = [p for p in report.problems if p.kind == "divergence"]
    assert [p.step for p in divergent] == ["process"]
    assert "EventB" in divergent[0].message


async def test_the_first_divergence_is_shown_side_by_side(tmp_path: Path) -> None:
    """Recorded and re-executed outcome of the first diverging attempt, field by field, as
    data (``expected``/``actual``, also in ``workflow verify --json``) and as text."""
    db = tmp_path / "v.db"
    run_id = await recorded_report(db)
    report = verify(NewProcess(store=db), [run_id], reexecute=True)
    first = report.first_divergence
    assert first is not None
    assert first.expected == {
        "record": "step_finished",
        "step": "process",
        "input": "EventA",
        "emitted": [{"type": "EventB", "fields": {"content": "second: first"}}],
    }
    assert first.actual == {
        "record": "step_finished",
        "step": "process",
        "input": "EventA",
        "emitted": [{"type": "EventB", "fields": {"content": "different: first"}}],
    }
    lines = str(first).splitlines()
    assert lines[1].strip().startswith("recorded: step_finished, step 'process', input EventA")
    assert 'EventB({"content":"second: first"})' in lines[1]
    assert 'EventB({"content":"different: first"})' in lines[2]
    spec = f"{__name__}:NewProcess"
    shown = CliRunner().invoke(
        cli, ["verify", str(db), run_id, "--workflow", spec, "--reexecute", "--json"]
    )
    assert shown.exit_code == 1, shown.output
    (problem,) = [p for p in json.loads(shown.stdout)["problems"] if p["kind"] == "divergence"]
    assert problem["expected"] == first.expected
    assert problem["actual"] == first.actual
    assert verify(NewProcess(store=db), [run_id]).first_divergence is None


async def test_conflicting_run_verifies(tmp_path: Path) -> None:
    """A run with conflicts and re-runs replays each recorded successful attempt."""
    wf = Counter(store=tmp_path / "c.db", timeout=60)
    await wf.run(n=100)
    report = verify(Counter(store=tmp_path / "c.db"), reexecute=True)
    assert report.ok, report.problems[:3]


async def _answered(wf: Workflow) -> str:
    """Runs ``wf``, answering every question it streams; returns the run id."""
    handler = wf.run(k=3) if isinstance(wf, FanIn) else wf.run()
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            handler.ctx.send_event(HumanResponseEvent(response="ok"))
    await handler
    return handler.run_id


@pytest.mark.parametrize(
    "flow",
    [FanIn, Assemble, Overtaken, Approvals, Replies],
    ids=["collect_events", "join", "join-overtaken", "wait_for_event", "question-returned"],
)
async def test_reexecuting_finds_no_divergence_where_the_run_was_deterministic(
    tmp_path: Path, flow: type[Workflow]
) -> None:
    """Re-executed attempts get what the recorded ones read besides the context: a collect's
    outcome as the log recorded it (a slower collector's take written after a later one's
    commit left the fold before it unlike the live buffer: ``join-overtaken``), the answers
    to their waits (each waiting step's second attempt raised the wait again), and a
    question an attempt returned is streamed, not emitted, as its commit recorded it."""
    db = tmp_path / "c.db"
    run_id = await _answered(flow(store=db, timeout=10))
    report = verify(flow(store=db), [run_id], reexecute=True)
    assert report.problems == []
    assert report.attempts_reexecuted >= 2


class Part(Event):
    x: int


class Go(Event):
    xs: list[int]


class Out(Event):
    pairs: list[list[int]]


class TwoTakes(Workflow):
    """One attempt that takes twice from one buffer, the first take with an event put
    before the attempt began."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Go | None:
        ctx.send_event(Go(xs=[10]))
        await asyncio.sleep(0.1)
        ctx.send_event(Go(xs=[1, 2, 3]))
        return None

    @step
    async def pairs(self, ctx: Context, ev: Go) -> Out:
        out = []
        for x in ev.xs:
            got = ctx.collect_events(Part(x=x), [Part, Part], buffer_id="pp")
            if got is not None:
                out.append([p.x for p in got])
        return Out(pairs=out)

    @step
    async def end(self, ev: Out) -> StopEvent | None:
        return StopEvent(result=ev.pairs) if ev.pairs else None


async def test_reexecuting_an_attempt_that_took_twice_from_one_buffer(tmp_path: Path) -> None:
    """Each of an attempt's takes from a buffer is given back to its re-execution."""
    db = tmp_path / "t.db"
    wf = TwoTakes(store=db, timeout=10)
    handler = wf.run()
    assert await handler == [[10, 1], [2, 3]]
    assert verify(TwoTakes(store=db), [handler.run_id], reexecute=True).problems == []
