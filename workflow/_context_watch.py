"""What a caller outside the steps asks of a context's run (LlamaIndex's external face).

``ctx.is_running``, ``ctx.to_dict()``, ``await ctx.running_steps()``, ``ctx.stream_events()``,
and the deprecated ``ctx.get_result()`` and ``ctx.streaming_queue``: the calls LlamaIndex
makes on the context a run was started with, beside the same ones on its handler. The run
calls need a run this process executes (or executed); before the context's first run they
raise :class:`~workflow.ContextStateError`, as LlamaIndex's do, and ``to_dict`` raises it
inside a step. They reach the handler through the workflow's context services (the handler
module sits above the context's).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from ._attempt import attempt_of
from ._errors import ContextStateError, WorkflowRuntimeError
from ._events import Event, StopEvent

if TYPE_CHECKING:
    from .context.serializers import BaseSerializer

__all__ = ["ContextWatch", "RunWatch"]


class RunWatch(Protocol):
    """What the context uses of the handler of its run (``WorkflowHandler``)."""

    run_id: str

    def stream_events(self, expose_internal: bool = False) -> AsyncIterator[Event]: ...

    def is_done(self) -> bool: ...

    def result(self) -> Any: ...


class _Services(Protocol):
    """The context services these calls use (``ContextServices``)."""

    def running_steps(self, ctx: Any) -> list[str]: ...

    def run_is_live(self, ctx: Any) -> bool: ...

    def context_dict(self, ctx: Any, serializer: Any, state: bool) -> dict[str, Any]: ...

    def handler(self, ctx: Any, call: str) -> RunWatch: ...


class _Owner(Protocol):
    @property
    def __context_services__(self) -> _Services: ...


class _Link(Protocol):
    """What these calls read of ``ctx.__context_link__`` (``ContextLink``)."""

    @property
    def workflow(self) -> _Owner: ...

    @property
    def host(self) -> object: ...


class ContextWatch:
    """The context's calls about its run as a whole, for code outside the steps."""

    __context_link__: _Link

    def to_dict(
        self, serializer: BaseSerializer | None = None, *, include_state: bool = True
    ) -> dict[str, Any]:
        """The context as a JSON-native dict: its run and seq, and the run's state there.

        The state (context values, queues, in-progress events, waiters, collect buffers) is
        in the codec's typed JSON; ``include_state=False`` leaves the context values out:
        restored where the store has the run they are the log's; imported into a store
        without it, the run starts with none. ``serializer`` turns each value into its text
        instead (:mod:`workflow.context.serializers`). Restore it with :meth:`from_dict`,
        here or in another process.

        :raises ContextStateError: called inside one of the run's steps, as in LlamaIndex:
            what the attempt wrote is not committed yet, so the dict would silently lack it.
        """
        if attempt_of(self.__context_link__.host) is not None:
            msg = (
                "to_dict is only available from handler code, not from within steps: the"
                " running attempt's writes are not committed yet (every commit is a"
                " checkpoint: wf.checkpoints(run_id) outside the step)"
            )
            raise ContextStateError(msg)
        services = self.__context_link__.workflow.__context_services__
        return services.context_dict(self, serializer, include_state)

    @property
    def is_running(self) -> bool:
        """Whether this context's run is being executed (here, or by another process).

        Inside one of the run's steps it is always True: asking there is deprecated (a
        ``DeprecationWarning``, as in LlamaIndex)."""
        if attempt_of(self.__context_link__.host) is not None:
            warnings.warn(
                "is_running called from within a step; the workflow is always running"
                " inside a step. This usage is deprecated.",
                DeprecationWarning,
                stacklevel=2,
            )
            return True
        return self.__context_link__.workflow.__context_services__.run_is_live(self)

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

        :raises ContextStateError: no run was started from this context.
        :raises WorkflowRuntimeError: its run has not ended yet (as in LlamaIndex).
        """
        warnings.warn(
            "Context.get_result() is deprecated: await the handler wf.run(ctx=ctx) returned",
            DeprecationWarning,
            stacklevel=2,
        )
        handler = self.__context_link__.workflow.__context_services__.handler(self, "get_result()")
        if not handler.is_done():
            msg = (
                f"Workflow run with run_id {handler.run_id} is not complete: await its handler"
                " for the result"
            )
            raise WorkflowRuntimeError(msg)
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
