"""A fan-out / fan-in flow for the collection-stream tests (``tests/test_collect_streams``):
each attempt of ``work`` and ``gather`` leaves a file in ``counters``; ``kill`` names where
the process kills itself (SIGKILL) the first time it gets there."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from workflow import Event, StartEvent, StopEvent, Workflow, step


class Item(Event):
    i: int


class Done(Event):
    i: int


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Scatter(Workflow):
    """Eight items, four workers; odd items are slower; item 6 is dropped (None)."""

    def __init__(self, *, counters: Path, kill: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.counters = counters
        self.kill = kill

    def _mark(self, what: str) -> int:
        """Counts an attempt of ``what`` in its file; returns how many came before."""
        path = self.counters / what
        before = path.read_text() if path.exists() else ""
        path.write_text(before + "x")
        return len(before)

    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(8)]

    @step(num_workers=4)
    async def work(self, ev: Item) -> Done | None:
        if self._mark(f"work-{ev.i}") == 0 and self.kill == f"work-{ev.i}":
            _die()
        await asyncio.sleep(0.01 * (ev.i % 2))
        return None if ev.i == 6 else Done(i=ev.i)

    @step
    async def gather(self, done: list[Done]) -> StopEvent:
        if self._mark("gather") == 0 and self.kill == "gather":
            _die()
        return StopEvent(result=sorted(d.i for d in done))
