"""Properties of generated workflows: the model, the fold, forks, crashes, the replay kit.

Workflows come from ``tests/support/workflow_gen.py`` as plans;
:func:`~tests.support.workflow_gen.expected` says how every run of a plan ends.
Each example runs in its own event loop and its own
temporary store (``tmp_path`` is function-scoped, so Hypothesis examples use ``tempfile``):
an SQLite file, and for the run, fold and fork properties a PostgreSQL schema too (the
``postgres`` marker: ``make test-postgres``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from eventstore import EventStore, StoredRecord
from eventstore._postgres import is_url
from tests.conftest import BACKENDS, POSTGRES_URL, ci_examples, new_location
from tests.support import workflow_gen as gen
from tests.support.workflow_gen import (
    LEDGER,
    Add,
    Chain,
    Expected,
    FanOut,
    Loop,
    Mark,
    Plan,
    Push,
    Read,
    StepPlan,
    Stream,
)
from workflow import (
    Checkpoint,
    CheckpointNotFoundError,
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    RunNotFoundError,
    RunState,
    RunSuspendedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowRuntimeError,
    step,
)
from workflow._fold import Folded, fold, to_run_state
from workflow._read import commits, fold_run
from workflow.testing import assert_replay_deterministic

ROOT: Final = Path(__file__).resolve().parent.parent
# Seconds any one run may take before the test calls it a hang (runs take milliseconds;
# a short limit keeps shrinking a hanging example bearable).
RUN_TIMEOUT: Final = 10.0
T = TypeVar("T")


# ----------------------------------------------------------------------------- helpers


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Runs one example's coroutine in a fresh event loop."""
    return asyncio.run(coro)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A temporary directory for one example's stores."""
    with tempfile.TemporaryDirectory(prefix="props-") as d:
        yield Path(d)


@contextlib.contextmanager
def opened(path: str | Path, **kw: Any) -> Iterator[EventStore]:
    """An EventStore object on ``path``, closed at the end."""
    es = EventStore(path, **kw)
    try:
        yield es
    finally:
        es.close()


@dataclass(frozen=True)
class Observed:
    """How a run ended as the engine tells it: result or error, context, stream."""

    result: Any
    error: str | None
    context: dict[str, Any]
    stream: frozenset[tuple[str, str, int]]


async def ending(handler: Any) -> tuple[Any, BaseException | None]:
    """Awaits a handler; returns (result, None) or (None, error); a hang fails the test."""
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            return await handler, None
    except TimeoutError:
        msg = f"run {handler.run_id} did not end within {RUN_TIMEOUT} s"
        raise AssertionError(msg) from None
    except Exception as exc:
        return None, exc


async def started(start: Callable[[], Any]) -> tuple[Any, tuple[Any, BaseException | None]]:
    """Starts a run inside the loop (``run``, ``resume`` and ``run_from`` need one); ends it."""
    handler = start()
    return handler, await ending(handler)


def observe(wf: Workflow, run_id: str, result: Any, error: BaseException | None) -> Observed:
    """The outcome of a run, read back from the store."""
    state = wf.state_at(run_id)
    stream = frozenset((n["step"], n["path"], n["v"]) for n in state.stream)
    err = None if error is None else f"{type(error).__name__}: {error}"
    return Observed(result, err, dict(state.context), stream)


def check(obs: Observed, exp: Expected, where: str) -> None:
    """The run ended as the model says: same result, context and stream, or same failure."""
    if exp.failure is not None:
        assert obs.error == f"PlannedFailure: planned failure in {exp.failure}", where
        return
    assert obs.error is None, f"{where}: {obs.error}"
    ledger, want = obs.context.get(LEDGER, {}), exp.context.get(LEDGER, {})
    wrong = {
        k: (ledger.get(k), want.get(k)) for k in {*ledger, *want} if ledger.get(k) != want.get(k)
    }
    assert not wrong, f"{where}: effects landed (times, expected): {wrong}"
    assert obs.result == exp.result, where
    assert obs.context == exp.context, where
    assert obs.stream == exp.stream, where


