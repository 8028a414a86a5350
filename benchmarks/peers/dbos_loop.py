"""DBOS with a SQLite system database (its defaults), the loop workload: prints one JSON
line (runs in the peers venv).

DBOS keeps a workflow's state in its local variables and checkpoints each step's output,
so the loop is a workflow calling a step N times and appending the 100-byte item the step
returns; recovery replays recorded outputs. ``python dbos_loop.py MODE N DB``, MODE:

* ``run``: the workflow from the start (``BENCH_CRASH_AT=K`` kills the process in step K);
  prints ``seconds`` (the workflow call) and ``bytes`` (db + wal after ``DBOS.destroy``).
* ``resume``: ``DBOS.launch()`` recovers the pending workflow; prints ``seconds`` from
  ``launch`` until its result is back, and ``launch_s`` (``launch`` itself).
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import argparse  # noqa: E402 - the clock above starts before the imports it measures
import json  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

from dbos import DBOS, SetWorkflowID  # noqa: E402

ITEM = "x" * 100
WORKFLOW_ID = "bench-loop"
CRASH_AT = int(os.environ.get("BENCH_CRASH_AT", "-1"))


@DBOS.step()
def make_item(i: int) -> str:
    """One step: returns the item (its output is what DBOS checkpoints)."""
    if i == CRASH_AT:
        os._exit(9)
    return ITEM


@DBOS.workflow()
def loop(n: int) -> int:
    """The loop: N steps, the list held in the workflow."""
    items: list[str] = []
    for i in range(n):
        items.append(make_item(i))  # noqa: PERF401 - one step at a time, in order
    return len(items)


def db_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["run", "resume"])
    parser.add_argument("n", type=int)
    parser.add_argument("db")
    args = parser.parse_args()
    DBOS(
        config={
            "name": "bench-loop",
            # DB is a SQLite file, or a PostgreSQL URL (DBOS on its usual database).
            "system_database_url": args.db if "://" in args.db else f"sqlite:///{args.db}",
            "log_level": "WARNING",
        }
    )
    out: dict[str, Any] = {}
    start = time.perf_counter()
    out["import_s"] = start - _START
    DBOS.launch()
    launched = time.perf_counter()
    out["launch_s"] = launched - start
    if args.mode == "run":
        with SetWorkflowID(WORKFLOW_ID):
            result = loop(args.n)
        out["seconds"] = time.perf_counter() - launched
    else:
        result = DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
        out["seconds"] = time.perf_counter() - start
    assert result == args.n, result
    DBOS.destroy()
    out["bytes"] = db_bytes(args.db) if "://" not in args.db else 0
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
