"""Reliability under faults: SIGKILL loops, several processes on one store, a full disk, readers.

Every test drives real subprocesses (``tests/support/reliability_worker.py``) against a real
store, an SQLite file or a PostgreSQL schema (the ``location`` fixture: a full disk is
SQLite's alone), and then checks it as a user would: the result of an uninterrupted run,
context effects and emitted events exactly once, every acknowledged commit present, and
SQLite's own integrity check. On PostgreSQL the workers lease their runs for
:data:`LEASE_TTL_S` (``Workflow(lease_ttl=...)``): a killed worker's runs are resumed once
its leases lapse, as another host would take them over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

import eventstore._sqlite as _sqlite
from eventstore import Commit, EventStore, NewRun, Record, WriterFailedError
from tests.support.reliability_worker import Bulky, Counter, Flaky, effects_file, read_effects
from workflow import RunOwnedError, RunState, WorkflowCancelledError

ROOT = Path(__file__).resolve().parent.parent
ITEMS = 60  # inputs per Counter run in the crash loops
MAX_KILL_DELAY_S = 0.3  # a kill lands this long at most after the worker's START line
# On PostgreSQL: how long a worker's leases last, so how long a resume waits for a killed one's.
LEASE_TTL_S = 1.0

Store = str | Path  # an SQLite file, or a PostgreSQL URL


def is_postgres(db: Store) -> bool:
    return str(db).startswith("postgresql://")


# ---------------------------------------------------------------------------- helpers


@pytest.fixture
def db(location: str) -> Iterator[str]:
    """A new store (an SQLite file or a PostgreSQL schema); its effects file goes with it."""
    yield location
    effects_file(location).unlink(missing_ok=True)


def spawn(*args: str | Path) -> subprocess.Popen[bytes]:
    """Starts ``python -m tests.support.reliability_worker ARGS`` with pipes for its output.

    The pipes are unbuffered: :func:`wait_line` must not read ahead of the line it wants,
    or :func:`finish` (``communicate``, which reads the raw pipe) would miss those lines.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.reliability_worker", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DW_TEST_LEASE_TTL": str(LEASE_TTL_S)},
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, list[str], str]:
    """Waits for the process; returns its status, its whole output lines and its stderr."""
    out, err = proc.communicate(timeout=timeout)
    # A line cut by SIGKILL (no newline) is not a fact the worker finished saying.
    text = out.decode()
    lines = [ln[:-1] for ln in text.splitlines(keepends=True) if ln.endswith("\n")]
    return proc.returncode, lines, err.decode(errors="replace")


def run_worker(*args: str | Path, timeout: float = 60) -> tuple[int, list[str], str]:
    """Runs the worker to its end."""
    return finish(spawn(*args), timeout)


def wait_line(proc: subprocess.Popen[bytes], prefix: str) -> str:
    """Reads the worker's next line (and nothing after it), which must start with ``prefix``."""
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith(prefix):
        proc.kill()
        _, _, err = finish(proc)
        pytest.fail(f"expected {prefix!r} from the worker, got {line!r}; stderr:\n{err}")
    return line


def wait_start(proc: subprocess.Popen[bytes]) -> list[str]:
    """Reads the worker's lines up to its ``START`` (which comes last in the list).

    A run's ``ACK`` lines may come first: on PostgreSQL the worker starts its first run and
    then waits for a killed worker's lease on the second to lapse, while the first commits.
    """
    assert proc.stdout is not None
    lines: list[str] = []
    while True:
        line = proc.stdout.readline().decode()
        if not line.startswith(("START", "ACK")):
            proc.kill()
            _, _, err = finish(proc)
            pytest.fail(f"expected 'START' or 'ACK' from the worker, got {line!r}; stderr:\n{err}")
        lines.append(line.rstrip("\n"))
        if line.startswith("START"):
            return lines


def integrity(db: Store) -> list[tuple[Any, ...]]:
    """SQLite's own check of the whole file (a PostgreSQL server checks its own pages: the
    store's checks there are the log's, :func:`check_gap_free` and the runs')."""
    if is_postgres(db):
        return [("ok",)]
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()