async def run_plan(plan: Plan, es: EventStore) -> tuple[Workflow, str, Observed]:
    """Runs a plan once in ``es``; returns the workflow, the run id and its outcome."""
    wf = gen.build(plan)(store=es, timeout=RUN_TIMEOUT)
    handler = wf.run(seed=plan.seed)
    result, error = await ending(handler)
    return wf, handler.run_id, observe(wf, handler.run_id, result, error)


def commit_ends(records: list[StoredRecord]) -> list[int]:
    """The last seq of each commit, in order."""
    return [group[-1].seq for group in commits(records)]


def copy_prefix(src: str, dst: str, upto: int) -> None:
    """A copy of the store holding only what was durable when a commit ending at ``upto``
    was the last one: the state a process killed right then leaves behind (a file, or a
    PostgreSQL schema of the same database)."""
    if is_url(src):
        copy_prefix_postgres(src, dst, upto)
        return
    with (
        contextlib.closing(sqlite3.connect(src)) as s,
        contextlib.closing(sqlite3.connect(dst)) as d,
    ):
        s.backup(d)
        d.execute("DELETE FROM log WHERE seq > ?", (upto,))
        d.execute("DELETE FROM snapshots WHERE seq > ?", (upto,))
        d.execute("UPDATE inbox SET taken_seq = NULL WHERE taken_seq > ?", (upto,))
        d.execute("UPDATE runs SET status = 'running'")
        d.commit()


def copy_prefix_postgres(src: str, dst: str, upto: int) -> None:
    """:func:`copy_prefix` between two PostgreSQL stores: ``dst`` is created by the store,
    then every table's rows are copied as of ``upto`` (its seq counter and id sequences
    where they were then); the leases go, as a killed executor's lease lapses."""
    import psycopg

    EventStore(dst).close()  # the tables of the current schema version, empty
    old, new = (f'"{url.rpartition("schema=")[2]}"' for url in (src, dst))
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn, conn.transaction():
        for table in ("runs", "log", "inbox", "snapshots"):
            conn.execute(f"INSERT INTO {new}.{table} SELECT * FROM {old}.{table}")
        conn.execute(f"DELETE FROM {new}.log WHERE seq > %s", (upto,))
        conn.execute(f"DELETE FROM {new}.snapshots WHERE seq > %s", (upto,))
        conn.execute(f"UPDATE {new}.inbox SET taken_seq = NULL WHERE taken_seq > %s", (upto,))
        conn.execute(f"UPDATE {new}.runs SET status = 'running'")
        conn.execute(f"UPDATE {new}.meta SET value = %s WHERE key = 'last_seq'", (str(upto),))
        for table, column in (("runs", "rid"), ("inbox", "id")):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{new}.{table}', '{column}'),"
                f" (SELECT coalesce(max({column}), 0) + 1 FROM {new}.{table}), false)"
            )


def pure_state(records: list[StoredRecord], run_id: str, seq: int) -> Folded:
    """The checkpoint rule by hand: every commit that begins at or before ``seq``."""
    kept = [r for group in commits(records) if group[0].seq <= seq for r in group]
    return fold(Folded(run_id), kept)


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("backend", BACKENDS)
@given(plan=gen.plans())
def test_run_ends_as_the_model_says(backend: str, plan: Plan) -> None:
    """A run ends with the sequential model's result and context, and no task outlives it."""

    async def body() -> None:
        with scratch() as d, new_location(backend, d) as where, opened(where) as es:
            obs = (await run_plan(plan, es))[2]
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            check(obs, gen.expected(plan), "the run")
            assert not left, f"tasks still pending after the run ended: {left}"

    run_async(body())


# ----------------------------------------------------------------------------- 1. the fold


@pytest.mark.parametrize("backend", BACKENDS)
@ci_examples(20)
@given(plan=gen.plans(max_stages=2))
def test_fold_is_deterministic_and_independent_of_reading(backend: str, plan: Plan) -> None:
    """Folding a run read by any page size, from a fresh store object, at any seq, agrees."""

    async def body() -> None:
        with scratch() as d, new_location(backend, d) as where, opened(where) as es:
            # Two runs at once, so each run's seqs have gaps: the "between commits" rule.
            cls = gen.build(plan)
            wf = cls(store=es, timeout=RUN_TIMEOUT)
            handlers = [wf.run(seed=plan.seed), wf.run(seed=plan.seed)]
            exp = gen.expected(plan)
            for h in handlers:
                check(observe(wf, h.run_id, *await ending(h)), exp, "a concurrent run")
            with opened(where, readonly=True) as fresh:
                wf2 = cls(store=fresh, timeout=RUN_TIMEOUT)
                for h in handlers:
                    check_fold(wf, wf2, es, fresh, h.run_id)

    run_async(body())


