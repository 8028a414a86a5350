"""What ``workflow verify --reexecute`` runs a recorded attempt on: a stand-in executor.

The attempt gets the context and collect buffers the log held when it began, and what it
writes, sends and collects stays with it, to be compared with what its commit recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventstore import StoredRecord

from . import _journal as J
from ._attempt import Attempt
from ._buffers import collect_key
from ._errors import WorkflowRuntimeError
from ._events import Event
from ._fold import Folded, MemoRec

if TYPE_CHECKING:
    from ._context import Context
    from ._facade_protocol import Facade

__all__ = ["Buffers", "ReplayHost", "ReplayInputs", "replay_inputs"]

Buffers = dict[str, dict[str, list[tuple[int, Event]]]]


@dataclass(slots=True)
class ReplayInputs:
    """What an attempt read besides its context: its step's collect buffers and the
    answers to its waits, as they stood when the recorded attempt ran."""

    buffers: Buffers = field(default_factory=dict)
    answers: dict[str, tuple[int, Event] | None] = field(default_factory=dict)


def replay_inputs(
    state: Folded, step: str, commit: list[StoredRecord], load: Callable[[Any], Any]
) -> ReplayInputs:
    """The inputs of the attempt whose commit is ``commit``, from ``state`` (the fold of
    the log before it).

    A collect's outcome comes from the log, as a memoized call's does: a buffer the commit
    took from holds the events it took (its ``ids``); one it only put into holds nothing
    else, since the live buffer held no full set then. The fold before the commit is not
    that buffer when a slower collector's take was written after this commit's: what
    the recorded attempt found there is what its records say.
    """
    prefix = f"{step}:"
    touched: dict[str, set[int] | None] = {}  # buffer key -> ids taken (None: no ids kept)
    for r in commit:
        if r.kind != J.COLLECTED:
            continue
        p: J.Collected = r.data()
        key = collect_key(step, p)
        ids = p.get("ids")
        if p.get("takes") and ids is None:
            touched[key] = None  # a take of records before ids: the buffer as folded
        elif key not in touched or touched[key] is not None:
            before = touched.get(key) or set()  # every take of the attempt from this buffer
            touched[key] = before | {i for a, b in ids or () for i in range(a, b + 1)}
    buffers: Buffers = {}
    for key, buf in state.buffers.items():
        if not key.startswith(prefix):
            continue
        keep = touched.get(key)
        if key in touched and keep is not None:
            buf = {n: [e for e in evs if e.id in keep] for n, evs in buf.items()}
        buffers[key] = {n: [(e.id, load(e.dump)) for e in evs] for n, evs in buf.items() if evs}
    answers = {
        wid: None if ev is None else (ev.id, load(ev.dump)) for wid, ev in state.answers.items()
    }
    return ReplayInputs(buffers, answers)


class _ThisLoop:
    """Where a context runs its calls (``Context._on_loop`` asks for the run's loop): a
    replayed attempt's code runs on the loop that replays it, a plain ``def`` too."""

    @staticmethod
    def get_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


class ReplayHost:
    """A stand-in executor for one attempt: recorded context and buffers in, buffered
    writes out; ``buffers`` (key -> class name -> (event id, event)) is the attempt's own
    to change."""

    replaying = True  # memoized calls come from the log; one it lacks is a divergence
    done = _ThisLoop()

    def __init__(
        self,
        wf: Facade,
        context: dict[str, Any],
        memos: dict[int, dict[str, MemoRec]],
        inputs: ReplayInputs | None = None,
    ) -> None:
        from ._context import bound_context

        parts = wf.__workflow_parts__

        self._memos = memos
        self.wf = wf
        self.config = parts.run_config()  # the settings a run started now would have
        self.codec = parts.codec
        self.graph = parts.graph
        self.committed = context
        self.versions: dict[str, int] = {}
        self.keylog: dict[str, list[int]] = {}  # sizes of values: none known here
        inputs = ReplayInputs() if inputs is None else inputs
        self.buffers: Buffers = inputs.buffers
        self.answers: dict[str, Any] = inputs.answers
        self.state_lock = asyncio.Lock()
        self.run_id = "verify"
        self.ctx: Context[Any] = bound_context(self, wf, parts.state_type)  # type: ignore[arg-type]
        self._next = 10**9

    def pin(self, key: str) -> None:
        return

    def new_event_id(self) -> int:
        self._next += 1
        return self._next

    def live_buffer(self, buf_key: str) -> dict[str, list[tuple[int, Event]]]:
        return self.buffers.setdefault(buf_key, {})

    def collect_put(self, att: Attempt, buf_key: str, entry: tuple[int, Event]) -> None:
        return

    def collect_take(self, att: Attempt, buf_key: str, taken: list[tuple[int, Event]]) -> None:
        return

    def stream_now(self, event: Event, att: Attempt | None) -> None:
        return

    def memos_of(self, step: str, event_id: int) -> dict[str, MemoRec]:
        return self._memos.get(event_id, {})

    async def append(self, records: list[Any], **kw: Any) -> int:
        msg = "verify re-executes attempts without writing to the log"
        raise WorkflowRuntimeError(msg)
