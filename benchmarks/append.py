"""Append throughput of the store against plain sqlite3 on the same table, disk and pragmas.

Two workloads, each at durability "normal" (``synchronous=NORMAL``) and "full":

* **single**: one asyncio task awaits one one-record commit after another. The floor is
  plain sqlite3 writing one row per transaction (``BEGIN IMMEDIATE``/``INSERT``/``COMMIT``)
  into the same ``log`` table. Goal: our store reaches at least 75% of the floor.
* **group**: 100 asyncio tasks each append 4-record commits concurrently, so the store's
  group commit can put many commits in one transaction. The baseline writes the same
  number of commits, one transaction each, with plain sqlite3. Goals: at least 5x the
  baseline, and at most one transaction per 10 commits (from ``store.stats``).

Every measurement gets a fresh database file created by :class:`EventStore`, so both sides
write into the identical schema (its ``(rid, seq)`` index included).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

from eventstore import Commit, Durability, EventStore, NewRun, Record

from ._common import Series, fmt_ratio, print_table, ratio_summary, report, scratch_dir
from ._common import write_results as _write

NAME = "append"
RUN_ID = "bench-run"
KIND = "step_finished"
STEP = "summarize"
PAYLOAD = '{"step":"summarize","attempt":1,"result":{"tokens":412,"text":"a short answer"}}'
TASKS = 100
RECORDS_PER_GROUP_COMMIT = 4
DURABILITIES: tuple[Durability, ...] = ("normal", "full")

# Commits per measurement: (full run, quick run). An fsync per transaction makes "full"
# slow (0.3k-3k per second on the machine of MEASUREMENTS.md), hence fewer commits there.
SINGLE_COMMITS = {"normal": (5000, 200), "full": (500, 20)}
GROUP_COMMITS_PER_TASK = {"normal": (50, 2), "full": (10, 1)}

INSERT = (
    "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _new_store_file(path: Path) -> None:
    """Creates a store with its run (one commit), exactly as users get it."""
    with EventStore(path) as store:
        store.append_sync(Commit(RUN_ID, [Record("run_started")], create=NewRun()))


def _raw_connection(path: Path, durability: Durability) -> sqlite3.Connection:
    """A plain sqlite3 connection configured as the store's writer is (WAL is in the file)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    return conn


def raw_commits(path: Path, durability: Durability, commits: int, size: int) -> float:
    """Commits per second of plain sqlite3 writing one transaction per commit."""
    _new_store_file(path)
    conn = _raw_connection(path, durability)
    try:
        (rid,) = conn.execute("SELECT rid FROM runs WHERE run_id = ?", (RUN_ID,)).fetchone()
        seq = conn.execute("SELECT max(seq) FROM log").fetchone()[0]
        start = time.perf_counter()
        for _ in range(commits):
            last = seq + size
            ts = time.time_ns() // 1000
            conn.execute("BEGIN IMMEDIATE")
            if size == 1:
                conn.execute(INSERT, (last, rid, KIND, STEP, PAYLOAD, last, ts))
            else:
                conn.executemany(
                    INSERT,
                    [(s, rid, KIND, STEP, PAYLOAD, last, ts) for s in range(seq + 1, last + 1)],
                )
            conn.execute("COMMIT")
            seq = last
        elapsed = time.perf_counter() - start
        assert conn.execute("SELECT count(*) FROM log").fetchone()[0] == commits * size + 1
    finally:
        conn.close()
    return commits / elapsed


def store_single(path: Path, durability: Durability, commits: int) -> float:
    """Commits per second of one task awaiting ``store.append`` of one-record commits."""
    _new_store_file(path)
    record = Record(KIND, STEP, PAYLOAD)

    async def work() -> float:
        await store.append(Commit(RUN_ID, [record]))  # warm-up: opens the writer connection
        start = time.perf_counter()
        for _ in range(commits):
            await store.append(Commit(RUN_ID, [record]))
        return time.perf_counter() - start

    with EventStore(path, durability=durability) as store:
        elapsed = asyncio.run(work())
        assert store.head() == commits + 2
    return commits / elapsed


