"""state (issue 17): what context state costs for the code users write, beside LlamaIndex.

The workloads live in ``benchmarks/peers/state_flows.py``, written once and run unchanged
by both engines (``BENCH_ENGINE`` picks ``workflow`` or ``workflows``, the one import a
LlamaIndex user changes): ours on a file store at durability "normal", LlamaIndex Workflows
2.26 in memory (no persistence). Every measurement is a fresh process
(``benchmarks/peers/state_run.py``), timed inside it from ``run`` to the result, imports
excluded; the two systems take turns on each case, in alternating order from one
repetition to the next, and each ratio comes from one repetition's pair.

1. **spellings**: one step looping N = 1000 times, adding 100 bytes per step with ``get``
   then ``set`` as users write it: ``append`` in place, ``items + [x]``, ``[*items, x]``,
   ``items[:] + [x]``, ``list(items)`` then append, ``copy.deepcopy(items)`` then append, a
   list at the nested path ``a.b``; dicts via ``d[k] = v``, ``{**d, k: v}``, ``d | {k: v}``,
   ``dict(d, k=v)``.
2. **agent**: two chat messages a step (N = 1000 steps) in ``Context[AgentState]`` through
   ``edit_state()`` and through ``get_state()``/``set_state()``, and as message dicts in a
   plain ``ctx.store`` list.
3. **fan-in**: one step sends K = 100 and 1000 events, a ``num_workers=4`` step handles each,
   a collector gathers them with ``collect_events``; from our log also the
   ``step_conflicted`` records and the collector's attempts (goal: none, one each).
4. **scale**: the in-place and ``items + [x]`` loops at N = 10,000 and 100,000 (N = 1000
   comes from 1); at 100,000 at most 3 repetitions.
5. **floor**: the design floor of a step measured in the same run (:mod:`benchmarks._floor`),
   beside our in-place loop's µs per step.

A run that takes longer than the cap (``--cap``, default 120 s; it bounds each process) is
killed and shown as "skipped: >T s"; its later repetitions and larger sizes are not tried.
A run that fails is shown with its error. Bytes are ours only (LlamaIndex keeps nothing):
the store file (db + wal, closed), per step, and the records' JSON per step.
Ours is also shown as process CPU time per step (all threads, user and system, over the
same span as the wall time), beside the floor's: the figure a loaded machine distorts least.

Quick mode: N = 20, K = 10, scale N = 50, the peers only if their venv exists (never
installed then); ``BENCH_PEERS=off`` leaves LlamaIndex out in any mode. Writes
``state.json`` and ``state.md`` and prints the Markdown.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _peers
from ._common import fmt_bytes, report, run_child, scratch_dir, write_results
from ._runs import fmt_num

NAME = "state"
OURS, LLAMA = "ours", "llama"
LABELS = {
    OURS: "ours (file, durability normal)",
    LLAMA: "LlamaIndex Workflows 2.26.1 (in memory)",
}
SCRIPT = _peers.script("state_run.py")
DEFAULT_CAP_S = 120.0
QUICK_CAP_S = 60.0

# name -> how users write it (the table's "code" column)
SPELLINGS: dict[str, str] = {
    "append": "`items.append(x)`",
    "plus": "`items = items + [x]`",
    "star": "`items = [*items, x]`",
    "slice_plus": "`items = items[:] + [x]`",
    "list_copy": "`items = list(items)`; `.append(x)`",
    "deepcopy": "`items = copy.deepcopy(items)`; `.append(x)`",
    "nested": '`get("a.b")`; `.append(x)`; `set("a.b", items)`',
    "dict_setitem": "`d[k] = v`",
    "dict_unpack": "`d = {**d, k: v}`",
    "dict_or": "`d = d | {k: v}`",
    "dict_call": "`d = dict(d, k=v)`",
}
AGENT: dict[str, str] = {
    "agent_edit_state": "`Context[AgentState]`, `async with ctx.store.edit_state() as state`",
    "agent_get_set_state": "`Context[AgentState]`, `get_state()` ... `set_state(state)`",
    "agent_dicts": '`ctx.store` list of message dicts, `get("messages")` ... `set`',
}
SCALE = ("append", "plus")
N = (1000, 20)  # spellings and agent: (full, quick)
FAN_K = ((100, 1000), (10,))
SCALE_N = ((10_000, 100_000), (50,))
SCALE_MAX_REPEAT = {100_000: 3}  # repetitions at most, by N
FLOOR_N = (10_000, 200)

# Goals of issue 17 (judged, never asserted)
GOAL_SPEEDUP = 5.0  # spellings and agent at N=1000: LlamaIndex time / ours
GOAL_FAN_SPEEDUP = 3.0  # fan-in at K=1000
GOAL_FLAT = 1.3  # per-step time at N=10,000 over N=1000
GOAL_STEP_US = 90.0  # the in-place loop


@dataclass(frozen=True, slots=True)
class Case:
    """One workload at one size, in one section of the report."""

    section: str
    workload: str
    size: int
    max_repeat: int | None = None

    def steps(self) -> int:
        """Step attempts of one run: N, or for the fan-in one fan, K work, K collects."""
        return 2 * self.size + 1 if self.workload == "fan_in" else self.size


@dataclass(slots=True)
class Cell:
    """What one system did on one case: a sample per repetition, or why it stopped."""

    seconds: list[float] = field(default_factory=list)
    outs: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None  # "skipped: >T s" or "failed: ..."

    def median(self, key: str) -> float | None:
        xs = [float(o[key]) for o in self.outs if o.get(key) is not None]
        return statistics.median(xs) if xs else None


def cases(quick: bool) -> list[Case]:
    """Every case of the benchmark, in the order they run within a repetition."""
    q = 1 if quick else 0
    out = [Case("spellings", w, N[q]) for w in SPELLINGS]
    out += [Case("agent", w, N[q]) for w in AGENT]
    out += [Case("fan_in", "fan_in", k) for k in FAN_K[q]]
    out += [Case("scale", w, n, SCALE_MAX_REPEAT.get(n)) for n in SCALE_N[q] for w in SCALE]
    return out


def systems(*, quick: bool) -> tuple[dict[str, Path | None], str]:
    """The systems (key -> interpreter; None: this one) and a note on LlamaIndex."""
    ours: dict[str, Path | None] = {OURS: None}
    if os.environ.get("BENCH_PEERS", "").lower() in ("off", "0", "no"):
        return ours, "LlamaIndex left out (BENCH_PEERS=off)"
    python = _peers.ensure(install=not quick)
    if python is None:
        return ours, f"LlamaIndex left out: no peers venv at {_peers.VENV} (quick never installs)"
    return {**ours, LLAMA: python}, f"LlamaIndex from {_peers.VENV}"


# ------------------------------------------------------------------------------ measuring


def _remove(db: Path) -> None:
    for p in db.parent.glob(db.name + "*"):
        p.unlink()


def _error(exc: RuntimeError) -> str:
    """The last line of a failed child's traceback: the error and its message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else "exited with an error"


