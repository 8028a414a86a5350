"""Batches written from the event loop's own thread to a server, without blocking it.

On a server-rules backend (PostgreSQL) a batch is one call sent to the server. The
writer thread cost a step about twice what the call itself costs the client: the loop
hands the batch over (a wake-up of the thread), the thread writes and waits, then wakes
the loop back (``call_soon_threadsafe``). Here the loop sends the call itself, waits on
the socket like on any other (its other tasks go on meanwhile) and reads the reply when
it came: no thread, no wake-up but the socket's. What its tasks queue while a call is in
flight goes in the next call, sent as soon as the reply came (group commit as before).

While a call is in flight and the loop has nothing else to do, the loop may keep running
instead of going to sleep (each of its turns polls the sockets without waiting), for up to
``spin_s``. On a virtual machine an idle core halts: waking it for the reply costs tens of
microseconds, and the code that runs then finds its caches cold (the loop benchmark's step
took 190 us of CPU between a reply and the next call after a sleep, 140 us after a busy
wait). It is the kernel's busy polling (``SO_BUSY_POLL``) done by the loop, and it never
holds up the loop's other tasks, which run between its turns. But on cores that other
processes want, a busy wait gives its core away at each turn and gets it back late (the
same loop beside two processes that kept both cores busy took three times as long), so
:class:`_ReplyWait` decides call by call from what it measured: it waits busily only while
the calls it did so were clearly followed sooner by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
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
# Gives the core to another runnable process, if any (Unix; elsewhere the turn only polls).
_yield: Final[Callable[[], None]] = getattr(os, "sched_yield", lambda: None)


class _ReplyWait:
    """Whether the loop busy-waits for a call's reply or sleeps until it comes.

    What it compares is a call's cycle: from its sending to the next call's, the reply
    and the work it woke included (where a busy wait's gain lies: caches kept warm, not
    only the reply read sooner). It keeps the last ``_WINDOW`` cycles of each way, takes
    the busy wait once their mean is below ``_GAIN`` of the sleeping calls', and leaves it
    once it is no longer below theirs (noise around one threshold would switch back and
    forth). The first ``_BURST`` calls of every ``_PERIOD`` take the other way and measure
    it afresh (less often while it keeps measuring much worse: :meth:`_next_period`), so
    that both follow the machine's load: a burst, since one busy call among sleeping ones
    measures only the cold caches it starts with (the first cycle after a switch is not
    kept). It sleeps until it has measured both (the first burst is the
    busy one, so a short run gains too). Means, not medians: a wall time is a sum, and a
    busy wait's cost is its long tail. Cycles longer than ``_IDLE_S`` are the loop having
    nothing to write, not a measure of the wait.
    """

    _WINDOW: Final = 16
    _GAIN: Final = 0.9
    _PERIOD: Final = 64
    _MAX_PERIOD: Final = 1024
    _WORSE: Final = 1.5
    _BURST: Final = 5
    _IDLE_S: Final = 0.02

    def __init__(self, spin_s: float) -> None:
        self.spin_s = spin_s
        self.busy_s: deque[float] = deque(maxlen=self._WINDOW)
        self.asleep_s: deque[float] = deque(maxlen=self._WINDOW)
        self._calls = 0
        self._burst_at = 1  # the call the next burst begins with
        self.period = self._PERIOD
        self.prefer_busy = False
        self._last = False  # the way the last call took
        self._switched = False  # whether it was the first call of its way

    def busy(self) -> bool:
        """Whether the next call is waited for busily."""
        if self.spin_s <= 0:
            return False
        self._calls += 1
        busy, asleep = self.busy_s, self.asleep_s
        burst = self._burst_at <= self._calls < self._burst_at + self._BURST
        if self._calls == self._burst_at + self._BURST:  # a burst just ended
            self._burst_at += self._next_period()
        if not burst and busy and asleep:
            ratio = (sum(busy) / len(busy)) / (sum(asleep) / len(asleep))
            # Hysteresis: noise around one threshold would switch ways back and forth.
            self.prefer_busy = ratio < (1.0 if self.prefer_busy else self._GAIN)
        way = self.prefer_busy != burst
        self._switched, self._last = way != self._last, way
        if burst and self._switched:  # a burst measures the other way afresh
            (busy if way else asleep).clear()
        return way

    def _next_period(self) -> int:
        """Calls from this burst to the next: twice as many as last time (up to
        ``_MAX_PERIOD``) while the way it tried measured much worse than the other, such
        as busy waits on full cores, which cost milliseconds each; ``_PERIOD`` else."""
        tried, kept = (
            (self.asleep_s, self.busy_s) if self.prefer_busy else (self.busy_s, self.asleep_s)
        )
        worse = bool(tried and kept) and sum(tried) / len(tried) > self._WORSE * sum(kept) / len(
            kept
        )
        self.period = min(2 * self.period, self._MAX_PERIOD) if worse else self._PERIOD
        return self.period

    def took(self, busy: bool, seconds: float) -> None:
        """The cycle of the last call :meth:`busy` was asked about."""
        if seconds < self._IDLE_S and not self._switched:
            (self.busy_s if busy else self.asleep_s).append(seconds)


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
        spin_s: float = 0.0,
    ) -> None:
        self.loop = loop
        self.sql = sql
        self.writer = BatchWriter(sql)
        self._done = done
        self._lazy_s = lazy_s
        # Busy waiting for a reply (see the module's docstring): when to, and the call in
        # flight's (when it was sent, the wait's deadline and its next turn).
        self.reply_wait = _ReplyWait(spin_s)
        self._sent_at = 0.0
        self._busy = False
        self._spin_until = 0.0
        self._spin_turn: asyncio.Handle | None = None
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
        # The previous call's cycle ends here (a call sent in parts is not timed: its
        # cycle is the socket's, not the wait's).
        now = time.perf_counter()
        if self._sent_at:
            self.reply_wait.took(self._busy, now - self._sent_at)
        self._sent_at = now if sent else 0.0
        # (A closed loop's call is drained, blocking: no turn of it could run.)
        self._busy = sent and self.loop.is_running() and self.reply_wait.busy()
        if self._busy:
            self._spin_until = now + self.reply_wait.spin_s
            self._spin_turn = self.loop.call_soon(self._spin)

    def _spin(self) -> None:
        """One turn of the busy wait for the reply: another unless its time is up."""
        if time.perf_counter() < self._spin_until:
            _yield()  # a process that wants this core (the server's) has it first
            self._spin_turn = self.loop.call_soon(self._spin)
        else:
            self._spin_turn = None

    def _stop_spin(self) -> None:
        turn = self._spin_turn
        if turn is not None:
            turn.cancel()
            self._spin_turn = None

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
        self._stop_spin()
        self._flight = None
        self._finish(*flight, result)
        self._next()

    def _failed_in_flight(self, exc: Exception) -> None:
        self._stop_spin()
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
        self._stop_spin()
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
