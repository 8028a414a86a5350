"""peers (issue 7): ours side by side with LlamaIndex Workflows, LangGraph and DBOS.

Every system runs in a fresh process per measurement (ours: :mod:`benchmarks._child`; the
peers: the scripts in this folder, in the peers venv made by :mod:`benchmarks._peers`),
timed inside that process from the run's start to its result, imports excluded, and the
systems take turns (A B C A B C ...) so drift in the disk's speed hits all alike. Ratios
are computed per repetition from measurements taken side by side.

Workloads (the one of MEASUREMENTS.md: one step looping N times, appending a 100-byte item
to a list in state):

1. **loop** at N = 1000 and 3000 (also 100 and 300 for ours and LlamaIndex): ours on a
   file at durability "normal" and "full"; LlamaIndex in memory (no persistence);
   LlamaIndex checkpointed by hand (``ctx.to_dict()`` as JSON after every step, one line
   per step so any step can be restored; quadratic, so at N = 100 and 300 only);
   LangGraph + SqliteSaver with ``durability="sync"``, the list a plain channel and a
   DeltaChannel (beta); DBOS on its default SQLite system database.
4. **restore** after the loop at N = 1000, in a fresh process: the latest state and the
   middle one (ours ``state_at``; LangGraph ``get_state`` without and with
   ``checkpoint_id``). **crash -> resume**: the run's process dies at step N/2, another
   process resumes it to the end (ours ``wf.resume``; LangGraph ``invoke(None, config)``;
   DBOS's recovery at ``launch``).

Quick mode: N = 20, one repetition, ours at durability "normal" only, the peers only if
their venv exists (never installed then); ``BENCH_PEERS=off`` leaves the peers out in any
mode. Writes ``peers.json``, ``peers.md`` and the plots ``peers-time.png`` and
``peers-bytes.png``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _peers
from .._common import (
    fmt_bytes,
    report,
    run_child,
    scratch_dir,
    write_results,
)
from .._runs import CHILD, CRASH_ENV, flow_class, fmt_num, middle_seq, open_workflow

NAME = "peers"
SIZES = ((100, 300, 1000, 3000), (20,))  # (full run, quick run)
SMALL = (100, 300)  # only the systems cheap enough there (LlamaIndex manual: only there)
RESTORE_N = (1000, 20)
RUN_ID = "bench-loop"

Json = dict[str, Any]
Runner = Callable[[int, Path], Json]


@dataclass(slots=True)
class System:
    """One contender: how to run the loop, and optionally restore and crash -> resume."""

    key: str
    label: str
    sizes: tuple[int, ...]
    run: Runner
    restore: Callable[[int, Path], Json] | None = None
    crash: Callable[[int, Path], None] | None = None
    resume: Runner | None = None
    ours: bool = False


@dataclass(slots=True)
class Samples:
    """Measurements of one system at one N, one entry per repetition."""

    seconds: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)


# ------------------------------------------------------------------------------ systems


def _ours(kind: str) -> System:
    def run(n: int, db: Path) -> Json:
        return run_child([*CHILD, "run", "loop", str(n), kind, str(db), RUN_ID])

    def restore(n: int, db: Path) -> Json:
        wf = open_workflow(flow_class("loop", n), "normal", db)  # untimed: the middle seq
        try:
            seq = middle_seq(wf, RUN_ID)
        finally:
            wf.store.close()
        return run_child([*CHILD, "restore", "loop", str(n), kind, str(db), RUN_ID, str(seq)])

    def crash(n: int, db: Path) -> None:
        argv = [*CHILD, "run", "loop", str(n), kind, str(db), RUN_ID]
        run_child(argv, env={CRASH_ENV: str(n // 2)}, expect_exit=9)

    def resume(n: int, db: Path) -> Json:
        return run_child([*CHILD, "resume", "loop", str(n), kind, str(db), RUN_ID])

    return System(
        f"ours-{kind}",
        f"ours, file, durability {kind}",
        SIZES[0],
        run,
        restore,
        crash,
        resume,
        ours=True,
    )


def _peer_systems(python: Path) -> list[System]:
    def peer(name: str, *args: str, env: dict[str, str] | None = None, code: int = 0) -> Json:
        return run_child([_peers.script(name), *args], python=python, env=env, expect_exit=code)

    def llama(mode: str) -> Runner:
        return lambda n, db: peer("llama_loop.py", mode, str(n), str(db.with_suffix(".jsonl")))

    def lg(channel: str, mode: str) -> Runner:
        return lambda n, db: peer("langgraph_loop.py", channel, mode, str(n), str(db))

    def lg_crash(channel: str) -> Callable[[int, Path], None]:
        def crash(n: int, db: Path) -> None:
            peer("langgraph_loop.py", channel, "run", str(n), str(db), env=_crash(n), code=9)

        return crash

    def dbos(mode: str) -> Runner:
        return lambda n, db: peer("dbos_loop.py", mode, str(n), str(db))

    def dbos_crash(n: int, db: Path) -> None:
        peer("dbos_loop.py", "run", str(n), str(db), env=_crash(n), code=9)

    big = (1000, 3000)
    return [
        System("llama-memory", "LlamaIndex Workflows, in memory", (*SMALL, *big), llama("memory")),
        System(
            "llama-manual",
            "LlamaIndex, ctx.to_dict() + JSON per step (N<=300 only)",
            SMALL,
            llama("manual"),
        ),
        System(
            "langgraph-full",
            "LangGraph + SqliteSaver, full channel, sync",
            big,
            lg("full", "run"),
            lg("full", "restore"),
            lg_crash("full"),
            lg("full", "resume"),
        ),
        System(
            "langgraph-delta",
            "LangGraph + SqliteSaver, DeltaChannel (beta), sync",
            big,
            lg("delta", "run"),
            lg("delta", "restore"),
            lg_crash("delta"),
            lg("delta", "resume"),
        ),
        System(
            "dbos",
            "DBOS, SQLite system database",
            big,
            dbos("run"),
            None,
            dbos_crash,
            dbos("resume"),
        ),
    ]


def _crash(n: int) -> dict[str, str]:
    return {CRASH_ENV: str(n // 2)}


def systems(*, quick: bool) -> tuple[list[System], str]:
    """The contenders and a note on the peers (used, or why not)."""
    # Quick runs check the harness, not the store: durability "full" is left to ``loop``.
    ours = [_ours("normal")] if quick else [_ours("normal"), _ours("full")]
    if os.environ.get("BENCH_PEERS", "").lower() in ("off", "0", "no"):
        return ours, "peers left out (BENCH_PEERS=off)"
    python = _peers.ensure(install=not quick)
    if python is None:
        return ours, f"peers left out: no peers venv at {_peers.VENV} (quick runs never install)"
    return [*ours, *_peer_systems(python)], f"peers from {_peers.VENV}"


# ------------------------------------------------------------------------------ measuring


def _remove(db: Path) -> None:
    for p in db.parent.glob(db.name + "*"):
        p.unlink()
    with contextlib.suppress(FileNotFoundError):
        db.with_suffix(".jsonl").unlink()


def measure(
    contenders: Sequence[System], sizes: Sequence[int], restore_n: int, repeat: int, tmp: Path
) -> tuple[dict[tuple[str, int], Samples], dict[str, Samples], dict[str, Samples]]:
    """Workloads 1 and 4, the systems taking turns in each repetition."""
    loop: dict[tuple[str, int], Samples] = {}
    restore: dict[str, Samples] = {}
    crash: dict[str, Samples] = {}
    for rep in range(repeat):
        for n in sizes:
            for s in contenders:
                if n not in s.sizes:
                    continue
                db = tmp / f"{s.key}-{n}-{rep}.db"
                out = s.run(n, db)
                got = loop.setdefault((s.key, n), Samples())
                got.seconds.append(out["seconds"])
                got.bytes.append(float(out.get("bytes", 0)))
                got.add("import_s", out.get("import_s", 0.0))
                if n == restore_n and s.restore is not None:
                    r = s.restore(n, db)
                    into = restore.setdefault(s.key, Samples())
                    for key in ("latest_s", "middle_s", "wall_s"):
                        into.add(key, r[key])
                _remove(db)
                print(f"  rep {rep + 1}/{repeat} N={n} {s.key}: {out['seconds']:.3g} s", flush=True)
        for s in contenders:
            if s.crash is None or s.resume is None:
                continue
            db = tmp / f"crash-{s.key}-{rep}.db"
            s.crash(restore_n, db)
            r = s.resume(restore_n, db)
            into = crash.setdefault(s.key, Samples())
            into.seconds.append(r["seconds"])
            into.add("wall_s", r["wall_s"])
            _remove(db)
            print(
                f"  rep {rep + 1}/{repeat} crash->resume {s.key}: {r['seconds']:.3g} s", flush=True
            )
    return loop, restore, crash


# ------------------------------------------------------------------------------ reporting


def _stats(xs: Sequence[float]) -> Json:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "samples": list(xs)}


def _cell(xs: Sequence[float], fmt: Callable[[float], str]) -> str:
    if not xs:
        return "—"
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"


def _ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-repetition ratios of measurements taken side by side."""
    return [a / b for a, b in zip(num, den, strict=False) if b]


