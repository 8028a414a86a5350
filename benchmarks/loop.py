"""loop (issue 3): one step running N times, each appending a 100-byte item to a list held
in context state, the workload our users compare with LlamaIndex, LangGraph and DBOS.

Each step reads the list, appends, and sets it back, as a LlamaIndex user writes it::

    items = await ctx.store.get("items", default=[])
    items.append("x" * 100)
    await ctx.store.set("items", items)

The list grows to N items, so a store that wrote the whole list at every step would write
O(N^2) bytes; the goal is that ours grows linearly. N = 1000 and 3000 (quick: 50), on the
in-memory store, a file at durability "normal" and a file at "full". Measured per run: the
wall time from ``run`` to the result, bytes on disk (db + wal, store closed), and
``state_at`` at the latest and the middle checkpoint, in this process and in a fresh one.

Goals (issue 3), for a file store at durability "normal": N=1000 in at most 0.3 s and
1 MB (10^6 bytes); N=3000 linear: time and bytes per step at most 1.25x those at N=1000.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step

from ._runs import CRASH_ENV, StoreKind, bench, linear

NAME = "loop"
SIZES = ((1000, 3000), (50,))  # (full run, quick run)
ITEM = "x" * 100
GOAL_SECONDS = 0.3
GOAL_BYTES = 1_000_000
GOAL_LINEAR = 1.25
# The step about to run when this process should die (crash -> resume benchmarks); -1: never.
CRASH_AT = int(os.environ.get(CRASH_ENV, "-1"))


class Again(Event):
    """Runs the loop step once more: ``i`` steps done so far, ``n`` in all."""

    i: int
    n: int


class LoopFlow(Workflow):
    """One step that loops ``n`` times (``run(n=...)``), growing ``items`` in context."""

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:  # type: ignore[type-arg]
        i, n = (ev.i, ev.n) if isinstance(ev, Again) else (0, int(ev["n"]))
        if i == CRASH_AT:
            os._exit(9)  # a simulated crash in the middle of the run
        items = await ctx.store.get("items", default=[])
        items.append(ITEM)
        await ctx.store.set("items", items)
        if i + 1 >= n:
            return StopEvent(result=len(items))
        return Again(i=i + 1, n=n)


def workflow_class(n: int) -> type[Workflow]:
    """The flow for N steps (one class for every N: N is the start event's field)."""
    return LoopFlow


def _goal(
    n: int,
    kind: StoreKind,
    entry: dict[str, Any],
    entries: dict[tuple[int, StoreKind], dict[str, Any]],
) -> tuple[str, bool, str] | None:
    if kind != "normal":
        return None
    if n == 1000:
        seconds, size = entry["seconds"]["median"], entry["bytes"]["median"]
        met = seconds <= GOAL_SECONDS and size <= GOAL_BYTES
        text = f"{seconds:.3g} s, {size / 1e6:.3g} MB: {'yes' if met else 'NO'}"
        return text, met, f"<= {GOAL_SECONDS} s and <= {GOAL_BYTES} bytes at N=1000"
    ratios = linear(n, kind, entries)
    if ratios is None:
        return None
    t, b = ratios
    met = t <= GOAL_LINEAR and b is not None and b <= GOAL_LINEAR
    text = f"per step vs N={min(k for k, _ in entries)}: time {t:.2f}x, bytes {b or 0:.2f}x: "
    text += "yes" if met else "NO"
    return text, met, f"time and bytes per step <= {GOAL_LINEAR}x those at the smallest N"


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the loop at each size on each store, prints the table, writes ``loop.json``."""
    return bench(
        NAME,
        "loop: one step x N, appending 100 bytes to a context list per step",
        sizes=SIZES[1 if quick else 0],
        quick=quick,
        repeat=repeat,
        out_dir=out_dir,
        goal=_goal,
        goal_header="goal (file, normal)",
    )
