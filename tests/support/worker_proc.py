"""A worker process for the worker tests: ``python -m tests.support.worker_proc STORE [TTL]``."""

from __future__ import annotations

import asyncio
import sys

from tests.test_workers import Doubler
from workflow import Worker


async def main(store: str, ttl: float | None) -> None:
    wf = Doubler(store=store, timeout=None, lease_ttl=ttl)
    worker = Worker(wf, concurrency=4, poll_interval=0.05)
    print("READY", flush=True)
    await worker.run(handle_signals=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None))