def store_group(path: Path, durability: Durability, per_task: int) -> tuple[float, float]:
    """Commits per second of 100 concurrent tasks, and transactions per commit."""
    _new_store_file(path)
    records = [Record(KIND, STEP, PAYLOAD)] * RECORDS_PER_GROUP_COMMIT

    async def appender() -> None:
        for _ in range(per_task):
            await store.append(Commit(RUN_ID, records))

    async def work() -> float:
        await store.append(Commit(RUN_ID, records[:1]))  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(TASKS)))
        return time.perf_counter() - start

    with EventStore(path, durability=durability) as store:
        before = store.stats
        elapsed = asyncio.run(work())
        after = store.stats
        total = TASKS * per_task
        assert store.head() == total * RECORDS_PER_GROUP_COMMIT + 2
    # The warm-up commit is one operation and one transaction of its own.
    transactions = after.transactions - before.transactions - 1
    operations = after.operations - before.operations - 1
    assert operations == total
    return total / elapsed, transactions / operations


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs both workloads at both durabilities, prints the tables, writes ``append.json``."""
    pick = 1 if quick else 0
    single = {
        d: (Series("sqlite3 floor", "commits/s"), Series("store", "commits/s"))
        for d in DURABILITIES
    }
    group = {
        d: (Series("sqlite3 1 txn/commit", "commits/s"), Series("store", "commits/s"))
        for d in DURABILITIES
    }
    txn_per_commit: dict[str, list[float]] = {d: [] for d in DURABILITIES}
    with scratch_dir() as tmp:
        for rep in range(repeat):
            for d in DURABILITIES:
                n = SINGLE_COMMITS[d][pick]
                per_task = GROUP_COMMITS_PER_TASK[d][pick]
                single[d][0].add(raw_commits(tmp / f"s-raw-{d}-{rep}.db", d, n, 1))
                single[d][1].add(store_single(tmp / f"s-store-{d}-{rep}.db", d, n))
                group[d][0].add(
                    raw_commits(
                        tmp / f"g-raw-{d}-{rep}.db", d, TASKS * per_task, RECORDS_PER_GROUP_COMMIT
                    )
                )
                rate, per_commit = store_group(tmp / f"g-store-{d}-{rep}.db", d, per_task)
                group[d][1].add(rate)
                txn_per_commit[d].append(per_commit)

    results: list[dict[str, Any]] = []
    single_rows, group_rows = [], []
    for d in DURABILITIES:
        base, ours = single[d]
        r = ratio_summary(ours, base)
        goal = r["median"] >= 0.75
        single_rows.append(
            [
                d,
                SINGLE_COMMITS[d][pick],
                base.cell(),
                ours.cell(),
                fmt_ratio(r, percent=True),
                _ok(goal),
            ]
        )
        results.append(
            {
                "workload": "single",
                "durability": d,
                "commits": SINGLE_COMMITS[d][pick],
                "records_per_commit": 1,
                "baseline": base.summary(),
                "ours": ours.summary(),
                "ratio": r,
                "goal": "ours >= 75% of the sqlite3 floor",
                "goal_met": goal,
            }
        )
    for d in DURABILITIES:
        base, ours = group[d]
        r = ratio_summary(ours, base)
        tpc = txn_per_commit[d]
        tpc_median = statistics.median(tpc)
        goal = r["median"] >= 5 and tpc_median <= 0.1
        total = TASKS * GROUP_COMMITS_PER_TASK[d][pick]
        group_rows.append(
            [
                d,
                total,
                base.cell(),
                ours.cell(),
                fmt_ratio(r),
                f"{tpc_median:.3f} ({min(tpc):.3f}-{max(tpc):.3f})",
                _ok(goal),
            ]
        )
        results.append(
            {
                "workload": "group",
                "durability": d,
                "commits": total,
                "tasks": TASKS,
                "records_per_commit": RECORDS_PER_GROUP_COMMIT,
                "baseline": base.summary(),
                "ours": ours.summary(),
                "ratio": r,
                "transactions_per_commit": {
                    "median": tpc_median,
                    "min": min(tpc),
                    "max": max(tpc),
                    "samples": tpc,
                },
                "goal": "ours >= 5x one transaction per commit, <= 0.1 transactions per commit",
                "goal_met": goal,
            }
        )
    print_table(
        f"append (a): one task, one-record commits, commits/s, median (min-max) of {repeat}",
        single_rows,
        ["durability", "commits", "sqlite3 floor", "store.append", "store/floor", ">=75%"],
    )
    print_table(
        f"append (b): {TASKS} tasks, {RECORDS_PER_GROUP_COMMIT}-record commits, commits/s,"
        f" median (min-max) of {repeat}",
        group_rows,
        [
            "durability",
            "commits",
            "sqlite3 1 txn/commit",
            "store (group commit)",
            "ratio",
            "txn/commit",
            ">=5x, <=0.1",
        ],
    )
    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={
            "single_commits": {d: SINGLE_COMMITS[d][pick] for d in DURABILITIES},
            "group_commits_per_task": {d: GROUP_COMMITS_PER_TASK[d][pick] for d in DURABILITIES},
            "tasks": TASKS,
            "payload_bytes": len(PAYLOAD),
        },
        results=results,
    )
    _write(NAME, data, out_dir)
    return data


def _ok(goal: bool) -> str:
    return "yes" if goal else "NO"
