"""Durable waits and external events: the part of the executor that talks to the outside.

``wait_for_event`` ends an attempt with a ``waiting`` record; an event taken in from the
inbox (or the waiter's deadline) resolves the wait and delivers the step's input again.
Events that no step takes and no waiter wants stay ``unclaimed`` until one does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from eventstore import EventStore, Record, class_name

from . import _journal as J
from ._events import Event

if TYPE_CHECKING:
    from eventstore import Codec

    from ._context import Attempt
    from ._graph import Graph

__all__ = ["INBOX_POLL_S", "Delivery", "WaitInfo", "WaitsAndInbox"]

INBOX_POLL_S: Final = 0.1
_ABSENT: Final[Any] = object()


@dataclass(slots=True)
class Delivery:
    """An event handed to a step's worker: new, or re-delivered by a resume."""

    event_id: int
    event: Event
    attempts: int = 0
    failures: int = 0
    redelivered: bool = False  # taken before (in progress): no new dequeue record
    durable: bool = False  # its start is committed before it runs (delivered by a resume)


@dataclass(slots=True)
class WaitInfo:
    waiter_id: str
    step: str
    event_id: int
    event: Event
    awaited: type[Event] | None
    awaited_name: str
    requirements: dict[str, Any]
    deadline: float | None
    timer: asyncio.TimerHandle | None = None


class WaitsAndInbox:
    """Waits and external events of :class:`~workflow._runner.Executor` (its base class)."""

    # What this part uses of the executor.
    run_id: str
    codec: Codec
    graph: Graph
    store: EventStore
    waiters: dict[str, WaitInfo]
    answers: dict[str, tuple[int, Event] | None]
    unclaimed: dict[int, Event]
    _taken_inbox: set[int]
    _poke: asyncio.Event
    _closing: bool

    if TYPE_CHECKING:

        async def append(self, records: list[Record], **kw: Any) -> int: ...

        def deliver(self, step: str, d: Delivery) -> None: ...

        def stream_now(self, event: Event, att: Attempt | None) -> None: ...

        def new_event_id(self) -> int: ...

        def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

        def _streamed(self, att: Attempt) -> list[Record]: ...

    # ------------------------------------------------------------------ waits

    async def _commit_wait(self, att: Attempt, info: dict[str, Any]) -> None:
        dump = self.codec.dump
        awaited: type[Event] = info["awaited"]
        wev: Event | None = info["waiter_event"]
        deadline = None if info["timeout"] is None else time.time() + float(info["timeout"])
        if wev is not None:
            self.stream_now(wev, att)
            att.streamed.insert(0, wev)
        await self.append(
            [
                J.waiting(
                    att.step,
                    att.event_id,
                    att.attempt,
                    info["waiter_id"],
                    class_name(awaited),
                    dump(info["requirements"]),
                    deadline,
                    None if wev is None else dump(wev),
                ),
                *self._streamed(att),
            ]
        )
        w = WaitInfo(
            info["waiter_id"],
            att.step,
            att.event_id,
            att.event,
            awaited,
            class_name(awaited),
            info["requirements"],
            deadline,
        )
        self.waiters[w.waiter_id] = w
        self._arm(w)
        for ev_id, ev in list(self.unclaimed.items()):
            if self._matches(w, ev):
                del self.unclaimed[ev_id]
                await self._resolve(w, ev_id, ev)
                break

    def _arm(self, w: WaitInfo) -> None:
        if w.deadline is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, w.deadline - time.time())
        w.timer = loop.call_later(delay, lambda: self._spawn(self._expire(w)))

    async def _expire(self, w: WaitInfo) -> None:
        if self.waiters.get(w.waiter_id) is w:
            await self._resolve(w, None, None)

    def _matches(self, w: WaitInfo, ev: Event) -> bool:
        if w.awaited is not None:
            if not isinstance(ev, w.awaited):
                return False
        elif class_name(type(ev)) != w.awaited_name:
            return False
        return all(getattr(ev, k, _ABSENT) == v for k, v in w.requirements.items())

    async def _resolve(
        self, w: WaitInfo, ev_id: int | None, ev: Event | None, inbox_id: int | None = None
    ) -> None:
        dump = self.codec.dump
        del self.waiters[w.waiter_id]
        if w.timer is not None:
            w.timer.cancel()
        await self.append(
            [
                J.wait_resolved(w.step, w.waiter_id, ev_id, None if ev is None else dump(ev)),
                J.enqueued(w.step, w.event_id, dump(w.event), J.SRC_WAITER),
            ],
            inbox_taken=[inbox_id] if inbox_id is not None else None,
        )
        self.answers[w.waiter_id] = None if ev is None or ev_id is None else (ev_id, ev)
        self.deliver(w.step, Delivery(w.event_id, w.event))

    # ------------------------------------------------------------------ external events

    def poke(self) -> None:
        self._poke.set()

    def send_external_nowait(self, event: Event) -> None:
        """Takes an event from outside any step (``ctx.send_event`` on ``handler.ctx``)."""
        self._spawn(self.take_external(event, None))

    async def take_external(
        self, ev: Event, inbox_id: int | None, src: str = J.SRC_EXTERNAL
    ) -> None:
        if self._closing:
            return
        ev_id = self.new_event_id()
        for w in list(self.waiters.values()):
            if self._matches(w, ev):
                await self._resolve(w, ev_id, ev, inbox_id)
                return
        dump = self.codec.dump(ev)
        targets = self.graph.route(type(ev))
        records = [J.enqueued(t, ev_id, dump, src) for t in targets] or [
            J.enqueued(None, ev_id, dump, src)
        ]
        await self.append(records, inbox_taken=[inbox_id] if inbox_id is not None else None)
        if not targets:
            self.unclaimed[ev_id] = ev
        for t in targets:
            self.deliver(t, Delivery(ev_id, ev))

    async def take_inbox(self) -> None:
        for entry in self.store.inbox(self.run_id):
            if entry.id in self._taken_inbox or self._closing:
                continue
            self._taken_inbox.add(entry.id)
            ev = self.codec.decode(entry.payload)
            await self.take_external(ev, entry.id)

    async def _inbox_loop(self) -> None:
        # A timer pokes too, so another process's send is taken in within the interval.
        # (Not asyncio.wait_for: on Python 3.11 cancelling it can hang the task.)
        loop = asyncio.get_running_loop()
        while True:
            timer = loop.call_later(INBOX_POLL_S, self._poke.set)
            try:
                await self._poke.wait()
            finally:
                timer.cancel()
            self._poke.clear()
            await self.take_inbox()