def check_fold(wf: Workflow, wf2: Workflow, es: EventStore, fresh: EventStore, run_id: str) -> None:
    """The fold of ``run_id`` is a pure function of its records, however they are read."""
    reads = [list(es.records(run_id, page=n)) for n in (1, 3, 1000)]
    reads.append(list(fresh.records(run_id)))
    assert all(r == reads[0] for r in reads)
    records = reads[0]
    whole = [fold(Folded(run_id), r) for r in reads]
    assert all(f == whole[0] for f in whole)
    # The engine's read path (its cached state, when there is one) agrees with the pure fold.
    assert fold_run(es, run_id) == whole[0]
    assert fold_run(fresh, run_id) == whole[0]
    first, last = records[0].seq, records[-1].seq
    if first > 1:
        with pytest.raises(CheckpointNotFoundError):
            wf.state_at(run_id, first - 1)
    for seq in range(first, last + 1):
        assert fold_run(es, run_id, seq) == pure_state(records, run_id, seq), f"seq {seq}"
    for cp in wf.checkpoints(run_id):
        a, b = wf.state_at(run_id, cp.seq), wf2.state_at(run_id, cp.seq)
        assert a == b, f"state_at({cp.seq}) differs between two store objects"
        assert a == wf.state_at(run_id, cp.seq)
        pure = to_run_state(
            pure_state(records, run_id, cp.seq), wf.__workflow_parts__.codec, a.status
        )
        assert a == pure, f"state_at({cp.seq}) differs from the pure fold"


# ----------------------------------------------------------------------------- 2. forks


@pytest.mark.parametrize("backend", BACKENDS)
@ci_examples(20)
@given(plan=gen.plans(max_stages=2))
def test_fork_from_every_checkpoint_ends_alike(backend: str, plan: Plan) -> None:
    """A fork from any checkpoint ends as the original run; the original's log is unchanged."""

    async def body() -> None:
        with scratch() as d, new_location(backend, d) as where, opened(where) as es:
            wf, run_id, obs = await run_plan(plan, es)
            exp = gen.expected(plan)
            check(obs, exp, "the original run")
            before = list(es.records(run_id))
            cps = wf.checkpoints(run_id)
            for cp in cps:
                fork = wf.run_from(cp)
                result, error = await ending(fork)
                check(observe(wf, fork.run_id, result, error), exp, f"fork from {cp.seq}")
                assert wf.state_at(fork.run_id).parent == (run_id, cp.seq)
            assert list(es.records(run_id)) == before

    run_async(body())


async def test_fork_from_the_final_checkpoint_ends() -> None:
    """A fork from the commit that finished a run ends at once (result or clear error)."""

    class One(Workflow):
        @step
        async def only(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result="done")

    wf = One(timeout=None)
    h = wf.run()
    assert await h == "done"
    last = wf.checkpoints(h.run_id)[-1]
    fork = wf.run_from(last)
    try:
        async with asyncio.timeout(2):
            await fork
    except TimeoutError:
        await fork.cancel_run()
        pytest.fail("the fork from the final checkpoint did not end within 2 s")
    except Exception:  # a clear error is a fine answer too
        return


# ----------------------------------------------------------------------------- 3. crashes


