"""An attempt's buffers: what one step attempt read, wrote, sent, streamed and collected.

The lowest of the engine's modules: the context, its store, memoized calls, timers and the
executor all hand attempts around, so the attempt imports none of them.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson

from eventstore import class_name

from ._diff import Tracker
from ._events import Event

if TYPE_CHECKING:
    from ._changes import KeyChange
    from ._retry import RetryClock

__all__ = [
    "MISSING",
    "Attempt",
    "Current",
    "WaitRequest",
    "WaitSuspend",
    "Write",
    "attempt_of",
    "current_attempt",
]

# What a read finds where there is no value (never a value of the run's).
MISSING: Any = object()

V = TypeVar("V")


class Current(Generic[V]):
    """A context variable for what is running now (the attempt, its context) that a copy of
    the context cannot keep alive: ``set`` puts the value in a box and ``reset`` empties
    it, so a timer or a task a step scheduled (each keeps a copy of the context's
    variables) holds the empty box after the step, not the run's workflow and executor.
    Its ``get``, ``set`` and ``reset`` are ``ContextVar``'s."""

    __slots__ = ("_var",)

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[list[V | None] | None] = contextvars.ContextVar(
            name, default=None
        )

    def get(self) -> V | None:
        box = self._var.get()
        return None if box is None else box[0]

    def set(self, value: V) -> tuple[contextvars.Token[list[V | None] | None], list[V | None]]:
        box: list[V | None] = [value]
        return self._var.set(box), box

    def reset(self, token: tuple[contextvars.Token[list[V | None] | None], list[V | None]]) -> None:
        var_token, box = token
        box[0] = None
        self._var.reset(var_token)


current_attempt: Current[Attempt] = Current("workflow_attempt")


def attempt_of(host: object) -> Attempt | None:
    """The attempt running now, if it is an attempt of ``host``'s run; else None.

    A step may hold the context of another run (a workflow it ran: ``handler.ctx``):
    calls on that context act on that run as from outside it, never on the caller's own
    attempt (its reads, writes and sends are the caller's run's).
    """
    box = current_attempt._var.get()  # Current.get, inlined: this runs at every get and set
    att = None if box is None else box[0]
    return att if att is not None and att.host is host else None


@dataclass(frozen=True, slots=True)
class WaitRequest:
    """What an attempt waits for: ``wait_for_event``'s arguments, checked, or a durable
    sleep's (``timeout`` its seconds, an ``awaited`` class nobody sends)."""

    waiter_id: str
    awaited: type[Event]
    requirements: dict[str, Any]
    timeout: float | None
    waiter_event: Event | None = None  # the question streamed to ask for the answer

    @property
    def awaited_name(self) -> str:
        """The awaited class's recorded name."""
        return class_name(self.awaited)


class WaitSuspend(BaseException):
    """Ends an attempt that waits for an event (a BaseException: user code must not catch it)."""

    def __init__(self, request: WaitRequest) -> None:
        self.request = request
        super().__init__(request.waiter_id)


@dataclass(slots=True)
class Write:
    """One key's pending change in an attempt, as ``set()`` encoded it: a tracked view's
    patch, a new value, or a delete.

    What the commit writes is fixed at the ``set()`` call, as a durable store writes what it
    is given: a change made to the value afterwards, without setting it again, is not
    written (the attempt's own reads still see it).
    """

    tracker: Tracker | None = None
    value: Any = MISSING  # what the attempt reads back, when not the tracker's view
    deleted: bool = False
    change: KeyChange | None = None  # what the commit writes, encoded (None: no change)
    text: str | None = None  # a new value's JSON text
    version: int = 0  # the key's version a new value's change was made against


@dataclass(slots=True, init=False)
class Attempt:
    """An attempt's buffers: what it read (with versions), wrote, sent, streamed, collected.

    Its ``__init__`` is written out (literals, not eleven default factories called): one is
    built per attempt, on the path of every step.
    """

    step: str
    event_id: int
    attempt: int
    event: Event
    reads: dict[str, int] = field(default_factory=dict)
    trackers: dict[str, Tracker] = field(default_factory=dict)
    writes: dict[str, Write] = field(default_factory=dict)
    sent: list[tuple[Event, str | None]] = field(default_factory=list)
    streamed: list[Event] = field(default_factory=list)
    # (buffer key, buffer id, event put in, names taken out) of each collect_events change;
    # for a put, [the name it is buffered under] when not its event's class (a join of subclasses)
    collects: list[tuple[str, str, tuple[int, Event] | None, list[str] | None]] = field(
        default_factory=list
    )
    buffers: dict[str, dict[str, list[tuple[int, Event]]]] = field(default_factory=dict)
    # What its collect_events calls took out of live buffers (buffer key, entries), the
    # outcomes of the attempts whose puts it took, and its own outcome (True: committed;
    # False: its collects were undone), for those who took what it put.
    taken: list[tuple[str, list[tuple[int, Event]]]] = field(default_factory=list)
    deps: list[Attempt] = field(default_factory=list)
    outcome: asyncio.Future[bool] | None = None
    put_written: bool = False  # its commit, with its puts, is written (set in the writer)
    collect_base: int = 0  # the latest commit of the buffers it collected in (for "base")
    wait_calls: int = 0
    answers_used: list[str] = field(default_factory=list)
    holds_lock: bool = False
    retry: RetryClock | None = None  # where this event's attempts stand (ctx.retry_info())
    refused: Exception | None = None  # a deprecate_patch refusal: the run stops unfailed
    # The JSON of events checked when they were streamed or asked, by id(event): the
    # attempt's outcome commit writes it (the events stay alive in ``streamed``).
    encoded: dict[int, orjson.Fragment] | None = None
    # The run it belongs to, for memoized calls (``_memo.MemoHost``), and how many times
    # each memo key was used in it (so repeated calls keep their call order).
    host: Any = None
    memo_keys: dict[str, int] | None = None
    sleep_calls: int = 0
    child_calls: int = 0
    # Where the events of the list a fan-out step returned start in ``sent`` (None: it
    # returned no list): they are the members of the stream it opens (``_streams``).
    spread: int | None = None

    def __init__(
        self,
        step: str,
        event_id: int,
        attempt: int,
        event: Event,
        *,
        host: Any = None,
        sent: list[tuple[Event, str | None]] | None = None,
        streamed: list[Event] | None = None,
    ) -> None:
        self.step = step
        self.event_id = event_id
        self.attempt = attempt
        self.event = event
        self.reads = {}
        self.trackers = {}
        self.writes = {}
        self.sent = [] if sent is None else sent
        self.streamed = [] if streamed is None else streamed
        self.collects = []
        self.buffers = {}
        self.taken = []
        self.deps = []
        self.outcome = None
        self.put_written = False
        self.collect_base = 0
        self.wait_calls = 0
        self.answers_used = []
        self.holds_lock = False
        self.retry = None
        self.refused = None
        self.encoded = None
        self.host = host
        self.memo_keys = None
        self.sleep_calls = 0
        self.child_calls = 0
        self.spread = None

    def keep_json(self, event: Event, text: orjson.Fragment) -> None:
        """Keeps the JSON of an event the attempt streams, for its outcome commit."""
        if self.encoded is None:
            self.encoded = {}
        self.encoded[id(event)] = text
