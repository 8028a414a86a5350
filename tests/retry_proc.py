"""Fails a step and dies in its backoff: ``python -m tests.retry_proc DB FLOW RUN_ID``.

Starts run ``RUN_ID`` of ``tests.test_durable_retries:FLOW``, whose step fails at once and
is retried after a backoff. Prints ``READY`` once the failure (with its ``retry_at``) is
durable, then sleeps in the backoff until the test kills it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys

from tests import test_durable_retries as flows


async def main(db: str, flow: str, run_id: str) -> None:
    wf = getattr(flows, flow)(store=db, timeout=None)
    handler = wf.run(run_id=run_id)

    def failed() -> bool:
        if wf.store.get_run(run_id) is None:
            return False  # its first commit is not written yet
        return any(p.failures >= 1 for p in wf.state_at(run_id).in_progress.get("call", []))

    # What the test finds after the kill is what was committed: wait until the log says so.
    while not failed():  # noqa: ASYNC110 - polls the log
        await asyncio.sleep(0.02)
    print("READY", flush=True)  # noqa: T201 - how the test learns the failure is durable
    await asyncio.sleep(3600)
    del handler


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
