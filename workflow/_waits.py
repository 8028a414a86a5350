"""Durable waits and external events: the part of the executor that talks to the outside.

``wait_for_event`` ends an attempt with a ``waiting`` record; an event taken in from the
inbox (or the waiter's deadline) resolves the wait and delivers the step's input again.
Events that no step takes and no waiter wants stay ``unclaimed`` until one does.

Matching is atomic on the event loop: a wait is registered, and an event from outside is
matched or parked, synchronously, in the same turn as its commit is queued. Commits are
written in the order they are queued, so whatever the interleaving, a wait meets every event
taken in before it and every event taken in after it meets the wait, and the answer's commit
follows the wait's. Effects (the step running again, an event reaching its step) wait for
their commit to be durable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from eventstore import ConcurrencyError, EventStore, Record, class_name

from . import _journal as journal
from ._commit import wait_records
from ._errors import WorkflowRuntimeError
from ._events import Event
from ._fold import Failure, Folded

if TYPE_CHECKING:
    from eventstore import Codec

    from ._attempt import Attempt, WaitRequest
    from ._graph import Graph

__all__ = ["INBOX_POLL_S", "Delivery", "WaitInfo", "Waits", "WaitsHost"]

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
    failure: Failure | None = None  # its latest recorded failure (delivered by a resume)


@dataclass(slots=True)
class WaitInfo:
    """A wait of the run: what it awaits, and the step input it delivers again when answered."""

    waiter_id: str
    step: str
    event_id: int
    event: Event
    awaited: type[Event] | None
    awaited_name: str
    requirements: dict[str, Any]
    deadline: float | None
    question: Event | None = None  # the waiter event, streamed to ask for the answer
    timer: asyncio.TimerHandle | None = None
    # Whether its ``waiting`` record is written (False while that commit is in flight): an
    # answer's commit checks it in the writer, so it never lands without the wait.
    written: bool = True


class _Unrecorded(ConcurrencyError):
    """An answer's commit refused because the wait it answers was never written."""

    def __init__(self, run_id: str, waiter_id: str) -> None:
        msg = f"run {run_id!r}: wait {waiter_id!r} was not recorded; its answer is not either"
        super().__init__(msg, run_id=run_id)


class WaitsHost(Protocol):
    """What the waits use of the executor that owns them."""

    run_id: str
    codec: Codec
    graph: Graph
    store: EventStore

    @property
    def closing(self) -> bool: ...

    def submit(self, records: list[Record], **kw: Any) -> asyncio.Future[Any]: ...

    def end_with(self, exc: BaseException) -> None: ...

    def deliver(self, step: str, d: Delivery) -> None: ...

    def stream_now(self, event: Event, att: Attempt | None) -> None: ...

    def new_event_id(self) -> int: ...