@pytest.mark.parametrize("backend", BACKENDS)
@ci_examples(20)
@given(plan=gen.plans(), data=st.data())
def test_crash_at_any_commit_boundary_resumes_alike(
    backend: str, plan: Plan, data: st.DataObject
) -> None:
    """A log cut after any commit and resumed ends as the uninterrupted run, effects once."""

    async def body() -> None:
        exp = gen.expected(plan)
        with scratch() as d, contextlib.ExitStack() as stores:

            def new(name: str) -> str:
                return stores.enter_context(new_location(backend, d, name))

            src = new("orig.db")
            with opened(src) as es:
                _, run_id, obs = await run_plan(plan, es)
                records = list(es.records(run_id))
            check(obs, exp, "the uninterrupted run")
            ends = commit_ends(records)
            if exp.failure is not None:
                ends = ends[:-1]  # resuming a failed run retries it: not a crash
            # A PostgreSQL copy is a schema made and filled: fewer of them an example.
            most = 6 if backend == "sqlite" else 2
            cuts = data.draw(
                st.lists(st.sampled_from(ends), min_size=1, max_size=most, unique=True),
                label="crash after seq",
            )
            cls = gen.build(plan)
            for i, upto in enumerate(cuts):
                dst = new(f"cut{i}.db")
                copy_prefix(src, dst, upto)
                again = await crash_and_resume(cls, dst, run_id, records, upto, exp)
                # Sometimes the resumed run crashes too (while recovering, or later).
                later = [e for e in commit_ends(again) if e > upto]
                if exp.failure is not None:
                    later = later[:-1]
                crash_again: bool = data.draw(st.booleans(), label="crash again")
                if later and crash_again:
                    upto2 = data.draw(st.sampled_from(later), label="crash again after seq")
                    dst2 = new(f"cut{i}-again.db")
                    copy_prefix(dst, dst2, upto2)
                    await crash_and_resume(cls, dst2, run_id, again, upto2, exp)

    run_async(body())


async def crash_and_resume(
    cls: type[Workflow],
    db: str,
    run_id: str,
    records: list[StoredRecord],
    upto: int,
    exp: Expected,
) -> list[StoredRecord]:
    """Resumes ``run_id`` in a store cut after ``upto``; checks it; returns its new log."""
    with opened(db) as es:
        wf = cls(store=es, timeout=RUN_TIMEOUT)
        kept = list(es.records(run_id))
        assert kept == [r for r in records if r.seq <= upto]
        result, error = await ending(wf.resume(run_id))
        check(observe(wf, run_id, result, error), exp, f"resumed after a crash at {upto}")
        log = list(es.records(run_id))
        assert log[: len(kept)] == kept
        return log


def _db_head(db: str) -> int:
    if is_url(db):
        import psycopg

        schema = db.rpartition("schema=")[2]
        try:
            with psycopg.connect(POSTGRES_URL, autocommit=True) as c:
                row = c.execute(f'SELECT count(*) FROM "{schema}".log').fetchone()
        except psycopg.Error:
            return 0  # not created yet
        return int(row[0]) if row else 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            return int(c.execute("SELECT count(*) FROM log").fetchone()[0])
    except sqlite3.Error:
        return 0


# On PostgreSQL a run is owned by a lease, which a killed process leaves until it lapses:
# the subprocess leases for this long, and the resume waits that out.
KILLED_LEASE_S: Final = 0.5


