"""The handler a caller awaits for a run's result, streams events from, and steers."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import (
    RunSuspendedError,
    WorkflowCancelledByUser,
    WorkflowRuntimeError,
)
from ._events import Event, InternalDispatchEvent, StopEvent, WorkflowCancelledEvent

if TYPE_CHECKING:
    from ._context import Context
    from ._parts import OwnerParts
    from ._runner import Executor

__all__ = ["HandlerOwner", "WorkflowHandler", "executor_of"]


class HandlerOwner(Protocol):
    """What a handler uses of the workflow that made it (``Workflow``): its name and, of
    its parts, the step graph and how it posts an event to a run."""

    @property
    def __workflow_parts__(self) -> OwnerParts: ...

    @property
    def workflow_name(self) -> str: ...


class WorkflowHandler:
    """A run in progress (or done): ``await handler`` gives its result.

    The result is ``StopEvent.result``, or the stop event itself for a ``StopEvent``
    subclass. A step's exception (after its retries) propagates from ``await``.
    """

    def __init__(
        self,
        wf: HandlerOwner,
        run_id: str,
        future: asyncio.Future[Any],
        executor: Executor | None = None,
        recorded_stream: list[Event] | None = None,
    ) -> None:
        self._wf = wf
        self.run_id = run_id
        self._future = future
        self._executor = executor
        self._recorded = recorded_stream or []
        self._all_events_consumed = False

    def __repr__(self) -> str:
        state = "done" if self.is_done() else "running"
        return f"<WorkflowHandler run_id={self.run_id!r} {state}>"

    def __str__(self) -> str:
        return (
            f"WorkflowHandler(workflow={self._wf.workflow_name}, run_id={self.run_id},"
            f" result={self.get_stop_event()})"
        )

    def __await__(self) -> Generator[Any, None, Any]:
        return self._future.__await__()

    def is_done(self) -> bool:
        """Whether the run ended (finished, failed, cancelled, timed out or suspended)."""
        return self._future.done()

    def result(self) -> Any:
        """The result of a run that is done (raises its error, as ``await`` does)."""
        return self._future.result()

    def exception(self) -> BaseException | None:
        """The run's error, None if it finished; only for a run that is done."""
        return self._future.exception()

    def done(self) -> bool:
        """Same as :meth:`is_done` (LlamaIndex's older spelling)."""
        return self.is_done()

    def cancelled(self) -> bool:
        """Whether the run ended by ``cancel_run()``, or this handler by ``cancel()``."""
        if self._future.cancelled():
            return True
        return self._future.done() and isinstance(self._future.exception(), WorkflowCancelledByUser)

    def cancel(self) -> bool:
        """LlamaIndex's deprecated hard cancel: this process stops executing the run at once
        and records nothing, so the run stays unfinished (``interrupted``) and resumable,
        e.g. from a dict of its context; awaiting the handler raises
        ``asyncio.CancelledError``. Prefer ``await handler.cancel_run()``, which records the
        cancellation.

        :returns: whether the handler was cancelled (False once the run had ended).
        """
        warnings.warn(
            "WorkflowHandler.cancel() is deprecated (as in LlamaIndex): it leaves the run"
            " unfinished; use await handler.cancel_run() to cancel the run",
            DeprecationWarning,
            stacklevel=2,
        )
        if self._future.done():
            return False
        self._future.add_done_callback(_retrieve)
        cancelled = self._future.cancel()
        if self._executor is not None:
            self._executor.abandon()
        return cancelled

    def get_stop_event(self) -> StopEvent | None:
        """The run's stop event once it is done (None before; for a cancelled run a
        :class:`WorkflowCancelledEvent`, for a failed one None)."""
        if not self._future.done():
            return None
        exc = self._future.exception()
        if exc is None:
            value = self._future.result()
            return value if isinstance(value, StopEvent) else StopEvent(result=value)
        if isinstance(exc, WorkflowCancelledByUser):
            return WorkflowCancelledEvent()
        return None

    async def stop_event_result(self) -> StopEvent:
        """Waits for the run and returns its stop event (raises its error, as ``await``)."""
        value = await self
        return value if isinstance(value, StopEvent) else StopEvent(result=value)

    @property
    def ctx(self) -> Context[Any]:
        """The run's context: reads see committed state; writes are operator updates."""
        if self._executor is None:
            msg = f"run {self.run_id!r} is not running here; read it with wf.state_at()"
            raise WorkflowRuntimeError(msg)
        return self._executor.ctx

    async def stream_events(
        self, expose_internal: bool = False, *, replay: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Yields the events steps write to the stream, live, then the stop event.

        The last event is a :class:`StopEvent`: the run's own, or how it ended otherwise
        (:class:`WorkflowFailedEvent`, :class:`WorkflowCancelledEvent`,
        :class:`WorkflowTimedOutEvent`; awaiting the handler then raises). With
        ``expose_internal=True`` it also yields the engine's own events
        (:class:`StepStateChanged` as each attempt starts and ends).

        As in LlamaIndex the stream is consumed once, by one consumer at a time: each event
        goes to one of them, a second consumer (another ``stream_events()``, this handler's
        or the context's) waits until the first stops (a ``break`` lets it go on where that
        one stopped), and streaming again after the stop event was read raises
        :class:`WorkflowRuntimeError` (unless ``replay=True``: the recorded stream, from its
        start, for as many readers as ask).

        A handler obtained by ``resume`` yields only new events, unless ``replay=True``
        (then the events recorded before come first); a question a step still waits on
        once the inbox is taken in is asked again first (with ``replay``, it is among the
        recorded events).
        """
        executor = self._executor
        if replay or executor is None:
            if not replay:
                self._check_unconsumed()
            async for ev in self._stream(expose_internal, replay):
                if isinstance(ev, StopEvent) and not replay:
                    self._all_events_consumed = True
                yield ev
            return
        self._check_unconsumed()
        stream = executor.stream
        # One reader at a time, as LlamaIndex's stream lock: a consumer waiting for an event
        # keeps its turn until it stops, so readers never split the events. One that stopped
        # at an event it was given (a break whose generator is still referenced, and so not
        # closed) is taken over rather than waited for (LlamaIndex waits: for ever), and
        # raises if it reads on.
        while stream.holder is not None and stream.holder_waiting:
            await stream.holder_left.wait()
        token = object()
        stream.holder = token
        try:
            self._check_unconsumed()
            queue = executor.subscribe(replay=False, internal=expose_internal)
            while True:
                if stream.holder is not token:
                    msg = (
                        "another stream_events() took this run's stream over while this one"
                        " was stopped at an event: each event goes to one consumer"
                    )
                    raise WorkflowRuntimeError(msg)
                stream.holder_waiting = True
                try:
                    item = await queue.get()
                finally:
                    stream.holder_waiting = False
                if item is None:
                    return
                if isinstance(item, InternalDispatchEvent) and not expose_internal:
                    continue
                if isinstance(item, StopEvent):
                    self._all_events_consumed = True
                    stream.consumed = True
                yield item
                if isinstance(item, StopEvent):
                    return
        finally:
            if stream.holder is token:
                stream.holder = None
                left, stream.holder_left = stream.holder_left, asyncio.Event()
                left.set()

    def _check_unconsumed(self) -> None:
        executor = self._executor
        if self._all_events_consumed or (executor is not None and executor.stream.consumed):
            msg = (
                "All the streamed events have already been consumed: a run's stream is read"
                " once (stream_events(replay=True) reads it again)"
            )
            raise WorkflowRuntimeError(msg)

    async def _stream(self, expose_internal: bool, replay: bool) -> AsyncIterator[Event]:
        if replay:
            for ev in self._recorded:
                yield ev
        if self._executor is None:
            if self._future.done() and not self._future.exception():
                value = self._future.result()
                if isinstance(value, StopEvent):
                    yield value
                else:
                    yield StopEvent(result=value)
            return
        # With the recorded stream replayed, the pending questions are in it already.
        queue = self._executor.subscribe(replay=replay, internal=expose_internal)
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, InternalDispatchEvent) and not expose_internal:
                continue
            yield item
            if isinstance(item, StopEvent):
                return

    def origin(self, event: Event) -> tuple[str, int, int] | None:
        """Which attempt streamed ``event``: (step, input event id, attempt), if known."""
        if self._executor is None:
            return None
        found = self._executor.origins.get(id(event))
        if found is None or found[0]() is not event:
            return None
        return found[1]

    async def send_event(self, event: Event, step: str | None = None) -> None:
        """Sends an event into the run (recorded in its inbox, taken in by the executor).

        An event from outside goes to the steps (or the wait) its class routes it to:
        ``step`` is checked, not used to route it.

        :raises WorkflowStepDoesNotExistError: ``step`` names no step of the workflow.
        :raises WorkflowRuntimeError: ``step`` does not take events of this class.
        """
        if step is not None:
            self._wf.__workflow_parts__.graph.check_target(step, event)
        await self._wf.__workflow_parts__.post(self.run_id, event, None)
        if self._executor is not None:
            self._executor.poke()

    async def cancel_run(
        self,
        *,
        timeout: float = 5.0,  # noqa: ASYNC109
        reason: str | None = None,
        via: str = "handler",
    ) -> None:
        """Cancels the run: running attempts stop, ``run_cancelled`` is recorded.

        As in LlamaIndex it raises nothing (also for a run that already ended) and returns
        once the run has ended, or after ``timeout`` seconds; awaiting the handler then
        raises :class:`WorkflowCancelledByUser`, whose message gives ``reason``. A caller
        that asked for the cancellation need not await it (LlamaIndex's pause-and-resume
        does not): asyncio does not report it as never retrieved.

        ``reason`` and ``via`` (how it was cancelled: the UI says ``"ui"``) are recorded in
        ``run_cancelled`` with the process that cancelled; ``workflow history`` shows them.
        """
        if self._executor is None or self._future.done():
            return
        self._future.add_done_callback(_retrieve)
        with contextlib.suppress(Exception):
            await self._executor.cancel(via, reason)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._future), timeout)

    async def suspend(self) -> None:
        """Leaves a run that waits for an event: it stays ``waiting`` and resumable.

        Awaiting the handler then raises :class:`RunSuspendedError`.
        """
        if self._executor is not None and not self._future.done():
            await self._executor.suspend(RunSuspendedError(self.run_id))

    async def wait_until_waiting(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Returns once the run has nothing to do but wait for an event (or has ended)."""
        async with asyncio.timeout(timeout):
            while not self._future.done():
                executor = self._executor
                if executor is None or executor.only_waiters():
                    return
                await asyncio.sleep(0.01)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # marks the error as seen; awaiting the handler still raises it


def executor_of(handler: WorkflowHandler) -> Executor | None:
    """The executor running ``handler``'s run in this process (None: a handler of a run
    that had ended), for the engine's modules: a handler keeps it private."""
    return handler._executor
