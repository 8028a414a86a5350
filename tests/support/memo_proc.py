"""Runs a flow of tests/support/memo_flows.py until it kills itself:
``python -m tests.support.memo_proc DB FLOW COUNTERS KILL`` (KILL: ``between``, or
``waiting``: once the run waits)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from tests.support.memo_flows import FLOWS


async def main(db: str, flow: str, counters: str, kill: str) -> None:
    wf = FLOWS[flow](store=db, timeout=None, counters=Path(counters), kill=kill)
    handler = wf.run(run_id="agent", topic="llamas")
    if kill == "waiting":
        await handler.wait_until_waiting(60.0)
        os.kill(os.getpid(), signal.SIGKILL)
    await handler
    print("the flow finished: it was to be killed", flush=True)  # noqa: T201
    sys.exit(3)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
