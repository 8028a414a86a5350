"""Flows whose steps make paid calls through ``ctx.memo``, for tests/test_memo.py.

Each paid call appends a line to a counter file (``COUNTERS/<name>``), so a test counts the
calls made in every process. ``kill`` names the point at which the process kills itself
with SIGKILL (the flows are run so by ``tests.support.memo_proc``); the test process passes None.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

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
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed


def calls(counters: Path, name: str) -> int:
    """How many times the paid call ``name`` was made, in every process."""
    path = counters / name
    return len(path.read_text().splitlines()) if path.exists() else 0


class Paid(Workflow):
    """A flow with a paid call that counts itself, and a point to die at."""

    def __init__(self, *args: Any, counters: Path, kill: str | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.counters = counters
        self.kill = kill
        self.attempts_here = 0  # attempts of the agent step in this process

    async def paid(self, name: str, arg: str) -> str:
        """The expensive call: counted in a file, then answered."""
        with (self.counters / name).open("a") as f:
            f.write(f"{arg}\n")
        return f"{name}({arg})"

    def die_at(self, point: str) -> None:
        if self.kill == point:
            os.kill(os.getpid(), signal.SIGKILL)


class CrashFlow(Paid):
    """Two paid calls; the process dies between them."""

    @step
    async def agent(self, ctx: Context, ev: StartEvent) -> StopEvent:
        a = await ctx.memo("first", self.paid, "first", ev.topic)
        self.die_at("between")
        b = await ctx.memo("second", self.paid, "second", a)
        return StopEvent(result=[a, b])


class WaitFlow(Paid):
    """A paid call, a wait for a human, a paid call with the answer."""

    @step
    async def agent(self, ctx: Context, ev: StartEvent) -> StopEvent:
        a = await ctx.memo("first", self.paid, "first", ev.topic)
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix=f"go on with {a}?")
        )
        b = await ctx.memo("second", self.paid, "second", answer.response)
        return StopEvent(result=[a, b])


class Go(Event):
    """Starts the agent and the step that changes what the agent read."""


class ConflictFlow(Paid):
    """The agent's read goes stale (``bump`` writes it) after its first paid call: it
    conflicts, runs again, and dies in the re-run between its two calls."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Go:
        await ctx.store.set("topic", ev.topic)
        return Go()

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.read = asyncio.Event()

    @step
    async def bump(self, ctx: Context, ev: Go) -> None:
        await self.read.wait()  # the agent has read the count: this write makes it stale
        await ctx.store.set("count", 5)

    @step
    async def agent(self, ctx: Context, ev: Go) -> StopEvent:
        self.attempts_here += 1
        a = await ctx.memo("first", self.paid, "first", "topic")
        count = await ctx.store.get("count", default=0)
        self.read.set()
        while self.state_at(ctx.run_id).context.get("count") is None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # until bump's write is committed: this read is stale
        await ctx.store.set("count", count + 1)
        if self.attempts_here > 1:
            self.die_at("between")
        b = await ctx.memo("second", self.paid, "second", a)
        return StopEvent(result=[a, b])


class RetryFlow(Paid):
    """A step a retry policy re-runs: ``first`` is reused (``reuse_on_retry=True``),
    ``fresh`` is paid again by the retry; the retry's process dies before ``second``."""

    @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(3)))
    async def agent(self, ctx: Context, ev: StartEvent) -> StopEvent:
        self.attempts_here += 1
        a = await ctx.memo("first", self.paid, "first", ev.topic, reuse_on_retry=True)
        f = await ctx.memo("fresh", self.paid, "fresh", ev.topic)
        if self.attempts_here == 1 and self.kill is not None:
            raise ConnectionError("the network went away")
        self.die_at("between")
        b = await ctx.memo("second", self.paid, "second", a + f)
        return StopEvent(result=[a, b])


FLOWS: dict[str, type[Paid]] = {
    "crash": CrashFlow,
    "wait": WaitFlow,
    "conflict": ConflictFlow,
    "retry": RetryFlow,
}


class SleepFlow(Paid):
    """A paid call, a durable sleep of ``SLEEP`` seconds, a paid call."""

    sleep_threshold = 0.5

    @step
    async def agent(self, ctx: Context, ev: StartEvent) -> StopEvent:
        a = await ctx.memo("first", self.paid, "first", ev.topic)
        await ctx.sleep(SLEEP)
        b = await ctx.memo("second", self.paid, "second", a)
        return StopEvent(result=[a, b])


SLEEP = 1.5
FLOWS["sleep"] = SleepFlow


class ChildFlow(Paid):
    """A child run with a paid call; its process may die after it."""

    gate: asyncio.Event | None = None

    @step
    async def work(self, ctx: Context, ev: StartEvent) -> StopEvent:
        c = await ctx.memo("child_call", self.paid, "child_call", ev.topic)
        self.die_at("in_child")
        if self.gate is not None:
            await self.gate.wait()
        return StopEvent(result=c)


class ParentFlow(Paid):
    """A paid call, then a child run given the result."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.child = ChildFlow(
            store=self.store, timeout=None, counters=self.counters, kill=self.kill
        )

    @step
    async def agent(self, ctx: Context, ev: StartEvent) -> StopEvent:
        a = await ctx.memo("first", self.paid, "first", ev.topic)
        got = await ctx.run_workflow(self.child, topic=a)
        return StopEvent(result=[a, got])


FLOWS["parent"] = ParentFlow
