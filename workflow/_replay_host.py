"""What ``workflow verify --reexecute`` runs a recorded attempt on: a stand-in executor.

The attempt gets the context and collect buffers the log held when it began, and what it
writes, sends and collects stays with it, to be compared with what its commit recorded.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ._attempt import Attempt
from ._errors import WorkflowRuntimeError
from ._events import Event
from ._fold import MemoRec

if TYPE_CHECKING:
    from ._context import Context
    from ._facade_protocol import Facade

__all__ = ["Buffers", "ReplayHost"]

Buffers = dict[str, dict[str, list[tuple[int, Event]]]]


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
        buffers: Buffers | None = None,
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
        self.buffers: Buffers = {} if buffers is None else buffers
        self.answers: dict[str, Any] = {}
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