def uninterrupted_result(items: int) -> Any:
    """What a Counter run of ``items`` inputs returns when nothing interrupts it."""

    async def go() -> Any:
        return await Counter(store=None, timeout=None).run(items=items)

    return asyncio.run(go())


def payloads(store: EventStore, run_id: str, kind: str, step: str) -> list[dict[str, Any]]:
    """The payloads of a run's records of one kind and step, parsed."""
    return [orjson.loads(r.payload) for r in store.records(run_id, kinds=[kind]) if r.step == step]


def check_exactly_once(
    wf: Counter, store: EventStore, run_id: str, items: int, *, sample: int = 12
) -> RunState:
    """Checks a finished Counter run: every context effect and emitted event exactly once.

    Also checks atomicity at ``sample`` checkpoints (seeded by the run id): an input's
    counter and its entry in ``seen`` appear in the same commit, and never twice.
    """
    state = wf.state_at(run_id)
    assert state.status == "finished"
    ctx = state.context
    assert ctx["n"] == items
    assert {k: v for k, v in ctx.items() if k.startswith("count-")} == {
        f"count-{i}": 1 for i in range(items)
    }
    assert sorted(ctx["seen"]) == list(range(items))
    # Emitted events: each input's Item and Done were enqueued once.
    items_in = Tally(p["event"]["v"]["i"] for p in payloads(store, run_id, "enqueued", "work"))
    dones = Tally(p["event"]["v"]["i"] for p in payloads(store, run_id, "enqueued", "join"))
    assert items_in == dones == Tally(range(items))
    cps = wf.checkpoints(run_id)
    for cp in random.Random(run_id).sample(cps, min(sample, len(cps))):
        at = wf.state_at(run_id, cp.seq).context
        counted = {int(k[6:]) for k, v in at.items() if k.startswith("count-") and v == 1}
        assert len(counted) == sum(1 for k in at if k.startswith("count-"))
        seen = at.get("seen", [])
        assert len(seen) == len(set(seen))
        assert set(seen) == counted
    return state


def check_acks(store: EventStore, acks: set[tuple[str, int]]) -> None:
    """Every commit a process acknowledged is in the log, whole, with its seq."""
    by_run: dict[str, set[int]] = {}
    for run_id, seq in acks:
        by_run.setdefault(run_id, set()).add(seq)
    for run_id, seqs in by_run.items():
        ends = {r.commit_seq for r in store.records(run_id)}
        assert seqs <= ends, f"acknowledged commits missing from {run_id}: {sorted(seqs - ends)}"


def check_gap_free(db: Store) -> None:
    """The log's seqs are 1..n without a gap, and every commit ends on a record of its own."""
    with EventStore(db, readonly=True) as store:
        [(count, low, high)] = store.query("SELECT count(*), min(seq), max(seq) FROM log")
        [(torn,)] = store.query(
            "SELECT count(*) FROM (SELECT DISTINCT commit_seq FROM log) AS c"
            " WHERE commit_seq NOT IN (SELECT seq FROM log)"
        )
    assert (count, low, high) == (high, 1, high)
    assert torn == 0


def acks_in(lines: list[str]) -> set[tuple[str, int]]:
    return {(p[1], int(p[2])) for p in (ln.split() for ln in lines) if p[0] == "ACK"}


def wait_lease_lapsed(db: Store, run_id: str) -> None:
    """Waits until the lease of a killed worker on ``run_id`` lapsed (within its length)."""
    deadline = time.monotonic() + 3 * LEASE_TTL_S
    with EventStore(db, readonly=True) as store:
        while (lease := store.lease_of(run_id)) is not None and lease[1] > time.time_ns() // 1000:
            assert time.monotonic() < deadline, lease
            time.sleep(LEASE_TTL_S / 20)


def results_in(lines: list[str]) -> dict[str, Any]:
    return {p[1]: json.loads(p[2]) for p in (ln.split(" ", 2) for ln in lines) if p[0] == "RESULT"}


# ---------------------------------------------------------------------------- crash loop


@dataclass
class CrashLoop:
    """What a crash loop did: kills, worker processes, runs and their results."""

    kills: int = 0
    processes: int = 0
    results: dict[str, Any] = field(default_factory=dict)
    acks: set[tuple[str, int]] = field(default_factory=set)
    seconds: float = 0.0


