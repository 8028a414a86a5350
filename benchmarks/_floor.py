"""The design floor of one loop step (issue 17), measured in a fresh process; prints JSON.

``python -m benchmarks._floor N DB``: what no engine can avoid per step, done N times:

* ``queue_us``: one queue hop, an ``asyncio.Queue`` ``put`` then ``get`` of the next event;
* ``encode_us``: the step's five records (``dequeued``, ``step_started``, ``step_finished``,
  the ``state_set`` patch appending 100 bytes, the ``enqueued`` next event) encoded with
  orjson, as ours writes them;
* ``commit_us``: one transaction inserting those five rows into the ``log`` table of a
  real store file (created by :class:`EventStore`: our schema, WAL), on a connection with
  our pragmas (``synchronous=NORMAL``, ``busy_timeout``), ``BEGIN IMMEDIATE`` .. ``COMMIT``;
* ``floor_us``: the three together, per step (the floor the in-place loop is held to);
  ``floor_cpu_us`` the process's CPU time of that loop, per step.

Each part is timed in its own loop over N steps, then the whole in one more loop; the
transactions of the part and of the whole each go to a new store file (``DB.parts`` and
``DB``), so both start alike.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from eventstore import Commit, EventStore, NewRun, Record

ITEM = "x" * 100
INSERT = (
    "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
RECORDS_PER_STEP = 5


def payloads(i: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    """The kinds and payloads of step ``i``'s records, shaped as ours writes them."""
    event = {"$t": "model", "c": "state_flows:Again", "v": {"i": i + 1, "n": n}}
    return [
        ("dequeued", {"id": i + 1, "worker": 0}),
        ("step_started", {"id": i + 1, "attempt": 1}),
        ("step_finished", {"id": i + 1, "attempt": 1, "emitted": [i + 2], "base": 5 * i}),
        ("state_set", {"key": "items", "patch": [["append", [], ITEM]]}),
        ("enqueued", {"id": i + 2, "event": event, "src": [i + 1, 1]}),
    ]


def encode(i: int, n: int) -> list[tuple[str, str]]:
    """Step ``i``'s records as (kind, JSON text)."""
    return [(kind, orjson.dumps(p).decode()) for kind, p in payloads(i, n)]


class Log:
    """A store file with one run, written through a raw connection with our pragmas."""

    def __init__(self, path: str) -> None:
        es = EventStore(path)  # our schema, WAL, the meta rows
        try:
            es.append_sync(Commit("floor", [Record("run_started", None, "{}")], create=NewRun()))
        finally:
            es.close()
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA busy_timeout = 5000")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        (self.rid,) = self.conn.execute("SELECT rid FROM runs WHERE run_id = 'floor'").fetchone()
        self.seq = self.conn.execute("SELECT max(seq) FROM log").fetchone()[0]

    def commit(self, records: list[tuple[str, str]]) -> None:
        """One transaction with the step's records, as the group-commit writer does it."""
        first, last, ts = self.seq + 1, self.seq + len(records), time.time_ns() // 1000
        rows = [
            (first + j, self.rid, kind, "loop", text, last, ts)
            for j, (kind, text) in enumerate(records)
        ]
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(INSERT, rows)
        self.conn.execute("COMMIT")
        self.seq = last

    def close(self) -> None:
        self.conn.close()


def _per_step(n: int, fn: Callable[[int], Any]) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


async def measure(n: int, path: str) -> dict[str, Any]:
    """The floor's parts and whole, in µs per step over ``n`` steps."""
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def hops() -> float:
        start = time.perf_counter()
        for i in range(n):
            await queue.put(i)
            await queue.get()
        return (time.perf_counter() - start) / n * 1e6

    out: dict[str, Any] = {"steps": n, "records_per_step": RECORDS_PER_STEP}
    out["queue_us"] = await hops()
    out["encode_us"] = _per_step(n, lambda i: encode(i, n))
    pre = [encode(i, n) for i in range(n)]
    parts = Log(path + ".parts")
    try:
        out["commit_us"] = _per_step(n, lambda i: parts.commit(pre[i]))
    finally:
        parts.close()
    log = Log(path)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            await queue.put(i)
            j = await queue.get()
            log.commit(encode(j, n))
        out["floor_us"] = (time.perf_counter() - start) / n * 1e6
        out["floor_cpu_us"] = (time.process_time() - cpu) / n * 1e6
    finally:
        log.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(int(sys.argv[1]), sys.argv[2]))), flush=True)
