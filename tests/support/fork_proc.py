"""Leaves a fork in the middle of a step: ``python -m tests.support.fork_proc DB RUN SEQ STALL``.

Forks RUN at SEQ with ``tests.test_fork_snapshots:Phased``, whose step ``STALL`` stays busy,
snapshots spaced closely. Prints ``READY <fork id>`` once the fork's log durably holds the
steps before it and a snapshot of its own keeping the list by reference, then stays until
it is killed.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from tests.test_fork_snapshots import Phased
from tests.test_snapshots import spacing
from workflow._read import snapshots


async def main(db: str, run: str, seq: int, stall: int) -> None:
    Phased.stall_at = stall
    wf = Phased(store=db, timeout=None)
    handler = wf.run_from((run, seq))

    def there() -> bool:
        if wf.store.get_run(handler.run_id) is None:
            return False  # its first commit is not written yet
        if wf.state_at(handler.run_id).context.get("steps") != stall:
            return False
        kept = [orjson.loads(s.data)["context"] for s in snapshots(wf.store, handler.run_id)]
        return any(c.get("items", [None])[-1] == "log" for c in kept)

    # What the test finds after the kill is what was committed: wait until the log says so.
    while not there():  # noqa: ASYNC110 - polls the log
        await asyncio.sleep(0.02)
    print("READY", handler.run_id, flush=True)  # noqa: T201 - how the test learns the fork
    await asyncio.sleep(3600)


if __name__ == "__main__":
    with spacing(4096, 2):
        asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