def run_one(system: str, python: Path | None, case: Case, cap_s: float, tmp: Path) -> Any:
    """One fresh-process run: its JSON, or a "skipped"/"failed" string."""
    db = tmp / f"{system}-{case.workload}-{case.size}-{uuid.uuid4().hex[:8]}.db"
    engine = "workflow" if system == OURS else "workflows"
    argv = [SCRIPT, engine, case.workload, str(case.size)]
    if system == OURS:
        argv.append(str(db))
    try:
        return run_child(argv, python=python, env={"BENCH_ENGINE": engine}, timeout=cap_s)
    except subprocess.TimeoutExpired:
        return f"skipped: >{cap_s:g} s"
    except RuntimeError as exc:
        return f"failed: {_error(exc)}"
    finally:
        _remove(db)


def measure(
    all_cases: Sequence[Case],
    contenders: dict[str, Path | None],
    repeat: int,
    cap_s: float,
    tmp: Path,
    floor_n: int,
) -> tuple[dict[tuple[str, Case], Cell], list[dict[str, Any]], list[tuple[float, ...]]]:
    """Every case on every system, interleaved; the floor once per repetition.

    Returns the cells, the floor samples and the load averages seen at each repetition.
    """
    cells = {(s, c): Cell() for c in all_cases for s in contenders}
    floors: list[dict[str, Any]] = []
    loads: list[tuple[float, ...]] = []
    order = list(contenders)
    for rep in range(repeat):
        loads.append(os.getloadavg())
        db = tmp / f"floor-{rep}.db"
        floors.append(run_child(["-m", "benchmarks._floor", str(floor_n), str(db)]))
        _remove(db)
        print(
            f"  rep {rep + 1}/{repeat} floor: {floors[-1]['floor_us']:.3g} µs/step"
            f" (load {loads[-1][0]:.2f})",
            flush=True,
        )
        for case in all_cases:
            if case.max_repeat is not None and rep >= case.max_repeat:
                continue
            for system in order:
                cell = cells[system, case]
                if cell.stopped is None:
                    cell.stopped = _blocked(cells, system, case)
                if cell.stopped is not None:
                    continue
                out = run_one(system, contenders[system], case, cap_s, tmp)
                if isinstance(out, str):
                    cell.stopped = out
                    print(f"  rep {rep + 1}/{repeat} {case.workload} {case.size} {system}: {out}")
                    continue
                cell.seconds.append(out["seconds"])
                cell.outs.append(out)
                us = out["seconds"] / case.steps() * 1e6
                print(
                    f"  rep {rep + 1}/{repeat} {case.workload} {case.size} {system}:"
                    f" {out['seconds']:.3g} s, {us:.3g} µs/step",
                    flush=True,
                )
        order.reverse()  # the other system goes first next time: drift hits both alike
    loads.append(os.getloadavg())
    return cells, floors, loads