@pytest.mark.crash
# Each example starts a Python process: few examples, and no shrinking (a failure here is
# best reduced with the cheap prefix test above, which explores the same crash points).
@settings(
    max_examples=max(3, (settings.default or settings()).max_examples // 13),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@pytest.mark.parametrize("backend", BACKENDS)
@given(
    plan=gen.plans(max_stages=3, failures=False).filter(lambda p: len(p.stages) >= 2),
    kill_after=st.integers(3, 60),
)
def test_sigkill_anywhere_then_resume_ends_alike(backend: str, plan: Plan, kill_after: int) -> None:
    """A run SIGKILLed in a subprocess after some records, resumed here, ends as the model."""
    name, path = gen.module_file(plan)
    exp = gen.expected(plan)
    with scratch() as d, new_location(backend, d, "kill.db") as db:
        run_id = "victim"
        args = [name, str(path), db, run_id, str(plan.seed), "0.01", str(KILLED_LEASE_S)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.prop_runner", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            while proc.poll() is None and _db_head(db) < kill_after:
                assert time.monotonic() < deadline, "the subprocess made no progress"
                time.sleep(0.002)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(RUN_TIMEOUT)
        note(f"killed after {_db_head(db)} records (exit code {proc.returncode})")
        if is_url(db):
            time.sleep(KILLED_LEASE_S)  # the killed process's lease lapses

        async def body() -> None:
            with opened(db) as es:
                wf = gen.build(plan)(store=es, timeout=RUN_TIMEOUT)
                result, error = await ending(wf.resume(run_id))
                check(observe(wf, run_id, result, error), exp, "resumed after SIGKILL")

        run_async(body())


# ----------------------------------------------------------------------------- the kit


class Middle(Event):
    """The event between the kit workflows' steps."""

    text: str


class Greeter(Workflow):
    """Two steps and a context write."""

    @step
    async def greet(self, ctx: Context[Any], ev: StartEvent) -> Middle:
        name = ev["name"]
        await ctx.store.set("name", name)
        return Middle(text=f"hello {name}")

    @step
    async def shout(self, ctx: Context[Any], ev: Middle) -> StopEvent:
        count = await ctx.store.get("count", 0)
        await ctx.store.set("count", count + 1)
        return StopEvent(result=ev.text.upper())


_CALLS = {"n": 0}


class Drifting(Workflow):
    """Nondeterministic: the result depends on how often the step ran in this process."""

    @step
    async def count(self, ev: StartEvent) -> Middle:
        return Middle(text="x")

    @step
    async def drift(self, ev: Middle) -> StopEvent:
        _CALLS["n"] += 1
        return StopEvent(result=_CALLS["n"])


async def test_kit_passes_deterministic_workflows() -> None:
    """assert_replay_deterministic accepts a hand-written and a generated workflow."""
    report = await assert_replay_deterministic(Greeter, name="ada")
    assert report.outcome == "result 'HELLO ADA'"
    assert report.forks == report.checkpoints
    assert report.crash_points == report.checkpoints
    plan = Plan(
        stages=(
            FanOut(width=3, work=StepPlan(ops=(Add("a", gap=True), Mark()), workers=3)),
            Loop(times=2, body=StepPlan(ops=(Read("a"), Push(), Stream()))),
        ),
        seed=7,
    )
    report = await assert_replay_deterministic(gen.build(plan), seed=plan.seed)
    assert report.outcome == f"result {gen.expected(plan).result!r}"


async def test_kit_catches_a_nondeterministic_workflow() -> None:
    """A step whose result depends on a global counter makes the kit fail, naming a seq."""
    with pytest.raises(AssertionError, match=r"Drifting: the fork from checkpoint seq \d+"):
        await assert_replay_deterministic(Drifting)


# ----------------------------------------------------------------------------- 4. stateful

MACHINE_PLANS: Final = (
    Plan(stages=(Chain(StepPlan(ops=(Add("a"), Push()))),), seed=1),
    Plan(
        stages=(FanOut(width=2, work=StepPlan(ops=(Add("a", gap=True), Mark()), workers=2)),),
        end=StepPlan(ops=(Read("a"),)),
        seed=2,
    ),
    Plan(stages=(Loop(times=2, body=StepPlan(ops=(Stream(),))),), end=StepPlan(ops=(gen.Fail(),))),
)


class Asker(Workflow):
    """Waits durably for a human's answer."""

    @step
    async def ask(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix="name?"),
        )
        return StopEvent(result=f"hello {answer.response}")


class EngineMachine(RuleBasedStateMachine):
    """Store, engine and fold against a model: runs, checkpoints, forks, resumes, sends."""

    runs = Bundle("runs")
    checkpoints = Bundle("checkpoints")
    asks = Bundle("asks")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="machine-"))
        self.runner = asyncio.Runner()
        self.store = EventStore(self.tmp / "m.db")
        self.flows = [gen.build(p)(store=self.store, timeout=RUN_TIMEOUT) for p in MACHINE_PLANS]
        self.asker = Asker(store=self.store, timeout=RUN_TIMEOUT)
        self.expect: dict[str, tuple[int, Expected]] = {}  # run -> (plan index, outcome)
        self.logs: dict[str, list[StoredRecord]] = {}  # the log of every ended run
        self.seen: dict[tuple[str, int], RunState] = {}  # state_at when first read
        self.live: dict[tuple[str, int], RunState] = {}  # state_at read while running

    def teardown(self) -> None:
        self.store.close()
        self.runner.close()
        for f in self.tmp.iterdir():
            f.unlink()
        self.tmp.rmdir()

    def _ended(self, which: int, run_id: str, result: Any, error: BaseException | None) -> None:
        wf = self.flows[which]
        check(observe(wf, run_id, result, error), self.expect[run_id][1], f"run {run_id}")
        self.logs[run_id] = list(self.store.records(run_id))

    @rule(target=runs, which=st.integers(0, len(MACHINE_PLANS) - 1))
    def start(self, which: int) -> str:
        wf = self.flows[which]

        async def go() -> tuple[Any, tuple[Any, BaseException | None]]:
            # Reads the latest state while the run is live: later reads at those seqs
            # must give the same states (invariant checkpoints_never_change).
            handler = wf.run(seed=MACHINE_PLANS[which].seed)
            while not handler.is_done():
                await asyncio.sleep(0.001)
                with contextlib.suppress(RunNotFoundError):  # its first commit is not in
                    live = wf.state_at(handler.run_id)
                    if live.status == "running":
                        self.live[(handler.run_id, live.seq)] = live
            return handler, await ending(handler)

        handler, (result, error) = self.runner.run(go())
        self.expect[handler.run_id] = (which, gen.expected(MACHINE_PLANS[which]))
        self._ended(which, handler.run_id, result, error)
        return str(handler.run_id)

    @rule(run_id=runs)
    def send_to_ended_run(self, run_id: str) -> None:
        which = self.expect[run_id][0]
        with pytest.raises(WorkflowRuntimeError, match="nothing would take the event in"):
            self.flows[which].send(run_id, HumanResponseEvent(response="late"))

    @rule(target=checkpoints, run_id=runs, data=st.data())
    def take_checkpoint(self, run_id: str, data: st.DataObject) -> Checkpoint:
        wf = self.flows[self.expect[run_id][0]]
        cp = data.draw(st.sampled_from(wf.checkpoints(run_id)))
        self.seen.setdefault((run_id, cp.seq), wf.state_at(run_id, cp.seq))
        return cp

    @rule(target=runs, cp=checkpoints)
    def fork(self, cp: Checkpoint) -> str:
        which, exp = self.expect[cp.run_id]
        wf = self.flows[which]
        handler, (result, error) = self.runner.run(started(lambda: wf.run_from(cp)))
        self.expect[handler.run_id] = (which, exp)
        self._ended(which, handler.run_id, result, error)
        return str(handler.run_id)

    @rule(run_id=runs)
    def resume_ended_run(self, run_id: str) -> None:
        which, exp = self.expect[run_id]
        _, (result, error) = self.runner.run(started(lambda: self.flows[which].resume(run_id)))
        before = self.logs[run_id]
        self._ended(which, run_id, result, error)
        assert self.logs[run_id][: len(before)] == before
        if exp.failure is None:
            assert self.logs[run_id] == before  # a finished run is only read

    @rule(target=asks)
    def ask(self) -> str:
        async def go() -> str:
            handler = self.asker.run()
            await handler.wait_until_waiting(RUN_TIMEOUT)
            await handler.suspend()
            with pytest.raises(RunSuspendedError):
                await handler
            return handler.run_id

        run_id = self.runner.run(go())
        assert self.asker.state_at(run_id).status == "waiting"
        return run_id

    @rule(run_id=consumes(asks), answer=st.sampled_from(["ada", "bob"]))
    def answer(self, run_id: str, answer: str) -> None:
        self.asker.send(run_id, HumanResponseEvent(response=answer))
        _, (result, error) = self.runner.run(started(lambda: self.asker.resume(run_id)))
        assert error is None
        assert result == f"hello {answer}"
        self.logs[run_id] = list(self.store.records(run_id))

    @invariant()
    def checkpoints_never_change(self) -> None:
        for (run_id, seq), state in [*self.seen.items(), *self.live.items()]:
            wf = self.flows[self.expect[run_id][0]]
            assert wf.state_at(run_id, seq) == state, f"state_at({run_id}, {seq})"

    @invariant()
    def ended_logs_never_change(self) -> None:
        for run_id, records in self.logs.items():
            assert list(self.store.records(run_id)) == records, run_id

    @precondition(lambda self: bool(self.expect))
    @invariant()
    def cached_fold_equals_pure_fold(self) -> None:
        for run_id in self.expect:
            assert fold_run(self.store, run_id) == fold_run(self.store, run_id, cached=False)


TestEngineMachine = EngineMachine.TestCase
TestEngineMachine.settings = settings(ci_examples(20), stateful_step_count=10)
