"""What every benchmark shares: timing, summaries, tables, scratch files and the JSON output.

A benchmark measures its baseline and our code interleaved, once per repetition, in the same
process: the disk's speed drifts (MEASUREMENTS.md saw fsync vary 10x over an hour), so only
numbers taken side by side can be compared. Each repetition's ratio is computed from that
repetition's pair, and the table reports medians with the min-max spread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate  # type: ignore[import-untyped]

__all__ = [
    "RESULTS_DIR",
    "ROOT",
    "Series",
    "db_bytes",
    "fmt_bytes",
    "fmt_rate",
    "fmt_ratio",
    "machine_info",
    "print_table",
    "ratio_summary",
    "report",
    "run_child",
    "scratch_dir",
    "timed",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent  # the repository: what child processes import


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: they mean little without the machine and versions."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def timed(fn: Callable[[], Any]) -> float:
    """Seconds that ``fn()`` took, by the monotonic high-resolution clock."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Series:
    """The samples of one measurement (a rate per repetition) and their summary."""

    def __init__(self, name: str, unit: str) -> None:
        self.name = name
        self.unit = unit
        self.samples: list[float] = []

    def add(self, value: float) -> None:
        self.samples.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def cell(self, fmt: Callable[[float], str] | None = None) -> str:
        """``median (min-max)`` for a table cell, each number written by ``fmt``."""
        fmt = fmt or fmt_rate
        lo, hi = min(self.samples), max(self.samples)
        return f"{fmt(self.median)} ({fmt(lo)}-{fmt(hi)})"

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "min": min(self.samples),
            "max": max(self.samples),
            "samples": list(self.samples),
        }


def ratio_summary(ours: Series, baseline: Series) -> dict[str, float]:
    """Per-repetition ratios ours/baseline (each pair measured side by side), summarized."""
    ratios = [a / b for a, b in zip(ours.samples, baseline.samples, strict=True) if b]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def fmt_rate(value: float) -> str:
    """A rate with three significant digits and a k/M suffix: 12.3k, 1.05M."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def fmt_bytes(value: float) -> str:
    """A byte count with three significant digits: 512 B, 1.07 MB (decimal units)."""
    for scale, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:.0f} B"


def db_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of an SQLite database on disk: the file plus its ``-wal`` file, if any.

    Close every connection first, so the WAL is checkpointed into the file (and removed or
    truncated): otherwise the same content may be counted in both.
    """
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(os.fspath(path) + suffix)
    return total


def run_child(
    argv: Sequence[str],
    *,
    python: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    expect_exit: int = 0,
    timeout: float = 1800,
) -> dict[str, Any]:
    """Runs ``python ARGV`` in a fresh process and returns the JSON of its last output line.

    Fresh processes measure what a restarted service pays (nothing cached, every import
    done anew) and keep each system's measurement apart from the harness. ``wall_s`` is
    added: the child's whole life, interpreter start and imports included. A child that
    should die (a simulated crash) passes ``expect_exit`` and returns ``{"wall_s": ...}``.
    """
    cmd = [os.fspath(python or sys.executable), *argv]
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.perf_counter() - start
    if proc.returncode != expect_exit:
        msg = (
            f"{' '.join(cmd)} exited {proc.returncode}, expected {expect_exit}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
        raise RuntimeError(msg)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    data: dict[str, Any] = json.loads(lines[-1]) if lines and expect_exit == 0 else {}
    data["wall_s"] = wall
    return data


def fmt_ratio(r: dict[str, float], *, percent: bool = False) -> str:
    """A ratio summary as ``median (min-max)``, as a multiple or a percentage."""
    if percent:
        return f"{r['median']:.0%} ({r['min']:.0%}-{r['max']:.0%})"
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def print_table(title: str, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Prints a titled plain-text table (GitHub markdown, so it pastes into issues)."""
    print(f"\n{title}")
    print(tabulate(rows, headers=headers, tablefmt="github"))


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory for benchmark databases, removed afterwards.

    ``BENCH_TMPDIR`` chooses where: fsync timings mean something only on a real disk, so
    point it away from a tmpfs ``/tmp``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-", dir=os.environ.get("BENCH_TMPDIR")) as d:
        yield Path(d)


def write_results(name: str, data: dict[str, Any], out_dir: str | os.PathLike[str] | None) -> Path:
    """Writes ``data`` as ``NAME.json`` under ``out_dir`` (default ``BENCH_RESULTS_DIR`` or
    ``benchmarks/results``) and returns the file's path."""
    target = Path(out_dir or os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path


def report(
    name: str, *, quick: bool, repeat: int, params: dict[str, Any], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON document of one benchmark run: what ran, where, and what came out."""
    return {
        "benchmark": name,
        "quick": quick,
        "repeat": repeat,
        "machine": machine_info(),
        "params": params,
        "results": results,
    }