def _blocked(cells: dict[tuple[str, Case], Cell], system: str, case: Case) -> str | None:
    """Why not to try ``case`` on ``system``: a smaller size of it already hit the cap."""
    for (s, c), cell in cells.items():
        if s != system or c.workload != case.workload or c.size >= case.size:
            continue
        if cell.stopped is not None and cell.stopped.startswith("skipped"):
            return f"{cell.stopped} at N={c.size:,}"
    return None


# ------------------------------------------------------------------------------ reporting


def _stat(xs: Sequence[float]) -> dict[str, Any] | None:
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": list(xs)}


def _cell(xs: Sequence[float], fmt: Callable[[float], str]) -> str:
    if not xs:
        return "—"
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def _us(cell: Cell, case: Case) -> str:
    if cell.stopped is not None and not cell.seconds:
        return cell.stopped
    text = _cell([s / case.steps() * 1e6 for s in cell.seconds], fmt_num)
    return text if cell.stopped is None else f"{text}; then {cell.stopped}"


def _cpu_us(cell: Cell, case: Case) -> list[float]:
    return [o["cpu_s"] / case.steps() * 1e6 for o in cell.outs if o.get("cpu_s") is not None]


def speedups(ours: Cell, llama: Cell | None) -> list[float]:
    """LlamaIndex's time over ours, per repetition (each pair measured side by side)."""
    if llama is None:
        return []
    return [b / a for a, b in zip(ours.seconds, llama.seconds, strict=False) if a]


