"""Workers: any process picks up runs that need work; one worker runs a run at a time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from workflow import Context, Event, StartEvent, StopEvent, Worker, Workflow, step

ROOT = Path(__file__).resolve().parent.parent


class Half(Event):
    n: int


class Doubler(Workflow):
    """Two steps; each counts its own execution in the context (to check exactly-once)."""

    @step
    async def first(self, ctx: Context, ev: StartEvent) -> Half:
        await ctx.store.set("first_runs", await ctx.store.get("first_runs", default=0) + 1)
        await asyncio.sleep(0.01)
        return Half(n=ev.n)

    @step
    async def second(self, ctx: Context, ev: Half) -> StopEvent:
        await ctx.store.set("second_runs", await ctx.store.get("second_runs", default=0) + 1)
        await asyncio.sleep(0.01)
        return StopEvent(result=ev.n * 2)


def start_workers(store: str, n: int, *extra: str) -> list[subprocess.Popen[str]]:
    procs = []
    for _ in range(n):
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.support.worker_proc", store, *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        procs.append(p)
    return procs


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        assert p.stdout is not None
        p.stdout.close()


def wait_all_finished(wf: Workflow, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        statuses = {r.run_id: r.status for r in wf.runs()}
        if all(statuses.get(i) == "finished" for i in ids):
            return
        if time.monotonic() > deadline:
            left = Counter(statuses.get(i) for i in ids)
            raise AssertionError(f"runs not finished in time: {left}")
        time.sleep(0.1)


def check_exactly_once(wf: Workflow, ids: list[str], inputs: dict[str, int]) -> None:
    for run_id in ids:
        state = wf.state_at(run_id)
        assert state.result == inputs[run_id] * 2
        assert state.context == {"first_runs": 1, "second_runs": 1}, run_id
        finished = Counter(
            (r.step, r.data()["id"]) for r in wf.store.records(run_id, kinds=["step_finished"])
        )
        assert set(finished.values()) == {1}, run_id


async def test_worker_runs_submitted_runs(tmp_path: Path) -> None:
    """submit returns at once; a worker in this process runs every submitted run."""
    wf = Doubler(store=tmp_path / "w.db", timeout=None)
    inputs = {wf.submit(n=i): i for i in range(20)}
    assert {r.status for r in wf.runs()} == {"submitted"}  # no worker took them yet
    worker = Worker(wf, concurrency=4, poll_interval=0.02)
    task = asyncio.create_task(worker.run())
    async with asyncio.timeout(30):
        while {r.status for r in wf.runs()} != {"finished"}:  # noqa: ASYNC110 - polls the store
            await asyncio.sleep(0.05)
    worker.stop()
    assert await task == 20
    check_exactly_once(wf, list(inputs), inputs)


async def test_a_worker_takes_the_next_run_as_soon_as_one_ends(tmp_path: Path) -> None:
    """A worker whose run ends looks for the next one at once, not at its next poll: a
    backlog goes through one run after another even when polls are ten minutes apart."""
    wf = Doubler(store=tmp_path / "w.db", timeout=None)
    inputs = {wf.submit(n=i): i for i in range(5)}
    worker = Worker(wf, concurrency=1, poll_interval=600)
    task = asyncio.create_task(worker.run())
    async with asyncio.timeout(60):  # without it, the second run waits for the next poll
        while {r.status for r in wf.runs()} != {"finished"}:  # noqa: ASYNC110 - polls the store
            await asyncio.sleep(0.05)
    worker.stop()
    assert await task == 5
    check_exactly_once(wf, list(inputs), inputs)


async def test_submit_is_once_per_run_id(tmp_path: Path) -> None:
    """Submitting the same run id twice records one run."""
    wf = Doubler(store=tmp_path / "w.db")
    assert wf.submit(run_id="job-7", n=1) == "job-7"
    assert wf.submit(run_id="job-7", n=1) == "job-7"
    assert len(wf.runs()) == 1


def _crash_test(store: str, wf: Workflow, runs: int, workers: int, *extra: str) -> None:
    inputs = {wf.submit(n=i): i for i in range(runs)}
    procs = start_workers(store, workers, *extra)
    try:
        deadline = time.monotonic() + 60
        while sum(r.status == "finished" for r in wf.runs()) < runs // 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        procs[0].kill()  # SIGKILL mid-way: its runs must be taken over
        procs[0].wait()
        wait_all_finished(wf, list(inputs), timeout=90)
    finally:
        stop_all(procs)
    check_exactly_once(wf, list(inputs), inputs)


@pytest.mark.crash
def test_three_workers_survive_a_kill_on_sqlite(tmp_path: Path) -> None:
    """Three worker processes share a file; one is killed; every run ends exactly once."""
    store = str(tmp_path / "shared.db")
    _crash_test(store, Doubler(store=store, timeout=None), runs=200, workers=3)


@pytest.mark.postgres
@pytest.mark.crash
def test_three_workers_survive_a_kill_on_postgres() -> None:
    """On PostgreSQL a killed worker's leases lapse and the others take its runs over."""
    from tests.conftest import postgres_store

    with postgres_store() as es:
        assert es.path is not None
        _crash_test(es.path, Doubler(store=es, timeout=None), 200, 3, "1.0")


