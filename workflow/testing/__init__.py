"""Testing helpers: ``WorkflowTestRunner`` (LlamaIndex's) and the replay-determinism kit.

:class:`WorkflowTestRunner` (in :mod:`workflow.testing.runner`, as in LlamaIndex) runs a
workflow end to end and collects what it streamed.

The replay-determinism kit: check that a workflow can be restored, forked and resumed.

A durable workflow is only as good as its steps are deterministic: a fork or a resume runs
steps again and must end where the original run ended. :func:`assert_replay_deterministic`
runs a workflow once and then replays it every way the engine can::

    import asyncio
    from workflow import StartEvent, StopEvent, Workflow, step
    from workflow.testing import assert_replay_deterministic

    class Hello(Workflow):
        @step
        async def hello(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=f"hello {ev.name}")

    asyncio.run(assert_replay_deterministic(Hello, name="world"))

It raises :class:`AssertionError` naming the checkpoint (seq) and what differed, e.g. a step
whose result depends on a clock, a random number or a global counter. Put it in a test::

    async def test_hello_replays() -> None:
        await assert_replay_deterministic(Hello, name="world")
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from eventstore import Commit, EventStore, NewRun, Record, StoredRecord

from .. import _journal as J
from .._fold import Folded, fold, to_run_state
from .._handler import WorkflowHandler
from .._read import commits
from .._state import TERMINAL, Checkpoint, RunState
from .._workflow import Workflow
from .runner import WorkflowTestResult, WorkflowTestRunner

__all__ = [
    "ReplayReport",
    "WorkflowTestResult",
    "WorkflowTestRunner",
    "assert_replay_deterministic",
    "copy_log_prefix",
]

# Crash points checked at most (spread evenly over the run's commit boundaries).
MAX_CRASH_POINTS: Final = 20
# Seconds any one run, fork or resume may take before the check gives up on it.
RUN_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: its result, or the type and message of its error."""

    result: Any = None
    error: BaseException | None = None

    def same_as(self, other: Outcome) -> bool:
        """Equal results, or errors of the same type."""
        if self.error is not None or other.error is not None:
            return type(self.error) is type(other.error)
        return bool(self.result == other.result)

    def __str__(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        return f"result {self.result!r}"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What :func:`assert_replay_deterministic` checked, for a test to look at or print."""

    run_id: str
    outcome: str  # the original run's result or error, as text
    checkpoints: int  # checkpoints whose state was folded twice and compared
    forks: int  # forks run to their end
    crash_points: int  # log prefixes resumed to their end


async def _outcome(handler: WorkflowHandler, what: str) -> Outcome:
    deadline = asyncio.timeout(RUN_TIMEOUT_S)
    try:
        async with deadline:
            return Outcome(result=await handler)
    except TimeoutError as exc:
        if not deadline.expired():  # the run's own timeout (or a wait's): its outcome
            return Outcome(error=exc)
        msg = f"{what} did not end within {RUN_TIMEOUT_S} s"
        raise AssertionError(msg) from None
    except Exception as exc:
        return Outcome(error=exc)


def copy_log_prefix(source: EventStore, run_id: str, upto: int) -> EventStore:
    """A new in-memory store holding ``run_id``'s commits that end at or before ``upto``.

    It is the log as a process killed right after that commit left it: resume the run
    there (``Workflow(store=...).resume(run_id)``) to see what a crash would have done.
    The run must not be a fork (a fork's state needs its parent's log too).
    """
    info = source.run(run_id)
    target = EventStore()
    first = True
    for group in commits(source.records(run_id, upto=upto)):
        if group[-1].seq > upto:
            break
        create = None
        if first:
            create = NewRun(meta=dict(info.meta), status="running")
            first = False
        target.append_sync(
            Commit(
                run_id,
                [Record(r.kind, r.step, r.payload) for r in group],
                create=create,
                status=None if create is not None else "running",
            )
        )
    return target


def _first_difference(a: RunState, b: RunState) -> str:
    for name in RunState.__dataclass_fields__:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            return f"{name}: {va!r} != {vb!r}"
    return "no field differs"


def _spread(items: Sequence[int], k: int) -> list[int]:
    if len(items) <= k:
        return list(items)
    step = (len(items) - 1) / (k - 1)
    return sorted({items[round(i * step)] for i in range(k)})


async def assert_replay_deterministic(
    workflow_cls: type[Workflow],
    *,
    store: EventStore | str | os.PathLike[str] | None = None,
    **start_kwargs: Any,
) -> ReplayReport:
    """Runs ``workflow_cls`` once, then checks that every replay of that run agrees.

    1. ``state_at(seq)`` of every checkpoint is well defined: reading it twice, and folding
       the records up to it afresh, give equal states.
    2. A fork (``run_from``) from every checkpoint ends as the original did: the same
       result, or an error of the same type; and the original run's log is unchanged.
    3. Crash anywhere: the log cut at a commit boundary (all of them, or
       ``MAX_CRASH_POINTS`` spread over the run) and resumed ends with the same result and
       the same final context.

    The last commit of a failed run is not a crash point (resuming a failed run
    retries its step with a fresh budget, which is not what a crash does). The run must
    end by itself: a workflow that waits for an external event cannot be checked here.

    :param store: where the original run and the forks are journaled (an in-memory store
        by default); crash points are resumed in in-memory copies.
    :param start_kwargs: what ``wf.run(**start_kwargs)`` gets (fields of the start event,
        or ``start_event=``).
    :returns: a :class:`ReplayReport` of what was checked.
    :raises AssertionError: a replay differs; the message names the checkpoint seq.

    Example::

        report = await assert_replay_deterministic(MyFlow, topic="x")
        assert report.forks > 0
    """
    owned = not isinstance(store, EventStore)
    es = store if isinstance(store, EventStore) else EventStore(store)
    try:
        return await _check(workflow_cls, es, start_kwargs)
    finally:
        if owned:
            es.close()


async def _check(
    workflow_cls: type[Workflow], es: EventStore, start_kwargs: dict[str, Any]
) -> ReplayReport:
    name = workflow_cls.__name__
    wf = workflow_cls(store=es)
    handler = wf.run(**start_kwargs)
    run_id = handler.run_id
    original = await _outcome(handler, f"the original run of {name}")
    final = wf.state_at(run_id)
    records = list(es.records(run_id))
    cps = wf.checkpoints(run_id)

    # 1. state_at(seq) is a pure function of the log up to seq.
    for cp in cps:
        a = wf.state_at(run_id, cp.seq)
        b = wf.state_at(run_id, cp.seq)
        if a != b:
            msg = (
                f"{name}: state_at({cp.seq}) gave two different states when read twice"
                f" ({_first_difference(a, b)})"
            )
            raise AssertionError(msg)
        pure = to_run_state(
            fold(Folded(run_id), [r for r in records if r.commit_seq <= cp.seq]),
            wf.__workflow_parts__.codec,
            a.status,
        )
        if a != pure:
            msg = (
                f"{name}: state_at({cp.seq}) differs from a fresh fold of the log up to"
                f" seq {cp.seq} ({_first_difference(a, pure)})"
            )
            raise AssertionError(msg)

    # 2. A fork from every checkpoint ends alike; the original run is left as it was.
    forks = 0
    for cp in cps:
        fork = wf.run_from(cp)
        got = await _outcome(fork, f"the fork of {name} from checkpoint seq {cp.seq}")
        forks += 1
        if not got.same_as(original):
            msg = (
                f"{name}: the fork from checkpoint seq {cp.seq} ({_describe(cp)}) ended with"
                f" {got}; the original run ended with {original}"
            )
            raise AssertionError(msg)
    after = list(es.records(run_id))
    if after != records:
        msg = f"{name}: forking changed the original run's log (run {run_id!r})"
        raise AssertionError(msg)

    # 3. A crash after any commit, then a resume, ends alike.
    ends = [group[-1].seq for group in commits(records)]
    if final.status in TERMINAL and final.status != "finished":
        ends = ends[:-1]
    points = _spread(ends, MAX_CRASH_POINTS)
    for upto in points:
        copy = copy_log_prefix(es, run_id, upto)
        try:
            again = workflow_cls(store=copy)
            got = await _outcome(
                again.resume(run_id), f"{name} resumed after a crash at seq {upto}"
            )
            if not got.same_as(original):
                msg = (
                    f"{name}: resumed after a crash at checkpoint seq {upto} it ended with"
                    f" {got}; the original run ended with {original}"
                )
                raise AssertionError(msg)
            _check_memos(name, records, list(copy.records(run_id)), upto)
            if original.error is None:
                context = again.state_at(run_id).context
                if context != final.context:
                    msg = (
                        f"{name}: resumed after a crash at checkpoint seq {upto} its final"
                        f" context is {context!r}; the original run's is {final.context!r}"
                    )
                    raise AssertionError(msg)
        finally:
            copy.close()
    return ReplayReport(run_id, str(original), len(cps), forks, len(points))


def _check_memos(
    name: str, records: list[StoredRecord], resumed: list[StoredRecord], upto: int
) -> None:
    """A resume must reuse what the log recorded: a memoized call it made again with other
    arguments (a prompt built from a clock, a random number) is not deterministic."""
    before = fold(Folded(""), [r for r in records if r.commit_seq <= upto]).memos
    for r in resumed:
        if r.seq <= upto or r.kind != J.MEMOIZED or r.step is None:
            continue
        p: J.Memoized = r.data()
        rec = before.get(r.step, {}).get(p["id"], {}).get(p["key"])
        if rec is not None and not rec.retried and rec.error is None:
            msg = (
                f"{name}: resumed after a crash at checkpoint seq {upto}, step {r.step!r}"
                f" called {p['name']}() (memo key {p['key']!r}) again with other arguments"
                f" than the log recorded at seq {rec.seq}: its arguments are not"
                " deterministic, so a re-run pays for it again"
            )
            raise AssertionError(msg)


def _describe(cp: Checkpoint) -> str:
    return cp.kind if cp.step is None else f"{cp.kind} of step {cp.step!r}"
