"""Batches written from the event loop's own thread to a server, without blocking it.

On a server-rules backend (PostgreSQL) a batch is one call sent to the server. The
writer thread cost a step about twice what the call itself costs the client: the loop
hands the batch over (a wake-up of the thread), the thread writes and waits, then wakes
the loop back (``call_soon_threadsafe``). Here the loop sends the call itself, waits on
the socket like on any other (its other tasks go on meanwhile) and reads the reply when
it came: no thread, no wake-up but the socket's. What its tasks queue while a call is in
flight goes in the next call, sent as soon as the reply came (group commit as before).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from ._backend import LoopWriteSQL, Reply
from ._errors import StoreUnavailableError, WriterFailedError
from ._writer import BatchWriter, Op, ServerBatch

__all__ = ["LoopWriter"]


class _HasOp(Protocol):
    @property
    def op(self) -> Op: ...


# What a batch came to: each op's (ok, result or exception), or the error that failed the
# whole batch (StoreUnavailableError: the connection was lost; WriterFailedError).
Outcome = list[tuple[bool, Any]] | StoreUnavailableError | WriterFailedError
Done = Callable[[Sequence[Any], Outcome], None]

_IDLE: Final = None


class LoopWriter:
    """Writes the batches of one event loop over one connection, one call in flight.

    ``done`` is told each batch's items and outcome, on the loop, in commit order. After
    an outcome that is an error the writer takes nothing more (``usable`` is False): its
    committer writes through the writer thread from then on.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sql: LoopWriteSQL,
        done: Done,
        *,
        lazy_s: float,
    ) -> None:
        self.loop = loop
        self.sql = sql
        self.writer = BatchWriter(sql)
        self._done = done
        self._lazy_s = lazy_s
        self._queue: list[Any] = []
        self._lazy_only = True  # whether every queued item only says work began
        self._lazy_handle: asyncio.TimerHandle | None = None
        self._flight: tuple[list[Any], ServerBatch] | None = _IDLE
        self._fd = sql.fileno()
        # The socket stays watched for reading from the first call on (not added and
        # removed around each call: two epoll changes and a handle a step); readable
        # while no call is in flight, it is only drained (:meth:`_readable`).
        self._watched: asyncio.AbstractEventLoop | None = None
        self.usable = True

    @property
    def idle(self) -> bool:
        """Whether no call is in flight and nothing waits to be sent."""
        return self._flight is None and not self._queue

    def add(self, items: Sequence[_HasOp], *, lazy: bool) -> None:
        """Queues items the loop's tasks submitted; sent now unless a call is in flight
        (then with the reply) or all are lazy (then within ``lazy_s``, or with the next
        item that is not)."""
        self._queue.extend(items)
        self._lazy_only = self._lazy_only and lazy
        if self._flight is not None:
            return
        if not self._lazy_only:
            self._send()
        elif self._lazy_handle is None:
            self._lazy_handle = self.loop.call_later(self._lazy_s, self._lazy_due)

    def _lazy_due(self) -> None:
        self._lazy_handle = None
        if self._flight is None and self._queue:
            self._send()

    def _send(self) -> None:
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        items, self._queue, self._lazy_only = self._queue, [], True
        writer = self.writer
        batch = writer.plan_on_server([item.op for item in items])
        if not batch.plan:
            self._done(items, batch.outcomes)
            return
        try:
            sent = self.sql.send(batch.plan)
        except Exception as exc:
            self._finish(items, batch, exc)
            return
        self._flight = (items, batch)
        if self._watched is not self.loop:
            self._unwatch()
            self.loop.add_reader(self._fd, self._readable)
            self._watched = self.loop
        if not sent:
            self.loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sql.flush()
        except Exception as exc:
            self._failed_in_flight(exc)
            return
        if sent:
            self.loop.remove_writer(self._fd)

    def _readable(self) -> None:
        flight = self._flight
        if flight is None:
            # No call in flight: what came is the server's own (a notice, or the end of
            # the connection, which the next call meets); a socket that cannot be read
            # any more is watched no longer.
            try:
                self.sql.discard_input()
            except Exception:
                self._unwatch()
            else:
                if self.sql.broken:
                    self._unwatch()
            return
        try:
            result = self.sql.poll()
        except Exception as exc:
            self._failed_in_flight(exc)
            return
        if result is None:
            return  # more of the reply to come
        self._flight = None
        self._finish(*flight, result)
        self._next()

    def _failed_in_flight(self, exc: Exception) -> None:
        self._unwatch()
        flight = self._flight
        assert flight is not None
        self._flight = None
        self._finish(*flight, exc)
        self._next()

    def _next(self) -> None:
        if not self._queue or not self.usable:
            return
        if self._lazy_only:
            self._lazy_handle = self.loop.call_later(self._lazy_s, self._lazy_due)
        else:
            self._send()

    def _unwatch(self) -> None:
        loop, self._watched = self._watched or self.loop, None
        with contextlib.suppress(Exception):  # a closed loop watches nothing any more
            loop.remove_reader(self._fd)
            loop.remove_writer(self._fd)

    def _finish(
        self,
        items: list[Any],
        batch: ServerBatch,
        result: tuple[list[Reply], int | None] | Exception,
    ) -> None:
        try:
            outcome: Outcome = self.writer.finish_on_server(self.sql, batch, result)
        except (StoreUnavailableError, WriterFailedError) as exc:
            self.usable = False
            outcome = exc
        self._done(items, outcome)

    def run_now(self, items: Sequence[_HasOp]) -> Outcome:
        """Writes ``items`` at once, blocking (a synchronous caller on the loop's thread,
        which waits anyway); only while idle, so that they go in commit order."""
        assert self.idle
        batch = self.writer.plan_on_server([item.op for item in items])
        if not batch.plan:
            return batch.outcomes
        try:
            self.sql.send(batch.plan)
            result: tuple[list[Reply], int | None] | Exception = self.sql.wait()
        except Exception as exc:
            result = exc
        try:
            return self.writer.finish_on_server(self.sql, batch, result)
        except (StoreUnavailableError, WriterFailedError) as exc:
            self.usable = False
            return exc

    def take_queued(self) -> list[Any]:
        """What was queued and not sent (given to another writer once this one failed)."""
        items, self._queue = self._queue, []
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        return items

    def drain(self) -> None:
        """Waits (blocking) for the call in flight and writes what is queued: the store
        is closing, or the loop went away with a call in flight."""
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        self._unwatch()  # the calls below are waited for here; the loop may change after
        while self.usable:
            flight = self._flight
            if flight is None:
                if not self._queue:
                    return
                items, self._queue, self._lazy_only = self._queue, [], True
                batch = self.writer.plan_on_server([item.op for item in items])
                if not batch.plan:
                    self._done(items, batch.outcomes)
                    continue
                try:
                    self.sql.send(batch.plan)
                except Exception as exc:
                    self._finish(items, batch, exc)
                    continue
                flight = (items, batch)
            self._flight = None
            try:
                result: tuple[list[Reply], int | None] | Exception = self.sql.wait()
            except Exception as exc:
                result = exc
            self._finish(*flight, result)

    def close(self) -> None:
        """Drains, then closes the connection."""
        self.drain()
        self._unwatch()
        with contextlib.suppress(Exception):
            self.sql.close()