def crash_loop(db: Store, *, kills: int, seed: int, items: int = ITEMS) -> CrashLoop:
    """Runs pairs of Counter runs, SIGKILLing the worker at seeded random moments.

    Each worker resumes what the last one left (``run(run_id=...)``); a pair of runs is
    done when a worker finishes it. New pairs start until ``kills`` kills happened; the
    last pair then runs to its end without being killed.
    """
    rng = random.Random(seed)
    loop = CrashLoop()
    started = time.monotonic()
    pair = 0
    while loop.kills < kills:
        run_ids = [f"p{pair}-a", f"p{pair}-b"]
        while True:
            proc = spawn("counter", db, str(items), *run_ids)
            loop.processes += 1
            first = wait_start(proc)
            if loop.kills < kills:
                time.sleep(rng.uniform(0, MAX_KILL_DELAY_S))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            code, lines, err = finish(proc)
            lines[:0] = first
            loop.acks |= acks_in(lines)
            if code == -signal.SIGKILL:
                loop.kills += 1
                continue
            assert code == 0, f"worker failed ({code}):\n{lines[-5:]}\n{err}"
            assert "database is locked" not in err
            loop.results.update(results_in(lines))
            break
        pair += 1
    loop.seconds = time.monotonic() - started
    return loop


def check_crash_loop(db: Store, loop: CrashLoop, items: int = ITEMS) -> None:
    """Every run of the loop ended as an uninterrupted run would, with effects exactly once."""
    expected = uninterrupted_result(items)
    assert loop.results
    assert all(res == expected for res in loop.results.values()), loop.results
    assert integrity(db) == [("ok",)]
    check_gap_free(db)
    with EventStore(db, readonly=True) as store:
        wf = Counter(store=store)
        assert {r.run_id for r in store.runs()} == set(loop.results)
        for run_id in loop.results:
            check_exactly_once(wf, store, run_id, items)
        check_acks(store, loop.acks)
    # External side effects are at-least-once: every input's step ran, some more than once.
    effects = Tally(read_effects(db))
    for run_id in loop.results:
        assert all(effects[f"work {run_id} {i}"] >= 1 for i in range(items))


@pytest.mark.long  # a dozen processes killed and started again: make test-long
def test_crash_loop_quick(db: str) -> None:
    """Ten SIGKILLs at random moments: each run still ends as if never interrupted."""
    loop = crash_loop(db, kills=10, seed=1)
    assert loop.kills == 10
    check_crash_loop(db, loop)


@pytest.mark.slow
def test_crash_loop_two_hundred_kills(db: str) -> None:
    """Two hundred SIGKILLs at random moments: every run still ends as if never interrupted."""
    loop = crash_loop(db, kills=200, seed=7)
    assert loop.kills == 200
    check_crash_loop(db, loop)


# ---------------------------------------------------------------------------- concurrency


def test_four_processes_share_one_store(db: str) -> None:
    """Four processes running different runs on one store all finish; no lock error surfaces."""
    EventStore(db).close()
    procs = [spawn("counter", db, "40", f"proc{k}-a", f"proc{k}-b") for k in range(4)]
    outcomes = [finish(p, timeout=120) for p in procs]
    expected = uninterrupted_result(40)
    acks: set[tuple[str, int]] = set()
    for code, lines, err in outcomes:
        assert code == 0, f"{lines[-3:]}\n{err}"
        assert "locked" not in err
        assert "locked" not in "\n".join(lines)
        assert all(v == expected for v in results_in(lines).values())
        acks |= acks_in(lines)
    assert integrity(db) == [("ok",)]
    check_gap_free(db)
    with EventStore(db, readonly=True) as store:
        wf = Counter(store=store)
        assert len(store.runs()) == 8
        for info in store.runs():
            check_exactly_once(wf, store, info.run_id, 40)
        check_acks(store, acks)


@pytest.mark.long  # many processes at once: make test-long (CI runs it)
def test_processes_creating_one_store_at_once(tmp_path: Path) -> None:
    """Processes that open the same new store file at the same instant all succeed."""
    code, lines, err = run_worker("create-race", tmp_path, "16", "4")
    assert code == 0, err
    outcomes = [ln for ln in lines if ln.startswith("CREATED")]
    assert len(outcomes) == 64
    assert [ln for ln in outcomes if ln != "CREATED OK"] == []


