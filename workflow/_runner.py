"""The executor of one run: queues, workers, attempts, retries, waits, timeouts.

Every change goes to the log first; only once its commit is durable does it take effect in
memory (the committed context, the queues): durable before visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
import traceback
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, cast

import orjson

from eventstore import (
    CodecError,
    Commit,
    ConcurrencyError,
    EncodeError,
    EventStoreError,
    LogCorruptedError,
    NewRun,
    ReadOnlyStoreError,
    Record,
    Seq,
    Snapshot,
    StoreClosedError,
    StoredRecord,
    StoreUnavailableError,
    UnknownClassError,
    WriterFailedError,
)

from . import _journal as J
from ._catch_error import StepFailedEvent
from ._changes import ContextChanges, KeyChange, refused
from ._context import (
    COLLECT_PREFIX,
    Attempt,
    Context,
    WaitSuspend,
    current_attempt,
    current_context,
)
from ._errors import (
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
    StepState,
    StepStateChanged,
    StopEvent,
    WorkflowCancelledEvent,
    WorkflowFailedEvent,
    WorkflowIdleEvent,
    WorkflowTimedOutEvent,
)
from ._fold import FOLD_VERSION, Folded, MemoRec, fold, not_damage, result_of
from ._ownership import LeaseOwners
from ._retry import RetryClock
from ._snapshot import dump_folded
from ._waits import Delivery, WaitInfo, WaitsAndInbox

if TYPE_CHECKING:
    from ._step import StepSpec
    from ._workflow import Workflow

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


_ENDING: Final = frozenset({"finished", "failed", "cancelled", "timed_out", "waiting"})
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


# A durable commit of a returned attempt, for _took_effect: its changes, seq, event ids,
# emitted events with their targets, deliveries, questions asked, and its StopEvent (id,
# event, dump).
_Written = tuple[
    list[KeyChange],
    int,
    list[int],
    list[tuple[Event, "str | None"]],
    list[tuple[str, Delivery]],
    list[Event],
    "tuple[int, StopEvent, Any] | None",
]


class _Sealed(ConcurrencyError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} has ended; nothing more is recorded", run_id=run_id)


class _Conflict(ConcurrencyError):
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"stale reads of {keys}")


_verbose_log = logging.getLogger("workflow.verbose")


def _say(line: str) -> None:
    """A ``verbose=True`` line: to the ``workflow.verbose`` logger when it is enabled for
    DEBUG or INFO (as LlamaIndex's ``workflows.verbose``), else printed."""
    if _verbose_log.isEnabledFor(logging.DEBUG):
        _verbose_log.debug(line)
    elif _verbose_log.isEnabledFor(logging.INFO):
        _verbose_log.info(line)
    else:
        print(line)  # noqa: T201


class Executor(ContextChanges, WaitsAndInbox):
    """Runs one run in this process until it finishes, fails, is cancelled or suspended."""

    def __init__(
        self,
        wf: Workflow,
        run_id: str,
        rid: int,
        epoch: int,
        folded: Folded | None,
        *,
        stream_from: int = 0,
    ) -> None:
        self.wf = wf
        self.graph = wf._graph
        self.codec = wf._codec
        self.store = wf._store
        self.run_id = run_id
        self.rid = rid
        self.epoch = epoch
        self.ctx: Context[Any] = Context._bound(self, wf._state_type)
        self.committed: dict[str, Any] = {}
        self.versions: dict[str, int] = {}
        self._wversions: dict[str, int] = {}
        self._keylog: dict[str, list[int]] = {}
        self._pins: dict[str, int] = {}
        self.state_lock = asyncio.Lock()
        self.queues: dict[str, asyncio.Queue[Delivery]] = {
            name: asyncio.Queue() for name in self.graph.steps
        }
        self.buffers: dict[str, dict[str, list[tuple[int, Event]]]] = {}
        # Puts into live buffers not committed yet, by event id, and the puts undone while
        # another attempt held them taken (by id of the entry, which that attempt holds).
        self._put_owner: dict[int, Attempt] = {}
        self._dead_puts: set[int] = set()
        self.waiters: dict[str, WaitInfo] = {}
        self.answers: dict[str, tuple[int, Event] | None] = {}
        self.unclaimed: dict[int, Event] = {}
        self._early: list[tuple[Event, Any]] = []
        self._taking = False
        self.next_id = 1
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.status = "running"
        self._sealed = False
        self._closing = False
        self._settler: asyncio.Task[None] | None = None
        # Set once the executor holds its epoch: before that, its commits would be refused.
        self.ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._busy = 0  # deliveries queued or running
        self.children_awaited = 0  # attempts awaiting a child run (their time is not counted)
        # Attempts being handled; once a failure is to end the run (``_failing``), no new
        # one starts, and ``_drained`` is set when the failing one is the last.
        self._handling = 0
        self._failing = False
        self._drained = asyncio.Event()
        self._poke = asyncio.Event()
        self._taken_inbox: set[int] = set()
        self._subscribers: list[asyncio.Queue[Event | None]] = []
        # Consumers of the engine's own events (stream_events(expose_internal=True)):
        # these are never journaled nor kept, so a run no one watches pays nothing for them.
        self._internal: list[asyncio.Queue[Event | None]] = []
        self._history: list[Event] = []
        # What ended the run, for the stream's last event: (step, attempts, elapsed seconds).
        self._failed_step: tuple[str, int | None, float | None] | None = None
        self._running: dict[tuple[str, int], int] = {}  # (step, worker) -> attempts running
        # The questions a resumed run asks again (None until the inbox is taken in), and
        # the consumers subscribed before that, who are to be asked.
        self._reasks: list[Event] | None = None if folded is not None else []
        self._askees: list[asyncio.Queue[Event | None]] = []
        self.origins: dict[int, tuple[weakref.ref[Event], tuple[str, int, int]]] = {}
        self._exec_before = 0.0
        self._clock_start: float | None = None
        self._stream_from = stream_from
        self._unfolded: list[tuple[list[Record], Any]] = []  # durable, not folded yet
        self._fold_state = folded if folded is not None else Folded(run_id)
        self._since_snapshot = 0
        self._snapshot_bytes = 0
        if folded is not None:
            # Live values must never share objects with the fold's JSON, which the
            # executor goes on folding its commits into (the codec does not copy).
            self._load(copy.deepcopy(folded))

    # ------------------------------------------------------------------ state from the log

    def reload(self, folded: Folded) -> None:
        """Starts over from a newer fold of the log (before any work was delivered)."""
        self.committed.clear()
        self._keylog.clear()
        self.buffers.clear()
        self.waiters.clear()
        self.answers.clear()
        self.unclaimed.clear()
        self._history.clear()
        self._folded = folded
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
                not_damage(exc, f"record seq {entry.seq} of run {f.run_id!r}, context key {key!r}")
                msg = f"record seq {entry.seq} of run {f.run_id!r}: context key {key!r}: {exc}"
                raise LogCorruptedError(msg, seq=entry.seq) from exc
            self._keylog[key] = [entry.full_bytes, entry.patch_bytes]
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
        self.unclaimed = {i: load(e.dump) for i, e in f.unclaimed.items()}
        self.next_id = f.next_id
        self._exec_before = f.exec_us / 1e6

    # ------------------------------------------------------------------ helpers for Context

    replaying: Final = False  # memoized calls are made (``_memo.MemoHost``)

    def memos_of(self, step: str, event_id: int) -> dict[str, MemoRec]:
        """The memoized calls recorded for ``step``'s input ``event_id`` (the live fold's)."""
        return self._folded.memos.get(step, {}).get(event_id, {})

    def new_event_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def pin(self, key: str) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1

    def _unpin(self, att: Attempt) -> None:
        for key in att.reads:
            n = self._pins.get(key, 0) - 1
            if n > 0:
                self._pins[key] = n
            else:
                self._pins.pop(key, None)

    def live_buffer(self, buf_key: str) -> dict[str, list[tuple[int, Event]]]:
        """The live collect buffer ``buf_key``, which collect_events changes in place."""
        buf = self.buffers.get(buf_key)
        if buf is None:
            buf = self.buffers[buf_key] = {}
        return buf

    def collect_put(self, att: Attempt, buf_key: str, entry: tuple[int, Event]) -> None:
        """An attempt put ``entry`` in a live buffer; it is pending until the attempt commits."""
        att.collect_base = max(att.collect_base, self.versions.get(COLLECT_PREFIX + buf_key, 0))
        if att.outcome is None:
            att.outcome = asyncio.get_running_loop().create_future()
        self._put_owner[entry[0]] = att

    def collect_take(self, att: Attempt, buf_key: str, taken: list[tuple[int, Event]]) -> None:
        """An attempt took ``taken`` out of a live buffer: its commit must follow the commits
        of the attempts that put them, and it cannot commit if one of those is undone."""
        att.taken.append((buf_key, taken))
        for ev_id, _ in taken:
            owner = self._put_owner.get(ev_id)
            if owner is None or owner is att or owner.outcome is None:
                continue
            # Two attempts that each took what the other put (two buffers, two calls each)
            # would wait for each other: that rare order is committed as it comes.
            if att in owner.deps:
                continue
            att.deps.append(owner)

    def _collects_done(self, att: Attempt, *, committed: bool, seq: int = 0) -> None:
        """Settles an attempt's collects: kept when it committed (at ``seq``), else undone
        in reverse."""
        for key, _, put, _ in att.collects:
            if put is not None and self._put_owner.get(put[0]) is att:
                del self._put_owner[put[0]]
            if committed:
                self.versions[COLLECT_PREFIX + key] = seq
        if not committed:
            for key, entries in reversed(att.taken):
                buf = self.live_buffer(key)
                for entry in reversed(entries):
                    if id(entry) in self._dead_puts:  # its put was undone: it is gone
                        self._dead_puts.discard(id(entry))
                        continue
                    buf.setdefault(type(entry[1]).__qualname__, []).insert(0, entry)
            for key, _, put, _ in reversed(att.collects):
                if put is None:
                    continue
                events = self.live_buffer(key).get(type(put[1]).__qualname__)
                i = next((i for i, e in enumerate(events or ()) if e is put), None)
                if events is not None and i is not None:
                    del events[i]
                    if not events:
                        del self.buffers[key][type(put[1]).__qualname__]
                else:  # taken by an attempt not yet committed, which must not commit now
                    self._dead_puts.add(id(put))
        att.collects.clear()
        att.taken.clear()
        att.deps.clear()
        if att.outcome is not None and not att.outcome.done():
            att.outcome.set_result(committed)
        att.outcome = None

    def stream_now(self, event: Event, att: Attempt | None) -> None:
        if att is not None:
            # Kept beside the event, not on it: an attribute would be logged as a field.
            ref = weakref.ref(event, lambda _: self.origins.pop(key, None))
            key = id(event)
            self.origins[key] = (ref, (att.step, att.event_id, att.attempt))
        self._history.append(event)
        for q in self._subscribers:
            q.put_nowait(event)

    def subscribe(
        self, *, replay: bool = False, internal: bool = False
    ) -> asyncio.Queue[Event | None]:
        """A queue of the run's stream from this executor's start, then live events.

        Without ``replay`` (whose recorded stream holds them already) a consumer of a
        resumed run is first asked the questions still unanswered (:meth:`ask_again`).
        """
        q: asyncio.Queue[Event | None] = asyncio.Queue()
        if not replay:
            if self._reasks is None:
                self._askees.append(q)
            else:
                for ev in self._reasks:
                    q.put_nowait(ev)
        for ev in self._history:
            q.put_nowait(ev)
        if self._closing:
            q.put_nowait(None)
        else:
            self._subscribers.append(q)
            if internal:
                self._internal.append(q)
        return q

    def _step_state(
        self, step: str, worker: int, state: StepState, given: Event, output: Event | None = None
    ) -> None:
        """Tells internal-event consumers (and, verbose, the console) an attempt's state."""
        verbose = self.wf._verbose
        if not self._internal and not verbose:
            return
        name_in = type(given).__name__
        name_out = None if output is None else type(output).__name__
        if verbose:
            if state is StepState.PREPARING:
                _say(f"[{step}] enqueued (waiting for capacity)")
            elif state is StepState.RUNNING:
                _say(f"[{step}:{worker}] started from {name_in}")
            else:
                result = f"with {name_out}" if name_out else "with no result"
                _say(f"[{step}:{worker}] complete {result}")
        if self._internal:
            ev = StepStateChanged(
                name=step,
                step_state=state,
                worker_id="<enqueued>" if state is StepState.PREPARING else str(worker),
                input_event_name=name_in,
                output_event_name=name_out,
            )
            for q in self._internal:
                q.put_nowait(ev)

    def ask_again(self) -> None:
        """Asks the questions of waits still unanswered once the inbox is taken in (resume).

        A wait answered by the inbox, or by an event sent as the run resumed, is not asked.
        """
        now = time.time()
        self._reasks = [
            w.question
            for w in self.waiters.values()
            if w.question is not None and (w.deadline is None or w.deadline > now)
        ]
        for q in self._askees:
            for ev in self._reasks:
                q.put_nowait(ev)
        self._askees.clear()

    # ------------------------------------------------------------------ committing

    def _commit(
        self,
        records: list[Record],
        *,
        status: str | None = None,
        check: Callable[[], None] | None = None,
        on_written: Callable[[Any], None] | None = None,
        inbox_taken: list[int] | None = None,
        create: NewRun | None = None,
    ) -> Commit:
        # Once a commit that ends the run is written, nothing of this executor may follow
        # it: the guard runs in the writer, in seq order, so no commit in flight can.
        def guard() -> None:
            if self._sealed:
                raise _Sealed(self.run_id)
            if check is not None:
                check()

        sealing = status in _ENDING
        written = on_written

        def seal(seq: Any) -> None:
            self._sealed = True
            if written is not None:
                written(seq)

        return Commit(
            self.run_id,
            records,
            epoch=self.epoch,
            status=status,
            check=guard,
            on_written=seal if sealing else on_written,
            inbox_taken=inbox_taken or (),
            create=create,
        )

    def _submit(
        self, records: list[Record], *, lazy: bool = False, **kw: Any
    ) -> asyncio.Future[Any]:
        def absorb(ok: bool, res: Any) -> None:
            """Keeps a durable commit to fold into the executor's copy of the folded state.

            Folded lazily (:attr:`_folded`): only a snapshot and recovery read that copy, so
            a commit costs its fold once per snapshot's worth of records, not a fold each.
            """
            if ok:
                self._keep(records, res)

        # Absorbed in seq order, before the code that waits for the commit goes on.
        return self.store.submit(self._commit(records, **kw), lazy=lazy, then=absorb)

    def _keep(self, records: list[Record], res: Any) -> None:
        self._unfolded.append((records, res))
        self._since_snapshot += sum(len(r.payload) for r in records)
        if self._since_snapshot >= max(SNAPSHOT_MIN_BYTES, SNAPSHOT_FACTOR * self._snapshot_bytes):
            self.write_snapshot()

    @property
    def _folded(self) -> Folded:
        """The folded state of every durable commit of this executor's run."""
        pending = self._unfolded
        if pending:
            self._unfolded = []
            run_id, stored = self.run_id, list[StoredRecord]()
            for records, res in pending:
                first, last, ts = int(res.first_seq), Seq(int(res.last_seq)), res.ts
                stored.extend(
                    StoredRecord(Seq(first + i), run_id, r.kind, r.step, r.payload, last, ts)
                    for i, r in enumerate(records)
                )
            fold(self._fold_state, stored)
        return self._fold_state

    @_folded.setter
    def _folded(self, folded: Folded) -> None:
        self._unfolded = []
        self._fold_state = folded

    def write_snapshot(
        self, *, lazy: bool = True, last: bool = False
    ) -> asyncio.Future[Any] | None:
        """Writes a snapshot of the folded state (lazily: it rides with the next commit).

        One is written only once the log since the last weighs ``SNAPSHOT_FACTOR`` times
        its size, unless it is the ``last`` of this executor's (the next reader of the
        latest state then folds nothing).
        """
        s = self._folded
        data = dump_folded(s).decode()
        self._snapshot_bytes = len(data)
        if not last and self._since_snapshot < SNAPSHOT_FACTOR * len(data):
            return None  # the state grew faster than its log: the next one waits for more log
        self._since_snapshot = 0
        snap = Snapshot(s.seq, data, FOLD_VERSION, s.records)
        commit = Commit(self.run_id, [], epoch=self.epoch, snapshot=snap)
        fut = self.store.submit(commit, lazy=lazy)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut

    def _lazy(self, records: list[Record]) -> None:
        def done(ok: bool, res: Any) -> None:
            if ok:
                self._keep(records, res)
            elif not self._closing:
                self._end_with(res)

        self.store.submit(self._commit(records), lazy=True, then=done)

    def _lazy_pair(self, first: list[Record], second: list[Record]) -> None:
        """Two commits that only say work began (a dequeue, an attempt's start), submitted
        as one operation: one future and one callback for both."""

        def done(ok: bool, res: Any) -> None:
            if not ok:
                if not self._closing:
                    self._end_with(res)
                return
            a, b = res
            self._keep(first, a)
            self._keep(second, b)

        self.store.submit_many([self._commit(first), self._commit(second)], lazy=True, then=done)

    async def append(self, records: list[Record], **kw: Any) -> int:
        res = await self._submit(records, **kw)
        return int(res.last_seq)

    # ------------------------------------------------------------------ the run

    def start_tasks(self) -> None:
        """Starts the workers of every step, the inbox poller and the timeout watchdog."""
        for name, spec in self.graph.steps.items():
            for worker in range(spec.num_workers):
                self._spawn(self._worker(name, spec, worker))
        self._spawn(self._inbox_loop())
        if self.wf._timeout is not None:
            self._spawn(self._watchdog(self.wf._timeout))
        owners = self.wf._owners
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
        if exc is not None and not self._closing:
            self._end_with(exc)

    def deliver(self, step: str, d: Delivery) -> None:
        self._busy += 1
        queue = self.queues[step]
        if (self._internal or self.wf._verbose) and self._tasks:
            # Every worker of the step is taken: the event waits for one (LlamaIndex's
            # PREPARING). Only counted when someone watches.
            running = sum(1 for s, _ in self._running if s == step)
            if running + queue.qsize() >= self.graph.steps[step].num_workers:
                self._step_state(step, -1, StepState.PREPARING, d.event)
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
                self._lazy_pair(dequeued, started)
                dequeued = None
            else:
                self._lazy(started)
            att = Attempt(step, d.event_id, attempt, d.event, host=self)
            att.retry = clock
            self._step_state(step, worker, StepState.RUNNING, d.event)
            self._running[(step, worker)] = attempt
            ended: Event | None = None  # what the attempt returned, once that took effect
            if conflicts >= CONFLICTS_BEFORE_LOCK:
                await self.state_lock.acquire()
                att.holds_lock = True
            try:
                outcome = await self._invoke(spec, att)
                if outcome[0] == "ok":
                    try:
                        written = await self._commit_success(att, outcome[1])
                    except _STORE_FAILURES:
                        raise
                    except Exception as err:
                        # What the attempt produced cannot be written (a value the log
                        # cannot hold, a commit the store refused): that is its failure.
                        outcome = ("error", err, traceback.format_exc())
                    else:
                        if written is not None:
                            ended = outcome[1]
                            self._step_state(step, worker, StepState.NOT_RUNNING, d.event, ended)
                            self._took_effect(att, *written)
                            return
                        conflicts += 1
                        continue
                if outcome[0] == "wait":
                    try:
                        await self._commit_wait(att, outcome[1])
                    except _STORE_FAILURES:
                        raise
                    except Exception as err:
                        outcome = ("error", err, traceback.format_exc())
                    else:
                        return
                exc, tb = outcome[1], outcome[2]
                stale = self._stale(att)
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
                    exc,
                    tb,
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
                if self.wf._verbose:
                    _say(f"[{step}:{worker}] failed with {exc!r}, retrying in {delay} s")
                await asyncio.sleep(delay)
                if self._failing:
                    return  # another step is failing the run: its retry waits for a resume
            finally:
                self._running.pop((step, worker), None)
                if ended is None and not self._closing:
                    self._step_state(step, worker, StepState.NOT_RUNNING, d.event)
                if att.collects:  # it did not commit (or its commit raised): undone
                    self._collects_done(att, committed=False)
                if att.holds_lock:
                    self.state_lock.release()
                self._unpin(att)

    async def _invoke(self, spec: StepSpec, att: Attempt) -> tuple[Any, ...]:
        kwargs: dict[str, Any] = {spec.event_param: att.event}
        if spec.ctx_param is not None:
            kwargs[spec.ctx_param] = self.ctx
        args = (self.wf,) if spec.bound else ()
        token = current_attempt.set(att)
        ctx_token = current_context.set(self.ctx)
        try:
            if spec.resources:  # built (or taken from the cache) for each attempt, never logged
                kwargs.update(await self.wf._resource_manager.inject(spec.resources))
            if spec.is_async:
                result = await spec.func(*args, **kwargs)
            else:
                # A plain def runs in a worker thread (which sees this attempt): it cannot
                # be interrupted, so if the run ends first its late outcome is dropped.
                result = await asyncio.to_thread(spec.func, *args, **kwargs)
        except WaitSuspend as ws:
            return ("wait", ws.waiter)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return ("error", exc, traceback.format_exc())
        finally:
            current_context.reset(ctx_token)
            current_attempt.reset(token)
        if result is not None and not isinstance(result, Event):
            wrong = WorkflowRuntimeError(
                f"Step function {spec.name} returned {type(result).__name__} instead of an"
                " Event instance."
            )
            return ("error", wrong, "")
        return ("ok", result)

    def _stale(self, att: Attempt) -> list[str]:
        w = self._wversions
        return [k for k, v in att.reads.items() if w.get(k, 0) != v]

    def _streamed(self, att: Attempt) -> list[Record]:
        records = []
        for e in att.streamed:
            text = None if att.encoded is None else att.encoded.get(id(e))
            if text is None:
                text = self._event_json(e, "refused by ctx.write_event_to_stream")
            records.append(J.streamed(att.step, att.event_id, att.attempt, text))
        return records

    def _event_json(self, ev: Event, how: str) -> orjson.Fragment:
        """An event's JSON for a record, checked: what the log cannot hold is refused."""
        try:
            return orjson.Fragment(self.codec.encode(ev, name=type(ev).__name__))
        except EncodeError as exc:
            raise refused(exc, how) from None

    def _event_dump(self, att: Attempt, ev: Event, returned: bool | None) -> Any:
        """An event's dump for a record of the attempt's commit, which it returned, sent or
        (``returned`` None) collected; its strings are checked as the record is serialized
        (:meth:`_refuse_text`)."""
        try:
            return self.codec.dump(ev, name=type(ev).__name__)
        except EncodeError as exc:
            verb = "collected" if returned is None else "returned" if returned else "sent"
            raise refused(exc, f"step {att.step!r} {verb} it") from None

    def _refuse_text(
        self, att: Attempt, emitted: list[tuple[Event, str | None]], result: Event | None
    ) -> None:
        """Raises the refusal of the event whose record orjson could not serialize."""
        events = [(put[1], "collected") for _, _, put, _ in att.collects if put is not None]
        events += [(ev, "returned" if ev is result else "sent") for ev, _ in emitted]
        for ev, verb in events:
            try:
                self.codec.encode(ev, name=type(ev).__name__)
            except EncodeError as exc:
                raise refused(exc, f"step {att.step!r} {verb} it") from None

    def _recovery(
        self, att: Attempt, exc: Exception, clock: RetryClock, elapsed: float
    ) -> tuple[str, Delivery, Record] | None:
        """The ``@catch_error`` handler that takes over a step out of retries, if any: its
        name, the delivery of its StepFailedEvent and that event's ``enqueued`` record.

        None when no handler covers the step, or its ``max_recoveries`` along this event's
        lineage are used up (the run fails then).
        """
        route = self.wf._catchers.get(att.step)
        if route is None:
            return None
        handler, limit = route
        counts = self._folded.recoveries.get(att.event_id, {})
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
        exc: BaseException,
        tb: str,
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
        failed = J.step_failed(
            att.step,
            att.event_id,
            att.attempt,
            exc,
            tb,
            delay is not None,
            delay,
            retry_at,
            elapsed,
        )
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
            bare = J.step_failed(
                att.step,
                att.event_id,
                att.attempt,
                exc,
                "",
                delay is not None,
                delay,
                retry_at,
                elapsed,
            )
            await self.append([bare, *extra])

    async def _commit_conflict(self, att: Attempt, keys: list[str]) -> None:
        shown = [k.replace(COLLECT_PREFIX, "collect:") for k in keys]
        await self.append(
            [J.step_conflicted(att.step, att.event_id, att.attempt, shown), *self._streamed(att)]
        )

    async def _commit_success(self, att: Attempt, result: Event | None) -> _Written | None:
        """Writes a returned attempt's commit; returns what :meth:`_took_effect` needs to
        make it take effect, or None when its reads went stale (it must re-run).

        When it raises, the commit was not written and nothing of it took effect.
        """
        step = att.step
        emitted: list[tuple[Event, str | None]] = list(att.sent)
        if result is not None:
            emitted.append((result, None))
        changes = self._key_changes(att)
        records: list[Record] = []
        ids: list[int] = []
        deliveries: list[tuple[str, Delivery]] = []
        stop: tuple[int, StopEvent, Any] | None = None
        # Questions no step takes: streamed once this commit is durable, as it records them.
        asked: list[tuple[Event, orjson.Fragment]] = []
        body: list[Record] = self._state_records(step, changes)
        dump = self.codec.dump
        try:  # events are dumped (checked but for their strings) and serialized once, here
            for _, buf, put, take in att.collects:
                put_json: J.EventRef | None = None
                if put is not None:
                    put_json = {"id": put[0], "event": self._event_dump(att, put[1], None)}
                body.append(J.collected(step, buf, put_json, take))
            for ev, target in emitted:
                ev_id = self.new_event_id()
                ids.append(ev_id)
                if isinstance(ev, StopEvent):
                    if stop is None:
                        stop = (ev_id, ev, self._event_dump(att, ev, ev is result))
                    continue
                if (
                    isinstance(ev, InputRequiredEvent)
                    and target is None
                    and not self.graph.route(type(ev))
                ):
                    verb = "returned" if ev is result else "sent"
                    asked.append((ev, self._event_json(ev, f"step {step!r} {verb} it")))
                    continue
                try:
                    d = dump(ev)
                except EncodeError:
                    d = self._event_dump(att, ev, ev is result)  # raises, naming the event
                targets = (target,) if target is not None else self.graph.route(type(ev))
                if not targets:
                    body.append(J.enqueued(None, ev_id, d, [att.event_id, att.attempt]))
                    continue
                for t in targets:
                    body.append(J.enqueued(t, ev_id, d, [att.event_id, att.attempt]))
                    deliveries.append((t, Delivery(ev_id, ev)))
            records.append(
                J.step_finished(
                    att.step,
                    att.event_id,
                    att.attempt,
                    ids,
                    max(max(att.reads.values(), default=0), att.collect_base),
                    att.answers_used,
                )
            )
            records.extend(body)
            records.extend(self._streamed(att))
            # Recorded as streamed by this commit only: a conflicted or failed attempt never
            # asked them.
            records.extend(
                J.streamed(att.step, att.event_id, att.attempt, text) for _, text in asked
            )
            if stop is not None:
                records.append(J.run_finished(stop[2], stop[0]))
        except orjson.JSONEncodeError:
            self._refuse_text(att, emitted, result)
            raise
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
            stale = self._stale(att)
            if stale:
                raise _Conflict(stale)
            if owners and not all(o.put_written for o in owners):
                raise _Conflict(taken_keys)

        def on_written(seq: Any) -> None:
            att.put_written = True
            for k in written:
                self._wversions[k] = int(seq)

        # A commit that changes state waits for an exclusive (edit_state) attempt to end.
        hold = bool(written) and not att.holds_lock and self.state_lock.locked()
        if hold:
            await self.state_lock.acquire()
        try:
            seq = await self.append(
                records,
                check=check if att.reads or owners else None,
                on_written=on_written if written or att.collects else None,
                status="finished" if stop is not None else None,
            )
        except _Conflict as exc:
            await self._commit_conflict(att, exc.keys)
            return None
        finally:
            if hold:
                self.state_lock.release()
        return (changes, seq, ids, emitted, deliveries, [q for q, _ in asked], stop)

    def _took_effect(
        self,
        att: Attempt,
        changes: list[KeyChange],
        seq: int,
        ids: list[int],
        emitted: list[tuple[Event, str | None]],
        deliveries: list[tuple[str, Delivery]],
        asked: list[Event],
        stop: tuple[int, StopEvent, Any] | None,
    ) -> None:
        """A returned attempt's commit is durable: now it takes effect.

        The attempt's own reads end here, so only other live readers of a key make
        applying its patch copy the value.
        """
        self._unpin(att)
        att.reads.clear()
        self._apply_changes(changes, seq)
        if att.collects:
            self._collects_done(att, committed=True, seq=seq)
        for wid in att.answers_used:
            self.answers.pop(wid, None)
        for ev_id, (ev, target) in zip(ids, emitted, strict=True):
            if (
                target is None
                and not isinstance(ev, StopEvent | InputRequiredEvent)
                and not self.graph.route(type(ev))
            ):
                self.park(ev_id, ev)  # it may answer a wait of another step
        for step, d in deliveries:
            self.deliver(step, d)
        for ev in asked:
            self.stream_now(ev, att)
        self._observe(seq)
        if stop is not None:
            self._finish(stop[1])

    def _observe(self, seq: int) -> None:
        hook = self.wf._commit_hook
        if hook is not None:
            hook(self, seq)

    # ------------------------------------------------------------------ time

    def only_waiters(self) -> bool:
        return bool(self.waiters) and self._busy == 0

    def _paused(self) -> bool:
        """Whether the run's clock stands: all it has pending is waits, timers or child runs
        (every delivery under way is an attempt awaiting a child, which counts its own)."""
        waiting = bool(self.waiters) or self.children_awaited > 0
        return waiting and self._busy == self.children_awaited

    def _update_clock(self) -> None:
        now = time.monotonic()
        paused = self._paused()
        if paused and self._clock_start is not None:
            self._exec_before += now - self._clock_start
            self._clock_start = None
            if self._internal and self.only_waiters():  # nothing but waits for events: idle
                idle = WorkflowIdleEvent()
                for q in self._internal:
                    q.put_nowait(idle)
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
                self._end_with(RunLostError(self.run_id, "its lease lapsed before renewal"))
                return

    def abandon(self) -> None:
        """Stops without recording anything: the run stays unfinished for another executor.

        What this executor was running is re-run by the next one (graceful shutdown).
        """
        self._end_with(RunAbandonedError(self.run_id))

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
        grace = float(getattr(self.wf, "failure_grace", DEFAULT_FAILURE_GRACE))
        if self._handling > 1 and grace > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        try:
            await self.append([J.run_failed(step, exc)], status="failed")
        except _Sealed:
            return  # something else ended the run first
        self._end_with(exc)

    async def _end_run(self, record: Record, exc: BaseException) -> None:
        if self._closing:
            return
        status = {
            J.RUN_CANCELLED: "cancelled",
            J.RUN_TIMED_OUT: "timed_out",
            J.RUN_SUSPENDED: "waiting",
        }[record.kind]
        try:
            await self.append([record], status=status)
        except _Sealed:
            return
        self._end_with(exc)

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
        if self.wf._verbose:
            _say(f"[result] {stop!r}")
        self.status = "finished"
        self._history.append(stop)
        for q in self._subscribers:
            q.put_nowait(stop)
        self._close(result=result_of(stop))

    def _end_with(self, exc: BaseException) -> None:
        if isinstance(exc, _Sealed):
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
            timeout = self.wf._timeout or 0.0
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
        if self._closing:
            return
        self._closing = True
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
        last = None if exc is None else self._last_event(exc)
        if last is not None:
            self._history.append(last)
        for q in self._subscribers:
            if last is not None:
                q.put_nowait(last)
            q.put_nowait(None)
        self._subscribers.clear()
        try:
            if self._since_snapshot and not self.store._closed and self.store._failed is None:
                # The next reader of the latest state folds nothing. A cache is never worth
                # failing the run's ending over.
                with contextlib.suppress(EventStoreError):
                    fut = self.write_snapshot(lazy=False, last=True)
                    if fut is not None:
                        last_snapshot.append(fut)
        finally:
            self.wf._release(self)
