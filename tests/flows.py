"""Workflows the restore tests run, also in subprocesses: ``python -m tests.flows FLOW DB MODE``.

MODE is ``run`` (start a run, print its id, await it) or ``resume RUN_ID``. Steps leave
marker lines in ``DB.trace`` so a test can tell which steps ran in which process.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
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


def beside(store: str | Path, suffix: str) -> Path:
    """A file of the tests beside a store's file, or, for a PostgreSQL store, in the
    temporary folder under its schema's name."""
    where = str(store)
    if "://" in where:
        return Path(tempfile.gettempdir()) / f"{where.rsplit('schema=', 1)[-1]}{suffix}"
    return Path(where + suffix)


def trace_path(store: str | Path) -> Path:
    """The trace file of a store."""
    return beside(store, ".trace")


def trace(wf: Workflow, line: str) -> None:
    """Appends a line to the store's trace file (one write, so lines never tear)."""
    if wf.store.path is None:
        return  # an in-memory store: nowhere to leave the trace
    with trace_path(wf.store.path).open("a") as fh:
        fh.write(f"{os.getpid()} {line}\n")


def read_trace(db: str | Path) -> list[str]:
    path = trace_path(db)
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
        marker = beside(str(self.store.path), ".died")
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


class Replies(Workflow):
    """LlamaIndex's separate-steps human in the loop: one step asks, another takes the
    answer (no wait: the run is idle until the answer comes)."""

    @step
    async def ask(self, ev: StartEvent) -> InputRequiredEvent:
        return InputRequiredEvent(prefix="name?")

    @step
    async def reply(self, ev: HumanResponseEvent) -> StopEvent:
        return StopEvent(result=f"hello {ev.response}")


class EchoesTypes(Workflow):
    """Says the start event's ``n`` and the context's ``x``, each with its type."""

    @step
    async def echo(self, ctx: Context, ev: StartEvent) -> StopEvent:
        n, x = ev.get("n"), await ctx.store.get("x", default=None)
        return StopEvent(result=f"n={n!r} ({type(n).__name__}); x={x!r} ({type(x).__name__})")


FLOWS: dict[str, type[Workflow]] = {
    "report": ReportFlow,
    "dies_once": DiesOnce,
    "always_dies": AlwaysDies,
    "sleeper": Sleeper,
    "asker": Asker,
}


async def _main(argv: list[str]) -> int:
    flow, db, mode, *rest = argv
    # A PostgreSQL store's runs are leased: DW_LEASE_TTL shortens how long a killed
    # process's lease keeps its runs from the next one.
    ttl = os.environ.get("DW_LEASE_TTL")
    wf = FLOWS[flow](store=db, timeout=None, lease_ttl=float(ttl) if ttl else None)
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


class Approved(Event):
    """A user's own answer event, awaited by :class:`AwaitsApproval`."""

    by: str


class AwaitsApproval(Workflow):
    """Waits durably for an event class of the user's own module."""

    @step
    async def wait(self, ctx: Context, ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(Approved)
        return StopEvent(result=f"approved by {answer.by}")


class Gated(Workflow):
    """A step that waits until its gate file (``ev.gate``) exists, then ends the run: a
    step in flight for exactly as long as a test keeps the gate shut, in any process.

    With ``ev.block`` it waits blocking its event loop (as a step calling blocking code
    does), from when it has written the file ``<gate>.blocking`` (its start is durable by
    then): nothing else of its process runs meanwhile, not even a cancel's notice."""

    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        trace(self, "start")
        gate = Path(str(ev.get("gate")))
        if ev.get("block"):
            await asyncio.sleep(0.3)  # the start's commit completes on this loop meanwhile
            Path(f"{gate}.blocking").write_text("")
            while not gate.exists():
                time.sleep(0.02)  # noqa: ASYNC251
        while not gate.exists():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return StopEvent(result="through")
