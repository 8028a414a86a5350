"""Group commit: operations from any thread or loop, written in batches by one writer.

Every operation waiting at a given moment goes into one transaction of the shared
:class:`~._writer.BatchWriter`. Batches are written by a writer thread, or, where a write
costs only microseconds of CPU (:attr:`~._backend.Backend.writes_inline`), by the event
loop itself at the end of the loop iteration in which its tasks queued them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any, Final, TypeVar

from . import _lock_wait
from ._backend import Backend, Busy
from ._errors import StoreUnavailableError, WriterFailedError
from ._loop_writer import LoopWriter, Outcome
from ._writer import BatchWriter, Op

__all__ = ["INLINE_BUSY_MS", "LAZY_FLUSH_S", "Committer", "Then"]

T = TypeVar("T")

# Records that only say work began may wait this long for a commit to ride with.
LAZY_FLUSH_S: Final = 0.05
# How long a write on the event loop's thread may wait for the lock before the batch is
# handed to the writer thread (which waits as long as it takes).
INLINE_BUSY_MS: Final = 20

_AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]
# Told an operation's outcome (ok, then its result or exception) on the submitter's loop.
Then = Callable[[bool, Any], None]


@dataclass(slots=True)
class _Item:
    op: Op
    future: _AnyFuture | None
    loop: asyncio.AbstractEventLoop | None
    then: Then | None = None


_STOP: Final = _Item(lambda w: None, None, None)
_LAZY: Final = object()  # a wake-up for lazy items: the writer may wait a little for more

# One settled async operation: its future, its ``then``, ok, and its result or exception.
_Settled = tuple[asyncio.Future[Any], Then | None, bool, Any]


def _resolve(batch: list[_Settled]) -> None:
    # In commit order: each ``then`` runs before the futures' waiters (woken through the
    # loop's queue) can go on, so what they see includes every commit of the batch.
    for fut, then, ok, value in batch:
        if fut.done() or fut.get_loop().is_closed():
            continue  # nobody can be waiting for it any more
        _settle(fut, then, ok, value)


def _resolve_inline(items: Sequence[_Item], outcomes: Sequence[tuple[bool, Any]]) -> None:
    """:func:`_resolve` for a batch written on its own loop, which is not closed: the
    same, without a list of what settled or a look at each future's loop."""
    for item, (ok, value) in zip(items, outcomes, strict=True):
        fut: asyncio.Future[Any] = item.future  # type: ignore[assignment]  # the loop's
        if not fut.done():  # done: cancelled, nobody waits for it any more
            _settle(fut, item.then, ok, value)


def _settle(fut: asyncio.Future[Any], then: Then | None, ok: bool, value: Any) -> None:
    """Tells ``then`` (if any) the outcome, then resolves the future with it."""
    if then is not None:
        try:
            then(ok, value)
        except Exception as exc:  # as a done-callback's would be: reported, not fatal
            fut.get_loop().call_exception_handler(
                {"message": "exception in a commit's then callback", "exception": exc}
            )
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
        if then is not None:
            fut.exception()  # then was told: not an exception nobody retrieved


