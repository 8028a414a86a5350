"""A run that advances only when the test says so, for watching a live run in the web UI:
``python -m tests.support.live_flow DB RUN_ID N``. Tick ``i`` waits until the file ``DB.gate`` holds
a number of at least ``i``, then records it and goes on; after ``N`` ticks the run ends."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Tick(Event):
    n: int


def opened(gate: Path) -> int:
    """How many ticks the gate lets through so far."""
    try:
        return int(gate.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


class Ticking(Workflow):
    """Ticks one step at a time, each when its gate opens."""

    @step
    async def begin(self, ctx: Context, ev: StartEvent) -> Tick:
        await ctx.store.set("last", int(ev.get("last", 3)))
        return Tick(n=1)

    @step
    async def tick(self, ctx: Context, ev: Tick) -> Tick | StopEvent:
        gate = Path(str(self.store.path) + ".gate")
        while opened(gate) < ev.n:  # noqa: ASYNC110 - the test opens it by writing a file
            await asyncio.sleep(0.02)
        await ctx.store.set("ticks", ev.n)
        if ev.n >= int(await ctx.store.get("last")):
            return StopEvent(result=f"ticked {ev.n} times")
        return Tick(n=ev.n + 1)


async def _main(db: str, run_id: str, n: int) -> None:
    wf = Ticking(store=db, timeout=None)
    h = wf.run(run_id=run_id, last=n)
    print("RESULT", await h, flush=True)  # noqa: T201 - the test reads it


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
