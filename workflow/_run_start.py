"""How a run's executor begins: a new run, a run of an imported state, a fork, a resume.

Each is an entry point of :class:`~workflow._runner.Executor` (``start``, ``start_imported``,
``fork``, ``resume``), which runs the function here as the run's first task: it writes the
run's first commit (or its ``run_resumed`` after the claim that fences a previous owner),
takes the run over, and hands the work the state left to the step workers.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from eventstore import NewRun, Record

from . import _journal as journal
from ._errors import RecoveryLimitError
from ._events import StartEvent, StopEvent
from ._fold import Folded, rename_steps, to_run_state
from ._read import fold_run
from ._renames import moves_for
from ._start_events import fork_started_record
from ._state_versions import resume_upcast, state_tag
from ._waits import Delivery

if TYPE_CHECKING:
    import asyncio

    from eventstore import Codec, EventStore

    from ._graph import Graph
    from ._run_config import RunConfig
    from ._run_log import RunLog
    from ._stream import RunStream
    from ._streams import StreamBook
    from ._waits import WaitInfo, Waits

__all__ = [
    "Starting",
    "fork_run",
    "go_on",
    "over_recovery_limit",
    "resume_run",
    "start_imported_run",
    "start_run",
]


class Starting(Protocol):
    """What beginning a run uses of its executor (``_runner.Executor``)."""

    run_id: str
    streams: StreamBook | None

    @property
    def config(self) -> RunConfig: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def graph(self) -> Graph: ...

    @property
    def store(self) -> EventStore: ...

    @property
    def log(self) -> RunLog: ...

    @property
    def waits(self) -> Waits: ...

    @property
    def stream(self) -> RunStream: ...

    @property
    def waiters(self) -> dict[str, WaitInfo]: ...

    @property
    def ready(self) -> asyncio.Event: ...

    @property
    def done(self) -> asyncio.Future[Any]: ...

    @property
    def folded(self) -> Folded: ...

    async def append(self, records: list[Record], **kw: Any) -> int: ...

    async def operator_update(
        self, updates: Mapping[str, Any], deletes: list[str] | None = None
    ) -> int: ...

    def deliver(self, step: str, d: Delivery) -> None: ...

    def hold(self, rid: int) -> None: ...

    def load(self, folded: Folded) -> None: ...

    def reload(self, folded: Folded) -> None: ...

    def reset_budget(self) -> None: ...

    def start_tasks(self) -> None: ...

    def finish(self, stop: StopEvent) -> None: ...

    def end_with(self, exc: BaseException) -> None: ...

    def close(self, *, result: Any = None, exc: BaseException | None = None) -> None: ...


def over_recovery_limit(
    run_id: str, folded: Folded, steps: Mapping[str, object], limit: int
) -> RecoveryLimitError | None:
    """The error that ends a run whose in-progress input was started ``limit`` times
    without ending (each start a process died in), or None."""
    for step, progs in folded.in_progress.items():
        if step not in steps:
            continue  # stranded work the caller chose to leave undone
        for p in progs.values():
            if p.crashes >= limit:
                return RecoveryLimitError(run_id, step, p.crashes, limit)
    return None


async def start_run(
    executor: Starting, records: list[Record], start_event: StartEvent, with_context: bool
) -> None:
    """A new run: its first commit creates it, then the start event reaches its steps."""
    config = executor.config
    await config.slot(executor.done)  # a new run: num_concurrent_runs counts it
    await executor.append(records, create=config.new_run())
    executor.hold(executor.store.run(executor.run_id).rid)
    if with_context:
        executor.load(copy.deepcopy(executor.folded))
    executor.ready.set()
    for t in executor.graph.route(type(start_event)):
        executor.deliver(t, Delivery(1, start_event))
    executor.waits.start_taking()
    executor.start_tasks()


async def start_imported_run(
    executor: Starting, records: list[Record], updates: dict[str, Any]
) -> None:
    """A new run whose first commit holds an imported state; it goes on from that state."""
    config = executor.config
    await config.slot(executor.done)
    await executor.append(records, create=config.new_run())
    executor.hold(executor.store.run(executor.run_id).rid)
    executor.load(copy.deepcopy(executor.folded))
    executor.ready.set()
    await go_on(executor, copy.deepcopy(executor.folded), updates, resumed=False)


async def fork_run(
    executor: Starting,
    folded: Folded,
    parent: tuple[str, int],
    updates: dict[str, Any] | None,
    deletes: list[str] | None,
    renamed: dict[str, str] | None = None,
    upcast: list[Record] | None = None,
) -> None:
    """A fork: its first commit names its parent; it goes on from the parent's state (with
    the moves of renamed steps and the upcast context ``folded`` had applied, recorded)."""
    config = executor.config
    # Read before the fork's first commit is folded into the same state.
    ended = folded.result if folded.status == "finished" else None
    await executor.append(
        [
            fork_started_record(
                config.name,
                executor.graph,
                executor.codec,
                parent,
                renamed,
                state_tag(config.state_type),
                config.deprecated,
            ),
            *(upcast or ()),
        ],
        create=NewRun(
            meta={"workflow": config.name},
            parent_run_id=parent[0],
            parent_seq=parent[1],
            status="running",
        ),
    )
    executor.hold(executor.store.run(executor.run_id).rid)
    executor.ready.set()
    if ended is not None:
        # Forked where the parent had finished: nothing is left to run, so the fork
        # ends at once with the parent's result at that point (after any updates).
        if updates or deletes:
            await executor.operator_update(updates or {}, deletes)
        stop = executor.codec.load(ended)
        await executor.append([journal.run_finished(ended, folded.next_id)], status="finished")
        executor.finish(stop)
        return
    await go_on(executor, copy.deepcopy(folded), updates, resumed=False, deletes=deletes)


async def resume_run(
    executor: Starting,
    folded: Folded,
    updates: dict[str, Any] | None,
    renamed: dict[str, str] | None,
    deletes: list[str] | None,
    upcast: list[Record] | None = None,
) -> None:
    """A resume: the claim fences any previous owner, then ``run_resumed`` is recorded
    (with the upcast context of a newer state model version, ``_state_versions``)."""
    executor.log.epoch = await executor.store.claim(executor.run_id)
    executor.ready.set()
    # The log as read before the claim may have grown since: a previous owner that
    # had not yet noticed it lost the run could commit until the claim fenced it.
    if executor.store.last_seq(executor.run_id) != folded.seq:
        folded = fold_run(executor.store, executor.run_id, None)
        renamed = moves_for(folded, executor.config.renames)
        rename_steps(folded, renamed)
        upcast = resume_upcast(executor.run_id, folded, executor.codec, executor.config.state_type)
        executor.reload(folded)
        folded = copy.deepcopy(folded)
        if folded.status == "finished":
            executor.close(result=to_run_state(folded, executor.codec).result)
            return
    config = executor.config
    tag = state_tag(config.state_type)
    resumed = journal.run_resumed(
        executor.log.epoch, folded.status, renamed, state=tag, deprecated=config.deprecated
    )
    await executor.append([resumed, *(upcast or ())], status="running")
    if folded.status == "timed_out":
        executor.reset_budget()  # a fresh timeout budget (the fold resets it too)
    await go_on(executor, folded, updates, resumed=True, deletes=deletes)


async def go_on(
    executor: Starting,
    folded: Folded,
    updates: dict[str, Any] | None,
    *,
    resumed: bool,
    deletes: list[str] | None = None,
) -> None:
    """Goes on from ``folded``: operator updates first, then the work it left, in-progress
    events first (attempt counts kept), then the queues; waits are armed again."""
    if updates or deletes:
        await executor.operator_update(updates or {}, deletes)
    failed = folded.status == "failed"
    steps = executor.graph.steps
    exc = over_recovery_limit(executor.run_id, folded, steps, executor.config.max_recovery)
    if exc is not None:
        await executor.append([journal.run_failed(exc.step, exc)], status="failed")
        executor.end_with(exc)
        return
    load = executor.codec.load
    for step, progs in folded.in_progress.items():
        if step not in steps:
            continue  # stranded, and the caller said to proceed without it
        for p in progs.values():
            executor.deliver(
                step,
                Delivery(
                    p.ev.id,
                    load(p.ev.dump),
                    attempts=p.attempt,
                    failures=0 if failed else p.failures,
                    redelivered=True,
                    failure=None if failed else p.failure,
                ),
            )
    for step, queue in folded.queues.items():
        if step not in steps:
            continue
        for ev in queue.values():
            executor.deliver(step, Delivery(ev.id, load(ev.dump), durable=resumed))
    if executor.streams is not None:
        executor.streams.restore(folded, load, steps)
    for w in executor.waiters.values():
        executor.waits.arm(w)
    executor.waits.take_inbox()
    executor.waits.start_taking()  # what was sent as the run resumed follows its inbox
    executor.stream.ask_again(executor.waiters.values())
    executor.start_tasks()