def _ratio_cell(xs: Sequence[float]) -> str:
    return _cell(xs, lambda v: f"{v:.3g}x")


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _goal(text: str, value: float | None, met: bool | None) -> Json:
    return {"goal": text, "value": value, "met": met}


def goals(
    loop: dict[tuple[str, int], Samples],
    restore: dict[str, Samples],
    crash: dict[str, Samples],
    restore_n: int,
) -> list[Json]:
    """The goals of issue 7, judged on medians of per-repetition ratios (None: not measured)."""
    n = restore_n
    ours = loop.get(("ours-normal", n))

    def faster(peer: str, times: float) -> Json:
        text = f"ours (normal) >= {times:g}x faster than {peer} at N={n}"
        other = loop.get((peer, n))
        if ours is None or other is None:
            return _goal(text, None, None)
        r = statistics.median(_ratios(other.seconds, ours.seconds))
        return _goal(text, r, r >= times)

    out = [faster("langgraph-full", 25), faster("llama-memory", 5)]
    text = f"ours (normal) bytes within 2x of DBOS at N={n}"
    dbos = loop.get(("dbos", n))
    if ours is not None and dbos is not None:
        r = statistics.median(ours.bytes) / statistics.median(dbos.bytes)
        out.append(_goal(text, r, r <= 2))
    else:
        out.append(_goal(text, None, None))
    big = 3 * n
    text = f"ours (normal) linear from N={n} to {big}: time and bytes per step <= 1.25x"
    ours_big = loop.get(("ours-normal", big))
    if ours is not None and ours_big is not None:
        t = statistics.median(_ratios(ours_big.seconds, ours.seconds)) / 3
        b = statistics.median(ours_big.bytes) / statistics.median(ours.bytes) / 3
        out.append({**_goal(text, max(t, b), max(t, b) <= 1.25), "time": t, "bytes": b})
    else:
        out.append(_goal(text, None, None))
    text = "ours latest-state restore (fresh process) within 2x of LangGraph full's"
    a, b2 = restore.get("ours-normal"), restore.get("langgraph-full")
    if a is not None and b2 is not None:
        r = statistics.median(_ratios(a.extra["latest_s"], b2.extra["latest_s"]))
        out.append(_goal(text, r, r <= 2))
    else:
        out.append(_goal(text, None, None))
    text = f"crash -> resume of {n - n // 2} remaining steps >= 10x faster than DBOS"
    a, b2 = crash.get("ours-normal"), crash.get("dbos")
    if a is not None and b2 is not None:
        r = statistics.median(_ratios(b2.seconds, a.seconds))
        out.append(_goal(text, r, r >= 10))
    else:
        out.append(_goal(text, None, None))
    return out


