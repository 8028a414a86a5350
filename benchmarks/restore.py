"""restore (issue 18): ``state_at`` at the latest and a middle seq in a fresh process, for
runs of 1k, 10k and 1M records, beside LangGraph's ``get_state`` in the same run.

Ours: a file store at durability "normal", each read timed in a fresh process
(:mod:`benchmarks._child` ``restore``: ``state_at(run)`` then ``state_at(run, middle)``, the
middle being the run's middle checkpoint), the process's imports and the store's opening not
counted. Two workloads:

* **chat** (the goals' workload): one step looping, each turn counting and keeping the last
  20 messages of 100 bytes in context, a state of bounded size, as an agent's memory is;
  170, 1,700 and 170,000 turns of 6 records: 1k, 10k and 1M records (quick: 40 and 400).
* **loop** (``benchmarks.loop``): the list grows by a 100-byte item a step, so the state
  grows with the run; 1,000 and 10,000 steps (quick: 50). Its snapshots keep the list by
  reference to the log (its full write and the patches since), so they stay small and come
  every 32 KB of log: a middle read folds a bounded span and builds no list it does not read.

LangGraph (peers venv, :mod:`benchmarks._peers`): ``benchmarks/peers/langgraph_loop.py``
with a plain list channel, a 3,000-step thread built once, then ``get_state`` latest and with
the middle checkpoint's id, in a fresh process per repetition, taking turns with ours.

Goals (issue 18): any seq of the 1M-record run within 2x of LangGraph's middle-checkpoint
read (latest likewise); the middle of the 10k-record run within 2x of the 1k-record run's
and of its own latest; snapshots at most 10% of the log's bytes at 10k records.
The command line on the largest chat run (1M records; quick: the large one), each command
in a fresh process (:mod:`benchmarks._cli_child`), timed from its call to its output, the
interpreter's start and imports apart: ``state --at`` the middle, ``diff`` of the middle and
a seq 600 later, ``history --from`` the middle ``--limit 50``, and the timeline's data
(``timeline --json``: the last window, and the one around the middle). Goal (issue 18):
milliseconds, whatever the run's length.

``BENCH_PEERS=off`` leaves LangGraph out. Writes ``restore.json``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step

from . import _peers
from ._common import fmt_bytes, print_table, report, run_child, scratch_dir, write_results
from ._runs import CHILD, flow_class, fmt_ms, middle_seq, open_workflow, run_flow

NAME = "restore"
WINDOW = 20  # messages the chat keeps
# (label, flow, steps) of the full and the quick run.
RUNS: tuple[tuple[tuple[str, str, int], ...], ...] = (
    (
        ("1k records", "restore", 170),  # a turn is 6 records
        ("10k records", "restore", 1_700),
        ("1M records", "restore", 170_000),
        ("loop 1k steps", "loop", 1_000),
        ("loop 10k steps", "loop", 10_000),
    ),
    (
        ("quick small", "restore", 40),
        ("quick large", "restore", 400),
        ("quick loop", "loop", 50),
    ),
)
LANGGRAPH_STEPS = (3_000, 20)
GOAL_PEER = 2.0
GOAL_SIZES = 2.0
GOAL_SNAPSHOT_SHARE = 0.10


class Turn(Event):
    """One more turn: ``i`` turns done, ``n`` in all."""

    i: int
    n: int


class ChatMemory(Workflow):
    """Each turn counts and keeps the last WINDOW messages: a bounded state, a growing log."""

    @step
    async def turn(self, ctx: Context, ev: StartEvent | Turn) -> Turn | StopEvent:  # type: ignore[type-arg]
        i, n = (ev.i, ev.n) if isinstance(ev, Turn) else (0, int(ev["n"]))
        recent = await ctx.store.get("recent", default=[])
        recent.append(f"turn {i}: " + "x" * 90)
        del recent[:-WINDOW]
        await ctx.store.set("recent", recent)
        await ctx.store.set("turns", i + 1)
        if i + 1 >= n:
            return StopEvent(result=i + 1)
        return Turn(i=i + 1, n=n)


def workflow_class(n: int) -> type[Workflow]:
    """The chat flow (one class for every N: N is the start event's field)."""
    return ChatMemory


def build(flow: str, steps: int, path: Path) -> dict[str, Any]:
    """Runs the flow to its end on a new store; returns the run and what its store holds."""
    wf = open_workflow(flow_class(flow, steps), "normal", path)
    try:
        seconds, run_id = run_flow(wf, steps)
        store = wf.store
        middle = middle_seq(wf, run_id)
        ((records, log_bytes),) = store.query(
            "SELECT count(*), sum(length(payload)) FROM records WHERE run_id = ?", (run_id,)
        )
        count, snap_bytes = store.snapshot_stats(run_id)
        last = store.find_snapshot(run_id)
        last_bytes = len(last.data) if last is not None else 0
    finally:
        wf.store.close()
    return {
        "run_id": run_id,
        "middle": middle,
        "build_s": seconds,
        "records": records,
        "log_bytes": log_bytes,
        "snapshots": count,
        "snapshot_bytes": snap_bytes,
        "last_snapshot_bytes": last_bytes,
    }


def ours(flow: str, steps: int, path: Path, built: dict[str, Any]) -> dict[str, Any]:
    """One fresh-process restore of ours: ``latest_s`` and ``middle_s``."""
    argv = [*CHILD, "restore", flow, str(steps), "normal", str(path), built["run_id"]]
    return run_child([*argv, str(built["middle"])])


def peer_runner(*, quick: bool) -> tuple[Callable[[str, int, Path], dict[str, Any]] | None, str]:
    """How to run the LangGraph script, or None with the reason it is left out (quick runs
    never install the peers venv)."""
    if os.environ.get("BENCH_PEERS", "").lower() in ("off", "0", "no"):
        return None, "LangGraph left out (BENCH_PEERS=off)"
    python = _peers.ensure(install=not quick)
    if python is None:
        return None, f"LangGraph left out: no peers venv at {_peers.VENV}"

    def run(mode: str, n: int, db: Path) -> dict[str, Any]:
        script = _peers.script("langgraph_loop.py")
        return run_child([script, "full", mode, str(n), str(db)], python=python)

    return run, ""


def cli_commands(path: Path, built: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The commands timed on a run: (label, the command line's arguments)."""
    db, run, mid = str(path), built["run_id"], built["middle"]
    return [
        ("state --at MIDDLE --json", ["state", db, run, "--at", str(mid), "--json"]),
        ("diff MIDDLE MIDDLE+600 --json", ["diff", db, run, str(mid), str(mid + 600), "--json"]),
        (
            "history --from MIDDLE --limit 50 --json",
            ["history", db, run, "--from", str(mid), "--limit", "50", "--json"],
        ),
        ("timeline --json (last window)", ["timeline", db, run, "--json"]),
        ("timeline --at MIDDLE --json", ["timeline", db, run, "--at", str(mid), "--json"]),
    ]


def cli_once(args: list[str]) -> dict[str, Any]:
    """One command in a fresh process: ``command_s`` (its own time) and ``wall_s``."""
    return run_child(["-m", "benchmarks._cli_child", *args])


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _cell(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{fmt_ms(_med(xs))} ({fmt_ms(min(xs))}-{fmt_ms(max(xs))})"


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Builds the runs, measures the restores taking turns with LangGraph, prints, writes."""
    runs = RUNS[1 if quick else 0]
    lg_steps = LANGGRAPH_STEPS[1 if quick else 0]
    peer, note = peer_runner(quick=quick)
    times: dict[str, dict[str, list[float]]] = {
        label: {"latest": [], "middle": []} for label, _, _ in runs
    }
    lg: dict[str, list[float]] = {"latest": [], "middle": []}
    big_label = runs[2][0] if len(runs) > 3 else runs[1][0]  # the 1M-record chat run
    cli_times: dict[str, dict[str, list[float]]] = {}
    with scratch_dir() as tmp:
        built: dict[str, dict[str, Any]] = {}
        for label, flow, steps in runs:
            start = time.perf_counter()
            built[label] = build(flow, steps, tmp / f"{flow}-{steps}.db")
            print(
                f"built {label}: {built[label]['records']:,} records in "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )
        lg_db = tmp / "langgraph.db"
        if peer is not None:
            peer("run", lg_steps, lg_db)
        for _ in range(repeat):
            for label, flow, steps in runs:
                out = ours(flow, steps, tmp / f"{flow}-{steps}.db", built[label])
                times[label]["latest"].append(out["latest_s"])
                times[label]["middle"].append(out["middle_s"])
            if peer is not None:
                out = peer("restore", lg_steps, lg_db)
                lg["latest"].append(out["latest_s"])
                lg["middle"].append(out["middle_s"])
            _, flow, steps = next(r for r in runs if r[0] == big_label)
            big = tmp / f"{flow}-{steps}.db"
            for label, args in cli_commands(big, built[big_label]):
                out = cli_once(args)
                t = cli_times.setdefault(label, {"command": [], "wall": []})
                t["command"].append(out["command_s"])
                t["wall"].append(out["wall_s"])
    data = _report(runs, built, times, lg, lg_steps, note, quick=quick, repeat=repeat)
    records = built[big_label]["records"]
    print_table(
        f"the command line on the {records:,}-record run, each command in a fresh process,"
        f" ms, median (min-max) of {repeat}",
        [[label, _cell(t["command"]), _cell(t["wall"])] for label, t in cli_times.items()],
        ["command", "the command's own ms", "process ms (start and imports too)"],
    )
    data["cli"] = {
        "run": big_label,
        "records": records,
        "commands": {
            label: {"command_s": _summary(t["command"]), "wall_s": _summary(t["wall"])}
            for label, t in cli_times.items()
        },
    }
    write_results(NAME, data, out_dir)
    return data


def _report(
    runs: tuple[tuple[str, str, int], ...],
    built: dict[str, dict[str, Any]],
    times: dict[str, dict[str, list[float]]],
    lg: dict[str, list[float]],
    lg_steps: int,
    note: str,
    *,
    quick: bool,
    repeat: int,
) -> dict[str, Any]:
    lg_middle = _med(lg["middle"]) if lg["middle"] else None
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for label, flow, steps in runs:
        b, t = built[label], times[label]
        share = b["snapshot_bytes"] / b["log_bytes"]
        spaced = (b["snapshot_bytes"] - b["last_snapshot_bytes"]) / b["log_bytes"]
        vs_lg = (
            f"{_med(t['latest']) / lg_middle:.2f}x / {_med(t['middle']) / lg_middle:.2f}x"
            if lg_middle
            else "—"
        )
        rows.append(
            [
                label,
                f"{b['records']:,}",
                _cell(t["latest"]),
                _cell(t["middle"]),
                vs_lg,
                b["snapshots"],
                f"{fmt_bytes(b['snapshot_bytes'])} ({share:.0%}; {spaced:.0%} without the last)",
            ]
        )
        results.append(
            {
                "run": label,
                "flow": "chat" if flow == NAME else flow,
                "steps": steps,
                **{k: v for k, v in b.items() if k != "run_id"},
                "latest_s": _summary(t["latest"]),
                "middle_s": _summary(t["middle"]),
                "snapshot_share": share,
            }
        )
    if lg["latest"]:
        rows.append(
            [
                f"LangGraph get_state, {lg_steps}-step thread",
                "",
                _cell(lg["latest"]),
                _cell(lg["middle"]),
                "1.00x",
                "",
                "",
            ]
        )
        results.append(
            {
                "run": "langgraph",
                "steps": lg_steps,
                "latest_s": _summary(lg["latest"]),
                "middle_s": _summary(lg["middle"]),
            }
        )
    print_table(
        f"restore: state_at in a fresh process, ms, median (min-max) of {repeat}"
        + (f"; {note}" if note else ""),
        rows,
        [
            "run",
            "records",
            "latest ms",
            "middle ms",
            "latest / middle vs LangGraph middle",
            "snapshots",
            "snapshot bytes (of the log's)",
        ],
    )
    goals = _goals(built, times, lg_middle, quick=quick)
    for text in goals:
        print(text)
    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={"runs": [list(r) for r in runs], "langgraph_steps": lg_steps, "note": note},
        results=results,
    )
    data["goals"] = goals
    return data


def _summary(xs: list[float]) -> dict[str, Any] | None:
    if not xs:
        return None
    return {"median": _med(xs), "min": min(xs), "max": max(xs), "samples": xs}


def _goals(
    built: dict[str, dict[str, Any]],
    times: dict[str, dict[str, list[float]]],
    lg_middle: float | None,
    *,
    quick: bool,
) -> list[str]:
    """The issue's goals, judged (only in a full run: quick sizes mean nothing)."""
    if quick:
        return ["goals are judged in full runs only"]
    med = {label: {k: _med(v) for k, v in t.items()} for label, t in times.items()}
    out = []
    big, small, mid = "1M records", "1k records", "10k records"

    def verdict(ok: bool) -> str:
        return "yes" if ok else "NO"

    if lg_middle:
        for part in ("latest", "middle"):
            r = med[big][part] / lg_middle
            out.append(
                f"1M records, {part} within {GOAL_PEER}x of LangGraph's middle read: "
                f"{r:.2f}x: {verdict(r <= GOAL_PEER)}"
            )
    for name, (one, ten) in {
        "chat": (small, mid),
        "loop": ("loop 1k steps", "loop 10k steps"),
    }.items():
        r1 = med[ten]["middle"] / med[one]["middle"]
        r2 = med[ten]["middle"] / med[ten]["latest"]
        out.append(
            f"{name}: 10k middle within {GOAL_SIZES}x of 1k middle: {r1:.2f}x:"
            f" {verdict(r1 <= GOAL_SIZES)}"
        )
        out.append(
            f"{name}: 10k middle within {GOAL_SIZES}x of 10k latest: {r2:.2f}x:"
            f" {verdict(r2 <= GOAL_SIZES)}"
        )
    for label in (mid, "loop 10k steps"):
        b = built[label]
        share = b["snapshot_bytes"] / b["log_bytes"]
        out.append(
            f"{label}: snapshots {share:.1%} of the log's bytes (goal <= "
            f"{GOAL_SNAPSHOT_SHARE:.0%}): {verdict(share <= GOAL_SNAPSHOT_SHARE)}"
        )
    return out
