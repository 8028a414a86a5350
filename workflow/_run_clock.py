"""A run's clock: the time it was being executed, summed across resumes, and its watchdogs.

A run's timeout counts only the time it was being executed: the clock stands while all the
run has pending is waits, timers or child runs (which count their own). The executor
(``workflow._runner.Executor``) owns one :class:`RunClock`, which reaches it through
:class:`ClockHost`; the watchdog ends the run when its budget is spent, the heartbeat when
its lease could not be renewed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from eventstore import Record

from . import _journal as journal
from ._errors import RunLostError, WorkflowTimeoutError

__all__ = ["ClockHost", "RunClock"]


class _Steps(Protocol):
    @property
    def busy(self) -> int: ...

    def active_steps(self) -> list[str]: ...


class _Stream(Protocol):
    def idle(self) -> None: ...


class ClockHost(Protocol):
    """What the clock reads of the executor: what is pending, and how a run ends."""

    run_id: str
    children_awaited: int  # attempts awaiting a child run (their time is not counted)

    @property
    def waiters(self) -> dict[str, Any]: ...

    @property
    def steps(self) -> _Steps: ...

    @property
    def stream(self) -> _Stream: ...

    def only_waiters(self) -> bool: ...

    def end_run(self, record: Record, exc: BaseException) -> Awaitable[None]: ...

    def end_with(self, exc: BaseException) -> None: ...


class RunClock:
    """The time the run was being executed: ``before`` (earlier executors' and this one's
    spans so far) plus the span running now, if the clock runs."""

    def __init__(self, host: ClockHost) -> None:
        self._host = host
        self.before = 0.0  # seconds executed, but for the span running now
        self._start: float | None = None  # when the span running now began

    def start(self) -> None:
        """The run's tasks started: the clock runs (unless all that is pending waits)."""
        self._start = time.monotonic()
        self.update()

    def _paused(self) -> bool:
        """Whether the run's clock stands: all it has pending is waits, timers or child runs
        (every delivery under way is an attempt awaiting a child, which counts its own)."""
        host = self._host
        children = host.children_awaited
        waiting = bool(host.waiters) or children > 0
        return waiting and host.steps.busy == children

    def update(self) -> None:
        """Stops or starts the clock as what is pending changed."""
        paused = self._paused()
        if paused and self._start is not None:
            self.before += time.monotonic() - self._start
            self._start = None
            if self._host.only_waiters():  # nothing to do but wait for an event
                self._host.stream.idle()
        elif not paused and self._start is None:
            self._start = time.monotonic()

    def exec_time(self) -> float:
        """Seconds the run was being executed, across resumes."""
        running = 0.0 if self._start is None else time.monotonic() - self._start
        return self.before + running

    async def watchdog(self, timeout: float) -> None:  # noqa: ASYNC109 - the run's budget
        """Ends the run as timed out once it was executed ``timeout`` seconds."""
        host = self._host
        while True:
            self.update()
            remaining = timeout - self.exec_time()
            if remaining <= 0:
                active = host.steps.active_steps()
                steps = (
                    "Currently active steps: " + ", ".join(active) if active else "No steps active"
                )
                await host.end_run(
                    journal.run_timed_out(self.exec_time()),
                    WorkflowTimeoutError(
                        f"Operation timed out after {timeout} seconds of execution"
                        f" (run {host.run_id!r}). {steps}"
                    ),
                )
                return
            await asyncio.sleep(min(remaining, 0.5) if self._start is not None else 0.05)

    async def heartbeat(self, renew: Callable[[str], Any], ttl: float) -> None:
        """Renews the run's lease; an executor that lost it stops without writing more."""
        host = self._host
        while True:
            await asyncio.sleep(ttl / 3)
            if not await renew(host.run_id):
                host.end_with(RunLostError(host.run_id, "its lease lapsed before renewal"))
                return
