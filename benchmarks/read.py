"""Read throughput: iterating one run of 1M records (quick: 20k) with ``store.records``.

Restoring a run reads its whole log, so this rate bounds how fast a long run restarts.
Measured, interleaved per repetition:

* **sqlite3 floor**: plain sqlite3 selecting the same columns with the same index and order,
  rows as tuples: what any Python reader of this table pays.
* **records()**: ``store.records(run_id)``, touching a column of each record, no JSON parsing.
  Goal: at least 500k records/s (MEASUREMENTS.md read raw rows at 520k-629k/s).
* **+ orjson**: also ``orjson.loads(record.payload)``.
* **+ codec**: also ``default_codec.decode(record.payload)`` (the typed values).

The run is built fast: the store creates the schema and the run with one commit, then plain
sqlite3 ``executemany`` fills the ``log`` table with records in 4-record commits and small,
realistic JSON payloads written by the store's codec.
"""

from __future__ import annotations

import datetime as dt
import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from eventstore import Commit, EventStore, NewRun, Record, default_codec

from ._common import Series, fmt_ratio, print_table, ratio_summary, report, scratch_dir
from ._common import write_results as _write

NAME = "read"
RUN_ID = "long-run"
RECORDS = (1_000_000, 20_000)  # (full run, quick run)
COMMIT_SIZE = 4
GOAL_RECORDS_PER_S = 500_000
KINDS = ("step_started", "event_emitted", "step_finished", "context_set")
_CHUNK = 50_000


def payloads(n: int) -> list[str]:
    """``n`` distinct payloads like the ones workflows write: 60-200 bytes of JSON."""
    base = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
    out = []
    for i in range(n):
        value: dict[str, Any] = {"step": f"step_{i % 10}", "attempt": 1 + i % 3, "i": i}
        if i % 4 == 0:
            value["result"] = {"tokens": 100 + i % 900, "text": "an answer " * (1 + i % 5)}
        elif i % 4 == 1:
            value["event"] = {"type": "ProgressEvent", "done": i % 7, "total": 7}
        elif i % 4 == 2:
            value["at"] = base + dt.timedelta(seconds=i)  # a tagged value for the codec
        else:
            value["tags"] = ["alpha", "beta"][: 1 + i % 2]
        out.append(default_codec.encode(value))
    return out


def build(path: Path, records: int) -> None:
    """Creates a store whose run ``RUN_ID`` holds ``records`` records, seqs 1..records."""
    with EventStore(path) as store:
        store.append_sync(Commit(RUN_ID, [Record("run_started")], create=NewRun()))
    variety = payloads(1000)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        (rid,) = conn.execute("SELECT rid FROM runs WHERE run_id = ?", (RUN_ID,)).fetchone()
        ts = time.time_ns() // 1000

        def row(seq: int) -> tuple[Any, ...]:
            commit_seq = min(records, 1 + COMMIT_SIZE * ((seq - 2) // COMMIT_SIZE + 1))
            i = seq % len(variety)
            return (seq, rid, KINDS[i % 4], f"step_{i % 10}", variety[i], commit_seq, ts + seq)

        seqs = iter(range(2, records + 1))
        while chunk := list(itertools.islice(seqs, _CHUNK)):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                map(row, chunk),
            )
            conn.execute("COMMIT")
    finally:
        conn.close()


def _rate(count: Callable[[], int]) -> float:
    start = time.perf_counter()
    n = count()
    return n / (time.perf_counter() - start)


def raw_floor(path: Path) -> int:
    """Reads the run's rows with plain sqlite3: the same columns, index and order."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        (rid,) = conn.execute("SELECT rid FROM runs WHERE run_id = ?", (RUN_ID,)).fetchone()
        n = 0
        for row in conn.execute(
            "SELECT seq, rid, kind, step, payload, commit_seq, ts FROM log"
            " WHERE rid = ? ORDER BY seq",
            (rid,),
        ):
            n += row[2] is not None
    finally:
        conn.close()
    return n


def _records(store: EventStore) -> Iterator[Any]:
    return store.records(RUN_ID)


def columns(store: EventStore) -> int:
    """Iterates the run's records, touching one column each (no JSON parsing)."""
    n = 0
    for r in _records(store):
        n += r.kind is not None
    return n


def with_orjson(store: EventStore) -> int:
    """Iterates the run's records and parses each payload with orjson."""
    loads = orjson.loads
    n = 0
    for r in _records(store):
        n += loads(r.payload) is not None
    return n


def with_codec(store: EventStore) -> int:
    """Iterates the run's records and decodes each payload with the store's codec."""
    decode = default_codec.decode
    n = 0
    for r in _records(store):
        n += decode(r.payload) is not None
    return n


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Builds the run, measures the four readers interleaved, prints the table, writes JSON."""
    records = RECORDS[1 if quick else 0]
    floor = Series("sqlite3 floor", "records/s")
    readers: list[tuple[Series, Callable[[EventStore], int]]] = [
        (Series("records() columns", "records/s"), columns),
        (Series("records() + orjson.loads", "records/s"), with_orjson),
        (Series("records() + default_codec.decode", "records/s"), with_codec),
    ]
    with scratch_dir() as tmp:
        path = tmp / "read.db"
        build_s = -time.perf_counter()
        build(path, records)
        build_s += time.perf_counter()
        print(f"built {records:,} records in {build_s:.1f} s ({path.stat().st_size / 1e6:.0f} MB)")
        with EventStore(path, readonly=True) as store:
            for _ in range(repeat):
                floor.add(_rate(lambda: raw_floor(path)))
                for series, reader in readers:
                    series.add(_rate(partial(reader, store)))
    rows = [[floor.name, floor.cell(), "1.00x", ""]]
    results: list[dict[str, Any]] = [{"reader": floor.name, "ours": floor.summary()}]
    for series, _ in readers:
        r = ratio_summary(series, floor)
        entry: dict[str, Any] = {
            "reader": series.name,
            "ours": series.summary(),
            "ratio_to_floor": r,
        }
        goal = ""
        if series.name.endswith("columns"):
            met = series.median >= GOAL_RECORDS_PER_S
            entry["goal"] = f">= {GOAL_RECORDS_PER_S} records/s"
            entry["goal_met"] = met
            goal = "yes" if met else "NO"
        rows.append([series.name, series.cell(), fmt_ratio(r), goal])
        results.append(entry)
    print_table(
        f"read: one run of {records:,} records, records/s, median (min-max) of {repeat}",
        rows,
        ["reader", "records/s", "vs sqlite3 floor", ">=500k/s"],
    )
    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={"records": records, "commit_size": COMMIT_SIZE, "build_seconds": build_s},
        results=results,
    )
    _write(NAME, data, out_dir)
    return data
