"""The step workers of a run: each takes deliveries from its step's queue and runs
attempts until one ends the input (returned, waiting, failed for good, or taken over by a
``@catch_error`` handler), retrying and re-running conflicted attempts.

An attempt's outcome (:mod:`workflow._commit`) is written first; only once its commit is
durable does it take effect (durable before visible). The executor owns one
:class:`StepRunner`, which reaches the rest of the run through the executor's public parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from typing import TYPE_CHECKING, Any, Final

from eventstore import (
    CodecError,
    ConcurrencyError,
    ReadOnlyStoreError,
    Record,
    StoreClosedError,
    StoreUnavailableError,
    WriterFailedError,
)

from . import _journal as journal
from ._attempt import Attempt, WaitSuspend, current_attempt
from ._catch_error import recovery_of
from ._changes import KeyChange
from ._collect_call import event_inputs
from ._collects import COLLECT_PREFIX
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
from ._context import current_context
from ._errors import WorkflowRuntimeError
from ._events import Event, StepState
from ._retry import RetryClock
from ._run_log import Sealed
from ._step_queue import StepQueue
from ._step_shapes import returned_events
from ._stream import say
from ._waits import Delivery

if TYPE_CHECKING:
    from ._step import StepSpec
    from ._steps_host import StepsHost

__all__ = ["CONFLICTS_BEFORE_LOCK", "Conflict", "StepRunner"]

# After this many conflicts in a row an attempt runs holding the run's state lock.
CONFLICTS_BEFORE_LOCK: Final = 3

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


class Conflict(ConcurrencyError):
    """An attempt's commit refused in the writer: ``keys`` it read changed since."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"stale reads of {keys}")


