"""The handler a caller awaits for a run's result, streams events from, and steers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

from ._errors import RunSuspendedError, WorkflowRuntimeError
from ._events import Event, StopEvent

if TYPE_CHECKING:
    from ._context import Context
    from ._runner import Executor
    from ._workflow import Workflow

__all__ = ["WorkflowHandler"]


class WorkflowHandler:
    """A run in progress (or done): ``await handler`` gives its result.

    The result is ``StopEvent.result``, or the stop event itself for a ``StopEvent``
    subclass. A step's exception (after its retries) propagates from ``await``.
    """

    def __init__(
        self,
        wf: Workflow,
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

    def __repr__(self) -> str:
        state = "done" if self.is_done() else "running"
        return f"<WorkflowHandler run_id={self.run_id!r} {state}>"

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

    @property
    def ctx(self) -> Context[Any]:
        """The run's context: reads see committed state; writes are operator updates."""
        if self._executor is None:
            msg = f"run {self.run_id!r} is not running here; read it with wf.state_at()"
            raise WorkflowRuntimeError(msg)
        return self._executor.ctx

    async def stream_events(self, replay: bool = False) -> AsyncIterator[Event]:
        """Yields the events steps write to the stream, live, then the stop event.

        A handler obtained by ``resume`` yields only new events, unless ``replay=True``
        (then the events recorded before come first); a question a step still waits on
        once the inbox is taken in is asked again first (with ``replay``, it is among the
        recorded events).
        """
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
        queue = self._executor.subscribe(replay=replay)
        while True:
            item = await queue.get()
            if item is None:
                return
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

    async def send_event(self, event: Event) -> None:
        """Sends an event into the run (recorded in its inbox, taken in by the executor)."""
        await self._wf._post(self.run_id, event, None)
        if self._executor is not None:
            self._executor.poke()

    async def cancel_run(self) -> None:
        """Cancels the run: running attempts stop, ``run_cancelled`` is recorded.

        Awaiting the handler then raises :class:`WorkflowCancelledError`; a caller that
        asked for the cancellation need not await it (LlamaIndex's pause-and-resume does
        not), so asyncio does not report it as never retrieved.
        """
        if self._executor is not None and not self._future.done():
            self._future.add_done_callback(_retrieve)
            await self._executor.cancel()

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
                x = self._executor
                if x is None or x.only_waiters():
                    return
                await asyncio.sleep(0.01)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # marks the error as seen; awaiting the handler still raises it