class Waits:
    """A run's waits and the events that come from outside it (the inbox, ``handler.ctx``).

    Owned by the executor (:class:`~workflow._runner.Executor`), which it reaches through
    :class:`WaitsHost`: commits go through ``submit``, effects through ``deliver`` and
    ``stream_now``.
    """

    def __init__(self, host: WaitsHost) -> None:
        self._host = host
        self.waiters: dict[str, WaitInfo] = {}
        self.answers: dict[str, tuple[int, Event] | None] = {}
        self.unclaimed: dict[int, Event] = {}
        self._taken_inbox: set[int] = set()
        self._poke = asyncio.Event()
        # Events sent from outside before the executor holds the run, taken in once it does.
        self._early: list[tuple[Event, Any]] = []
        self._taking = False

    def load(self, folded: Folded) -> None:
        """Loads the waits, answers and unclaimed events of ``folded`` (JSON form)."""
        codec = self._host.codec
        load = codec.load
        for wid, w in folded.waiters.items():
            self.waiters[wid] = WaitInfo(
                wid,
                w.step,
                w.ev.id,
                load(w.ev.dump),
                # The class, not its name: an answer matches whatever module it came under.
                cast("type[Event]", codec.resolve(w.awaited)),
                w.awaited,
                load(w.requirements) or {},
                w.deadline,
                None if w.waiter_event is None else load(w.waiter_event),
            )
        for wid, ans in folded.answers.items():
            self.answers[wid] = None if ans is None else (ans.id, load(ans.dump))
        self.unclaimed.update((i, load(e.dump)) for i, e in folded.unclaimed.items())

    def clear(self) -> None:
        """Forgets the waits (the executor starts over from a newer fold)."""
        self.waiters.clear()
        self.answers.clear()
        self.unclaimed.clear()

    def _then(self, fut: asyncio.Future[Any], effect: Callable[[], None]) -> None:
        """Runs ``effect`` once the commit of ``fut`` is durable; a failed commit ends the run."""

        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is None:
                effect()
            elif not self._host.closing and not isinstance(exc, _Unrecorded):
                # (An unrecorded wait's own commit failed first and ends the run with that.)
                self._host.end_with(exc)

        fut.add_done_callback(done)

    # ------------------------------------------------------------------ waits

    async def commit_wait(self, att: Attempt, request: WaitRequest) -> None:
        """Ends an attempt in a wait; the wait is matched from the moment its commit is queued.

        The question (the waiter event) is streamed once the wait is durable, unless the
        wait was answered by then.
        """
        other = self.waiters.get(request.waiter_id)
        if other is not None and (other.step, other.event_id) != (att.step, att.event_id):
            # Waits are keyed by id: a second one would replace the first, which then
            # never runs again (branches that share an explicit waiter_id).
            msg = (
                f"waiter_id {request.waiter_id!r} is already waited on by step {other.step!r}"
                f" (event {other.event_id}); give each wait its own waiter_id, or none"
            )
            raise WorkflowRuntimeError(msg)
        question = request.waiter_event
        timeout = request.timeout
        deadline = None if timeout is None else time.time() + float(timeout)
        w = WaitInfo(
            request.waiter_id,
            att.step,
            att.event_id,
            att.event,
            request.awaited,
            request.awaited_name,
            request.requirements,
            deadline,
            question,
            written=False,
        )
        # An event taken in before the wait began answers it at once: nobody is asked.
        early = next(((i, ev) for i, ev in self.unclaimed.items() if self._matches(w, ev)), None)
        ask = question if early is None else None
        if ask is not None:
            att.streamed.insert(0, ask)
        records = wait_records(self._host.codec, att, request, deadline)

        def written(seq: Any) -> None:
            w.written = True

        fut = self._host.submit(records, on_written=written)
        # Nothing awaited since the match above: the wait and the events are still as seen.
        if early is not None:
            del self.unclaimed[early[0]]
            self._resolve(w, early[0], early[1])
        else:
            self.waiters[w.waiter_id] = w
            self.arm(w)
        try:
            await fut
        except BaseException:
            if self.waiters.get(w.waiter_id) is w:
                del self.waiters[w.waiter_id]
                if w.timer is not None:
                    w.timer.cancel()
            raise
        if ask is not None and self.waiters.get(w.waiter_id) is w:
            self._host.stream_now(ask, att)

    def arm(self, w: WaitInfo) -> None:
        if w.deadline is None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, w.deadline - time.time())
        w.timer = loop.call_later(delay, self._expire, w)

    def _expire(self, w: WaitInfo) -> None:
        if self.waiters.get(w.waiter_id) is not w or self._host.closing:
            return
        try:
            self._resolve(w, None, None)
        except Exception as exc:  # a timer callback: nobody else would see it
            self._host.end_with(exc)

    def _matches(self, w: WaitInfo, ev: Event) -> bool:
        if w.awaited is not None:
            if not isinstance(ev, w.awaited):
                return False
        elif class_name(type(ev)) != w.awaited_name:
            return False
        return all(getattr(ev, k, _ABSENT) == v for k, v in w.requirements.items())

    def _waiters_for(self, ev: Event) -> list[WaitInfo]:
        """Every wait ``ev`` answers: as in LlamaIndex, one event answers all the waits it
        matches (three branches waiting for one approval all get it)."""
        return [w for w in self.waiters.values() if self._matches(w, ev)]

    def _resolve(
        self,
        w: WaitInfo | list[WaitInfo],
        ev_id: int | None,
        ev: Event | None,
        inbox_id: int | None = None,
    ) -> asyncio.Future[Any]:
        """Answers waits (``ev`` None: a deadline passed) now, in one commit; each one's
        step runs again once the answer is durable. Returns the answer's commit."""
        ws = w if isinstance(w, list) else [w]
        dump = self._host.codec.dump
        answer_dump = None if ev is None else dump(ev)
        records = []
        for one in ws:
            self.waiters.pop(one.waiter_id, None)
            if one.timer is not None:
                one.timer.cancel()
            records.append(journal.wait_resolved(one.step, one.waiter_id, ev_id, answer_dump))
            records.append(
                journal.enqueued(one.step, one.event_id, dump(one.event), journal.SRC_WAITER)
            )

        def recorded() -> None:
            for one in ws:
                if not one.written:
                    raise _Unrecorded(self._host.run_id, one.waiter_id)

        fut = self._host.submit(
            records,
            inbox_taken=[inbox_id] if inbox_id is not None else None,
            check=None if all(one.written for one in ws) else recorded,
        )
        answer = None if ev is None or ev_id is None else (ev_id, ev)

        def run_again() -> None:
            for one in ws:
                self.answers[one.waiter_id] = answer
                self._host.deliver(one.step, Delivery(one.event_id, one.event))

        self._then(fut, run_again)
        return fut

    def park(self, ev_id: int, ev: Event) -> None:
        """An event no step takes (already in the log): it answers a wait, or waits for one."""
        ws = self._waiters_for(ev)
        if ws:
            self._resolve(ws, ev_id, ev)
        else:
            self.unclaimed[ev_id] = ev

    # ------------------------------------------------------------------ external events

    def poke(self) -> None:
        self._poke.set()

    def send_external_nowait(self, event: Event) -> None:
        """Takes an event from outside any step (``ctx.send_event`` on ``handler.ctx``) now.

        Before the executor holds the run it is kept, in order, and taken in right after
        the inbox. A value the codec cannot store is refused here.
        """
        dumped = self._host.codec.dump(event)
        if not self._taking:
            self._early.append((event, dumped))
            return
        self.take_external(event, None, dumped=dumped)

    def start_taking(self) -> None:
        """From now on events from outside are taken in as they come; the early ones first."""
        self._taking = True
        early, self._early = self._early, []
        for ev, dumped in early:
            self.take_external(ev, None, dumped=dumped)

    def take_external(
        self,
        ev: Event,
        inbox_id: int | None,
        src: journal.Source = journal.SRC_EXTERNAL,
        *,
        dumped: Any = _ABSENT,
    ) -> asyncio.Future[Any] | None:
        """Takes an event into the run, deciding now where it goes; returns its commit.

        A waiter it matches is answered; otherwise its steps get it once its commit is
        durable, or, if no step takes it, it is parked at once, so a wait that begins
        before that commit is durable still finds it.
        """
        if self._host.closing:
            return None
        dump = self._host.codec.dump(ev) if dumped is _ABSENT else dumped
        ev_id = self._host.new_event_id()
        ws = self._waiters_for(ev)
        if ws:
            return self._resolve(ws, ev_id, ev, inbox_id)
        targets = self._host.graph.route(type(ev))
        records = [journal.enqueued(t, ev_id, dump, src) for t in targets] or [
            journal.enqueued(None, ev_id, dump, src)
        ]
        fut = self._host.submit(records, inbox_taken=[inbox_id] if inbox_id is not None else None)
        if not targets:
            self.unclaimed[ev_id] = ev

        def reach_steps() -> None:
            for t in targets:
                self._host.deliver(t, Delivery(ev_id, ev))

        self._then(fut, reach_steps)
        return fut

    def take_inbox(self) -> None:
        """Takes in the inbox's new entries, in order (their commits are queued in order)."""
        for entry in self._host.store.inbox(self._host.run_id):
            if entry.id in self._taken_inbox or self._host.closing:
                continue
            self._taken_inbox.add(entry.id)
            ev = self._host.codec.decode(entry.payload)
            self.take_external(ev, entry.id)

    async def inbox_loop(self) -> None:
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
            self.take_inbox()