def test_two_processes_racing_to_resume_one_run(db: str, tmp_path: Path) -> None:
    """Two processes resume one interrupted run at the same instant: exactly one runs it."""
    first = spawn("slow", db, "contested")
    wait_line(first, "START")
    deadline = time.monotonic() + 10
    # The step has begun once its effect line is written (the file exists a moment before).
    while not read_effects(db):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    assert finish(first)[0] == -signal.SIGKILL
    if is_postgres(db):
        wait_lease_lapsed(db, "contested")

    go = tmp_path / "go"
    racers = [spawn("race", db, "contested", go) for _ in range(2)]
    for proc in racers:
        wait_line(proc, "READY")
    go.touch()
    outcomes = [finish(p) for p in racers]
    assert [code for code, _, _ in outcomes] == [0, 0], [err for _, _, err in outcomes]
    said = sorted(lines[-1].split()[0] for _, lines, _ in outcomes)
    assert said == ["OWNED", "RESULT"], outcomes
    owned = next(lines[-1] for _, lines, _ in outcomes if lines[-1].startswith("OWNED"))
    held = "executor (its lease is held by" if is_postgres(db) else "live executor (another process"
    assert f"'contested' is owned by another {held}" in owned
    # The step ran once in the first process and once more in the winner only.
    assert len(read_effects(db)) == 2
    with EventStore(db, readonly=True) as store:
        kinds = [r.kind for r in store.records("contested")]
    assert kinds.count("run_resumed") == 1
    assert kinds[-1] == "run_finished"


def test_a_polling_reader_never_makes_a_resume_fail(db: str) -> None:
    """A process polling a run's latest state never makes a resume elsewhere fail as owned."""

    async def first() -> None:
        with pytest.raises(RuntimeError, match="flaky"):
            await Flaky(store=db).run(run_id="polled")

    asyncio.run(first())
    poller = spawn("poll", db, "polled", "5")
    wait_line(poller, "POLLING")

    async def resumes() -> list[str]:
        wf = Flaky(store=db)
        refused = []
        for _ in range(300):
            try:
                handler = wf.resume("polled")
            except RunOwnedError as exc:
                refused.append(str(exc))
                continue
            with pytest.raises(RuntimeError, match="flaky"):
                await handler
        return refused

    try:
        refused = asyncio.run(resumes())
    finally:
        poller.kill()
        finish(poller)
    assert refused == []


async def test_cancel_right_after_resume_is_recorded(db: str) -> None:
    """Cancelling a run at once after resuming it records the cancellation."""
    wf = Flaky(store=db)
    with pytest.raises(RuntimeError, match="flaky"):
        await wf.run(run_id="c")
    handler = wf.resume("c")
    await handler.cancel_run()
    with pytest.raises(WorkflowCancelledError):
        await handler
    assert wf.state_at("c").status == "cancelled"


# ---------------------------------------------------------------------------- disk full


def test_disk_full_keeps_the_store_whole_and_the_run_resumable(tmp_path: Path) -> None:
    """A write that fills the disk stops the run; the log stays whole; a resume finishes it."""
    db = tmp_path / "full.db"
    EventStore(db).close()
    code, lines, err = run_worker("diskfull", db, "60", "bulky", "bulky", "1.5")
    # The error reaches the caller (ERROR), or only the log (HUNG: see the xfail below).
    assert lines[-1].split()[0] in ("ERROR", "HUNG"), lines[-3:]
    assert "database or disk is full" in "\n".join(lines) + err
    acks = acks_in(lines)
    assert acks
    assert integrity(db) == [("ok",)]
    check_gap_free(db)
    with EventStore(db, readonly=True) as store:
        check_acks(store, acks)
        wf = Bulky(store=store)
        for _, seq in sorted(acks):
            assert wf.state_at("bulky", seq).seq == seq
        stopped = wf.state_at("bulky")
        assert stopped.status in ("interrupted", "failed")
        blobs = [k for k in stopped.context if k.startswith("blob-")]
        assert 0 < len(blobs) < 40

    # Space is freed (no page limit): a fresh process resumes the run to its end.
    code, lines, err = run_worker("diskfull", db, "0", "bulky", "bulky", "30")
    assert code == 0, f"{lines[-3:]}\n{err}"
    assert lines[-1] == 'RESULT bulky {"n": 40, "sum": 20540}'
    assert integrity(db) == [("ok",)]
    with EventStore(db, readonly=True) as store:
        state = Bulky(store=store).state_at("bulky")
        assert state.status == "finished"
        assert {k: v for k, v in state.context.items() if k.startswith("blob-")} == {
            f"blob-{i}": f"{i:08d}" * 1000 for i in range(40)
        }
        dones = Tally(p["event"]["v"]["i"] for p in payloads(store, "bulky", "enqueued", "join"))
        assert dones == Tally(range(40))


