"""The executor of one run: queues, workers, attempts, retries, waits, timeouts.

Every change goes to the log first; only once its commit is durable does it take effect in
memory (the committed context, the queues): durable before visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, cast

from eventstore import (
    CodecError,
    ConcurrencyError,
    EventStoreError,
    LogCorruptedError,
    NewRun,
    ReadOnlyStoreError,
    Record,
    StoreClosedError,
    StoreUnavailableError,
    UnknownClassError,
    WriterFailedError,
)

from . import _journal as J
from ._attempt import Attempt, WaitSuspend, current_attempt
from ._catch_error import StepFailedEvent
from ._changes import KeyChange, encode_updates
from ._collects import COLLECT_PREFIX, CollectBuffers
from ._commit import (
    Outcome,
    Planned,
    Raised,
    Returned,
    Waited,
    commit_of,
    failure_record,
    streamed_records,
)
from ._context import Context, current_context
from ._errors import (
    RecoveryLimitError,
    RunAbandonedError,
    RunLostError,
    RunSuspendedError,
    WorkflowCancelledByUser,
    WorkflowCancelledError,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
)
from ._events import (
    Event,
    InputRequiredEvent,
    StartEvent,
    StepState,
    StopEvent,
    WorkflowCancelledEvent,
    WorkflowFailedEvent,
    WorkflowTimedOutEvent,
)
from ._fold import Folded, MemoRec, rename_steps, result_of, to_run_state
from ._live_context import LiveContext
from ._live_runs import own, release
from ._ownership import LeaseOwners
from ._read import fold_run
from ._renames import moves_for
from ._retry import RetryClock
from ._run_log import RunLog, Sealed
from ._stream import RunStream, say
from ._waits import Delivery, WaitInfo, Waits

if TYPE_CHECKING:
    from ._run_config import RunConfig
    from ._step import StepSpec

__all__ = ["Delivery", "Executor"]

# After this many conflicts in a row an attempt runs holding the run's state lock.
CONFLICTS_BEFORE_LOCK: Final = 3
# A snapshot of the folded state is written once the run's log bytes since the last one
# reach SNAPSHOT_FACTOR times its size (and at least SNAPSHOT_MIN_BYTES): snapshots then
# weigh at most a tenth of the log, and a read at any seq replays at most ten times the
# state's size of records. A run's executor also writes one as it lets go of the run.
SNAPSHOT_FACTOR: Final = 10
SNAPSHOT_MIN_BYTES: Final = 32 * 1024
# Seconds that attempts still running get to commit when another step's failure fails the
# run (``Workflow.failure_grace``).
DEFAULT_FAILURE_GRACE: Final = 2.0

# Why a commit may fail that is not the attempt's doing: the store cannot write (I/O, closed,
# read-only, unreachable) or the run is no longer this executor's. Any other failure to
# write an attempt's records is that attempt's failure, recorded as one.
_STORE_FAILURES: Final = (
    WriterFailedError,
    ConcurrencyError,
    StoreClosedError,
    StoreUnavailableError,
    ReadOnlyStoreError,
)


# A durable commit of a returned attempt, for _took_effect: what it planned, its context
# changes, and its seq.
_Written = tuple[Planned, list[KeyChange], int]


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


class _Conflict(ConcurrencyError):
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"stale reads of {keys}")


class Executor:
    """Runs one run in this process until it finishes, fails, is cancelled or suspended."""

    def __init__(
        self,
        config: RunConfig,
        run_id: str,
        rid: int,
        epoch: int,
        folded: Folded | None,
        *,
        stream_from: int = 0,
    ) -> None:
        self.config = config
        self.graph = config.graph
        self.codec = config.codec
        self.store = config.store
        self.run_id = run_id
        self.rid = rid
        self.ctx: Context[Any] = Context._bound(self, config.instance, config.state_type)
        # The context's values (the same objects as the component's: the context's store
        # reads them through the executor).
        self.live = live = LiveContext(self.codec)
        self.committed = live.committed
        self.versions = live.versions
        self.keylog = live.keylog
        self.state_lock = live.state_lock
        self.pin = live.pin
        self.queues: dict[str, asyncio.Queue[Delivery]] = {
            name: asyncio.Queue() for name in self.graph.steps
        }
        self.collects = CollectBuffers(live.versions)
        self.buffers = self.collects.buffers
        self.live_buffer = self.collects.live_buffer
        self.collect_put = self.collects.put
        self.collect_take = self.collects.take
        # Waits and events from outside (their dicts are read by the context and timers).
        self.waits = waits = Waits(self)
        self.waiters = waits.waiters
        self.answers = waits.answers
        self.unclaimed = waits.unclaimed
        self.next_id = 1
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.status = "running"
        self.closing = False
        self._settler: asyncio.Task[None] | None = None
        # Set once the executor holds its epoch: before that, its commits would be refused.
        self.ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy = 0  # deliveries queued or running
        # Attempts being handled; once a failure is to end the run (``_failing``), no new
        # one starts, and ``_drained`` is set when the failing one is the last.
        self._handling = 0
        self._failing = False
        self._drained = asyncio.Event()
        self.stream = stream = RunStream(verbose=config.verbose, resumed=folded is not None)
        self.stream_now = stream.stream_now
        self.subscribe = stream.subscribe
        self.origins = stream.origins
        # What ended the run, for the stream's last event: (step, attempts, elapsed seconds).
        self._failed_step: tuple[str, int | None, float | None] | None = None
        self._running: dict[tuple[str, int], int] = {}  # (step, worker) -> attempts running
        self._exec_before = 0.0
        self._clock_start: float | None = None
        self._stream_from = stream_from
        # The executor's commits, and its copy of their fold.
        self.log = RunLog(
            self.store,
            run_id,
            epoch,
            folded,
            self._on_lazy_failure,
            snapshot_factor=SNAPSHOT_FACTOR,
            snapshot_min_bytes=SNAPSHOT_MIN_BYTES,
        )
        self.submit = self.log.submit
        if folded is not None:
            # Live values must never share objects with the fold's JSON, which the
            # executor goes on folding its commits into (the codec does not copy).
            self._load(copy.deepcopy(folded))

    # ------------------------------------------------------------------ state from the log

    def reload(self, folded: Folded) -> None:
        """Starts over from a newer fold of the log (before any work was delivered)."""
        self.committed.clear()
        self.keylog.clear()
        self.buffers.clear()
        self.waits.clear()
        self.stream.forget()
        self.log.restart(folded)
        self._load(copy.deepcopy(folded))

    def _load(self, f: Folded) -> None:
        load = self.codec.load
        for key, entry in f.context.items():
            try:
                self.committed[key] = load(entry.dump)
            except UnknownClassError as exc:  # not damage: a class this program lacks
                exc.add_note(f"in record seq {entry.seq} of run {f.run_id!r}, context key {key!r}")
                raise
            except CodecError as exc:  # refused with the record named, before any work
                msg = f"record seq {entry.seq} of run {f.run_id!r}: context key {key!r}: {exc}"
                raise LogCorruptedError(msg, seq=entry.seq) from exc
            self.keylog[key] = [entry.full_bytes, entry.patch_bytes]
        for buf, by_type in f.buffers.items():
            self.buffers[buf] = {t: [(e.id, load(e.dump)) for e in es] for t, es in by_type.items()}
        for wid, w in f.waiters.items():
            self.waiters[wid] = WaitInfo(
                wid,
                w.step,
                w.ev.id,
                load(w.ev.dump),
                # The class, not its name: an answer matches whatever module it came under.
                cast("type[Event]", self.codec.resolve(w.awaited)),
                w.awaited,
                load(w.requirements) or {},
                w.deadline,
                None if w.waiter_event is None else load(w.waiter_event),
            )
        for wid, ans in f.answers.items():
            self.answers[wid] = None if ans is None else (ans.id, load(ans.dump))
        self.unclaimed.update((i, load(e.dump)) for i, e in f.unclaimed.items())
        self.next_id = f.next_id
        self._exec_before = f.exec_us / 1e6

    # ------------------------------------------------------------------ helpers for Context

    def poke(self) -> None:
        """Takes in the inbox now (something was posted to it)."""
        self.waits.poke()

    def send_external_nowait(self, event: Event) -> None:
        """Takes an event from outside any step now (``ctx.send_event`` on ``handler.ctx``)."""
        self.waits.send_external_nowait(event)

    async def operator_update(
        self, updates: Mapping[str, Any], deletes: list[str] | None = None
    ) -> int:
        """Records operator writes (``updates`` of ``resume``/``run_from``, ``handler.ctx``).

        :raises EncodeError: a value cannot be stored (nothing is recorded then).
        """
        live = self.live
        encoded = encode_updates(self.codec, updates)  # all refused before any is written
        await self.wait_ready()
        changes: list[KeyChange] = []
        for key, new in encoded.items():
            change = live.update_change(key, new)
            if change is not None:
                changes.append(change)
        changes.extend(KeyChange(k, deleted=True) for k in deletes or () if k in self.committed)
        if not changes:
            return 0
        records = live.state_records(None, changes)
        written = [c.key for c in changes]

        def on_written(seq: Any) -> None:
            live.mark_written(written, int(seq))

        async with self.state_lock:
            seq = await self.append(records, on_written=on_written)
        live.apply(changes, seq)
        self._observe(seq)
        return seq

    replaying: Final = False  # memoized calls are made (``_memo.MemoHost``)

    def memos_of(self, step: str, event_id: int) -> dict[str, MemoRec]:
        """The memoized calls recorded for ``step``'s input ``event_id`` (the live fold's)."""
        return self.folded.memos.get(step, {}).get(event_id, {})

    def new_event_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    # ------------------------------------------------------------------ committing

    @property
    def folded(self) -> Folded:
        """The folded state of every durable commit of this executor's run."""
        return self.log.folded

    def _on_lazy_failure(self, exc: Any) -> None:
        if not self.closing:
            self.end_with(exc)

    async def append(self, records: list[Record], **kw: Any) -> int:
        """Commits ``records`` (``kw``: :meth:`RunLog.commit`'s) and returns the last seq
        once it is durable."""
        res = await self.submit(records, **kw)
        return int(res.last_seq)

    # ------------------------------------------------------------------ entry points

    # Each entry point starts the run's first task and returns at once; the handler made
    # beside the executor follows the run from there.

    def launch(self, work: Coroutine[Any, Any, Any]) -> None:
        """Runs ``work`` as a task of the run (cancelled with it)."""
        self._spawn(work)

    def start(
        self, records: list[Record], start_event: StartEvent, *, with_context: bool = False
    ) -> None:
        """Starts a new run: its first commit (``records``: run_started, any context, the
        start event enqueued) creates it, then the start event reaches its steps.

        ``with_context``: the first commit writes context values (a run from a context),
        which the live state loads from the commit just folded.
        """
        self._spawn(self._start(records, start_event, with_context))

    def start_imported(self, records: list[Record], updates: dict[str, Any]) -> None:
        """Starts a new run whose first commit (``records``) holds a state from elsewhere (a
        context dict of another store); its queued work runs, its waits wait and ask again."""
        self.stream.will_ask_again()  # its waits' questions are asked again, as on a resume
        self._spawn(self._start_imported(records, updates))

    def fork(
        self,
        folded: Folded,
        parent: tuple[str, int],
        updates: dict[str, Any] | None,
        deletes: list[str] | None = None,
    ) -> None:
        """Starts a fork of ``parent`` (run id, seq) whose state there is ``folded``."""
        self._spawn(self._fork(folded, parent, updates, deletes))

    def resume(
        self,
        folded: Folded,
        updates: dict[str, Any] | None,
        *,
        renamed: dict[str, str] | None = None,
        deletes: list[str] | None = None,
    ) -> None:
        """Continues the run from ``folded``, the fold of its log (its owner lock is held):
        claims it (fencing any previous owner), records the resume, and goes on."""
        self._spawn(self._resume(folded, updates, renamed, deletes))

    async def _start(
        self, records: list[Record], start_event: StartEvent, with_context: bool
    ) -> None:
        config = self.config
        await config.slot(self.done)  # a new run: num_concurrent_runs counts it
        await self.append(records, create=config.new_run())
        self._hold(self.store.run(self.run_id).rid)
        if with_context:
            self._load(copy.deepcopy(self.folded))
        self.ready.set()
        for t in self.graph.route(type(start_event)):
            self.deliver(t, Delivery(1, start_event))
        self.waits.start_taking()
        self.start_tasks()

    async def _start_imported(self, records: list[Record], updates: dict[str, Any]) -> None:
        config = self.config
        await config.slot(self.done)
        await self.append(records, create=config.new_run())
        self._hold(self.store.run(self.run_id).rid)
        self._load(copy.deepcopy(self.folded))
        self.ready.set()
        await self._go_on(copy.deepcopy(self.folded), updates, resumed=False)

    async def _fork(
        self,
        folded: Folded,
        parent: tuple[str, int],
        updates: dict[str, Any] | None,
        deletes: list[str] | None,
    ) -> None:
        config = self.config
        # Read before the fork's first commit is folded into the same state.
        ended = folded.result if folded.status == "finished" else None
        await self.append(
            [
                J.run_started(
                    config.name,
                    self.graph.fingerprint(),
                    0,
                    None,
                    parent,
                    self.codec,
                    self.graph.describe(),
                )
            ],
            create=NewRun(
                meta={"workflow": config.name},
                parent_run_id=parent[0],
                parent_seq=parent[1],
                status="running",
            ),
        )
        self._hold(self.store.run(self.run_id).rid)
        self.ready.set()
        if ended is not None:
            # Forked where the parent had finished: nothing is left to run, so the fork
            # ends at once with the parent's result at that point (after any updates).
            if updates or deletes:
                await self.operator_update(updates or {}, deletes)
            stop = self.codec.load(ended)
            await self.append([J.run_finished(ended, folded.next_id)], status="finished")
            self._finish(stop)
            return
        await self._go_on(copy.deepcopy(folded), updates, resumed=False, deletes=deletes)

    async def _resume(
        self,
        folded: Folded,
        updates: dict[str, Any] | None,
        renamed: dict[str, str] | None,
        deletes: list[str] | None,
    ) -> None:
        self.log.epoch = await self.store.claim(self.run_id)
        self.ready.set()
        # The log as read before the claim may have grown since: a previous owner that
        # had not yet noticed it lost the run could commit until the claim fenced it.
        if self.store.last_seq(self.run_id) != folded.seq:
            folded = fold_run(self.store, self.run_id, None)
            renamed = moves_for(folded, self.config.renames)
            rename_steps(folded, renamed)
            self.reload(folded)
            folded = copy.deepcopy(folded)
            if folded.status == "finished":
                self._close(result=to_run_state(folded, self.codec).result)
                return
        await self.append([J.run_resumed(self.log.epoch, folded.status, renamed)], status="running")
        if folded.status == "timed_out":
            self._exec_before = 0.0  # a fresh timeout budget (the fold resets it too)
        await self._go_on(folded, updates, resumed=True, deletes=deletes)

    def recovery_limit(self) -> RecoveryLimitError | None:
        """The error that ends this run at its resume if its in-progress input was started
        ``max_recovery_attempts`` times without ending, or None."""
        return over_recovery_limit(
            self.run_id, self.folded, self.graph.steps, self.config.max_recovery
        )

    def _hold(self, rid: int) -> None:
        """The run's row exists (id ``rid``): this executor owns it from now on."""
        self.rid = rid
        own(self.store, self.config.owners, self.run_id, rid, self)

    async def _go_on(
        self,
        folded: Folded,
        updates: dict[str, Any] | None,
        *,
        resumed: bool,
        deletes: list[str] | None = None,
    ) -> None:
        """Goes on from ``folded``: operator updates first, then the work it left, in-progress
        events first (attempt counts kept), then the queues; waits are armed again."""
        if updates or deletes:
            await self.operator_update(updates or {}, deletes)
        failed = folded.status == "failed"
        steps = self.graph.steps
        exc = over_recovery_limit(self.run_id, folded, steps, self.config.max_recovery)
        if exc is not None:
            await self.append([J.run_failed(exc.step, exc)], status="failed")
            self.end_with(exc)
            return
        load = self.codec.load
        for step, progs in folded.in_progress.items():
            if step not in steps:
                continue  # stranded, and the caller said to proceed without it
            for p in progs.values():
                self.deliver(
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
                self.deliver(step, Delivery(ev.id, load(ev.dump), durable=resumed))
        for w in self.waiters.values():
            self.waits.arm(w)
        self.waits.take_inbox()
        self.waits.start_taking()  # what was sent as the run resumed follows its inbox
        self.stream.ask_again(self.waiters.values())
        self.start_tasks()

    # ------------------------------------------------------------------ the run

    def start_tasks(self) -> None:
        """Starts the workers of every step, the inbox poller and the timeout watchdog."""
        for name, spec in self.graph.steps.items():
            for worker in range(spec.num_workers):
                self._spawn(self._worker(name, spec, worker))
        self._spawn(self.waits.inbox_loop())
        if self.config.timeout is not None:
            self._spawn(self._watchdog(self.config.timeout))
        owners = self.config.owners
        if isinstance(owners, LeaseOwners):
            self._spawn(self._heartbeat(owners.renew, owners.ttl))
        self._clock_start = time.monotonic()
        self._update_clock()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self.closing:
            self.end_with(exc)

    def deliver(self, step: str, d: Delivery) -> None:
        self._busy += 1
        queue = self.queues[step]
        if self.stream.watched and self._tasks:
            # Every worker of the step is taken: the event waits for one (LlamaIndex's
            # PREPARING). Only counted when someone watches.
            running = sum(1 for s, _ in self._running if s == step)
            if running + queue.qsize() >= self.graph.steps[step].num_workers:
                self.stream.step_state(step, -1, StepState.PREPARING, d.event)
        queue.put_nowait(d)

    async def _worker(self, step: str, spec: StepSpec, worker: int) -> None:
        queue = self.queues[step]
        while True:
            d = await queue.get()
            if self._failing:  # the run is failing: what is queued stays queued
                self._busy -= 1
                continue
            self._handling += 1
            try:
                await self._handle(step, spec, d, worker)
            finally:
                self._busy -= 1
                self._handling -= 1
                if self._failing and self._handling <= 1:
                    self._drained.set()
                self._update_clock()

    async def _handle(self, step: str, spec: StepSpec, d: Delivery, worker: int) -> None:
        durable_start = d.redelivered or d.durable
        dequeued: list[Record] | None = None
        if not d.redelivered:
            dequeued = [J.dequeued(step, d.event_id, worker)]
            if durable_start:
                await self.append(dequeued)
                dequeued = None  # else submitted with the attempt's start, just below
        attempt = d.attempts
        clock = RetryClock.resume(d.failures, d.failure)
        if clock.retry_at is not None:
            # Resumed mid-backoff: the retry is due when the failure's record says.
            await clock.wait_due()
        conflicts = 0
        while True:
            attempt += 1
            started = [J.step_started(step, d.event_id, attempt)]
            if durable_start:
                # An input delivered by a resume may be what killed the process before:
                # its start is made durable first, so every such death is counted.
                await self.append(started)
                durable_start = False
            elif dequeued is not None:
                self.log.lazy_pair(dequeued, started)
                dequeued = None
            else:
                self.log.lazy(started)
            att = Attempt(step, d.event_id, attempt, d.event, host=self)
            att.retry = clock
            self.stream.step_state(step, worker, StepState.RUNNING, d.event)
            self._running[(step, worker)] = attempt
            ended: Event | None = None  # what the attempt returned, once that took effect
            if conflicts >= CONFLICTS_BEFORE_LOCK:
                await self.state_lock.acquire()
                att.holds_lock = True
            try:
                outcome = await self._invoke(spec, att)
                if isinstance(outcome, Returned):
                    try:
                        written = await self._commit_success(att, outcome)
                    except _STORE_FAILURES:
                        raise
                    except Exception as err:
                        # What the attempt produced cannot be written (a value the log
                        # cannot hold, a commit the store refused): that is its failure.
                        outcome = Raised(err, traceback.format_exc())
                    else:
                        if written is not None:
                            ended = outcome.result
                            self.stream.step_state(
                                step, worker, StepState.NOT_RUNNING, d.event, ended
                            )
                            self._took_effect(att, *written)
                            return
                        conflicts += 1
                        continue
                elif isinstance(outcome, Waited):
                    try:
                        await self.waits.commit_wait(att, outcome.request)
                    except _STORE_FAILURES:
                        raise
                    except Exception as err:
                        outcome = Raised(err, traceback.format_exc())
                    else:
                        return
                exc = outcome.error
                stale = self.live.stale(att)
                if stale:
                    # It failed on reads that another attempt had already changed: that
                    # is a conflict, not the step's failure.
                    await self._commit_conflict(att, stale)
                    conflicts += 1
                    continue
                delay, retry_at, elapsed = clock.decide(
                    spec.retry_policy, exc, (self.run_id, step, d.event_id, attempt)
                )
                recovery = None if delay is not None else self._recovery(att, exc, clock, elapsed)
                await self._commit_failure(
                    att,
                    outcome,
                    delay,
                    retry_at,
                    elapsed,
                    None if recovery is None else recovery[2],
                )
                if recovery is not None:
                    self.deliver(recovery[0], recovery[1])  # its commit is durable
                    return
                if delay is None:
                    await self._fail_run(step, exc, clock.failures, elapsed)
                    return
                if self.config.verbose:
                    say(f"[{step}:{worker}] failed with {exc!r}, retrying in {delay} s")
                await asyncio.sleep(delay)
                if self._failing:
                    return  # another step is failing the run: its retry waits for a resume
            finally:
                self._running.pop((step, worker), None)
                if ended is None and not self.closing:
                    self.stream.step_state(step, worker, StepState.NOT_RUNNING, d.event)
                if att.collects:  # it did not commit (or its commit raised): undone
                    self.collects.settle(att, committed=False)
                if att.holds_lock:
                    self.state_lock.release()
                self.live.unpin(att)

    async def _invoke(self, spec: StepSpec, att: Attempt) -> Outcome:
        kwargs: dict[str, Any] = {spec.event_param: att.event}
        if spec.ctx_param is not None:
            kwargs[spec.ctx_param] = self.ctx
        args = (self.config.instance,) if spec.bound else ()
        token = current_attempt.set(att)
        ctx_token = current_context.set(self.ctx)
        try:
            if spec.resources:  # built (or taken from the cache) for each attempt, never logged
                kwargs.update(await self.config.resources.inject(spec.resources))
            if spec.is_async:
                result = await spec.func(*args, **kwargs)
            else:
                # A plain def runs in a worker thread (which sees this attempt): it cannot
                # be interrupted, so if the run ends first its late outcome is dropped.
                result = await asyncio.to_thread(spec.func, *args, **kwargs)
        except WaitSuspend as ws:
            return Waited(ws.request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return Raised(exc, traceback.format_exc())
        finally:
            current_context.reset(ctx_token)
            current_attempt.reset(token)
        if result is not None and not isinstance(result, Event):
            wrong = WorkflowRuntimeError(
                f"Step function {spec.name} returned {type(result).__name__} instead of an"
                " Event instance."
            )
            return Raised(wrong, "")
        return Returned(result)

    def _streamed(self, att: Attempt) -> list[Record]:
        return streamed_records(self.codec, att)

    def _recovery(
        self, att: Attempt, exc: Exception, clock: RetryClock, elapsed: float
    ) -> tuple[str, Delivery, Record] | None:
        """The ``@catch_error`` handler that takes over a step out of retries, if any: its
        name, the delivery of its StepFailedEvent and that event's ``enqueued`` record.

        None when no handler covers the step, or its ``max_recoveries`` along this event's
        lineage are used up (the run fails then).
        """
        route = self.config.catchers.get(att.step)
        if route is None:
            return None
        handler, limit = route
        counts = self.folded.recoveries.get(att.event_id, {})
        n = counts.get(handler, 0) + 1
        if n > limit:
            return None
        failed_at = clock.last_failed_at if clock.last_failed_at is not None else time.time()
        ev = StepFailedEvent(
            step_name=att.step,
            input_event=att.event,
            exception=exc,
            attempts=clock.failures,
            elapsed_seconds=elapsed,
            failed_at=datetime.fromtimestamp(failed_at, tz=UTC),
        )
        ev_id = self.new_event_id()
        record = J.enqueued_recovery(
            handler,
            ev_id,
            self.codec.dump(ev),
            [att.event_id, att.attempt],
            {**counts, handler: n},
        )
        return handler, Delivery(ev_id, ev), record

    async def _commit_failure(
        self,
        att: Attempt,
        outcome: Raised,
        delay: float | None,
        retry_at: float | None,
        elapsed: float,
        recovery: Record | None = None,
    ) -> None:
        """Records an attempt's failure; a failure is recorded whatever it carries.

        ``recovery`` (the StepFailedEvent a ``@catch_error`` handler is given) is in the
        same commit, so the handler's input and the recovery count are durable together.
        """
        extra = [] if recovery is None else [recovery]
        failed = failure_record(att, outcome, delay=delay, retry_at=retry_at, elapsed=elapsed)
        try:
            streamed = self._streamed(att)
        except CodecError:
            streamed = []  # what it streamed cannot be stored, unlike its failure
        try:
            await self.append([failed, *extra, *streamed])
        except _STORE_FAILURES:
            raise
        except Exception:
            # Refused for its size or content: the failure alone, without its traceback.
            bare = failure_record(
                att, outcome, delay=delay, retry_at=retry_at, elapsed=elapsed, with_traceback=False
            )
            await self.append([bare, *extra])

    async def _commit_conflict(self, att: Attempt, keys: list[str]) -> None:
        shown = [k.replace(COLLECT_PREFIX, "collect:") for k in keys]
        await self.append(
            [J.step_conflicted(att.step, att.event_id, att.attempt, shown), *self._streamed(att)]
        )

    async def _commit_success(self, att: Attempt, outcome: Returned) -> _Written | None:
        """Writes a returned attempt's commit; returns what :meth:`_took_effect` needs to
        make it take effect, or None when its reads went stale (it must re-run).

        When it raises, the commit was not written and nothing of it took effect.
        """
        changes = self.live.key_changes(att)
        first_id = self.next_id
        # One id per emitted event, taken whether or not the commit is written.
        self.next_id += len(att.sent) + (outcome.result is not None)
        planned = commit_of(
            att,
            outcome,
            self.live.state_records(att.step, changes),
            codec=self.codec,
            route=self.graph.route,
            first_id=first_id,
        )
        written = [c.key for c in changes]
        taken_keys = sorted({COLLECT_PREFIX + k for k, _ in att.taken})
        owners = [o for o in att.deps if not o.put_written]
        if owners and not att.holds_lock:
            # Its take is written after the puts it took (so the log folds to the live
            # buffer), or not at all if one of those attempts does not commit.
            outcomes = [o.outcome for o in owners if o.outcome is not None]
            if not all(await asyncio.gather(*outcomes)):
                await self._commit_conflict(att, taken_keys)
                return None
            owners = []
        # An attempt holding the state lock never waits for another (which may wait for
        # the lock to commit): its commit is refused unless those puts are written by then.

        def check() -> None:
            stale = self.live.stale(att)
            if stale:
                raise _Conflict(stale)
            if owners and not all(o.put_written for o in owners):
                raise _Conflict(taken_keys)

        def on_written(seq: Any) -> None:
            att.put_written = True
            self.live.mark_written(written, int(seq))

        # A commit that changes state waits for an exclusive (edit_state) attempt to end.
        hold = bool(written) and not att.holds_lock and self.state_lock.locked()
        if hold:
            await self.state_lock.acquire()
        try:
            seq = await self.append(
                planned.records,
                check=check if att.reads or owners else None,
                on_written=on_written if written or att.collects else None,
                status="finished" if planned.stop is not None else None,
            )
        except _Conflict as exc:
            await self._commit_conflict(att, exc.keys)
            return None
        finally:
            if hold:
                self.state_lock.release()
        return planned, changes, seq

    def _took_effect(
        self, att: Attempt, planned: Planned, changes: list[KeyChange], seq: int
    ) -> None:
        """A returned attempt's commit is durable: now it takes effect.

        The attempt's own reads end here, so only other live readers of a key make
        applying its patch copy the value.
        """
        self.live.unpin(att)
        att.reads.clear()
        self.live.apply(changes, seq)
        if att.collects:
            self.collects.settle(att, committed=True, seq=seq)
        for wid in att.answers_used:
            self.answers.pop(wid, None)
        for ev_id, (ev, target) in zip(planned.ids, planned.emitted, strict=True):
            if (
                target is None
                and not isinstance(ev, StopEvent | InputRequiredEvent)
                and not self.graph.route(type(ev))
            ):
                self.waits.park(ev_id, ev)  # it may answer a wait of another step
        for step, ev_id, ev in planned.deliveries:
            self.deliver(step, Delivery(ev_id, ev))
        for ev in planned.asked:
            self.stream_now(ev, att)
        self._observe(seq)
        if planned.stop is not None:
            self._finish(planned.stop[1])

    def _observe(self, seq: int) -> None:
        hook = self.config.commit_hook
        if hook is not None:
            hook(self, seq)

    # ------------------------------------------------------------------ time

    def only_waiters(self) -> bool:
        return bool(self.waiters) and self._busy == 0

    def _update_clock(self) -> None:
        now = time.monotonic()
        paused = self.only_waiters()
        if paused and self._clock_start is not None:
            self._exec_before += now - self._clock_start
            self._clock_start = None
            self.stream.idle()  # nothing to do but wait for an event
        elif not paused and self._clock_start is None:
            self._clock_start = now

    def exec_time(self) -> float:
        running = 0.0 if self._clock_start is None else time.monotonic() - self._clock_start
        return self._exec_before + running

    async def _heartbeat(self, renew: Callable[[str], Any], ttl: float) -> None:
        """Renews the run's lease; an executor that lost it stops without writing more."""
        while True:
            await asyncio.sleep(ttl / 3)
            if not await renew(self.run_id):
                self.end_with(RunLostError(self.run_id, "its lease lapsed before renewal"))
                return

    def abandon(self) -> None:
        """Stops without recording anything: the run stays unfinished for another executor.

        What this executor was running is re-run by the next one (graceful shutdown).
        """
        self.end_with(RunAbandonedError(self.run_id))

    async def _watchdog(self, timeout: float) -> None:  # noqa: ASYNC109 - the run's budget
        while True:
            self._update_clock()
            remaining = timeout - self.exec_time()
            if remaining <= 0:
                active = sorted({s for s, _ in self._running})
                steps = (
                    "Currently active steps: " + ", ".join(active) if active else "No steps active"
                )
                await self._end_run(
                    J.run_timed_out(self.exec_time()),
                    WorkflowTimeoutError(
                        f"Operation timed out after {timeout} seconds of execution"
                        f" (run {self.run_id!r}). {steps}"
                    ),
                )
                return
            await asyncio.sleep(min(remaining, 0.5) if self._clock_start is not None else 0.05)

    # ------------------------------------------------------------------ ending

    async def _fail_run(
        self,
        step: str,
        exc: BaseException,
        attempts: int | None = None,
        elapsed: float | None = None,
    ) -> None:
        if self._failing:
            return  # another failure is ending the run: this one is recorded as a step's
        self._failing = True
        self._failed_step = (step, attempts, elapsed)
        # Attempts of other steps still running get the grace period to commit, so that a
        # resume does not pay for them again; past it they are cancelled with the run.
        grace = self.config.failure_grace
        if self._handling > 1 and grace > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        try:
            await self.append([J.run_failed(step, exc)], status="failed")
        except Sealed:
            return  # something else ended the run first
        self.end_with(exc)

    async def _end_run(self, record: Record, exc: BaseException) -> None:
        if self.closing:
            return
        status = {
            J.RUN_CANCELLED: "cancelled",
            J.RUN_TIMED_OUT: "timed_out",
            J.RUN_SUSPENDED: "waiting",
        }[record.kind]
        try:
            await self.append([record], status=status)
        except Sealed:
            return
        self.end_with(exc)

    async def wait_ready(self) -> None:
        """Waits until the executor holds the run (or has already ended)."""
        await self.ready.wait()  # set on claiming the run, and on ending

    async def cancel(self) -> None:
        await self.wait_ready()
        await self._end_run(
            J.run_cancelled(), WorkflowCancelledByUser(f"run {self.run_id!r} was cancelled")
        )

    async def suspend(self, exc: BaseException) -> None:
        await self.wait_ready()
        await self._end_run(J.run_suspended(), exc)

    def _finish(self, stop: StopEvent) -> None:
        self.status = "finished"
        self.stream.finish(stop)
        self._close(result=result_of(stop))

    def end_with(self, exc: BaseException) -> None:
        if isinstance(exc, Sealed):
            return  # the run already ended; the commit that lost the race is moot
        if isinstance(exc, ConcurrencyError) and not isinstance(exc, _Conflict):
            if self._cancelled_elsewhere():
                # `workflow cancel` (or another process's cancel) took the run over to end
                # it: this handler's run was cancelled, not lost to another executor.
                self.status = "cancelled"
                self._close(exc=WorkflowCancelledByUser(f"run {self.run_id!r} was cancelled"))
                return
            exc = RunLostError(self.run_id, str(exc))
        self.status = "failed"
        self._close(exc=exc)

    def _cancelled_elsewhere(self) -> bool:
        """Whether another process cancelled the run (its runs row says so)."""
        try:
            return self.store.run(self.run_id).status == "cancelled"
        except EventStoreError:
            return False

    def _last_event(self, exc: BaseException) -> StopEvent | None:
        """The stream's last event for a run that ended with ``exc`` (as LlamaIndex's)."""
        if isinstance(exc, WorkflowTimeoutError):
            timeout = self.config.timeout or 0.0
            return WorkflowTimedOutEvent(
                timeout=timeout, active_steps=sorted({s for s, _ in self._running})
            )
        if isinstance(exc, WorkflowCancelledError):
            return WorkflowCancelledEvent()
        if isinstance(exc, RunSuspendedError | RunAbandonedError):
            return None  # the run goes on elsewhere, or later
        step, attempts, elapsed = self._failed_step or ("", None, None)
        return WorkflowFailedEvent(
            step_name=step, exception=exc, attempts=attempts, elapsed_seconds=elapsed
        )

    def _close(self, *, result: Any = None, exc: BaseException | None = None) -> None:
        if self.closing:
            return
        self.closing = True
        # Every task of the run stops (the caller's own at its next await); the handler
        # resolves once they all have, so nothing of the run outlives awaiting it.
        tasks = list(self._tasks)
        last_snapshot: list[asyncio.Future[Any]] = []

        async def settle() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)
            # The handler resolves once the last snapshot is written (or failed): a read of
            # the latest state right after ``await handler`` then folds nothing.
            await asyncio.gather(*last_snapshot, return_exceptions=True)
            self.ctx._ended(self)  # idle from here: writes open the context's next run
            if self.done.done():
                return
            if exc is not None:
                self.done.set_exception(exc)
            else:
                self.done.set_result(result)

        # Scheduled first: whatever the cleanup below meets, the handler resolves.
        self._settler = asyncio.get_running_loop().create_task(settle())
        self.ready.set()  # nobody may wait for a start that will not come
        for task in tasks:
            task.cancel()
        for w in self.waiters.values():
            if w.timer is not None:
                w.timer.cancel()
        self.stream.end(None if exc is None else self._last_event(exc))
        try:
            if self.log.unsnapshotted and not self.store._closed and self.store._failed is None:
                # The next reader of the latest state folds nothing. A cache is never worth
                # failing the run's ending over.
                with contextlib.suppress(EventStoreError):
                    fut = self.log.write_snapshot(lazy=False, last=True)
                    if fut is not None:
                        last_snapshot.append(fut)
        finally:
            release(self.store, self.config.owners, self.run_id, self.rid, self)
