"""A run's event stream as this process serves it: the consumers, what was streamed since
the executor started, the engine's own step-state events, and the questions a resumed run
asks again. Owned by the executor; nothing here is written to the log (the attempt that
streams an event records it with its commit).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ._events import Event, StepState, StepStateChanged, StopEvent, WorkflowIdleEvent

if TYPE_CHECKING:
    from ._attempt import Attempt
    from ._waits import WaitInfo

__all__ = ["RunStream", "say"]

_verbose_log = logging.getLogger("workflow.verbose")


def say(line: str) -> None:
    """A ``verbose=True`` line: to the ``workflow.verbose`` logger when it is enabled for
    DEBUG or INFO (as LlamaIndex's ``workflows.verbose``), else printed."""
    if _verbose_log.isEnabledFor(logging.DEBUG):
        _verbose_log.debug(line)
    elif _verbose_log.isEnabledFor(logging.INFO):
        _verbose_log.info(line)
    else:
        print(line)  # noqa: T201


class RunStream:
    """The consumers of one run's stream in this process, and what they are sent.

    ``origins`` says which attempt streamed an event (by id of the event, while it lives):
    kept beside the event, not on it, since an attribute would be logged as a field.
    """

    def __init__(self, *, verbose: bool, resumed: bool) -> None:
        self.verbose = verbose
        self._subscribers: list[asyncio.Queue[Event | None]] = []
        # Consumers of the engine's own events (stream_events(expose_internal=True)):
        # these are never journaled nor kept, so a run no one watches pays nothing for them.
        self._internal: list[asyncio.Queue[Event | None]] = []
        self._history: list[Event] = []
        self._ended = False
        # The questions a resumed run asks again (None until the inbox is taken in), and
        # the consumers subscribed before that, who are to be asked.
        self._reasks: list[Event] | None = None if resumed else []
        self._askees: list[asyncio.Queue[Event | None]] = []
        self.origins: dict[int, tuple[weakref.ref[Event], tuple[str, int, int]]] = {}
        # A consumer read the stream to its stop event: as in LlamaIndex, the run's stream
        # is consumed once (whichever handler or context read it), unless replayed.
        self.consumed = False
        # The run's one stream that consumers read without replay, as LlamaIndex's
        # streaming queue: what one of them took is gone, so a consumer that stops early
        # (a ``break`` to answer a question) and a later one go on from where it stopped.
        self._shared: asyncio.Queue[Event | None] | None = None
        # Who reads the shared queue now (a token of theirs), whether it is waiting there
        # for an event, and an event set once it stops reading (the handler's turns).
        self.holder: object | None = None
        self.holder_waiting = False
        self.holder_left = asyncio.Event()

    @property
    def watched(self) -> bool:
        """Whether step states are told to anyone (internal consumers, or the console)."""
        return bool(self._internal) or self.verbose

    def forget(self) -> None:
        """Forgets what was streamed (the executor starts over from a newer fold)."""
        self._history.clear()

    def will_ask_again(self) -> None:
        """The run's waits ask their questions again once its inbox is taken in."""
        self._reasks = None

    def stream_now(self, event: Event, att: Attempt | None) -> None:
        """Sends ``event`` to every consumer (``att``: the attempt that streamed it)."""
        if att is not None:
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

        Without ``replay`` it is the run's one shared queue, holding what no consumer took
        yet (from this executor's start, for the first); with ``replay``, a queue of its
        own. Without ``replay`` (whose recorded stream holds them already) a consumer of a
        resumed run is first asked the questions still unanswered (:meth:`ask_again`).
        """
        if not replay and (q := self._shared) is not None:
            if internal and not self._ended and q not in self._internal:
                self._internal.append(q)
            if self._ended and q.empty():
                q.put_nowait(None)  # read to its end before: it ends at once again
            return q
        q = asyncio.Queue()
        if not replay:
            self._shared = q
            if self._reasks is None:
                self._askees.append(q)
            else:
                for ev in self._reasks:
                    q.put_nowait(ev)
        for ev in self._history:
            q.put_nowait(ev)
        if self._ended:
            q.put_nowait(None)
        else:
            self._subscribers.append(q)
            if internal:
                self._internal.append(q)
        return q

    def step_state(
        self, step: str, worker: int, state: StepState, given: Event, output: Event | None = None
    ) -> None:
        """Tells internal-event consumers (and, verbose, the console) an attempt's state."""
        verbose = self.verbose
        if not self._internal and not verbose:
            return
        name_in = type(given).__name__
        name_out = None if output is None else type(output).__name__
        if verbose:
            if state is StepState.PREPARING:
                say(f"[{step}] enqueued (waiting for capacity)")
            elif state is StepState.RUNNING:
                say(f"[{step}:{worker}] started from {name_in}")
            else:
                result = f"with {name_out}" if name_out else "with no result"
                say(f"[{step}:{worker}] complete {result}")
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

    def idle(self) -> None:
        """The run has nothing to do but wait for an event (told to internal consumers)."""
        if self._internal:
            idle = WorkflowIdleEvent()
            for q in self._internal:
                q.put_nowait(idle)

    def ask_again(self, waiters: Iterable[WaitInfo]) -> None:
        """Asks the questions of waits still unanswered once the inbox is taken in (resume).

        A wait answered by the inbox, or by an event sent as the run resumed, is not asked.
        """
        now = time.time()
        self._reasks = [
            w.question
            for w in waiters
            if w.question is not None and (w.deadline is None or w.deadline > now)
        ]
        for q in self._askees:
            for ev in self._reasks:
                q.put_nowait(ev)
        self._askees.clear()

    def finish(self, stop: StopEvent) -> None:
        """The run finished with ``stop``: its consumers get it."""
        if self.verbose:
            say(f"[result] {stop!r}")
        self._history.append(stop)
        for q in self._subscribers:
            q.put_nowait(stop)

    def end(self, last: Event | None) -> None:
        """The run ended (``last``: the event that says how): every consumer's stream ends."""
        self._ended = True
        if last is not None:
            self._history.append(last)
        for q in self._subscribers:
            if last is not None:
                q.put_nowait(last)
            q.put_nowait(None)
        self._subscribers.clear()