def test_sigterm_abandons_cleanly(tmp_path: Path) -> None:
    """A worker stopped by SIGTERM leaves its runs to another worker, which finishes them."""
    store = str(tmp_path / "term.db")
    wf = Doubler(store=store, timeout=None)
    inputs = {wf.submit(n=i): i for i in range(40)}
    first = start_workers(store, 1)
    try:
        time.sleep(0.3)
        first[0].send_signal(signal.SIGTERM)
        assert first[0].wait(timeout=20) == 0
    finally:
        stop_all(first)
    second = start_workers(store, 1)
    try:
        wait_all_finished(wf, list(inputs), timeout=60)
    finally:
        stop_all(second)
    check_exactly_once(wf, list(inputs), inputs)


class Gated(Workflow):
    """One step that waits for the test to open the gate."""

    gate: asyncio.Event

    @step
    async def wait(self, ev: StartEvent) -> StopEvent:
        await self.gate.wait()
        return StopEvent(result="late")


@pytest.mark.postgres
async def test_a_worker_that_loses_a_run_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose run another executor took over (a claim moved the epoch on) stops
    that run, logs a warning naming it, and counts it as lost, not completed."""
    from eventstore import EventStore
    from tests.conftest import postgres_store

    with postgres_store() as es:
        wf = Gated(store=es, timeout=None)
        wf.gate = asyncio.Event()
        run_id = wf.submit()
        worker = Worker(wf, concurrency=1, poll_interval=0.02)
        task = asyncio.create_task(worker.run())
        async with asyncio.timeout(30):
            while not [r for r in es.records(run_id) if r.kind == "step_started"]:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert es.path is not None
            with EventStore(es.path) as other:  # another host takes the run over
                claimed = other.claim_sync(run_id)
                taken_at = other.run(run_id).last_seq or 0
            with caplog.at_level("WARNING", logger="workflow"):
                wf.gate.set()
                while worker.lost == 0:  # noqa: ASYNC110 - the worker's counter
                    await asyncio.sleep(0.02)
                worker.stop()
                await task
        # Nothing of the lost executor landed after the claim. The run is interrupted then
        # (the claimer runs nothing), so this worker may take it up again, under a newer
        # epoch, and finish it: only that may follow.
        after = [(r.kind, r.data()) for r in es.records(run_id, after=taken_at)]
        if after:
            kind, payload = after[0]
            assert kind == "run_resumed", after
            assert payload["epoch"] > claimed, after
    assert worker.lost == 1
    assert f"run {run_id!r}: this executor lost the run to another one" in caplog.text
