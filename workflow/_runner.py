"""The executor of one run: queues, workers, attempts, retries, waits, timeouts.

Its time (the timeout's clock, the watchdog, the lease's heartbeat) is :mod:`._run_clock`'s.

Every change goes to the log first; only once its commit is durable does it take effect in
memory (the committed context, the queues): durable before visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final

from eventstore import ConcurrencyError, EventStoreError, Record

from . import _journal as journal
from ._attempts import Conflict, StepRunner
from ._changes import KeyChange, encode_updates
from ._collects import CollectBuffers
from ._context import Context, bound_context, context_ended
from ._errors import (
    DeprecatedPatchError,
    RecoveryLimitError,
    RunAbandonedError,
    RunLostError,
    RunSuspendedError,
    StateConflictError,
    WaitTimeoutError,
    WorkflowCancelledError,
    WorkflowTimeoutError,
)
from ._events import (
    StartEvent,
    StopEvent,
    WorkflowCancelledEvent,
    WorkflowFailedEvent,
    WorkflowTimedOutEvent,
)
from ._fold import Folded, MemoRec, result_of
from ._live_context import LiveContext
from ._live_runs import own, release
from ._ownership import LeaseOwners
from ._run_clock import RunClock
from ._run_log import RunLog, Sealed
from ._run_start import fork_run, over_recovery_limit, resume_run, start_imported_run, start_run
from ._stream import RunStream
from ._streams import stream_book
from ._takeover import cancelled_elsewhere, cancelled_error
from ._takeover import watch as watch_takeover
from ._waits import Delivery, Waits

if TYPE_CHECKING:
    from ._run_config import RunConfig

__all__ = ["Delivery", "Executor"]

# A snapshot of the folded state is written once the run's log bytes since the last one
# reach SNAPSHOT_FACTOR times its size (and at least SNAPSHOT_MIN_BYTES): snapshots then
# weigh at most a tenth of the log, and a read at any seq replays at most ten times the
# state's size of records. A run's executor also writes one as it lets go of the run.
SNAPSHOT_FACTOR: Final = 10
SNAPSHOT_MIN_BYTES: Final = 32 * 1024


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
        self.ctx: Context[Any] = bound_context(self, config.instance, config.state_type)
        # The context's values (the same objects as the component's: the context's store
        # reads them through the executor).
        self.live = live = LiveContext(self.codec)
        self.committed = live.committed
        self.versions = live.versions
        self.keylog = live.keylog
        self.state_lock = live.state_lock
        self.pin = live.pin
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
        self.poke = waits.poke  # something was posted to the inbox: take it in now
        self.send_external_nowait = waits.send_external_nowait
        self.next_id = 1
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.status = "running"
        self.closing = False
        self._settler: asyncio.Task[None] | None = None
        # Set once the executor holds its epoch: before that, its commits would be refused.
        self.ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        # The step workers and their attempts.
        self.steps = StepRunner(self)
        self.deliver = deliver = self.steps.deliver
        # Collection streams (a list[E] parameter's), when a step takes one.
        self.streams = stream_book(self, config.graph, lambda s, i, e: deliver(s, Delivery(i, e)))
        self.stream = stream = RunStream(verbose=config.verbose, resumed=folded is not None)
        self.stream_now = stream.stream_now
        self.subscribe = stream.subscribe
        self.origins = stream.origins
        self.children_awaited = 0  # attempts awaiting a child run (their time is not counted)
        self.clock = clock = RunClock(self)
        self.update_clock = clock.update
        self.exec_time = clock.exec_time
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
            self.load(copy.deepcopy(folded))

    # ------------------------------------------------------------------ state from the log

    def reload(self, folded: Folded) -> None:
        """Starts over from a newer fold of the log (before any work was delivered)."""
        self.live.clear()
        self.collects.buffers.clear()
        self.waits.clear()
        self.stream.forget()
        self.log.restart(folded)
        self.load(copy.deepcopy(folded))

    def load(self, folded: Folded) -> None:
        """Loads the live state from ``folded`` (JSON form; its objects become the live ones).

        :raises UnknownClassError: a value names a class this program lacks.
        :raises LogCorruptedError: a value does not decode.
        """
        self.live.load(folded)
        load = self.codec.load
        for buf, by_type in folded.buffers.items():
            self.buffers[buf] = {t: [(e.id, load(e.dump)) for e in es] for t, es in by_type.items()}
        self.waits.load(folded)
        self.next_id = folded.next_id
        self.clock.before = folded.exec_us / 1e6

    # ------------------------------------------------------------------ helpers for Context

    async def operator_update(
        self,
        updates: Mapping[str, Any],
        deletes: list[str] | None = None,
        *,
        read: Mapping[str, int] | None = None,
    ) -> int:
        """Records operator writes (``updates`` of ``resume``/``run_from``, ``handler.ctx``).

        ``read`` gives, for an operator's read-modify-write, the version of each key it
        read (``handler.ctx.store.edit_state()``): the writes are checked against them in
        the writer, in seq order with the steps' commits, as an attempt's are.

        :raises EncodeError: a value cannot be stored (nothing is recorded then).
        :raises StateConflictError: a commit changed a key of ``read`` since it was read
            (nothing is recorded then).
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

        def check() -> None:
            stale = live.stale_of(read or {})
            if stale:
                raise Conflict(stale)

        try:
            async with self.state_lock:
                seq = await self.append(
                    records, on_written=on_written, check=check if read else None
                )
        except Conflict as exc:
            raise StateConflictError(exc.keys) from None
        live.apply(changes, seq)
        self.observe(seq)
        return seq

    replaying: Final = False  # memoized calls are made (``_memo.MemoHost``)

    def memos_of(self, step: str, event_id: int) -> dict[str, MemoRec]:
        """The memoized calls recorded for ``step``'s input ``event_id`` (the live fold's)."""
        return self.folded.memos.get(step, {}).get(event_id, {})

    def folded_state(self) -> Folded:
        """The folded state of the run's durable commits (``_patches`` reads its starts)."""
        return self.folded

    def new_event_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    # ------------------------------------------------------------------ committing

    @property
    def epoch(self) -> int:
        """The executor's hold on the run: its commits are refused once the run's is newer."""
        return self.log.epoch

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
        self._spawn(start_run(self, records, start_event, with_context))

    def start_imported(self, records: list[Record], updates: dict[str, Any]) -> None:
        """Starts a new run whose first commit (``records``) holds a state from elsewhere (a
        context dict of another store); its queued work runs, its waits wait and ask again."""
        self.stream.will_ask_again()  # its waits' questions are asked again, as on a resume
        self._spawn(start_imported_run(self, records, updates))

    def fork(
        self,
        folded: Folded,
        parent: tuple[str, int],
        updates: dict[str, Any] | None,
        deletes: list[str] | None = None,
        *,
        renamed: dict[str, str] | None = None,
        upcast: list[Record] | None = None,
    ) -> None:
        """Starts a fork of ``parent`` (run id, seq) whose state there is ``folded``, with
        the moves of renamed steps (``_renames``) and the upcast context
        (``_state_versions``) that ``folded`` had applied, recorded in its first commit."""
        self._spawn(fork_run(self, folded, parent, updates, deletes, renamed, upcast))

    def resume(
        self,
        folded: Folded,
        updates: dict[str, Any] | None,
        *,
        renamed: dict[str, str] | None = None,
        deletes: list[str] | None = None,
        upcast: list[Record] | None = None,
    ) -> None:
        """Continues the run from ``folded``, the fold of its log (its owner lock is held):
        claims it (fencing any previous owner), records the resume, and goes on."""
        self._spawn(resume_run(self, folded, updates, renamed, deletes, upcast))

    def reset_budget(self) -> None:
        """A fresh timeout budget (a timed-out run resumed; the fold resets it too)."""
        self.clock.before = 0.0

    def recovery_limit(self) -> RecoveryLimitError | None:
        """The error that ends this run at its resume if its in-progress input was started
        ``max_recovery_attempts`` times without ending, or None."""
        return over_recovery_limit(
            self.run_id, self.folded, self.graph.steps, self.config.max_recovery
        )

    def hold(self, rid: int) -> None:
        """The run's row exists (id ``rid``): this executor owns it from now on."""
        self.rid = rid
        own(self.store, self.config.owners, self.run_id, rid, self)

    # ------------------------------------------------------------------ the run

    def start_tasks(self) -> None:
        """Starts the workers of every step, the inbox poller and the timeout watchdog."""
        for name, spec in self.graph.steps.items():
            for worker in range(spec.num_workers):
                self._spawn(self.steps.work(name, spec, worker))
        self._spawn(self.waits.inbox_loop())
        self._spawn(watch_takeover(self))
        if self.config.timeout is not None:
            self._spawn(self.clock.watchdog(self.config.timeout))
        owners = self.config.owners
        if isinstance(owners, LeaseOwners):
            self._spawn(self.clock.heartbeat(owners.renew, owners.ttl))
        self.clock.start()

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

    @property
    def started(self) -> bool:
        """Whether the run's tasks (its step workers) have started."""
        return bool(self._tasks)

    def observe(self, seq: int) -> None:
        """The commit at ``seq`` that changed state took effect (the test hook is told)."""
        hook = self.config.commit_hook
        if hook is not None:
            hook(self, seq)

    # ------------------------------------------------------------------ time (``self.clock``)

    def only_waiters(self) -> bool:
        """Whether all the run has pending is waits for events."""
        return bool(self.waiters) and self.steps.idle

    def abandon(self) -> None:
        """Stops without recording anything: the run stays unfinished for another executor.

        What this executor was running is re-run by the next one (graceful shutdown).
        """
        self.end_with(RunAbandonedError(self.run_id))

    def stop_refused(self, exc: BaseException) -> None:
        """Stops as :meth:`abandon` does, the handler raising ``exc``: this code cannot finish
        the run (a ``deprecate_patch`` refusal), so it stays interrupted, not failed."""
        self.status = "interrupted"
        self.close(exc=exc)

    # ------------------------------------------------------------------ ending

    async def end_run(self, record: Record, exc: BaseException) -> None:
        if self.closing:
            return
        status = {
            journal.RUN_CANCELLED: "cancelled",
            journal.RUN_TIMED_OUT: "timed_out",
            journal.RUN_SUSPENDED: "waiting",
        }[record.kind]
        try:
            await self.append([record], status=status)
        except Sealed:
            return
        self.end_with(exc)

    async def wait_ready(self) -> None:
        """Waits until the executor holds the run (or has already ended)."""
        await self.ready.wait()  # set on claiming the run, and on ending

    async def cancel(self, via: str = "handler", reason: str | None = None) -> None:
        await self.wait_ready()
        await self.end_run(journal.run_cancelled(via, reason), cancelled_error(self.run_id, reason))

    async def suspend(self, exc: BaseException) -> None:
        await self.wait_ready()
        await self.end_run(journal.run_suspended(), exc)

    def finish(self, stop: StopEvent) -> None:
        self.status = "finished"
        self.stream.finish(stop)
        self.close(result=result_of(stop))

    def end_with(self, exc: BaseException) -> None:
        if isinstance(exc, Sealed):
            return  # the run already ended; the commit that lost the race is moot
        if isinstance(exc, ConcurrencyError) and not isinstance(exc, Conflict):
            # `workflow cancel` (or another process's cancel) took the run over to end it:
            # this handler's run was cancelled, not lost to another executor.
            exc = cancelled_elsewhere(self.store, self.run_id) or RunLostError(
                self.run_id, str(exc)
            )
        self.status = "cancelled" if isinstance(exc, WorkflowCancelledError) else "failed"
        self.close(exc=exc)

    def _last_event(self, exc: BaseException) -> StopEvent | None:
        """The stream's last event for a run that ended with ``exc`` (as LlamaIndex's)."""
        if isinstance(exc, WorkflowTimeoutError) and not isinstance(exc, WaitTimeoutError):
            timeout = self.config.timeout or 0.0
            return WorkflowTimedOutEvent(timeout=timeout, active_steps=self.steps.active_steps())
        if isinstance(exc, WorkflowCancelledError):
            return WorkflowCancelledEvent()
        if isinstance(exc, RunSuspendedError | RunAbandonedError | DeprecatedPatchError):
            return None  # the run goes on elsewhere, or later
        step, attempts, elapsed = self.steps.failed_step or ("", None, None)
        return WorkflowFailedEvent(
            step_name=step, exception=exc, attempts=attempts, elapsed_seconds=elapsed
        )

    def close(self, *, result: Any = None, exc: BaseException | None = None) -> None:
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
            context_ended(self.ctx, self)  # idle from here: writes open the context's next run
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
        self.log.close()  # what began and is unfinished is re-run by a resume
        try:
            if self.log.unsnapshotted and not self.store.closed and self.store.failed is None:
                # The next reader of the latest state folds nothing. A cache is never worth
                # failing the run's ending over.
                with contextlib.suppress(EventStoreError):
                    fut = self.log.write_snapshot(lazy=False, last=True)
                    if fut is not None:
                        last_snapshot.append(fut)
        finally:
            release(self.store, self.config.owners, self.run_id, self.rid, self)
