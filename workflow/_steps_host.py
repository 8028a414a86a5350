"""What the step workers (``workflow._attempts.StepRunner``) use of the executor that owns
them: a protocol, so that the workers' module never imports the executor's."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from eventstore import Record

from ._attempt import Attempt
from ._collect_call import CollectHost
from ._events import Event, StopEvent

if TYPE_CHECKING:
    from eventstore import Codec

    from ._collects import CollectBuffers
    from ._context import Context
    from ._fold import Folded
    from ._graph import Graph
    from ._live_context import LiveContext
    from ._run_config import RunConfig
    from ._run_log import RunLog
    from ._stream import RunStream
    from ._streams import StreamBook
    from ._waits import Waits

__all__ = ["StepsHost"]


class StepsHost(CollectHost, Protocol):
    """What the step workers use of the executor that owns them (``_runner.Executor``);
    a join's inputs wait in its buffer as ``collect_events`` keeps them."""

    run_id: str
    next_id: int
    ctx: Context[Any]
    streams: StreamBook | None

    @property
    def config(self) -> RunConfig: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def graph(self) -> Graph: ...

    @property
    def live(self) -> LiveContext: ...

    @property
    def collects(self) -> CollectBuffers: ...

    @property
    def waits(self) -> Waits: ...

    @property
    def stream(self) -> RunStream: ...

    @property
    def log(self) -> RunLog: ...

    @property
    def state_lock(self) -> asyncio.Lock: ...

    @property
    def answers(self) -> dict[str, tuple[int, Event] | None]: ...

    @property
    def closing(self) -> bool: ...

    @property
    def started(self) -> bool: ...

    @property
    def folded(self) -> Folded: ...

    async def append(self, records: list[Record], **kw: Any) -> int: ...

    def new_event_id(self) -> int: ...

    def stream_now(self, event: Event, att: Attempt | None) -> None: ...

    def update_clock(self) -> None: ...

    def observe(self, seq: int) -> None: ...

    def finish(self, stop: StopEvent) -> None: ...

    def end_with(self, exc: BaseException) -> None: ...

    def stop_refused(self, exc: BaseException) -> None: ...
