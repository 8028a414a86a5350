"""Fresh-process work for the workflow benchmarks; prints one JSON line.

``python -m benchmarks._child MODE FLOW N STORE DB RUN_ID [SEQ]``, MODE being:

* ``run``: runs the flow to its end as ``RUN_ID``; prints ``seconds`` (``run`` to result)
  and ``bytes`` (db + wal after closing the store). With ``BENCH_CRASH_AT`` set, the
  flow kills this process at that step instead.
* ``resume``: resumes ``RUN_ID`` to its end; prints ``seconds`` (``resume`` to result).
* ``restore``: times ``state_at`` at the latest seq, then at ``SEQ``; prints ``open_s``,
  ``latest_s``, ``middle_s``.

This module defines no classes: run as ``__main__``, the flows it imports keep the module
names their logs record.
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import asyncio  # noqa: E402 - the clock above starts before the imports it measures
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, cast  # noqa: E402

from benchmarks._common import db_bytes  # noqa: E402
from benchmarks._runs import StoreKind, flow_class, open_workflow, run_flow  # noqa: E402


def main(argv: list[str]) -> dict[str, Any]:
    """Does MODE and returns what to print."""
    mode, name, n_text, kind_text, db, run_id, *rest = argv
    n, kind = int(n_text), cast(StoreKind, kind_text)
    path = Path(db)
    imported = time.perf_counter()
    wf = open_workflow(flow_class(name, n), kind, path)
    opened = time.perf_counter()
    out: dict[str, Any] = {"import_s": imported - _START, "open_s": opened - imported}
    try:
        if mode == "run":
            out["seconds"], _ = run_flow(wf, n, run_id)
        elif mode == "resume":

            async def resume() -> float:
                start = time.perf_counter()
                result = await wf.resume(run_id)
                await wf.store.flush()
                if result != n:
                    msg = f"resume returned {result!r}, expected {n}"
                    raise AssertionError(msg)
                return time.perf_counter() - start

            out["seconds"] = asyncio.run(resume())
        elif mode == "restore":
            wf.state_at(run_id)
            latest = time.perf_counter()
            wf.state_at(run_id, int(rest[0]))
            middle = time.perf_counter()
            out["latest_s"], out["middle_s"] = latest - opened, middle - latest
        else:
            msg = f"unknown mode {mode!r}"
            raise SystemExit(msg)
    finally:
        wf.store.close()
    if mode != "restore":
        out["bytes"] = db_bytes(path)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
