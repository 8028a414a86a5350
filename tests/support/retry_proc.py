"""Dies in the middle of a run: ``python -m tests.support.retry_proc DB FLOW RUN_ID UNTIL``.

Starts run ``RUN_ID`` of ``FLOW`` (a workflow class of ``tests.test_durable_retries`` or
``tests.test_catch_error``) and prints ``READY`` once the log says the run is where the
test wants it (``UNTIL``: ``failed`` once step ``call`` has a failure durable, its
``retry_at`` included; ``running:STEP`` once STEP has begun an attempt), then stays, asleep
in a backoff or held in a step (``DYING`` is set), until the test kills it with SIGKILL.
``RETRY_PROC_LEASE_TTL`` in the environment sets the lease of a PostgreSQL store.
"""

from __future__ import annotations

import asyncio
import os
import sys

from tests import test_catch_error, test_durable_retries


async def main(db: str, flow: str, run_id: str, until: str) -> None:
    module = test_durable_retries if hasattr(test_durable_retries, flow) else test_catch_error
    module.DYING.set()
    ttl = os.environ.get("RETRY_PROC_LEASE_TTL")  # a PostgreSQL lease that expires soon
    wf = getattr(module, flow)(store=db, timeout=None, lease_ttl=float(ttl) if ttl else None)
    handler = wf.run(run_id=run_id)

    def there() -> bool:
        if wf.store.get_run(run_id) is None:
            return False  # its first commit is not written yet
        progress = wf.state_at(run_id).in_progress
        if until == "failed":
            return any(p.failures >= 1 for p in progress.get("call", []))
        step_name = until.removeprefix("running:")
        return any(p.attempt >= 1 for p in progress.get(step_name, []))

    # What the test finds after the kill is what was committed: wait until the log says so.
    while not there():  # noqa: ASYNC110 - polls the log
        await asyncio.sleep(0.02)
    print("READY", flush=True)  # noqa: T201 - how the test learns the run is in place
    await asyncio.sleep(3600)
    del handler


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
