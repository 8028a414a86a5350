"""What the workflow benchmarks (``loop``, ``chain``, ``peers``) share: run a flow of N steps
on a store, time ``state_at`` in this process and in a fresh one, crash and resume.

A *flow* is a module of this package with ``workflow_class(n) -> type[Workflow]`` whose
runs, started with ``run(n=n)``, take N steps and return N. Child processes
(:mod:`benchmarks._child`) rebuild the same class from the flow's name and N, so the log's
class names resolve there as here.

Stores, as users configure them:

* ``memory``: ``store=None``, the private in-memory store (nothing on disk).
* ``normal``: ``store=path``, a file at durability "normal" (``synchronous=NORMAL``).
* ``full``: ``store=EventStore(path, durability="full")`` (an fsync per transaction).
"""

from __future__ import annotations

import asyncio
import importlib
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eventstore import EventStore
from workflow import Workflow

from ._common import (
    Series,
    db_bytes,
    fmt_bytes,
    print_table,
    report,
    run_child,
    scratch_dir,
    write_results,
)

__all__ = [
    "CRASH_ENV",
    "KINDS",
    "FlowRun",
    "StoreKind",
    "bench",
    "crash_resume",
    "flow_class",
    "fmt_ms",
    "fmt_num",
    "fmt_s",
    "linear",
    "measure",
    "open_workflow",
    "restore_fresh",
    "run_flow",
]

StoreKind = Literal["memory", "normal", "full"]
KINDS: tuple[StoreKind, ...] = ("memory", "normal", "full")
# A flow's step kills its process (os._exit(9)) when it is about to do this step (0-based).
CRASH_ENV = "BENCH_CRASH_AT"
CHILD = ("-m", "benchmarks._child")


def flow_class(name: str, n: int) -> type[Workflow]:
    """The workflow class of flow ``name`` (a module of this package) for N steps."""
    factory: Callable[[int], type[Workflow]] = importlib.import_module(
        f"benchmarks.{name}"
    ).workflow_class
    return factory(n)


def open_workflow(cls: type[Workflow], kind: StoreKind, path: Path | None) -> Workflow:
    """An instance of ``cls`` on the store ``kind`` (a file at ``path`` unless in memory)."""
    if kind == "memory":
        return cls(store=None, timeout=None)
    assert path is not None
    if kind == "normal":
        return cls(store=path, timeout=None)
    return cls(store=EventStore(path, durability="full"), timeout=None)


def run_flow(wf: Workflow, n: int, run_id: str | None = None) -> tuple[float, str]:
    """Runs the flow to its end on a new event loop: (seconds, run id).

    Timed from ``run`` until the result is back and every record, lazy ones included, is
    written (``store.flush()``, which also keeps ``store.close()`` after the loop ends from
    resolving futures of a closed loop).
    """

    async def go() -> tuple[float, str]:
        start = time.perf_counter()
        handler = wf.run(n=n, run_id=run_id)
        result = await handler
        await wf.store.flush()
        seconds = time.perf_counter() - start
        if result != n:
            msg = f"the flow returned {result!r}, expected {n}"
            raise AssertionError(msg)
        return seconds, handler.run_id

    return asyncio.run(go())


