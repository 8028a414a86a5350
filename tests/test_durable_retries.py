"""Durable retries: a backoff survives the process, and ``ctx.retry_info()`` reads the log.

The crash tests kill a real process (tests/support/retry_proc.py) with SIGKILL while its step sleeps
in a backoff, then resume the run here, in another process, on the same SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from eventstore import EventStore, StoredRecord
from tests.conftest import POSTGRES_URL
from tests.support.child import child
from workflow import (
    Context,
    RunOwnedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowRuntimeError,
    step,
)
from workflow import _journal as J
from workflow._fold import Ev, Failure, Folded, Prog, fold
from workflow._retry import RetryClock, UnreconstructedException, rebuild_error
from workflow._snapshot import dump_folded, load_folded
from workflow._verify import verify
from workflow.cli._timeline import timeline_data
from workflow.retry_policy import (
    RetryInfo,
    _attempt_seed,
    retry_policy,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
    wait_random,
)

ROOT: Final = Path(__file__).resolve().parent.parent
# Set in the process the crash tests kill (tests/support/retry_proc.py).
DYING: Final = threading.Event()


class UpstreamDown(Exception):
    """What the flaky steps raise: a class of this module, rebuilt after a resume."""


# Random, so that the delay a resume keeps is shown to be the one the dead process drew;
# longer than the kill and the resume take (a PostgreSQL lease's second included), so a
# retry at once would be seen.
JITTERED: Final = retry_policy(wait=wait_random(1.5, 2.0), stop=stop_after_attempt(3))
# Gives up once 1.5 s have passed since the first attempt; retries 1 s after each failure.
DEADLINE: Final = retry_policy(wait=wait_fixed(1), stop=stop_after_delay(1.5))


class Resumable(Workflow):
    """Fails its first attempt; its retry returns what ``ctx.retry_info()`` said."""

    @step(retry_policy=JITTERED)
    async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
        info = ctx.retry_info()
        if info.retry_number == 0:
            raise UpstreamDown("upstream is down")
        assert info.last_failed_at is not None
        return StopEvent(
            result={
                "started": time.time(),
                "retry_number": info.retry_number,
                "elapsed": info.elapsed_seconds,
                "last": [type(info.last_exception).__qualname__, str(info.last_exception)],
                "last_failed_at": info.last_failed_at.timestamp(),
                "utc": info.last_failed_at.tzinfo is UTC,
            }
        )


class Deadline(Workflow):
    """Always fails; ``stop_after_delay`` ends its retries."""

    @step(retry_policy=DEADLINE)
    async def call(self, ev: StartEvent) -> StopEvent:
        raise UpstreamDown("still down")


@contextlib.contextmanager
def killed(
    db: Path | str, flow: str, run_id: str, until: str, *, lease_ttl: float | None = None
) -> Iterator[None]:
    """A real process running ``flow``, killed with SIGKILL once its run is ``until``
    (tests/support/retry_proc.py says how); ``lease_ttl`` for a PostgreSQL store's lease."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if lease_ttl is not None:
        env["RETRY_PROC_LEASE_TTL"] = str(lease_ttl)
    with child(
        [sys.executable, "-m", "tests.support.retry_proc", str(db), flow, run_id, until],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "READY\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        yield


def records(db: Path, run_id: str, kind: str) -> list[tuple[StoredRecord, Any]]:
    with EventStore(db, readonly=True) as store:
        return [(r, orjson.loads(r.payload)) for r in store.records(run_id, kinds=[kind])]


@pytest.mark.long  # a killed process and real delays: make test-long (CI runs it)
async def test_a_run_killed_in_its_backoff_retries_when_the_record_says(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with killed(db, "Resumable", "r1", "failed"):
        pass
    [(_, failed)] = records(db, "r1", J.STEP_FAILED)
    starts = records(db, "r1", J.STEP_STARTED)
    assert [p["attempt"] for _, p in starts] == [1], "the dead process began its retry"
    assert failed["retry"] is True
    assert failed["retry_at"] == pytest.approx(time.time() + failed["delay"], abs=5.0)
    # The run's state says when its retry is due.
    [waiting] = Resumable(store=db).state_at("r1").in_progress["call"]
    assert (waiting.failures, waiting.retry_at) == (1, failed["retry_at"])

    # Jitter replays identically: the policy, seeded from the attempt, draws the same delay.
    seed = _attempt_seed("r1", "call", failed["id"], failed["attempt"])
    again = JITTERED.next(failed["elapsed"], 1, UpstreamDown("upstream is down"), seed=seed)
    assert again == failed["delay"]

    result = await Resumable(store=db, timeout=None).resume("r1")

    # It waited for retry_at rather than retrying at once.
    starts = records(db, "r1", J.STEP_STARTED)
    assert [p["attempt"] for _, p in starts] == [1, 2]
    assert starts[1][0].ts / 1e6 >= failed["retry_at"]
    assert result["started"] >= failed["retry_at"]
    # What retry_info() said in the new process is what the dead one would have said.
    assert result["retry_number"] == 1
    assert result["last"] == ["UpstreamDown", "upstream is down"]
    assert result["last_failed_at"] == pytest.approx(failed["retry_at"] - failed["delay"])
    assert result["utc"] is True
    # Elapsed time counts from the first attempt, in the dead process, through the backoff.
    assert result["elapsed"] >= failed["elapsed"] + failed["delay"]


@pytest.mark.postgres
async def test_a_run_killed_in_its_backoff_on_postgresql_retries_when_the_record_says() -> None:
    """The same crash on a PostgreSQL store: the schedule lives in the log, not the file."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = f"{POSTGRES_URL}?schema={schema}"
    try:
        with killed(url, "Resumable", "p1", "failed", lease_ttl=1.0):
            pass
        with EventStore(url) as store:
            [failed] = [orjson.loads(r.payload) for r in store.records("p1", kinds=[J.STEP_FAILED])]
        wf = Resumable(store=EventStore(url), timeout=None, lease_ttl=1.0)
        try:
            while True:  # the dead process's lease lasts up to a second
                try:
                    handler = wf.resume("p1")
                    break
                except RunOwnedError:
                    await asyncio.sleep(0.1)
            result = await handler
            starts = list(wf.store.records("p1", kinds=[J.STEP_STARTED]))
        finally:
            wf.store.close()
        assert [orjson.loads(r.payload)["attempt"] for r in starts] == [1, 2]
        assert starts[1].ts / 1e6 >= failed["retry_at"]
        assert result["retry_number"] == 1
        assert result["last"] == ["UpstreamDown", "upstream is down"]
        assert result["elapsed"] >= failed["elapsed"] + failed["delay"]
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.long  # processes and real delays: make test-long (CI runs it)
async def test_stop_after_delay_counts_the_time_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with killed(db, "Deadline", "r2", "failed"):
        pass
    [(_, first)] = records(db, "r2", J.STEP_FAILED)
    assert [p["attempt"] for _, p in records(db, "r2", J.STEP_STARTED)] == [1]
    assert first["retry"] is True
    assert first["delay"] == 1.0
    # Nobody runs the run for a while: past its retry_at, and past the 1.5 s the policy allows.
    failed_at = first["retry_at"] - first["delay"]
    while time.time() < failed_at + 2.0:  # noqa: ASYNC110 - waits for the wall clock
        await asyncio.sleep(0.05)

    with pytest.raises(UpstreamDown, match="still down"):
        await Deadline(store=db, timeout=None).resume("r2")

    # Retried at once (its retry_at had passed), and given up on: 2 s had passed since the
    # first attempt. A schedule that restarted in this process would have retried again.
    failures = [p for _, p in records(db, "r2", J.STEP_FAILED)]
    assert [f["retry"] for f in failures] == [True, False]
    assert failures[1]["retry_at"] is None
    assert failures[1]["elapsed"] >= 2.0


# ---------------------------------------------------------------------- retry_info in process


async def test_retry_info_on_the_first_attempt_and_after_failures() -> None:
    seen: list[RetryInfo] = []

    class Twice(Workflow):
        @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(3)))
        async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
            info = ctx.retry_info()
            seen.append(info)
            if info.retry_number < 2:
                raise UpstreamDown(f"failure {info.retry_number + 1}")
            return StopEvent(result="ok")

    assert await Twice().run() == "ok"
    assert seen[0] == RetryInfo(0, 0.0, None, None)
    assert [i.retry_number for i in seen] == [0, 1, 2]
    last = seen[2].last_exception
    assert isinstance(last, UpstreamDown)
    assert str(last) == "failure 2"
    assert last.__traceback__ is not None  # in process, the exception itself
    assert seen[2].last_failed_at is not None
    assert seen[2].last_failed_at.tzinfo is UTC
    assert seen[1].last_failed_at is not None
    assert seen[1].last_failed_at <= seen[2].last_failed_at
    assert seen[2].elapsed_seconds >= seen[1].elapsed_seconds >= 0.0


class SecondTime(Workflow):
    """Succeeds on its retry only: what its attempt does depends on ctx.retry_info()."""

    @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(2)))
    async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
        info = ctx.retry_info()
        if info.retry_number == 0:
            raise UpstreamDown("first")
        return StopEvent(result=[info.retry_number, str(info.last_exception)])


async def test_verify_reexecutes_a_retry_with_the_retry_info_the_log_recorded(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    assert await SecondTime(store=db).run(run_id="v") == [1, "first"]
    report = verify(SecondTime(store=db), ["v"], reexecute=True)
    assert report.attempts_reexecuted == 1
    assert report.problems == []


async def test_retry_info_outside_a_step_is_an_error() -> None:
    class One(Workflow):
        @step
        async def only(self, ctx: Context, ev: StartEvent) -> StopEvent:
            return StopEvent()

    handler = One().run()
    with pytest.raises(WorkflowRuntimeError, match="inside a step"):
        handler.ctx.retry_info()
    await handler


async def test_a_failure_without_a_policy_records_when_and_how_long() -> None:
    class Once(Workflow):
        @step
        async def call(self, ev: StartEvent) -> StopEvent:
            raise UpstreamDown("no policy")

    wf = Once()
    with pytest.raises(UpstreamDown):
        await wf.run(run_id="once")
    [failed] = [orjson.loads(r.payload) for r in wf.store.records("once", kinds=[J.STEP_FAILED])]
    assert failed["retry"] is False
    assert failed["delay"] is None
    assert failed["retry_at"] is None
    assert failed["elapsed"] >= 0.0


async def test_the_timeline_says_when_a_retry_was_due(tmp_path: Path) -> None:
    class Twice(Workflow):
        @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(2)))
        async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
            if ctx.retry_info().retry_number == 0:
                raise UpstreamDown("once")
            return StopEvent(result="ok")

    db = tmp_path / "t.db"
    wf = Twice(store=db)
    assert await wf.run(run_id="t") == "ok"
    [(_, failed)] = records(db, "t", J.STEP_FAILED)
    with EventStore(db, readonly=True) as store:
        bars = timeline_data(store, "t")["attempts"]
    due = datetime.fromtimestamp(failed["retry_at"], tz=UTC).strftime("%H:%M:%S.%f")[:-3]
    after = f"{failed['elapsed']:.3f} s after the first attempt"
    note = f"UpstreamDown: once (retried at {due} UTC, {after})"
    assert [b[5:7] for b in bars] == [["failed", note], ["ok", "emitted #2"]]


# ---------------------------------------------------------------------- the rebuilt exception


class NeedsTwo(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


def test_a_recorded_exception_is_rebuilt_only_from_imported_exception_classes() -> None:
    here = __name__
    rebuilt = rebuild_error(here, "UpstreamDown", "down")
    assert type(rebuilt) is UpstreamDown
    assert str(rebuilt) == "down"
    assert type(rebuild_error("builtins", "KeyError", "k")) is KeyError
    for module, name in [
        ("no_such_module_here", "Boom"),  # never imported for a name read from the log
        ("builtins", "eval"),  # not an exception class
        (here, "NeedsTwo"),  # does not take one message
        (here, "UpstreamDown.nope"),
    ]:
        stand_in = rebuild_error(module, name, "msg")
        assert type(stand_in) is UnreconstructedException
        assert str(stand_in) == "msg"
        assert stand_in.original_type == f"{module}.{name}"
    assert "no_such_module_here" not in sys.modules


# ---------------------------------------------------------------------- old records, the cache


def _rec(seq: int, kind: str, payload: dict[str, Any], ts: int) -> StoredRecord:
    return StoredRecord(seq, "old", kind, "call", orjson.dumps(payload).decode(), seq, ts)  # type: ignore[arg-type]


def test_a_failure_recorded_before_retry_at_is_due_its_delay_after_its_commit() -> None:
    state = Folded("old")
    state.in_progress["call"] = {1: Prog(Ev(1, {}, 1), attempt=1)}
    old = {
        "id": 1,
        "attempt": 1,
        "error": "UpstreamDown",
        "module": __name__,
        "message": "down",
        "traceback": "",
        "retry": True,
        "delay": 2.5,
    }
    fold(state, [_rec(2, J.STEP_FAILED, old, 1_000_000_000)])
    failure = state.in_progress["call"][1].failure
    assert failure == Failure(1002.5, None, 1000.0, "UpstreamDown", __name__, "down")
    # Without a recorded elapsed time, a resumed schedule counts from the resume.
    clock = RetryClock.resume(1, failure)
    assert clock.elapsed() < 1.0
    assert type(clock.last_error) is UpstreamDown
    # Once the retry has begun, a resume does not wait for it again.
    fold(state, [_rec(3, J.STEP_STARTED, {"id": 1, "attempt": 2}, 1_000_000_100)])
    assert state.in_progress["call"][1].failure == Failure(
        None, None, 1000.0, "UpstreamDown", __name__, "down"
    )


def test_the_cached_state_keeps_the_latest_failure_and_reads_older_caches() -> None:
    state = Folded("cached")
    failure = Failure(12.5, 0.25, 10.0, "UpstreamDown", __name__, "down")
    state.in_progress["call"] = {
        1: Prog(Ev(1, {"a": 1}, 3), 2, 1, 0, failure),
        2: Prog(Ev(2, {"b": 2}, 4), 1, 0, 0),
    }
    back = load_folded(dump_folded(state))
    assert back.in_progress["call"][1].failure == failure
    assert back.in_progress["call"][2].failure is None
    # A cache written before failures were kept (format 3): six fields a step in progress.
    v3 = orjson.loads(dump_folded(state))
    v3["v"] = 3
    v3["in_progress"] = {k: [e[:6] for e in es] for k, es in v3["in_progress"].items()}
    old = load_folded(orjson.dumps(v3))
    assert old.in_progress["call"][1].failures == 1
    assert old.in_progress["call"][1].failure is None


def test_a_resumed_clock_counts_from_the_first_attempt_in_the_dead_process() -> None:
    now = time.time()
    failure = Failure(now + 5.0, 4.0, now - 6.0, "KeyError", "builtins", "'k'")
    clock = RetryClock.resume(2, failure)
    # 4 s before the failure, which was 6 s ago.
    assert clock.elapsed() == pytest.approx(10.0, abs=1.0)
    assert clock.retry_at == now + 5.0
    info = clock.info()
    assert info.retry_number == 2
    assert isinstance(info.last_exception, KeyError)
    assert info.last_failed_at == datetime.fromtimestamp(now - 6.0, tz=UTC)