class Committer:
    """Queues operations and writes them in batches, resolving each caller's future.

    ``guard`` raises when the store may not be written (closed, read-only); ``inline``
    lets the event loop write its own batches.
    """

    def __init__(self, backend: Backend, *, inline: bool, guard: Callable[[], None]) -> None:
        self._backend = backend
        self._guard = guard
        self._lock = threading.Lock()
        self._queue: deque[_Item] = deque()
        self._wake: SimpleQueue[object] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self.writer: BatchWriter | None = None  # the writer thread's, while connected
        self.failed: WriterFailedError | None = None
        # With durability "normal" a commit costs tens of microseconds of CPU and no fsync,
        # less than waking a thread and being woken by it (~100 us here), so the event loop
        # writes what its tasks queued at the end of each loop iteration, all in one
        # transaction; "full" (an fsync per transaction) keeps the loop free and uses the
        # writer thread. A lock held elsewhere moves the batch to the writer thread too.
        self._inline = inline
        self._inline_loop: asyncio.AbstractEventLoop | None = None
        self._inline_writer: BatchWriter | None = None
        self._pending: list[_Item] = []
        self._eager = False  # whether an item that is not lazy is pending
        self._flush_scheduled = False
        # Items of event loops for the writer thread, handed over once per loop iteration:
        # one wake-up of the writer for what the loop's tasks queued together, and a whole
        # batch for it to find (rather than the first item alone).
        self._handover: dict[asyncio.AbstractEventLoop, tuple[list[_Item], list[bool]]] = {}
        self._lazy_handle: asyncio.TimerHandle | None = None
        # On a server that a loop can write to without blocking (PostgreSQL), the first
        # loop's batches are sent by the loop itself: no hand-off to the writer thread.
        self._loop_writer: LoopWriter | None = None
        self._loop_writes = hasattr(backend, "loop_write_sql")
        self.operations = 0
        self.transactions = 0

    def _named(self, exc: WriterFailedError) -> WriterFailedError:
        """The failure, naming the store (and, for a file it may not write, why)."""
        msg = f"{self._backend.where}: {exc}"
        if "readonly database" in str(exc):
            msg += (
                " (this process may not write the file or its folder: check their"
                " permissions and owner, or open the store with readonly=True to read it)"
            )
        named = WriterFailedError(msg)
        named.__cause__ = exc.__cause__ or exc
        return named

    def _check_writable(self) -> None:
        self._guard()
        if self.failed is not None:
            raise self.failed

    # ------------------------------------------------------------------ the writer thread

    def _enqueue(self, item: _Item, *, lazy: bool = False) -> None:
        self._enqueue_all([item], lazy=lazy)

    def _enqueue_all(self, items: list[_Item], *, lazy: bool = False) -> None:
        self._check_writable()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._writer_main, name="eventstore-writer", daemon=True
                    )
                    self._thread.start()
        self._queue.extend(items)
        self._wake.put(_LAZY if lazy else None)

    def _writer_main(self) -> None:
        # Connected for the first batch, and again after a connection to a server was lost.
        writer: BatchWriter | None = None
        try:
            while True:
                token = self._wake.get()
                if token is _LAZY:
                    # Only work-began records so far: give a commit a moment to join them.
                    deadline = time.monotonic() + LAZY_FLUSH_S
                    while token is _LAZY and (left := deadline - time.monotonic()) > 0:
                        try:
                            token = self._wake.get(timeout=left)
                        except Empty:
                            break
                while True:
                    try:
                        self._wake.get_nowait()
                    except Empty:
                        break
                items: list[_Item] = []
                while self._queue:
                    items.append(self._queue.popleft())
                stop = any(item is _STOP for item in items)
                items = [item for item in items if item is not _STOP]
                if items:
                    if writer is None:
                        writer = self._connect(items)
                    if writer is not None and not self._write(writer, items):
                        if self.failed is not None:
                            return
                        writer.close()  # the connection was lost: a new one for the next
                        writer = None
                if stop:
                    return
        finally:
            self.writer = None
            if writer is not None:
                writer.close()

    def _connect(self, items: list[_Item]) -> BatchWriter | None:
        """The writer thread's writer; None (the batch refused) when the database cannot
        be reached now: the next batch tries again."""
        try:
            writer = self.writer = BatchWriter(
                self._backend.write_sql(busy_timeout_ms=_lock_wait.WRITER_BUSY_MS)
            )
        except Exception as exc:
            msg = f"cannot connect to write to {self._backend.where}: {exc}"
            err = StoreUnavailableError(msg)
            err.__cause__ = exc
            self._settle(items, [(False, err)] * len(items))
            return None
        return writer

    def _write(self, writer: BatchWriter, items: list[_Item]) -> bool:
        try:
            ops = [item.op for item in items]
            outcomes = _lock_wait.run_waiting(writer, ops, self._backend.where)
        except StoreUnavailableError as exc:
            # The connection went away mid-batch; the database may be fine. This batch is
            # in doubt (its callers are told), the store is not failed.
            self._settle(items, [(False, exc)] * len(items))
            return False
        except WriterFailedError as failed:
            named = self.failed = self._named(failed)
            while self._queue:
                items.append(self._queue.popleft())
            self._settle(items, [(False, named)] * len(items))
            return False
        self.operations += len(items)
        self.transactions += 1
        self._settle(items, outcomes)
        return True

    @staticmethod
    def _settle(items: Sequence[_Item], outcomes: Sequence[tuple[bool, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Settled]] = {}
        for item, (ok, value) in zip(items, outcomes, strict=True):
            fut = item.future
            if fut is None:
                continue
            if isinstance(fut, asyncio.Future):
                assert item.loop is not None
                by_loop.setdefault(item.loop, []).append((fut, item.then, ok, value))
            elif ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        for loop, batch in by_loop.items():
            # One wake-up of each loop per transaction, acks in commit order.
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve, batch)

    # ------------------------------------------------------------------ submitting

    def submit_async(
        self, op: Callable[[BatchWriter], T], *, lazy: bool = False, then: Then | None = None
    ) -> asyncio.Future[T]:
        """Queues ``op`` from async code; the future resolves once its batch is durable.

        ``then``, if given, is called with (ok, result or exception) on the loop just
        before the future resolves (not if it was cancelled): in commit order, with no
        loop iteration of its own, unlike a done-callback. A failure told to ``then``
        counts as retrieved: a future nobody awaits logs nothing.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        item = _Item(op, fut, loop, then)
        if (self._inline_loop is not loop or not self._inline) and not self._uses_inline(loop):
            self._check_writable()
            queued = self._handover.get(loop)
            if queued is None:
                queued = self._handover[loop] = ([], [True])
                loop.call_soon(self._hand_over, loop)
            queued[0].append(item)
            queued[1][0] = queued[1][0] and lazy
            return fut
        self._check_writable()
        self._pending.append(item)
        if not lazy:
            self._eager = True
        if self._flush_scheduled:
            return fut
        if not lazy:
            self._flush_scheduled = True
            loop.call_soon(self.flush_inline)
        else:
            self._arm_lazy(loop)
        return fut

    def _arm_lazy(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._lazy_handle is None:
            # Armed once and left to run out (not cancelled by the flushes before it): it
            # flushes whatever lazy items wait then, each no later than its deadline.
            self._lazy_handle = loop.call_later(LAZY_FLUSH_S, self._lazy_due)

    def _lazy_due(self) -> None:
        self._lazy_handle = None
        if self._pending and not self._flush_scheduled:
            self.flush_inline()

    def _flush_trailing(self) -> None:
        """The flush a written batch leaves behind it, for what the tasks it woke queue.

        Scheduled as the batch's futures resolve, it runs in the next loop iteration just
        after the tasks they woke: what those queue then is written in that same iteration,
        rather than one more later (one loop iteration a step instead of two). Lazy items
        alone are not written here: they wait for their deadline or a commit to join.
        """
        self._flush_scheduled = False
        if self._eager:
            self.flush_inline()
        elif self._pending and self._inline_loop is not None:
            self._arm_lazy(self._inline_loop)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """Gives the writer thread what the loop's tasks queued in this iteration."""
        queued = self._handover.pop(loop, None)
        if queued is None or not queued[0]:
            return  # close() handed them over, or a batch's reply woke tasks that queued none
        items, (lazy,) = queued
        try:
            writer = self._loop_writer_of(loop) if self._loop_writes else None
            if writer is not None:
                self._check_writable()
                writer.add(items, lazy=lazy)
            else:
                self._enqueue_all(items, lazy=lazy)
        except Exception as exc:  # the store was closed, or its writer failed, meanwhile
            _resolve([(i.future, i.then, False, exc) for i in items])  # type: ignore[misc]

    def _loop_writer_of(self, loop: asyncio.AbstractEventLoop) -> LoopWriter | None:
        """The writer on ``loop``'s thread, if this loop may have one: the first loop to
        write (or the next, once that one closed), while its connection holds."""
        writer = self._loop_writer
        if writer is not None:
            if writer.loop is loop:
                return writer if writer.usable else None
            if not writer.loop.is_closed():
                return None  # another loop's, still running: this one hands over
            writer.drain()  # a call the closed loop left in flight
            if not writer.usable:
                return None
            writer.loop = loop
            return writer
        sql = self._backend.loop_write_sql()  # type: ignore[attr-defined]
        if sql is None:
            self._loop_writes = False  # none ready: the writer thread connects
            return None
        self._loop_writer = LoopWriter(
            loop, sql, self._loop_done, lazy_s=LAZY_FLUSH_S, spin_s=sql.reply_spin_s
        )
        return self._loop_writer

    def _loop_done(self, items: Sequence[Any], outcome: Outcome) -> None:
        """A batch of the loop writer came back: each caller is told, in commit order."""
        if isinstance(outcome, list):
            self.operations += len(items)
            self.transactions += 1
            loop = self._loop_writer.loop if self._loop_writer is not None else None
            if loop is not None and loop.is_running():  # told on its loop: futures of it
                _resolve_inline(items, outcome)
                if loop not in self._handover:
                    # After the wake-ups of the tasks it resolved: what they queue in the
                    # next iteration is sent in that same iteration, not one later.
                    loop.call_soon(self._hand_over, loop)
                    self._handover[loop] = ([], [True])
                return
            _resolve(
                [
                    (item.future, item.then, ok, value)
                    for item, (ok, value) in zip(items, outcome, strict=True)
                ]
            )
            return
        _resolve([(item.future, item.then, False, outcome) for item in items])
        writer = self._loop_writer
        assert writer is not None
        self._loop_failed(writer, outcome)

    def _loop_failed(
        self, writer: LoopWriter, outcome: StoreUnavailableError | WriterFailedError
    ) -> None:
        left = writer.take_queued()
        if isinstance(outcome, WriterFailedError):
            self.failed = outcome
            _resolve([(item.future, item.then, False, outcome) for item in left])
        elif left:
            # The connection was lost: the writer thread, which may wait to connect,
            # writes this store's batches from now on (these first).
            self._enqueue_all(left)

    def submit_sync(self, op: Callable[[BatchWriter], T]) -> T:
        """Runs ``op`` from synchronous code on the writer thread; blocks until durable."""
        writer = self._idle_loop_writer() if self._loop_writes else None
        if writer is not None:
            # Called on the thread of the loop that writes itself (a lease taken as a run
            # starts): written from here, blocking as the caller would wait for the thread.
            self._check_writable()
            outcome = writer.run_now([_Item(op, None, None)])
            if not isinstance(outcome, list):
                self._loop_failed(writer, outcome)
                raise outcome
            self.operations += 1
            self.transactions += 1
            [(ok, value)] = outcome
            if not ok:
                raise value
            return value  # type: ignore[no-any-return]
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._enqueue(_Item(op, fut, None))
        return fut.result()

    def _idle_loop_writer(self) -> LoopWriter | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        writer = self._loop_writer_of(loop)
        return writer if writer is not None and writer.idle else None

    def _uses_inline(self, loop: asyncio.AbstractEventLoop) -> bool:
        if not self._inline:
            return False
        bound = self._inline_loop
        if bound is loop:
            return True
        if bound is None or (bound.is_closed() and not self._pending):
            self._inline_loop = loop
            self._lazy_handle = None  # a closed loop's timer never runs
            return True
        return False

    def flush_inline(self) -> None:
        """Writes what the event loop's tasks queued, on the loop's own thread."""
        self._flush_scheduled = False
        self._eager = False
        items, self._pending = self._pending, []
        if not items:
            return
        writer = self._inline_writer
        if writer is None:
            sql = self._backend.write_sql(busy_timeout_ms=INLINE_BUSY_MS)
            writer = self._inline_writer = BatchWriter(sql)
        try:
            outcomes = writer.run_batch([item.op for item in items])
        except Busy:
            # Contention with another writer: from now on the writer thread, which may
            # wait for the lock, writes for this store (in order: these items go first).
            self._inline = False
            for item in items:
                self._enqueue(item)
            return
        except WriterFailedError as failed:
            exc = self.failed = self._named(failed)
            outcomes = [(False, exc)] * len(items)
        else:
            self.operations += len(items)
            self.transactions += 1
        loop = self._inline_loop
        if loop is not None and not loop.is_closed():
            _resolve_inline(items, outcomes)
        else:  # written as the store closes, after its loop ended
            _resolve(
                [
                    (item.future, item.then, ok, value)  # type: ignore[misc]
                    for item, (ok, value) in zip(items, outcomes, strict=True)
                ]
            )
        # After the wake-ups of the tasks it resolved, so that it runs after them.
        if not self._flush_scheduled and self.failed is None and loop and loop.is_running():
            self._flush_scheduled = True
            loop.call_soon(self._flush_trailing)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Writes what is queued, stops the writer thread and closes the write connections."""
        if self._pending:
            self.flush_inline()
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        if self._inline_writer is not None:
            self._inline_writer.close()
        for loop in list(self._handover):
            self._hand_over(loop)
        if self._loop_writer is not None:
            self._loop_writer.close()
        thread = self._thread
        if thread is not None and self.failed is None:
            self._queue.append(_STOP)
            self._wake.put(None)
            thread.join()