def middle_seq(wf: Workflow, run_id: str) -> int:
    """The seq of the run's middle checkpoint (commit): half its steps done."""
    cps = wf.checkpoints(run_id)
    return cps[len(cps) // 2].seq


def time_state_at(wf: Workflow, run_id: str, seq: int | None) -> float:
    """Seconds one ``wf.state_at(run_id, seq)`` takes."""
    start = time.perf_counter()
    wf.state_at(run_id, seq)
    return time.perf_counter() - start


def restore_fresh(name: str, n: int, kind: StoreKind, path: Path, run_id: str, seq: int) -> Any:
    """``state_at`` latest and at ``seq`` timed in a fresh process (what a restart pays).

    Returns the child's JSON: ``open_s`` (the Workflow and its store), ``latest_s`` and
    ``middle_s`` (the first and second ``state_at`` calls), ``wall_s`` (the whole process).
    """
    return run_child([*CHILD, "restore", name, str(n), kind, str(path), run_id, str(seq)])


def crash_resume(name: str, n: int, kind: StoreKind, path: Path) -> dict[str, float]:
    """Kills a run at step N/2 in one process, resumes it to the end in another.

    Returns ``resume_s`` (``await wf.resume(run_id)`` to the result, timed in the resuming
    process) and ``wall_s`` (the resuming process's whole life, imports included).
    """
    run_id = f"crash-{uuid.uuid4().hex[:8]}"
    run_child(
        [*CHILD, "run", name, str(n), kind, str(path), run_id],
        env={CRASH_ENV: str(n // 2)},
        expect_exit=9,
    )
    out = run_child([*CHILD, "resume", name, str(n), kind, str(path), run_id])
    return {"resume_s": out["seconds"], "wall_s": out["wall_s"]}


@dataclass(slots=True)
class FlowRun:
    """One measured run: its time, its bytes on disk and the ``state_at`` timings."""

    seconds: float
    bytes: int | None
    latest_s: float
    middle_s: float
    fresh: dict[str, float] = field(default_factory=dict)


def measure(name: str, n: int, kind: StoreKind, tmp: Path, *, fresh: bool = True) -> FlowRun:
    """Runs flow ``name`` once with N steps on a new store and times reading its state.

    Bytes are counted after ``wf.store.close()``, so the WAL is checkpointed first.
    """
    path = tmp / f"{name}-{kind}-{n}-{uuid.uuid4().hex[:8]}.db"
    wf = open_workflow(flow_class(name, n), kind, None if kind == "memory" else path)
    try:
        seconds, run_id = run_flow(wf, n)
        mid = middle_seq(wf, run_id)
        latest_s = time_state_at(wf, run_id, None)
        middle_s = time_state_at(wf, run_id, mid)
    finally:
        wf.store.close()
    if kind == "memory":
        return FlowRun(seconds, None, latest_s, middle_s)
    out = FlowRun(seconds, db_bytes(path), latest_s, middle_s)
    if fresh:
        out.fresh = restore_fresh(name, n, kind, path, run_id, mid)
    return out


def fmt_num(value: float) -> str:
    """Three significant digits, never in exponent notation: 0.0123, 4.56, 1,234."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def fmt_s(value: float) -> str:
    """Seconds with three significant digits."""
    return fmt_num(value)


def fmt_ms(value: float) -> str:
    """Seconds shown as milliseconds with three significant digits."""
    return fmt_num(value * 1e3)


def _cell(samples: list[float], fmt: Callable[[float], str]) -> str:
    if not samples:
        return "—"
    s = Series("", "")
    s.samples = samples
    return s.cell(fmt)


def _summary(samples: list[float]) -> dict[str, Any] | None:
    if not samples:
        return None
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


Goal = Callable[[int, StoreKind, dict[str, Any], dict[tuple[int, StoreKind], dict[str, Any]]], Any]


def bench(
    name: str,
    title: str,
    *,
    sizes: tuple[int, ...],
    quick: bool,
    repeat: int,
    out_dir: str | Path | None,
    goal: Goal | None = None,
    goal_header: str = "goal",
) -> dict[str, Any]:
    """Measures flow ``name`` at each size on each store, interleaved per repetition.

    Prints the table, writes ``NAME.json`` and returns its data. ``goal(n, kind, entry,
    entries)`` may judge an entry (all entries given, for ratios across sizes): it returns
    a ``(text, met, what)`` triple or None.
    """
    runs: dict[tuple[int, StoreKind], list[FlowRun]] = {(n, k): [] for n in sizes for k in KINDS}
    with scratch_dir() as tmp:
        for _ in range(repeat):
            for n in sizes:
                for kind in KINDS:
                    runs[n, kind].append(measure(name, n, kind, tmp))
    entries: dict[tuple[int, StoreKind], dict[str, Any]] = {}
    for (n, kind), rs in runs.items():
        sizes_b = [r.bytes for r in rs if r.bytes is not None]
        entries[n, kind] = {
            "flow": name,
            "steps": n,
            "store": kind,
            "seconds": _summary([r.seconds for r in rs]),
            "seconds_per_step": _summary([r.seconds / n for r in rs]),
            "bytes": _summary([float(b) for b in sizes_b]),
            "state_at_latest_s": _summary([r.latest_s for r in rs]),
            "state_at_middle_s": _summary([r.middle_s for r in rs]),
            "fresh_open_s": _summary([r.fresh["open_s"] for r in rs if r.fresh]),
            "fresh_latest_s": _summary([r.fresh["latest_s"] for r in rs if r.fresh]),
            "fresh_middle_s": _summary([r.fresh["middle_s"] for r in rs if r.fresh]),
            "fresh_process_s": _summary([r.fresh["wall_s"] for r in rs if r.fresh]),
        }
    rows = []
    for (n, kind), e in entries.items():
        rs = runs[n, kind]
        verdict = goal(n, kind, e, entries) if goal else None
        if verdict is not None:
            _, met, what = verdict
            e["goal"], e["goal_met"] = what, met
        rows.append(
            [
                n,
                kind,
                _cell([r.seconds for r in rs], fmt_s),
                _cell([r.seconds / n * 1e6 for r in rs], fmt_num),
                fmt_bytes(e["bytes"]["median"]) if e["bytes"] else "—",
                _cell([r.latest_s for r in rs], fmt_ms),
                _cell([r.middle_s for r in rs], fmt_ms),
                _cell([r.fresh["latest_s"] for r in rs if r.fresh], fmt_ms),
                _cell([r.fresh["middle_s"] for r in rs if r.fresh], fmt_ms),
                _cell([r.fresh["wall_s"] for r in rs if r.fresh], fmt_s),
                "" if verdict is None else verdict[0],
            ]
        )
    print_table(
        f"{title}; median (min-max) of {repeat}",
        rows,
        [
            "N",
            "store",
            "wall s",
            "µs/step",
            "bytes (db+wal)",
            "state_at latest ms",
            "middle ms",
            "fresh proc: latest ms",
            "middle ms",
            "proc wall s",
            goal_header,
        ],
    )
    data = report(
        name,
        quick=quick,
        repeat=repeat,
        params={"sizes": list(sizes), "stores": list(KINDS)},
        results=list(entries.values()),
    )
    write_results(name, data, out_dir)
    return data


def linear(
    n: int, kind: StoreKind, entries: dict[tuple[int, StoreKind], dict[str, Any]]
) -> tuple[float, float | None] | None:
    """Per-step time and per-step bytes at ``n`` over those at the smallest size (None there)."""
    base_n = min(k for k, _ in entries)
    if n == base_n:
        return None
    here, base = entries[n, kind], entries[base_n, kind]
    t = here["seconds_per_step"]["median"] / base["seconds_per_step"]["median"]
    b = None
    if here["bytes"] and base["bytes"]:
        b = (here["bytes"]["median"] / n) / (base["bytes"]["median"] / base_n)
    return t, b