def _ratio(xs: Sequence[float]) -> str:
    return _cell(xs, lambda v: f"{v:.3g}x")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cells(row: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"

    lines = [cells(headers), "|" + "|".join("---" for _ in headers) + "|"]
    lines += [cells(row) for row in rows]
    return "\n".join(lines)


def _bytes_cells(cell: Cell, case: Case) -> list[str]:
    size, payload = cell.median("bytes"), cell.median("payload_bytes")
    if size is None or payload is None:
        return ["—", "—", "—"]
    steps = case.steps()
    return [fmt_bytes(size), fmt_num(size / steps), fmt_num(payload / steps)]


def _goal_cell(value: float | None, met: bool | None) -> str:
    if met is None:
        return "not measured"
    if value is None:
        return "yes" if met else "NO"
    return f"{'yes' if met else 'NO'} ({fmt_num(value)})"


@dataclass(slots=True)
class Report:
    """The cells, floors and loads of one run, turned into tables, goals and JSON."""

    cases: list[Case]
    cells: dict[tuple[str, Case], Cell]
    floors: list[dict[str, Any]]
    loads: list[tuple[float, ...]]
    repeat: int
    cap_s: float
    note: str
    goals: list[dict[str, Any]] = field(default_factory=list)

    def get(self, system: str, case: Case) -> Cell | None:
        return self.cells.get((system, case))

    def case(self, workload: str, size: int) -> Case | None:
        return next((c for c in self.cases if c.workload == workload and c.size == size), None)

    def goal(self, what: str, value: float | None, met: bool | None) -> str:
        """Records a goal's verdict (None: not measured) and returns it as a cell."""
        self.goals.append({"goal": what, "value": value, "met": met})
        return _goal_cell(value, met)

    def speedup_goal(self, case: Case, times: float) -> str:
        ours, llama = self.cells[OURS, case], self.get(LLAMA, case)
        ups = speedups(ours, llama)
        size = f"K={case.size:,}" if case.workload == "fan_in" else f"N={case.size:,}"
        what = f"{case.workload} {size}: >= {times:g}x faster than LlamaIndex"
        if not ours.seconds and ours.stopped is not None:
            return self.goal(what, None, False)  # ours failed or hit the cap: not met
        value = statistics.median(ups) if ups else None
        return self.goal(what, value, None if value is None else value >= times)

    def loop_rows(self, section: str, names: dict[str, str]) -> list[list[Any]]:
        rows = []
        for case in self.cases:
            if case.section != section:
                continue
            ours = self.cells[OURS, case]
            llama = self.get(LLAMA, case)
            rows.append(
                [
                    case.workload,
                    names[case.workload],
                    _us(ours, case),
                    _cell(_cpu_us(ours, case), fmt_num),
                    _us(llama, case) if llama is not None else "—",
                    _ratio(speedups(ours, llama)),
                    *_bytes_cells(ours, case),
                    self.speedup_goal(case, GOAL_SPEEDUP),
                ]
            )
        return rows

    def fan_rows(self) -> list[list[Any]]:
        rows = []
        for case in self.cases:
            if case.section != "fan_in":
                continue
            ours = self.cells[OURS, case]
            llama = self.get(LLAMA, case)
            conflicts = [o["conflicts"] for o in ours.outs]
            attempts = [o["collector_attempts"] / case.size for o in ours.outs]
            worst = [o["collector_max_attempt"] for o in ours.outs]
            size = ours.median("bytes")
            if case.size == max(c.size for c in self.cases if c.section == "fan_in"):
                verdict = self.speedup_goal(case, GOAL_FAN_SPEEDUP)
            else:
                verdict = ""
            none = self.goal(
                f"fan-in K={case.size:,}: no step_conflicted (value: median count),"
                " one collector attempt each",
                statistics.median(conflicts) if conflicts else None,
                bool(conflicts) and max(conflicts) == 0 and max(worst) == 1,
            )
            rows.append(
                [
                    case.size,
                    _us(ours, case),
                    _us(llama, case) if llama is not None else "—",
                    _ratio(speedups(ours, llama)),
                    fmt_bytes(size) if size is not None else "—",
                    fmt_num(size / case.size) if size is not None else "—",
                    _cell(conflicts, fmt_num),
                    _cell(attempts, lambda v: f"{v:.3g}"),
                    _cell(worst, fmt_num),
                    f"{verdict}; {none}" if verdict else none,
                ]
            )
        return rows

    def scale_rows(self) -> list[list[Any]]:
        rows = []
        base_n = min(c.size for c in self.cases if c.section == "spellings")
        sizes = sorted({c.size for c in self.cases if c.section == "scale"})
        for workload in SCALE:
            for n in (base_n, *sizes):
                case = self.case(workload, n)
                if case is None:
                    continue
                ours = self.cells[OURS, case]
                llama = self.get(LLAMA, case)
                flat = self.flat(workload, base_n, n)
                rows.append(
                    [
                        workload,
                        f"{n:,}",
                        _us(ours, case),
                        _us(llama, case) if llama is not None else "—",
                        _ratio(speedups(ours, llama)),
                        *_bytes_cells(ours, case)[1:],
                        flat,
                    ]
                )
        return rows

    def flat(self, workload: str, base_n: int, n: int) -> str:
        """Per-step time and bytes at ``n`` over those at ``base_n`` (medians), judged."""
        if n == base_n:
            return ""
        base, here = self.case(workload, base_n), self.case(workload, n)
        assert base is not None
        assert here is not None
        a, b = self.cells[OURS, base], self.cells[OURS, here]
        judged = n == min(c.size for c in self.cases if c.section == "scale")
        what = f"{workload}: µs/step at N={n:,} within {GOAL_FLAT}x of N={base_n:,}"
        if not a.seconds or not b.seconds:
            if not judged:
                return "—"
            # ours hitting the cap or failing there is not flat; LlamaIndex's absence is moot
            return self.goal(what, None, False if b.stopped else None)
        t = (statistics.median(b.seconds) / n) / (statistics.median(a.seconds) / base_n)
        sa, sb = a.median("bytes"), b.median("bytes")
        by = (sb / n) / (sa / base_n) if sa and sb else None
        text = f"time {t:.2f}x, bytes {by:.2f}x" if by is not None else f"time {t:.2f}x"
        if judged:
            text += "; " + self.goal(what, t, t <= GOAL_FLAT)
        return text

    def floor_rows(self) -> list[list[Any]]:
        parts = [
            ("one queue hop (`asyncio.Queue` put + get)", "queue_us"),
            ("the step's 5 records encoded (orjson)", "encode_us"),
            ("one transaction of those 5 rows (file, WAL, synchronous=NORMAL)", "commit_us"),
            ("**the floor**: all three, per step", "floor_us"),
        ]
        cpu = [f["floor_cpu_us"] for f in self.floors if "floor_cpu_us" in f]
        rows: list[list[Any]] = [
            [
                what,
                _cell([f[key] for f in self.floors], fmt_num),
                _cell(cpu, fmt_num) if key == "floor_us" else "",
                "",
            ]
            for what, key in parts
        ]
        base_n = min(c.size for c in self.cases if c.section == "spellings")
        case = self.case("append", base_n)
        assert case is not None
        ours = self.cells[OURS, case]
        us = [s / case.steps() * 1e6 for s in ours.seconds]
        over = [u / f["floor_us"] for u, f in zip(us, self.floors, strict=False)]
        median = statistics.median(us) if us else None
        verdict = self.goal(
            f"in-place loop at most {GOAL_STEP_US:g} µs/step",
            median,
            None if median is None else median <= GOAL_STEP_US,
        )
        rows.append(
            [
                f"ours, in-place `append` loop, N={base_n:,} (section 1)",
                _cell(us, fmt_num),
                _cell(_cpu_us(ours, case), fmt_num),
                f"{_ratio(over)} the floor; {verdict}",
            ]
        )
        return rows

    def markdown(self) -> str:
        """The report as Markdown: one table per workload, then the goals."""
        self.goals = []
        load = ", ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in self.loads)
        n = min(c.size for c in self.cases if c.section == "spellings")
        loop_head = [
            "workload",
            "code",
            "ours µs/step",
            "ours CPU µs/step",
            "LlamaIndex µs/step",
            "LlamaIndex time / ours",
            "ours bytes (file)",
            "bytes/step",
            "log JSON B/step",
            f"goal: >= {GOAL_SPEEDUP:g}x",
        ]
        scale_sizes = sorted({c.size for c in self.cases if c.section == "scale"})
        limited = ", ".join(
            f"N={k:,}: at most {v}" for k, v in SCALE_MAX_REPEAT.items() if k in scale_sizes
        )
        parts = [
            "# state: what context state costs for the code users write (issue 17)\n",
            f"Median (min-max) of {self.repeat} repetitions; ours and LlamaIndex take turns on"
            " each case (alternating order), each run a fresh process timed from `run` to its"
            " result without imports; ratios per repetition. Ours: "
            f"{LABELS[OURS]}; LlamaIndex: {LABELS[LLAMA]}, same step code"
            f" (`benchmarks/peers/state_flows.py`). {self.note}. Cap per run:"
            f" {self.cap_s:g} s. The machine is shared: load average (1/5/15 min) at each"
            f" repetition's start and at the end: {load}.\n",
            "Command: `python -m benchmarks state` (`make bench` runs it with the others).\n",
            f"## 1. Update spellings, N={n:,} steps, `get` then `set`\n",
            _md_table(loop_head, self.loop_rows("spellings", SPELLINGS)),
            f"\n## 2. Agent memory, N={n:,} steps, two messages a step\n",
            _md_table(loop_head, self.loop_rows("agent", AGENT)),
            "\n## 3. Fan-out / fan-in (`num_workers=4`, `collect_events(ev, [Done] * K)`)\n",
            "µs/step counts 2K + 1 steps (the fan, K workers, K collector deliveries);"
            " conflicts and attempts come from our log.\n",
            _md_table(
                [
                    "K",
                    "ours µs/step",
                    "LlamaIndex µs/step",
                    "LlamaIndex time / ours",
                    "ours bytes",
                    "bytes/K",
                    "step_conflicted",
                    "collector attempts / K",
                    "max attempt",
                    "goal",
                ],
                self.fan_rows(),
            ),
            f"\n## 4. Scale (N={n:,} from section 1{'; ' + limited if limited else ''})\n",
            _md_table(
                [
                    "workload",
                    "N",
                    "ours µs/step",
                    "LlamaIndex µs/step",
                    "LlamaIndex time / ours",
                    "bytes/step",
                    "log JSON B/step",
                    f"per step vs N={n:,}",
                ],
                self.scale_rows(),
            ),
            "\n## 5. The design floor of a step, measured in this run (`benchmarks/_floor.py`)\n",
            "CPU is the process's CPU time (all threads, user and system) over the same span:"
            " on a shared machine it is what the wall time would be without waiting for a"
            " core.\n",
            _md_table(["what", "µs/step", "CPU µs/step", ""], self.floor_rows()),
            "\n## Goals (issue 17)\n",
            _md_table(
                ["goal", "met (value)"],
                [[g["goal"], _goal_cell(g["value"], g["met"])] for g in self.goals],
            ),
        ]
        return "\n".join(parts) + "\n"

    def results(self) -> list[dict[str, Any]]:
        """The JSON results: one entry per system and case, the floor, the goals."""
        out: list[dict[str, Any]] = []
        for (system, case), cell in self.cells.items():
            keys = ("bytes", "payload_bytes", "conflicts", "collector_attempts")
            out.append(
                {
                    "section": case.section,
                    "workload": case.workload,
                    "size": case.size,
                    "steps": case.steps(),
                    "system": system,
                    "seconds": _stat(cell.seconds),
                    "us_per_step": _stat([s / case.steps() * 1e6 for s in cell.seconds]),
                    "cpu_us_per_step": _stat(_cpu_us(cell, case)),
                    "stopped": cell.stopped,
                    **{k: _stat([o[k] for o in cell.outs if k in o]) for k in keys},
                    "collector_max_attempt": _stat(
                        [o["collector_max_attempt"] for o in cell.outs if system == OURS]
                    ),
                }
            )
        parts = ("queue_us", "encode_us", "commit_us", "floor_us", "floor_cpu_us")
        out.append(
            {"section": "floor"} | {k: _stat([f[k] for f in self.floors if k in f]) for k in parts}
        )
        out += [{"section": "goal"} | g for g in self.goals]
        return out


def main(
    quick: bool = False,
    repeat: int = 5,
    out_dir: str | Path | None = None,
    cap_s: float | None = None,
) -> dict[str, Any]:
    """Runs the state workloads, prints the Markdown, writes ``state.json`` and ``state.md``.

    :param cap_s: seconds a run may take before it is killed and shown as skipped.
    """
    cap = cap_s if cap_s is not None else (QUICK_CAP_S if quick else DEFAULT_CAP_S)
    contenders, note = systems(quick=quick)
    print(note)
    all_cases = cases(quick)
    with scratch_dir() as tmp:
        cells, floors, loads = measure(
            all_cases, contenders, repeat, cap, tmp, FLOOR_N[1 if quick else 0]
        )
    rep = Report(all_cases, cells, floors, loads, repeat, cap, note)
    md = rep.markdown()
    print()
    print(md)
    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={
            "cases": [[c.section, c.workload, c.size] for c in all_cases],
            "systems": {k: LABELS[k] for k in contenders},
            "cap_s": cap,
            "floor_steps": FLOOR_N[1 if quick else 0],
            "load_averages": [list(x) for x in loads],
            "note": note,
        },
        results=rep.results(),
    )
    path = write_results(NAME, data, out_dir)
    (path.parent / f"{NAME}.md").write_text(md)
    print(f"wrote {path.parent / f'{NAME}.md'}")
    return data


__all__ = ["Case", "Cell", "Report", "cases", "main", "measure", "systems"]