def _yes(g: Json) -> str:
    if g["met"] is None:
        return "not measured"
    return ("yes" if g["met"] else "NO") + f" ({g['value']:.3g})"


def markdown(
    contenders: Sequence[System],
    loop: dict[tuple[str, int], Samples],
    restore: dict[str, Samples],
    crash: dict[str, Samples],
    goal_list: list[Json],
    *,
    repeat: int,
    restore_n: int,
    note: str,
) -> str:
    """The report as Markdown: the three tables and the goals."""
    labels = {s.key: s.label for s in contenders}
    rows = []
    for (key, n), smp in sorted(
        loop.items(), key=lambda kv: (kv[0][1], list(labels).index(kv[0][0]))
    ):
        base = loop.get(("ours-normal", n))
        full = loop.get(("ours-full", n))
        rows.append(
            [
                n,
                labels[key],
                _cell(smp.seconds, fmt_num),
                fmt_num(statistics.median(smp.seconds) / n * 1e3),
                fmt_bytes(statistics.median(smp.bytes)) if any(smp.bytes) else "—",
                _ratio_cell(_ratios(smp.seconds, base.seconds)) if base else "—",
                _ratio_cell(_ratios(smp.seconds, full.seconds)) if full else "—",
            ]
        )
    parts = [
        f"# peers: one step looping N times, appending 100 bytes to a list in state\n\n"
        f"Median (min-max) of {repeat} repetitions, systems interleaved; each run in a fresh "
        f"process, timed from start to result without imports. {note}.\n",
        "## Loop\n",
        _md_table(
            [
                "N",
                "system",
                "seconds",
                "ms/step",
                "bytes",
                "time / ours normal",
                "time / ours full",
            ],
            rows,
        ),
    ]
    rrows = [
        [
            labels[key],
            _cell(smp.extra["latest_s"], lambda v: fmt_num(v * 1e3)),
            _cell(smp.extra["middle_s"], lambda v: fmt_num(v * 1e3)),
            _cell(smp.extra["wall_s"], fmt_num),
        ]
        for key, smp in restore.items()
    ]
    parts += [
        f"\n## Restore after the loop at N={restore_n}, in a fresh process\n",
        _md_table(["system", "latest state ms", "middle state ms", "process wall s"], rrows),
    ]
    base = crash.get("ours-normal")
    crows = [
        [
            labels[key],
            _cell(smp.seconds, fmt_num),
            _cell(smp.extra["wall_s"], fmt_num),
            _ratio_cell(_ratios(smp.seconds, base.seconds)) if base else "—",
        ]
        for key, smp in crash.items()
    ]
    parts += [
        f"\n## Crash at step {restore_n // 2} of {restore_n}, resume to the end in a new process\n",
        _md_table(
            ["system", "resume s (in process)", "process wall s", "resume / ours normal"], crows
        ),
        "\n## Goals (issue 7)\n",
        _md_table(["goal", "met (value)"], [[g["goal"], _yes(g)] for g in goal_list]),
    ]
    return "\n".join(parts) + "\n"


