"""What a caller outside the steps watches of a context's run (LlamaIndex's external face).

``await ctx.running_steps()``, ``ctx.stream_events()``, and the deprecated
``ctx.get_result()`` and ``ctx.streaming_queue``: the calls LlamaIndex makes on the context
a run was started with, beside the same ones on its handler. They need a run this process
executes (or executed); before the context's first run they raise
:class:`~workflow.ContextStateError`, as LlamaIndex's do. They reach the handler through the
workflow's context services (the handler module sits above the context's).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from typing import Any, Protocol

from ._errors import ContextStateError
from ._events import Event, StopEvent

__all__ = ["ContextWatch", "RunWatch"]


class RunWatch(Protocol):
    """What the context uses of the handler of its run (``WorkflowHandler``)."""

    run_id: str

    def stream_events(self, expose_internal: bool = False) -> AsyncIterator[Event]: ...

    def is_done(self) -> bool: ...

    def result(self) -> Any: ...


class _Services(Protocol):
    """The two context services these calls use (``ContextServices``)."""

    def running_steps(self, ctx: Any) -> list[str]: ...

    def handler(self, ctx: Any, call: str) -> RunWatch: ...


class _Owner(Protocol):
    @property
    def __context_services__(self) -> _Services: ...


class _Link(Protocol):
    """What these calls read of ``ctx.__context_link__`` (``ContextLink``)."""

    @property
    def workflow(self) -> _Owner: ...


class ContextWatch:
    """The context's calls about its run as a whole, for code outside the steps."""

    __context_link__: _Link

    async def running_steps(self) -> list[str]:
        """The steps with an attempt running now, sorted (empty once the run ended).

        :raises ContextStateError: no run was started from this context yet.
        """
        return self.__context_link__.workflow.__context_services__.running_steps(self)

    def stream_events(self) -> AsyncIterator[Event]:
        """The events of the run started from this context, live, ending with how it ended:
        what ``handler.stream_events(expose_internal=True)`` yields (the engine's
        :class:`StepStateChanged` events among them, as LlamaIndex's context stream has).

        :raises ContextStateError: no run was started from this context yet.
        """
        services = self.__context_link__.workflow.__context_services__
        return services.handler(self, "stream_events()").stream_events(expose_internal=True)

    def get_result(self) -> Any:
        """The finished run's result, as ``await handler`` gives it.

        .. deprecated:: Await the handler ``wf.run(ctx=ctx)`` returned instead.

        :raises ContextStateError: no run was started from this context, or it has not
            ended yet.
        """
        warnings.warn(
            "Context.get_result() is deprecated: await the handler wf.run(ctx=ctx) returned",
            DeprecationWarning,
            stacklevel=2,
        )
        handler = self.__context_link__.workflow.__context_services__.handler(self, "get_result()")
        if not handler.is_done():
            msg = f"run {handler.run_id!r} has not ended yet: await its handler for the result"
            raise ContextStateError(msg)
        return handler.result()

    @property
    def streaming_queue(self) -> asyncio.Queue[Event]:
        """A queue the run's stream is copied into, up to its stop event.

        .. deprecated:: Iterate :meth:`stream_events` instead.

        :raises ContextStateError: no run was started from this context yet.
        """
        warnings.warn(
            "Context.streaming_queue is deprecated: iterate ctx.stream_events() instead",
            DeprecationWarning,
            stacklevel=2,
        )
        events = self.stream_events()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        async def pump() -> None:
            async for ev in events:
                await queue.put(ev)
                if isinstance(ev, StopEvent):
                    return

        task = asyncio.get_running_loop().create_task(pump())
        _PUMPS.add(task)
        task.add_done_callback(_PUMPS.discard)
        return queue


# The pumps running (a task only the loop references may be collected before it ends).
_PUMPS: set[asyncio.Task[None]] = set()