class StepRunner:
    """The queues and workers of every step of one run, and the attempts they run."""

    def __init__(self, executor: StepsHost) -> None:
        self._executor = executor
        self.queues: dict[str, StepQueue[Delivery]] = {
            name: StepQueue() for name in executor.graph.steps
        }
        # The step whose worker is making its commit take effect, until that commit's first
        # delivery to the same step: the worker takes it itself (see _step_queue).
        self._finishing: str | None = None
        self._busy = 0  # deliveries queued or running
        # Attempts being handled; once a failure is to end the run (``_failing``), no new
        # one starts, and ``_drained`` is set when the failing one is the last.
        self._handling = 0
        self._failing = False
        self._drained = asyncio.Event()
        # What ended the run, for the stream's last event: (step, attempts, elapsed seconds).
        self.failed_step: tuple[str, int | None, float | None] | None = None
        self._running: dict[tuple[str, int], int] = {}  # (step, worker) -> attempts running

    @property
    def idle(self) -> bool:
        """Whether no delivery is queued or running."""
        return self._busy == 0

    @property
    def busy(self) -> int:
        """How many deliveries are queued or running."""
        return self._busy

    def active_steps(self) -> list[str]:
        """The steps with an attempt running now, sorted."""
        return sorted({s for s, _ in self._running})

    def deliver(self, step: str, d: Delivery) -> None:
        self._busy += 1
        queue = self.queues[step]
        if self._executor.stream.watched and self._executor.started:
            # Every worker of the step is taken: the event waits for one (LlamaIndex's
            # PREPARING). Only counted when someone watches.
            running = sum(1 for s, _ in self._running if s == step)
            if running + queue.qsize() >= self._executor.graph.steps[step].num_workers:
                self._executor.stream.step_state(step, -1, StepState.PREPARING, d.event)
        if step == self._finishing and queue.empty():
            # The worker delivering it reads this queue next, with no await in between: it
            # takes the delivery itself, so no other worker is woken only to find none.
            self._finishing = None
            queue.put(d, wake=False)
        else:
            queue.put(d)

    async def work(self, step: str, spec: StepSpec, worker: int) -> None:
        queue = self.queues[step]
        while True:
            d = await queue.get()
            if self._executor.closing:  # the run ended (its stop): nothing starts after it
                self._busy -= 1
                return
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
                self._executor.update_clock()

    async def _handle(self, step: str, spec: StepSpec, d: Delivery, worker: int) -> None:
        durable_start = d.redelivered or d.durable
        dequeued: list[Record] | None = None
        if not d.redelivered:
            dequeued = [journal.dequeued(step, d.event_id, worker)]
            if durable_start:
                await self._executor.append(dequeued)
                dequeued = None  # else submitted with the attempt's start, just below
        attempt = d.attempts
        clock = RetryClock.resume(d.failures, d.failure)
        if clock.retry_at is not None:
            # Resumed mid-backoff: the retry is due when the failure's record says.
            await clock.wait_due()
        conflicts = 0
        while True:
            attempt += 1
            started = [journal.step_started(step, d.event_id, attempt)]
            if durable_start:
                # An input delivered by a resume may be what killed the process before:
                # its start is made durable first, so every such death is counted.
                await self._executor.append(started)
                durable_start = False
            elif dequeued is not None:
                self._executor.log.begun(dequeued, started)
                dequeued = None
            else:
                self._executor.log.begun(started)
            att = Attempt(step, d.event_id, attempt, d.event, host=self._executor)
            att.retry = clock
            self._executor.stream.step_state(step, worker, StepState.RUNNING, d.event)
            self._running[(step, worker)] = attempt
            ended: Event | None = None  # what the attempt returned, once that took effect
            if conflicts >= CONFLICTS_BEFORE_LOCK:
                await self._executor.state_lock.acquire()
                att.holds_lock = True
            try:
                outcome = await self._invoke(spec, att)
                if att.refused is not None:
                    # This code cannot finish the input (deprecate_patch): nothing of the
                    # attempt is recorded and the run stops, resumable by code that can.
                    self._executor.stop_refused(att.refused)
                    return
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
                            self._executor.stream.step_state(
                                step, worker, StepState.NOT_RUNNING, d.event, ended
                            )
                            self._finishing = step
                            try:
                                self._took_effect(att, *written)
                            finally:
                                self._finishing = None
                            return
                        conflicts += 1
                        continue
                elif isinstance(outcome, Waited):
                    try:
                        await self._executor.waits.commit_wait(att, outcome.request)
                    except _STORE_FAILURES:
                        raise
                    except Exception as err:
                        outcome = Raised(err, traceback.format_exc())
                    else:
                        return
                exc = outcome.error
                stale = self._executor.live.stale(att)
                if stale:
                    # It failed on reads that another attempt had already changed: that
                    # is a conflict, not the step's failure.
                    await self._commit_conflict(att, stale)
                    conflicts += 1
                    continue
                delay, retry_at, elapsed = clock.decide(
                    spec.retry_policy, exc, (self._executor.run_id, step, d.event_id, attempt)
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
                if att.holds_lock:
                    # Its failure is recorded: steps waiting to edit the state go on while
                    # it waits to retry, or the run gives its other steps their grace.
                    att.holds_lock = False
                    self._executor.state_lock.release()
                if recovery is not None:
                    self.deliver(recovery[0], recovery[1])  # its commit is durable
                    if self._executor.streams is not None:
                        self._executor.streams.done(d.event_id)  # the handler takes over
                    return
                if delay is None:
                    await self.fail_run(step, exc, clock.failures, elapsed)
                    return
                if self._executor.config.verbose:
                    say(f"[{step}:{worker}] failed with {exc!r}, retrying in {delay} s")
                await asyncio.sleep(delay)
                if self._failing:
                    return  # another step is failing the run: its retry waits for a resume
            finally:
                self._running.pop((step, worker), None)
                if ended is None and not self._executor.closing:
                    self._executor.stream.step_state(step, worker, StepState.NOT_RUNNING, d.event)
                if att.collects:  # it did not commit (or its commit raised): undone
                    self._executor.collects.settle(att, committed=False)
                if att.holds_lock:
                    att.holds_lock = False
                    self._executor.state_lock.release()
                self._executor.live.unpin(att)

    async def _invoke(self, spec: StepSpec, att: Attempt) -> Outcome:
        kwargs = event_inputs(self._executor, att, spec)
        if kwargs is None:
            return Returned(None)  # a join waiting for its other events, say
        if spec.ctx_param is not None:
            kwargs[spec.ctx_param] = self._executor.ctx
        args = (self._executor.config.instance,) if spec.bound else ()
        token = current_attempt.set(att)
        ctx_token = current_context.set(self._executor.ctx)
        try:
            if spec.resources:  # built (or taken from the cache) for each attempt, never logged
                kwargs.update(await self._executor.config.resources.inject(spec.resources))
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
        listed = type(result) is list
        try:
            result, spread = returned_events(spec, result)
        except WorkflowRuntimeError as wrong:
            return Raised(wrong, "")
        if result is not None and not isinstance(result, Event):
            wrong = WorkflowRuntimeError(
                f"Step function {spec.name} returned {type(result).__name__} instead of an"
                " Event instance."
            )
            return Raised(wrong, "")
        if listed:
            att.spread = len(att.sent)  # a fan-out's list: each is sent, a stream's member
        att.sent.extend((ev, None) for ev in spread)
        return Returned(result)

    def _streamed(self, att: Attempt) -> list[Record]:
        return streamed_records(self._executor.codec, att)

    def _recovery(
        self, att: Attempt, exc: Exception, clock: RetryClock, elapsed: float
    ) -> tuple[str, Delivery, Record] | None:
        """The ``@catch_error`` handler that takes over a step out of retries, if any: its
        name, the delivery of its StepFailedEvent and that event's ``enqueued`` record."""
        executor = self._executor
        found = recovery_of(
            att,
            exc,
            clock,
            elapsed,
            route=executor.config.catchers.get(att.step),
            counts=executor.folded.recoveries.get(att.event_id, {}),
            new_id=executor.new_event_id,
            codec=executor.codec,
        )
        if found is None:
            return None
        handler, ev_id, ev, record = found
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
            await self._executor.append([failed, *extra, *streamed])
        except _STORE_FAILURES:
            raise
        except Exception:
            # Refused for its size or content: the failure alone, without its traceback.
            bare = failure_record(
                att, outcome, delay=delay, retry_at=retry_at, elapsed=elapsed, with_traceback=False
            )
            await self._executor.append([bare, *extra])

    async def _commit_conflict(self, att: Attempt, keys: list[str]) -> None:
        shown = [k.replace(COLLECT_PREFIX, "collect:") for k in keys]
        conflicted = journal.step_conflicted(att.step, att.event_id, att.attempt, shown)
        await self._executor.append([conflicted, *self._streamed(att)])

    async def _commit_success(self, att: Attempt, outcome: Returned) -> _Written | None:
        """Writes a returned attempt's commit; returns what :meth:`_took_effect` needs to
        make it take effect, or None when its reads went stale (it must re-run).

        When it raises, the commit was not written and nothing of it took effect.
        """
        changes = self._executor.live.key_changes(att)
        book = self._executor.streams
        first_id = self._executor.next_id
        # One id per emitted event, taken whether or not the commit is written.
        self._executor.next_id += len(att.sent) + (outcome.result is not None)
        planned = commit_of(
            att,
            outcome,
            self._executor.live.state_records(att.step, changes),
            codec=self._executor.codec,
            route=self._executor.graph.route,
            first_id=first_id,
            flows=None if book is None else book.flows(att.step, att.event_id),
        )
        written = [c.key for c in changes]
        taken_keys = sorted({COLLECT_PREFIX + k for k, _ in att.taken}) if att.taken else []
        owners = [o for o in att.deps if not o.put_written] if att.deps else []
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
            stale = self._executor.live.stale(att)
            if stale:
                raise Conflict(stale)
            if owners and not all(o.put_written for o in owners):
                raise Conflict(taken_keys)

        def on_written(seq: Any) -> None:
            att.put_written = True
            self._executor.live.mark_written(written, int(seq))

        # A commit that changes state waits for an exclusive (edit_state) attempt to end.
        hold = bool(written) and not att.holds_lock and self._executor.state_lock.locked()
        if hold:
            await self._executor.state_lock.acquire()
        try:
            # The log's own submission (what ``append`` awaits): one coroutine less a step.
            res = await self._executor.log.submit(
                planned.records,
                check=check if att.reads or owners else None,
                on_written=on_written if written or att.collects else None,
                status="finished" if planned.stop is not None else None,
            )
            seq = int(res.last_seq)
        except Conflict as exc:
            await self._commit_conflict(att, exc.keys)
            return None
        finally:
            if hold:
                self._executor.state_lock.release()
        return planned, changes, seq

    def _took_effect(
        self, att: Attempt, planned: Planned, changes: list[KeyChange], seq: int
    ) -> None:
        """A returned attempt's commit is durable: now it takes effect.

        The attempt's own reads end here, so only other live readers of a key make
        applying its patch copy the value.
        """
        self._executor.live.unpin(att)
        att.reads.clear()
        self._executor.live.apply(changes, seq)
        if att.collects:
            self._executor.collects.settle(att, committed=True, seq=seq)
        for wid in att.answers_used:
            self._executor.answers.pop(wid, None)
        for ev_id, ev in planned.unrouted:
            self._executor.waits.park(ev_id, ev)  # it may answer a wait of another step
        if (book := self._executor.streams) is not None:
            book.took_effect(att.step, att.event_id, planned)
        for step, ev_id, ev in planned.deliveries:
            self.deliver(step, Delivery(ev_id, ev))
        for ev in planned.asked:
            self._executor.stream_now(ev, att)
        self._executor.observe(seq)
        if planned.stop is not None:
            self._executor.finish(planned.stop[1])

    async def fail_run(
        self,
        step: str,
        exc: BaseException,
        attempts: int | None = None,
        elapsed: float | None = None,
    ) -> None:
        if self._failing:
            return  # another failure is ending the run: this one is recorded as a step's
        self._failing = True
        self.failed_step = (step, attempts, elapsed)
        # Attempts of other steps still running get the grace period to commit, so that a
        # resume does not pay for them again; past it they are cancelled with the run.
        grace = self._executor.config.failure_grace
        if self._handling > 1 and grace > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        try:
            await self._executor.append([journal.run_failed(step, exc)], status="failed")
        except Sealed:
            return  # something else ended the run first
        self._executor.end_with(exc)