def plots(
    contenders: Sequence[System], loop: dict[tuple[str, int], Samples], out: Path
) -> list[Path]:
    """Time and bytes against N, one line per system (log-log); none without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is missing (pip install -e '.[bench]'): no plots")
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for what, ylabel in (("time", "seconds"), ("bytes", "bytes on disk")):
        fig, ax = plt.subplots(figsize=(8, 5))
        for s in contenders:
            pts = sorted((n, smp) for (k, n), smp in loop.items() if k == s.key)
            ys = [smp.seconds if what == "time" else smp.bytes for _, smp in pts]
            if not pts or (what == "bytes" and not any(map(any, ys))):
                continue
            xs = [n for n, _ in pts]
            med = [statistics.median(y) for y in ys]
            err = [
                [m - min(y) for m, y in zip(med, ys, strict=True)],
                [max(y) - m for m, y in zip(med, ys, strict=True)],
            ]
            ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=s.label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (steps)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"loop: {ylabel} against N (median, min-max)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        path = out / f"peers-{what}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")
        paths.append(path)
    return paths


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the peers benchmark, prints the Markdown, writes JSON, Markdown and plots."""
    pick = 1 if quick else 0
    sizes, restore_n = SIZES[pick], RESTORE_N[pick]
    contenders, note = systems(quick=quick)
    if quick:
        for s in contenders:
            s.sizes = sizes
    print(note)
    with scratch_dir() as tmp:
        loop, restore, crash = measure(contenders, sizes, restore_n, repeat, tmp)
    goal_list = goals(loop, restore, crash, restore_n)
    md = markdown(
        contenders,
        loop,
        restore,
        crash,
        goal_list,
        repeat=repeat,
        restore_n=restore_n,
        note=note,
    )
    print()
    print(md)
    results: list[Json] = [
        {
            "workload": "loop",
            "system": key,
            "steps": n,
            "seconds": _stats(s.seconds),
            "bytes": _stats(s.bytes),
            "import_s": _stats(s.extra["import_s"]),
        }
        for (key, n), s in loop.items()
    ]
    results += [
        {"workload": "restore", "system": key, "steps": restore_n}
        | {k: _stats(v) for k, v in s.extra.items()}
        for key, s in restore.items()
    ]
    results += [
        {
            "workload": "crash_resume",
            "system": key,
            "steps": restore_n,
            "crash_at": restore_n // 2,
            "resume_s": _stats(s.seconds),
            "wall_s": _stats(s.extra["wall_s"]),
        }
        for key, s in crash.items()
    ]
    results += [{"workload": "goal"} | g for g in goal_list]
    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={
            "sizes": {s.key: list(s.sizes) for s in contenders},
            "restore_steps": restore_n,
            "systems": {s.key: s.label for s in contenders},
            "note": note,
        },
        results=results,
    )
    path = write_results(NAME, data, out_dir)
    target = path.parent
    (target / f"{NAME}.md").write_text(md)
    print(f"wrote {target / f'{NAME}.md'}")
    plots(contenders, loop, target)
    return data


__all__ = ["System", "goals", "main", "markdown", "measure", "plots", "systems"]
