"""backends (issue 9): the same workloads on PostgreSQL and on SQLite (a file at durability
"normal"), measured by the same harness, repetitions interleaved.

Two parts:

* **One process.** The ``loop`` workload (one step running N times, each appending a
  100-byte item to a context list: :class:`benchmarks.loop.LoopFlow`) and a fan-out/fan-in
  (one step ``send_event``\\ s K items, a step with ``num_workers=4`` handles each, a third
  ``collect_events`` all K). N = 1000, K = 100 (quick: 30 and 10). Per repetition each
  backend runs each workload once on a new store; reported: wall seconds from ``run`` to
  the result (every record written), steps or items per second, and the per-repetition
  ratio of throughputs PostgreSQL/SQLite.
* **Worker processes.** M = 200 (quick: 10) runs of a two-step workflow are submitted
  (``wf.submit``) to a new shared store; then 1, 2, 4 or 8 worker processes
  (``python -m benchmarks.backends worker STORE POLL``, each a :class:`~workflow.Worker`
  with concurrency 4) start, import, open the store and say READY; the clock starts when
  they are all told to go and stops when ``wf.runs()`` (polled here every 20 ms) shows
  every run finished; the workers are then stopped with SIGTERM (quick mode: 1 and 2
  workers only, as each process start costs about a second). Reported: runs/s, the
  speed-up over one worker, PostgreSQL/SQLite, and where the CPU went while the clock ran:
  the workers' own CPU time (``/proc/PID/stat``) and the whole machine's busy time
  (``/proc/stat``: the workers, the PostgreSQL server, this harness and anything else
  running), each as cores kept busy. A worker takes at most ``concurrency`` runs at once
  and looks for work every ``poll_interval`` seconds and whenever one of its runs ends (so
  a backlog does not wait for polls; before that, at the default 0.2 s one worker completed
  at most 4 / 0.2 = 20 runs/s): the workers are measured at the default and at 0.02 s
  (quick mode: 0.02 s only). Below the table, each
  curve's gain per doubling of workers says where it flattens, next to the CPU it found.

In the full mode with the peers venv (``BENCH_PEERS_VENV``), DBOS runs the same loop on a
PostgreSQL system database of its own on the same server, and ours runs it once more at
durability "full": DBOS commits with the server's ``synchronous_commit`` (on by default),
ours at "normal" with it off for its sessions (the last commits may be lost on a server
crash, as SQLite's "normal" may lose them on a power loss), at "full" with it on.

With PostgreSQL, each repetition also runs the loop on a store whose URL says
``reply_spin_us=0`` (the event loop never busy-waits for a commit's reply), beside the
default (it does while that measures faster): both as ratios to SQLite's time.

PostgreSQL is ``BENCH_POSTGRES_URL`` (else ``DW_TEST_POSTGRES``, else the local test
database); each store is a schema of its own, dropped afterwards. ``BENCH_POSTGRES=1``
includes PostgreSQL, ``BENCH_POSTGRES=0`` leaves it out; unset, the full mode includes it
(``bash .ci/postgres-up`` starts the server) and the quick mode, the smoke test of the
default suite, does not, so ``make test`` never needs a server. ``BENCH_WORKERS=0`` leaves
the worker processes out (the one-process part alone takes a few minutes less).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eventstore import Durability, EventStore
from eventstore import _pg_connect as pg_connect
from workflow import Context, Event, StartEvent, StopEvent, Worker, Workflow, step

from . import _peers
from ._common import (
    ROOT,
    Series,
    fmt_rate,
    fmt_ratio,
    print_table,
    ratio_summary,
    report,
    run_child,
    scratch_dir,
    write_results,
)
from ._runs import fmt_s, run_flow
from .loop import LoopFlow

NAME = "backends"
LOOP_N = (1000, 30)  # (full run, quick run)
FAN_K = (100, 10)
RUNS_M = (200, 10)
WORKERS = ((1, 2, 4, 8), (1, 2))  # worker processes (quick: 1 and 2, each start costs ~1 s)
CONCURRENCY = 4  # runs each worker process executes at once
POLLS = ((0.2, 0.02), (0.02,))  # worker poll intervals, s: the default and a short one
WAIT_POLL_S = 0.02  # how often the harness looks at wf.runs()
WAIT_TIMEOUT_S = (600.0, 60.0)  # (full, quick): a stuck worker fails the run, not hangs it
WORKER_HEADERS = ("store", "poll s", "workers", "wall s", "runs/s", "vs 1 worker", "PG/SQLite",
                  "workers' CPU", "PG server CPU", "machine CPU")  # fmt: skip
FLAT_GAIN = 1.2  # a doubling of workers that gains less than this counts as flat
POSTGRES_ENV = "BENCH_POSTGRES"
WORKERS_ENV = "BENCH_WORKERS"  # "0": the one-process part only
POSTGRES_URL = (
    os.environ.get("BENCH_POSTGRES_URL")
    or os.environ.get("DW_TEST_POSTGRES")
    or "postgresql://postgres@127.0.0.1/test"
)
WORKER_CMD = ("-m", "benchmarks.backends", "worker")
ASLEEP = "&reply_spin_us=0"  # the store URL's parameter: never busy-wait for a reply

Backend = Literal["sqlite", "postgres"]
LABEL: dict[Backend, str] = {"sqlite": "SQLite (file, normal)", "postgres": "PostgreSQL"}


# --- the workflows ---------------------------------------------------------------------


class Item(Event):
    """One of the ``k`` items the fan-out sends."""

    i: int
    k: int


class Handled(Event):
    """An item handled; the fan-in waits for ``k`` of them."""

    i: int
    k: int


class FanFlow(Workflow):
    """Fan-out/fan-in: ``run(n=K)`` sends K items, handles them 4 at a time, collects all K.

    Returns K (so :func:`benchmarks._runs.run_flow` checks it like the loop's N).
    """

    @step
    async def scatter(self, ctx: Context, ev: StartEvent) -> Item | None:  # type: ignore[type-arg]
        k = int(ev["n"])
        for i in range(k):
            ctx.send_event(Item(i=i, k=k))
        return None

    @step(num_workers=4)
    async def handle(self, ctx: Context, ev: Item) -> Handled:  # type: ignore[type-arg]
        return Handled(i=ev.i, k=ev.k)

    @step
    async def gather(self, ctx: Context, ev: Handled) -> StopEvent | None:  # type: ignore[type-arg]
        got = ctx.collect_events(ev, [Handled] * ev.k)
        if got is None:
            return None
        return StopEvent(result=len(got))


class Half(Event):
    """The first step's output."""

    n: int


class TwoStep(Workflow):
    """The short run the workers execute: two steps, each writing one context key."""

    @step
    async def first(self, ctx: Context, ev: StartEvent) -> Half:  # type: ignore[type-arg]
        await ctx.store.set("first", ev["n"])
        return Half(n=int(ev["n"]))

    @step
    async def second(self, ctx: Context, ev: Half) -> StopEvent:  # type: ignore[type-arg]
        await ctx.store.set("second", ev.n * 2)
        return StopEvent(result=ev.n * 2)


# --- stores ----------------------------------------------------------------------------


def postgres_wanted(quick: bool) -> bool:
    """Whether to measure PostgreSQL: ``BENCH_POSTGRES`` decides, else the full mode only."""
    flag = os.environ.get(POSTGRES_ENV, "").strip().lower()
    if flag in ("1", "on", "true", "yes"):
        return True
    if flag in ("0", "off", "false", "no"):
        return False
    return not quick


def postgres_info() -> dict[str, str]:
    """The server's version and commit durability settings; raises if it does not answer."""
    import psycopg

    try:
        with psycopg.connect(pg_connect.split(POSTGRES_URL)[0], connect_timeout=5) as conn:
            return {
                name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("server_version", "synchronous_commit", "fsync")
            }
    except psycopg.OperationalError as exc:
        msg = (
            f"PostgreSQL does not answer at {POSTGRES_URL} ({exc}); start it with "
            f"`bash .ci/postgres-up`, or set {POSTGRES_ENV}=0 to measure SQLite only"
        )
        raise RuntimeError(msg) from exc


@contextlib.contextmanager
def new_store(backend: Backend, tmp: Path, query: str = "") -> Iterator[str]:
    """The target of a new, empty store (a file, or a PostgreSQL schema dropped after,
    its URL ending with ``query``: more parameters, such as ``&reply_spin_us=0``)."""
    tag = uuid.uuid4().hex[:12]
    if backend == "sqlite":
        yield str(tmp / f"{NAME}-{tag}.db")
        return
    import psycopg

    schema = f"bench_{tag}"
    base, _, given = POSTGRES_URL.partition("?")
    # What ``query`` sets replaces the URL's own (a store refuses a parameter given twice).
    keys = {"schema"} | {item.partition("=")[0] for item in query.split("&") if item}
    kept = [item for item in given.split("&") if item and item.partition("=")[0] not in keys]
    try:
        yield f"{base}?{'&'.join([*kept, f'schema={schema}'])}{query}"
    finally:
        # The URL as libpq reads it (without the store's own parameters).
        conninfo, _ = pg_connect.split(POSTGRES_URL)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --- part 1: one process ---------------------------------------------------------------


def time_flow_cpu(
    cls: type[Workflow],
    n: int,
    backend: Backend,
    tmp: Path,
    durability: Durability = "normal",
    query: str = "",
) -> tuple[float, float]:
    """Wall seconds of one run of ``cls`` with ``n=n`` on a new store of ``backend``, and
    this process's CPU seconds meanwhile (every thread's; not the PostgreSQL server's):
    on a shared machine the CPU says what the wall time cannot."""
    with new_store(backend, tmp, query) as target:
        wf = cls(store=EventStore(target, durability=durability), timeout=None)
        try:
            cpu = time.process_time()
            seconds, _ = run_flow(wf, n)
            cpu = time.process_time() - cpu
        finally:
            wf.store.close()
    return seconds, cpu


def time_dbos_postgres(n: int, python: Path) -> float:
    """Seconds DBOS takes for the loop on a fresh PostgreSQL system database (peers venv)."""
    import psycopg

    name = f"bench_dbos_{uuid.uuid4().hex[:12]}"
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        out = run_child([_peers.script("dbos_loop.py"), "run", str(n), url], python=python)
        return float(out["seconds"])
    finally:
        with psycopg.connect(pg_connect.split(POSTGRES_URL)[0], autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- part 2: worker processes ----------------------------------------------------------


def start_workers(target: str, count: int, poll: float) -> list[subprocess.Popen[str]]:
    """Starts ``count`` worker processes on ``target`` and waits until each is READY."""
    procs = [
        subprocess.Popen(
            [sys.executable, *WORKER_CMD, target, str(poll)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "READY":
                msg = f"a worker process said {line!r} instead of READY (exit {p.poll()})"
                raise RuntimeError(msg)
    except BaseException:
        stop_workers(procs)
        raise
    return procs


def stop_workers(procs: list[subprocess.Popen[str]]) -> list[int | None]:
    """SIGTERMs the workers, waits for them; returns how many runs each saw end."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    completed: list[int | None] = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        completed.append(json.loads(lines[-1])["completed"] if lines else None)
    return completed


def wait_finished(wf: Workflow, count: int, timeout: float) -> None:
    """Polls ``wf.runs()`` until ``count`` runs have finished; raises on a failed run or
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = [r.status for r in wf.runs()]
        if "failed" in statuses:
            msg = f"a run failed: {sorted(set(statuses))}"
            raise RuntimeError(msg)
        if statuses.count("finished") >= count:
            return
        if time.monotonic() > deadline:
            msg = f"runs not finished in {timeout} s: {dict(Counter(statuses))}"
            raise RuntimeError(msg)
        time.sleep(WAIT_POLL_S)


_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far, from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


def server_cpu() -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL server process on this machine (by pid)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            if "(postgres)" in text.split(" ", 2)[1]:
                out[int(stat.parent.name)] = process_cpu_s(int(stat.parent.name))
    return out


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has been busy so far (``/proc/stat``)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) * _TICK_S  # user..steal (guest time is inside user)


@dataclass(frozen=True)
class WorkersRun:
    """One measurement of the worker processes: its wall time and where the CPU went."""

    seconds: float
    completed: list[int | None]
    workers_cpu_s: float  # the worker processes, while the clock ran
    server_cpu_s: float  # PostgreSQL's processes on this machine (any client's), meanwhile
    machine_cpu_s: float  # every process on the machine, while the clock ran


def time_workers(
    backend: Backend, workers: int, runs: int, poll: float, tmp: Path, timeout: float
) -> WorkersRun:
    """How long ``workers`` processes take to finish ``runs`` submitted runs, each worker's
    count of runs completed, and the CPU the workers and the machine used meanwhile."""
    with new_store(backend, tmp) as target:
        wf = TwoStep(store=target, timeout=None)
        try:
            for i in range(runs):
                wf.submit(n=i)
            procs = start_workers(target, workers, poll)
            try:
                cpu0 = sum(process_cpu_s(p.pid) for p in procs)
                server0 = server_cpu()
                busy0 = machine_busy_s()
                start = time.perf_counter()
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write("go\n")
                    p.stdin.flush()
                wait_finished(wf, runs, timeout)
                seconds = time.perf_counter() - start
                busy = machine_busy_s() - busy0
                server = sum(v - server0.get(pid, 0.0) for pid, v in server_cpu().items())
                cpu = sum(process_cpu_s(p.pid) for p in procs) - cpu0
            finally:
                completed = stop_workers(procs)
        finally:
            wf.store.close()
    return WorkersRun(seconds, completed, cpu, server, busy)


def worker_main(target: str, poll: float) -> None:
    """A worker process: opens the store, says READY, waits for a line, works until SIGTERM,
    then prints ``{"completed": N}``."""
    wf = TwoStep(store=target, timeout=None)
    worker = Worker(wf, concurrency=CONCURRENCY, poll_interval=poll)
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        completed = asyncio.run(worker.run(handle_signals=True))
    finally:
        wf.store.close()
    print(json.dumps({"completed": completed}), flush=True)


# --- the benchmark ---------------------------------------------------------------------


def scaling_notes(
    backends: list[Backend],
    polls: tuple[float, ...],
    counts: tuple[int, ...],
    rates: dict[tuple[Backend, float, int], Series],
    wcores: dict[tuple[Backend, float, int], Series],
    scores: dict[tuple[Backend, float, int], Series],
    mcores: dict[tuple[Backend, float, int], Series],
    cores: int,
) -> list[str]:
    """Where each workers curve flattens, and the CPU it met there, in words."""
    lines = ["", "where the worker curves flatten:"]
    for b in backends:
        for p in polls:
            gains = [
                (c0, c1, rates[b, p, c1].median / rates[b, p, c0].median)
                for c0, c1 in itertools.pairwise(counts)
            ]
            steps = ", ".join(f"{c0}->{c1} x{g:.2f}" for c0, c1, g in gains)
            flat = next((c0 for c0, _, g in gains if g < FLAT_GAIN), None)
            if flat is None:
                verdict = f"still growing at {counts[-1]} workers"
            else:
                server = f", PostgreSQL {scores[b, p, flat].median:.1f}" if b == "postgres" else ""
                verdict = (
                    f"flat from {flat} worker(s) on (next doubling gains < x{FLAT_GAIN}), where"
                    f" the machine was {mcores[b, p, flat].median:.1f} of {cores} cores busy"
                    f" (the workers {wcores[b, p, flat].median:.1f}{server})"
                )
            lines.append(f"- {LABEL[b]}, poll {p} s: {steps}; {verdict}")
    why = (
        "Each worker is one Python process: the engine's work for its runs (fold, codec,"
        " commits) runs on one core at most, so runs/s can grow only while the workers, the"
        f" PostgreSQL server and the rest of the machine leave some of its {cores} cores"
        " idle (the machine's CPU counts every process on it, other users' too). Past that,"
        " more workers share the same cores and each adds its own polling (every poll it"
        " lists the runs: on PostgreSQL one query for the runs, one for the live leases,"
        " and a fold, a few round trips, for each run that changed since), so the curve"
        " flattens or falls. On PostgreSQL every write transaction (commits, leases taken"
        " or renewed, claims) is one call of the store's write function: the seq row is"
        " held for that call only, never across a round trip, so a worker descheduled or"
        " cut off mid-write holds no one up; the server's CPU per call is what the writes"
        " of all workers share."
        " A worker looks for its next run as soon as one of its runs ends, so with a backlog"
        " the poll interval matters little: one worker can keep a core busy by itself."
    )
    lines += textwrap.wrap(why, width=92)
    return lines


def _ratio_cell(ours: Series | None, base: Series | None) -> tuple[str, dict[str, float] | None]:
    if ours is None or base is None:
        return "—", None
    r = ratio_summary(ours, base)
    return fmt_ratio(r), r


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Measures both parts on each backend, prints the tables, writes ``backends.json``."""
    q = 1 if quick else 0
    n, k, m, polls, counts = LOOP_N[q], FAN_K[q], RUNS_M[q], POLLS[q], WORKERS[q]
    backends: list[Backend] = ["sqlite"]
    pg_info: dict[str, str] | None = None
    if postgres_wanted(quick):
        pg_info = postgres_info()
        backends.append("postgres")
    flows: dict[str, tuple[type[Workflow], int, str]] = {
        "loop": (LoopFlow, n, "steps/s"),
        "fan-out/fan-in": (FanFlow, k, "items/s"),
    }
    rates: dict[tuple[str, Backend], Series] = {}
    secs: dict[tuple[str, Backend], Series] = {}
    for w, (_, _, unit) in flows.items():
        for b in backends:
            rates[w, b] = Series(f"{w} {b}", unit)
            secs[w, b] = Series(f"{w} {b}", "s")
    cpus = {key: Series(f"{key[0]} {key[1]} CPU", "s") for key in secs}
    if os.environ.get(WORKERS_ENV, "").strip() == "0":
        counts = ()  # only the one-process part
    cells = [(b, p, c) for b in backends for p in polls for c in counts]
    wrates = {key: Series(f"workers {key}", "runs/s") for key in cells}
    wsecs = {key: Series(f"workers {key}", "s") for key in cells}
    wcores = {key: Series(f"workers {key}", "cores") for key in cells}
    scores = {key: Series(f"server {key}", "cores") for key in cells}
    mcores = {key: Series(f"machine {key}", "cores") for key in cells}
    completed: dict[tuple[Backend, float, int], list[list[int | None]]] = {c: [] for c in cells}

    # DBOS on PostgreSQL is the natural peer of ours on PostgreSQL (full mode, peers venv).
    peers_python = _peers.ensure(install=False) if "postgres" in backends and not quick else None
    dbos_secs = Series("DBOS loop postgres", "s")
    # DBOS commits each step with the server's synchronous_commit (on by default): ours at
    # durability "full" (on, too) beside ours at "normal" (off: the last commits may be lost
    # on a server crash, as SQLite's normal may lose them on a power loss).
    full_secs = Series("loop postgres durability full", "s")
    # The loop on PostgreSQL with the event loop never busy-waiting for a reply.
    asleep_secs = Series("loop postgres reply_spin_us=0", "s")
    with scratch_dir() as tmp:
        for _ in range(repeat):
            for w, (cls, size, _) in flows.items():
                for b in backends:
                    s, c = time_flow_cpu(cls, size, b, tmp)
                    secs[w, b].add(s)
                    rates[w, b].add(size / s)
                    cpus[w, b].add(c)
            if "postgres" in backends:
                asleep_secs.add(time_flow_cpu(LoopFlow, n, "postgres", tmp, query=ASLEEP)[0])
            if peers_python is not None:
                dbos_secs.add(time_dbos_postgres(n, peers_python))
                full_secs.add(time_flow_cpu(LoopFlow, n, "postgres", tmp, durability="full")[0])
            for p in polls:
                for c in counts:
                    for b in backends:
                        got = time_workers(b, c, m, p, tmp, WAIT_TIMEOUT_S[q])
                        wsecs[b, p, c].add(got.seconds)
                        wrates[b, p, c].add(m / got.seconds)
                        wcores[b, p, c].add(got.workers_cpu_s / got.seconds)
                        scores[b, p, c].add(got.server_cpu_s / got.seconds)
                        mcores[b, p, c].add(got.machine_cpu_s / got.seconds)
                        completed[b, p, c].append(got.completed)

    results: list[dict[str, Any]] = []
    rows = []
    for w, (_, size, unit) in flows.items():
        pg = rates.get((w, "postgres"))
        text, ratio = _ratio_cell(pg, rates[w, "sqlite"])
        row: list[Any] = [w, size]
        for b in ("sqlite", "postgres"):
            have = b in backends
            row += [
                secs[w, b].cell(fmt_s) if have else "—",
                rates[w, b].cell(fmt_rate) if have else "—",
            ]
            if have:
                results.append(
                    {
                        "part": "single-process",
                        "workload": w,
                        "size": size,
                        "backend": b,
                        "unit": unit,
                        "seconds": secs[w, b].summary(),
                        "rate": rates[w, b].summary(),
                        "cpu_seconds": cpus[w, b].summary(),
                        "postgres_over_sqlite": ratio if b == "postgres" else None,
                    }
                )
        rows.append([*row, text])
    print_table(
        f"one process, PostgreSQL vs SQLite; median (min-max) of {repeat}",
        rows,
        ["workload", "N/K", "SQLite s", "SQLite rate/s", "PG s", "PG rate/s", "PG/SQLite rate"],
    )
    print_table(
        f"this process's CPU seconds in the same runs (not the server's); median (min-max)"
        f" of {repeat}",
        [
            [w, size, *(cpus[w, b].cell(fmt_s) if b in backends else "—" for b in LABEL),
             fmt_ratio(ratio_summary(cpus[w, "postgres"], cpus[w, "sqlite"]))
             if "postgres" in backends else "—"]
            for w, (_, size, _) in flows.items()
        ],
        ["workload", "N/K", "SQLite CPU s", "PG CPU s", "PG/SQLite CPU"],
    )  # fmt: skip

    if "postgres" in backends:
        print_table(
            f"loop N={n} on PostgreSQL: the event loop busy-waiting for replies while that"
            f" measures faster (the default, unless the URL says otherwise) or never"
            f" ({ASLEEP[1:]}); median (min-max) of"
            f" {repeat}, taking turns",
            [
                ["as the URL says", secs["loop", "postgres"].cell(fmt_s),
                 fmt_ratio(ratio_summary(secs["loop", "postgres"], secs["loop", "sqlite"]))],
                [ASLEEP[1:], asleep_secs.cell(fmt_s),
                 fmt_ratio(ratio_summary(asleep_secs, secs["loop", "sqlite"]))],
            ],
            ["PostgreSQL", "s", "PG time / SQLite time"],
        )  # fmt: skip
        results.append(
            {
                "part": "reply-wait",
                "workload": "loop",
                "size": n,
                "default_seconds": secs["loop", "postgres"].summary(),
                "asleep_seconds": asleep_secs.summary(),
                "sqlite_seconds": secs["loop", "sqlite"].summary(),
            }
        )

    if peers_python is not None:
        ratio = ratio_summary(dbos_secs, secs["loop", "postgres"])
        ratio_full = ratio_summary(dbos_secs, full_secs)
        print_table(
            f"loop N={n} on PostgreSQL, ours vs DBOS (its PostgreSQL system database, the"
            f" server's synchronous_commit, {(pg_info or {}).get('synchronous_commit')});"
            f" median (min-max) of {repeat}",
            [
                ["normal (synchronous_commit off)", secs["loop", "postgres"].cell(fmt_s),
                 dbos_secs.cell(fmt_s), fmt_ratio(ratio)],
                ["full (synchronous_commit on)", full_secs.cell(fmt_s), dbos_secs.cell(fmt_s),
                 fmt_ratio(ratio_full)],
            ],
            ["ours at durability", "ours s", "DBOS s", "DBOS time / ours"],
        )  # fmt: skip
        results.append(
            {
                "part": "dbos-postgres",
                "workload": "loop",
                "size": n,
                "ours_seconds": secs["loop", "postgres"].summary(),
                "ours_full_seconds": full_secs.summary(),
                "dbos_seconds": dbos_secs.summary(),
                "dbos_over_ours": ratio,
                "dbos_over_ours_full": ratio_full,
            }
        )

    rows = []
    for b, p, c in cells:
        speedup = ratio_summary(wrates[b, p, c], wrates[b, p, 1])
        pg_text, pg_ratio = ("—", None)
        if b == "postgres":
            pg_text, pg_ratio = _ratio_cell(wrates[b, p, c], wrates["sqlite", p, c])
        rows.append(
            [
                LABEL[b],
                p,
                c,
                wsecs[b, p, c].cell(fmt_s),
                wrates[b, p, c].cell(fmt_rate),
                fmt_ratio(speedup),
                pg_text,
                f"{wcores[b, p, c].median:.2f}",
                f"{scores[b, p, c].median:.2f}" if b == "postgres" else "—",
                f"{mcores[b, p, c].median:.2f}",
            ]
        )
        results.append(
            {
                "part": "workers",
                "workload": "two-step runs",
                "backend": b,
                "poll_interval_s": p,
                "workers": c,
                "concurrency": CONCURRENCY,
                "runs": m,
                "seconds": wsecs[b, p, c].summary(),
                "rate": wrates[b, p, c].summary(),
                "speedup_over_1_worker": speedup,
                "postgres_over_sqlite": pg_ratio,
                "completed_per_worker": completed[b, p, c],
                "workers_cores_busy": wcores[b, p, c].summary(),
                "postgres_server_cores_busy": scores[b, p, c].summary()
                if b == "postgres"
                else None,
                "machine_cores_busy": mcores[b, p, c].summary(),
            }
        )
    cores = os.cpu_count() or 1
    if counts:
        print_table(
            f"{m} two-step runs by worker processes (concurrency {CONCURRENCY} each), "
            f"go to all finished; median (min-max) of {repeat}; CPU as cores kept busy "
            f"(medians) of the machine's {cores}",
            rows,
            WORKER_HEADERS,
        )
        for line in scaling_notes(backends, polls, counts, wrates, wcores, scores, mcores, cores):
            print(line)

    data = report(
        NAME,
        quick=quick,
        repeat=repeat,
        params={
            "loop_n": n,
            "fan_k": k,
            "runs_m": m,
            "workers": list(counts),
            "concurrency": CONCURRENCY,
            "poll_intervals_s": list(polls),
            "backends": list(backends),
            "postgres": pg_info,
        },
        results=results,
    )
    write_results(NAME, data, out_dir)
    return data


def _entry(argv: list[str]) -> None:
    """``python -m benchmarks.backends worker STORE [POLL]``: one worker process.

    Runs as ``__main__``, so it calls the importable module's :func:`worker_main`: the
    runs' logs name the classes of ``benchmarks.backends``, not of ``__main__``.
    """
    if len(argv) not in (2, 3) or argv[0] != "worker":
        sys.exit("usage: python -m benchmarks.backends worker STORE [POLL]")
    module = importlib.import_module("benchmarks.backends")
    run: Callable[[str, float], None] = module.worker_main
    run(argv[1], float(argv[2]) if len(argv) == 3 else POLLS[0][0])


if __name__ == "__main__":
    _entry(sys.argv[1:])