def test_disk_full_reaches_the_caller_as_a_clear_error(tmp_path: Path) -> None:
    """When the one commit in flight fills the disk, awaiting the run raises WriterFailedError."""
    db = tmp_path / "blob.db"
    EventStore(db).close()
    code, lines, _ = run_worker("diskfull", db, "40", "blob", "blob", "1.5")
    assert lines[-1].startswith("ERROR blob WriterFailedError: "), lines[-3:]
    assert "database or disk is full" in lines[-1]
    assert code == 1


async def test_fresh_workflow_after_disk_full_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a disk-full failure, a new Workflow on the same path works once space is free."""
    db = tmp_path / "again.db"
    original = _sqlite.connect

    def limited(target: str, **kw: Any) -> sqlite3.Connection:
        conn = original(target, **kw)
        if not kw["readonly"]:
            conn.execute("PRAGMA max_page_count = 30")
        return conn

    monkeypatch.setattr(_sqlite, "connect", limited)
    wf = Bulky(store=db, timeout=None)
    big = Record("run_started", None, orjson.dumps({"blob": "x" * 300_000}).decode())
    with pytest.raises(WriterFailedError, match="database or disk is full"):
        wf.store.append_sync(Commit("filler", [big], create=NewRun()))
    monkeypatch.setattr(_sqlite, "connect", original)  # space is free again
    assert integrity(db) == [("ok",)]
    fresh = Bulky(store=db, timeout=None)
    result = await asyncio.wait_for(fresh.run(items=3), 10)
    assert result == {"n": 3, "sum": 5}


# ---------------------------------------------------------------------------- live readers


def _without_status(state: RunState) -> RunState:
    return dataclasses.replace(state, status="running")


def test_reader_of_a_live_run_sees_consistent_states(db: str) -> None:
    """A read-only reader in another process sees, at every seq, the final log's state there."""
    EventStore(db).close()
    writer = spawn("counter", db, "40", "live-a", "live-b")
    wait_start(writer)
    rng = random.Random(3)
    seen: dict[tuple[str, int], RunState] = {}
    reads = 0
    with EventStore(db, readonly=True) as store:
        wf = Counter(store=store)
        while writer.poll() is None or reads == 0:
            for run_id in ("live-a", "live-b"):
                info = store.get_run(run_id)
                if info is None or info.first_seq is None or info.last_seq is None:
                    continue
                for seq in {info.last_seq, rng.randint(info.first_seq, info.last_seq)}:
                    state = wf.state_at(run_id, seq)
                    # The same invariant as the crash loop, on live state.
                    counted = {k for k, v in state.context.items() if k.startswith("count-")}
                    assert len(counted) == len(set(state.context.get("seen", [])))
                    seen[(run_id, seq)] = state
                    reads += 1
    code, _, err = finish(writer)
    assert code == 0, err
    assert reads > 20
    with EventStore(db, readonly=True) as store:
        final = Counter(store=store)
        for (run_id, seq), state in seen.items():
            later = final.state_at(run_id, seq)
            assert _without_status(later) == _without_status(state)
            # The latest state of a live run says "running"; an earlier seq shows the
            # folded status (also "running"); only the instant between a run's first commit
            # and its owner's lock may read "interrupted".
            assert state.status in ("running", "interrupted", "finished")
            assert later.status in ("running", "finished")
            if later.status == "finished":
                assert state.status == "finished"
