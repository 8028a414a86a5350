"""LlamaIndex Workflows, the loop workload: prints one JSON line (runs in the peers venv).

``python llama_loop.py memory N`` runs in memory, with no persistence at all.
``python llama_loop.py manual N FILE`` checkpoints by hand as users do (see
shared/context): after every step, ``handler.ctx.to_dict()`` dumped as JSON, one line per
step appended to FILE, so any step can be restored (what our log gives). ``to_dict`` works
only from outside the steps, so the step streams a ``Tick`` and the caller dumps on each.

Output: ``seconds`` (``run`` to result, checkpoints included), ``bytes`` (FILE's size).
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import argparse  # noqa: E402 - the clock above starts before the imports it measures
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

from workflows import Context, Workflow, step  # noqa: E402
from workflows.events import Event, StartEvent, StopEvent  # noqa: E402

ITEM = "x" * 100


class Again(Event):
    """Runs the loop step once more."""

    i: int
    n: int


class Tick(Event):
    """Streamed after each step, so the caller can checkpoint."""

    i: int


class LoopFlow(Workflow):
    """One step looping ``n`` times, appending 100 bytes to ``items`` in the state store."""

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i, n = (ev.i, ev.n) if isinstance(ev, Again) else (0, int(ev.n))
        items = await ctx.store.get("items", default=[])
        items.append(ITEM)
        await ctx.store.set("items", items)
        ctx.write_event_to_stream(Tick(i=i))
        if i + 1 >= n:
            return StopEvent(result=len(items))
        return Again(i=i + 1, n=n)


async def run(mode: str, n: int, path: str | None) -> dict[str, Any]:
    """Runs the loop once and returns what to print."""
    wf = LoopFlow(timeout=None)
    start = time.perf_counter()
    handler = wf.run(n=n)
    if mode == "manual":
        assert path is not None
        with open(path, "w") as fh:  # noqa: ASYNC230 - blocking, as the users' code is
            async for ev in handler.stream_events():
                if isinstance(ev, Tick):
                    fh.write(json.dumps(handler.ctx.to_dict()) + "\n")
                    fh.flush()
    result = await handler
    seconds = time.perf_counter() - start
    if result != n:
        msg = f"the loop returned {result!r}, expected {n}"
        raise AssertionError(msg)
    size = os.path.getsize(path) if mode == "manual" and path else 0  # noqa: ASYNC240
    return {"seconds": seconds, "bytes": size, "import_s": start - _START}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["memory", "manual"])
    parser.add_argument("n", type=int)
    parser.add_argument("file", nargs="?")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.mode, args.n, args.file))), flush=True)


if __name__ == "__main__":
    main()
