"""Workflows the restore tests run, also in subprocesses: ``python -m tests.flows FLOW DB MODE``.

MODE is ``run`` (start a run, print its id, await it) or ``resume RUN_ID``. Steps leave
marker lines in ``DB.trace`` so a test can tell which steps ran in which process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

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


class EventA(Event):
    content: str


class EventB(Event):
    content: str


def trace(wf: Workflow, line: str) -> None:
    """Appends a line to the trace file beside the store (one write, so lines never tear)."""
    if wf.store.kind != "sqlite":
        return  # no file to leave the trace beside
    path = Path(str(wf.store.path) + ".trace")
    with path.open("a") as fh:
        fh.write(f"{os.getpid()} {line}\n")


def read_trace(db: Path) -> list[str]:
    path = Path(str(db) + ".trace")
    return [ln.split(" ", 1)[1] for ln in path.read_text().splitlines()] if path.exists() else []


class ReportFlow(Workflow):
    """The user report's second scenario: finish fails unless context key 'var' is set."""

    @step
    async def start(self, ev: StartEvent) -> EventA:
        trace(self, "start")
        return EventA(content="first")

    @step
    async def process(self, ev: EventA) -> EventB:
        trace(self, "process")
        return EventB(content="second: " + ev.content)

    @step
    async def finish(self, ctx: Context, ev: EventB) -> StopEvent:
        trace(self, "finish")
        if await ctx.get("var", default=None):
            return StopEvent(result="end: " + ev.content)
        msg = "var is not set"
        raise ValueError(msg)


class DiesOnce(Workflow):
    """The third step kills the process on its first attempt (a marker file says so)."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> EventA:
        trace(self, "start")
        await ctx.store.set("heavy", ["step one's result"])
        return EventA(content="a")

    @step
    async def process(self, ctx: Context, ev: EventA) -> EventB:
        trace(self, "process")
        heavy = await ctx.store.get("heavy")
        heavy.append("step two's result")
        await ctx.store.set("heavy", heavy)
        return EventB(content=ev.content + "b")

    @step
    async def finish(self, ctx: Context, ev: EventB) -> StopEvent:
        trace(self, "finish")
        marker = Path(str(self.store.path) + ".died")
        if not marker.exists():
            marker.touch()
            os._exit(9)  # the process dies in the middle of the step
        return StopEvent(result=ev.content + "c")


class AlwaysDies(Workflow):
    """A step whose input kills the process every time."""

    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        trace(self, "start")
        os._exit(9)


class Sleeper(Workflow):
    """A run that stays busy for a long time (for ownership tests)."""

    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        trace(self, "start")
        await asyncio.sleep(float(ev.get("seconds", 60)))
        return StopEvent(result="slept")


class Asker(Workflow):
    """Waits durably for a human's answer."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        trace(self, "ask")
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="name?")
        )
        return StopEvent(result=f"hello {answer.response}")


FLOWS: dict[str, type[Workflow]] = {
    "report": ReportFlow,
    "dies_once": DiesOnce,
    "always_dies": AlwaysDies,
    "sleeper": Sleeper,
    "asker": Asker,
}


async def _main(argv: list[str]) -> int:
    flow, db, mode, *rest = argv
    wf = FLOWS[flow](store=db, timeout=None)
    if mode == "run":
        handler = wf.run(run_id=rest[0] if rest else None, seconds=60)
    else:
        handler = wf.resume(rest[0])
    print(f"RUN {handler.run_id}", flush=True)
    if flow == "asker" and os.environ.get("ASKER_STAYS") != "1":
        await handler.wait_until_waiting(10)
        await handler.suspend()
        print("SUSPENDED", flush=True)
        return 0
    try:
        result = await handler
    except Exception as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"RESULT {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
