"""Runs tests/support/stream_flows.py's Scatter until it kills itself:
``python -m tests.support.stream_proc DB COUNTERS KILL`` (KILL: ``work-N``, ``gather``, or
``release``: as the stream's release is about to be committed, after its last member)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from tests.support.stream_flows import Scatter, _die


async def main(db: str, counters: str, kill: str) -> None:
    if kill == "release":
        from workflow import _streams

        def release(self: Any, *args: Any, **kwargs: Any) -> None:
            _die()

        _streams.StreamBook._release = release  # type: ignore[method-assign]
    wf = Scatter(store=db, timeout=None, counters=Path(counters), kill=kill)
    await wf.run(run_id="scatter")
    print("the flow finished: it was to be killed", flush=True)  # noqa: T201
    sys.exit(3)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
