"""Runs one state workload of :mod:`state_flows` once in this process; prints one JSON line.

``python state_run.py ENGINE WORKLOAD SIZE [DB]``:

* ``ENGINE`` ``workflow``: durable-workflows on a file store at ``DB`` (durability
  "normal"); run in the project's venv.
* ``ENGINE`` ``workflows``: LlamaIndex Workflows in memory (no persistence); run in the
  peers venv.

``SIZE`` is N (steps of a loop) or K (events of the fan-out). Output: ``seconds`` (``run``
to result, and for ours every record written), ``cpu_s`` (the process's CPU time over the
same span: all threads, user and system), ``import_s``; for ours also ``bytes`` (db +
wal with the store closed), ``payload_bytes`` (the records' JSON), ``records`` and
``payload`` per kind, ``conflicts`` (``step_conflicted`` records), ``collector_attempts``
and ``collector_max_attempt`` (``step_started`` of the fan-in's ``gather`` step).

This script defines no classes: the flows keep their module's name in our log.
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import asyncio  # noqa: E402 - the clock above starts before the imports it measures
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


def _db_bytes(path: str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(path + suffix)
    return total


def _log_stats(wf: Any, run_id: str) -> dict[str, Any]:
    """What our log says about the run: records and bytes per kind, conflicts, attempts."""
    rows = wf.store.query(
        "SELECT kind, count(*), sum(length(payload)) FROM records WHERE run_id = ? GROUP BY kind",
        (run_id,),
    )
    records = {kind: count for kind, count, _ in rows}
    payload = {kind: size for kind, _, size in rows}
    ((attempts, max_attempt),) = wf.store.query(
        "SELECT count(*), max(json_extract(payload, '$.attempt')) FROM records"
        " WHERE run_id = ? AND kind = 'step_started' AND step = 'gather'",
        (run_id,),
    )
    return {
        "records": records,
        "payload": payload,
        "payload_bytes": sum(payload.values()),
        "conflicts": records.get("step_conflicted", 0),
        "collector_attempts": attempts,
        "collector_max_attempt": max_attempt or 0,
    }


async def _run(engine: str, workload: str, size: int, db: str | None) -> dict[str, Any]:
    import state_flows

    flow, arg, per = state_flows.WORKLOADS[workload]
    wf: Any = flow(store=db, timeout=None) if engine == "workflow" else flow(timeout=None)
    imported = time.perf_counter()
    cpu = time.process_time()
    handler = wf.run(**{arg: size})
    result = await handler
    if engine == "workflow":
        await wf.store.flush()
    seconds = time.perf_counter() - imported
    cpu_s = time.process_time() - cpu
    expected = size * per
    if result != expected:
        msg = f"{workload} returned {result!r}, expected {expected}"
        raise AssertionError(msg)
    out: dict[str, Any] = {"seconds": seconds, "cpu_s": cpu_s, "import_s": imported - _START}
    if engine == "workflow":
        try:
            out |= _log_stats(wf, handler.run_id)
        finally:
            wf.store.close()
        assert db is not None
        out["bytes"] = _db_bytes(db)
    return out


def main(argv: list[str]) -> dict[str, Any]:
    """Parses ``ENGINE WORKLOAD SIZE [DB]``, picks the engine, runs the workload."""
    engine, workload, size, *rest = argv
    if engine not in ("workflow", "workflows"):
        msg = f"unknown engine {engine!r}: workflow (ours) or workflows (LlamaIndex)"
        raise SystemExit(msg)
    if engine == "workflow" and not rest:
        msg = "ours needs a DB path: state_run.py workflow WORKLOAD SIZE DB"
        raise SystemExit(msg)
    os.environ["BENCH_ENGINE"] = engine  # read by state_flows when imported
    return asyncio.run(_run(engine, workload, int(size), rest[0] if rest else None))


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
