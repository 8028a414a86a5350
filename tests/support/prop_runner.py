"""Runs a generated workflow in a subprocess, to be killed: ``python -m tests.support.prop_runner``.

Arguments: MODULE FILE DB RUN_ID SEED PACE [LEASE]. MODULE and FILE name the generated
module (``tests.support.workflow_gen.module_file``); PACE is how long every step sleeps first, so
that a SIGKILL at a random moment lands in the middle of the run; LEASE, the seconds a
PostgreSQL lease lasts (what a test resuming the killed run waits for).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.support import workflow_gen as gen


async def _main(argv: list[str]) -> int:
    module, file, db, run_id, seed, pace, *lease = argv
    gen.Runtime.pace = float(pace)
    cls = gen.load_module(module, Path(file)).Generated
    wf = cls(store=db, timeout=None, lease_ttl=float(lease[0]) if lease else None)
    handler = wf.run(run_id=run_id, seed=int(seed))
    try:
        await handler
    except gen.PlannedFailure:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
