"""Durable retries: the clock of one event's attempts at a step, across processes.

A failed attempt's ``step_failed`` record carries ``retry_at`` (when the next attempt is
due, wall clock) and ``elapsed`` (seconds since the first attempt at this event began).
A run resumed in another process reads them back (``_fold.Failure``) and so

- waits until ``retry_at`` before the retry, instead of retrying at once or starting the
  backoff over;
- gives the policy the real time since the first attempt, the time the process was dead
  included (``stop_after_delay`` does not restart);
- answers ``ctx.retry_info()`` as the live run would have, the last exception rebuilt from
  its recorded type and message.

The delay a failure recorded is authoritative: the policy is never asked again for a
decision the log already holds. Random waits draw from a seed derived from (run, step,
event id, attempt), so the same failed attempt always draws the same jitter.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from ._fold import Failure
from .retry_policy import RetryInfo, RetryPolicy, _ask, _attempt_seed, _SeedlessRetryPolicy

__all__ = ["RetryClock", "UnreconstructedException", "rebuild_error"]


class UnreconstructedException(Exception):
    """Stands for a recorded exception whose class this program cannot rebuild.

    A failure read back from the log has only its class's name and its message: when the
    class is not among the modules already imported, is not an exception class, or does
    not take one message argument, this stands in for it. ``str()`` is the original
    message; ``original_type`` names the class (``module.QualName``).
    """

    def __init__(self, message: str, *, original_type: str | None = None) -> None:
        super().__init__(message)
        self.original_type = original_type

    def __repr__(self) -> str:
        return f"UnreconstructedException(original_type={self.original_type!r}, {self.args[0]!r})"


def rebuild_error(module: str, qualname: str, message: str) -> Exception:
    """The exception a ``step_failed`` record names, rebuilt as ``cls(message)``.

    The class is looked up only among modules already imported (nothing is imported for
    a name read from the log) and only an ``Exception`` subclass is called; anything else
    gives an :class:`UnreconstructedException`. The traceback is not rebuilt.
    """
    obj: object = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    if isinstance(obj, type) and issubclass(obj, Exception):
        try:
            return obj(message)
        except Exception:
            pass
    return UnreconstructedException(message, original_type=f"{module}.{qualname}")


@dataclass(slots=True)
class RetryClock:
    """Where one event's attempts at a step stand: failures, time spent, the last failure.

    ``started`` is the monotonic time the first attempt began, placed in this process's
    monotonic clock (a resumed run derives it from the recorded elapsed time and failure
    time, so the time between processes counts).
    """

    started: float
    failures: int = 0
    last_error: Exception | None = None
    last_failed_at: float | None = None  # seconds since the epoch
    retry_at: float | None = None  # a recorded retry not yet begun: due then

    @classmethod
    def resume(cls, failures: int, failure: Failure | None) -> RetryClock:
        """The clock of an event delivered again, from its latest recorded failure."""
        now_mono = time.monotonic()
        if failure is None:
            return cls(now_mono, failures)
        now = time.time()
        if failure.elapsed is None:  # recorded before ``elapsed``: the schedule starts here
            started = now_mono
        else:
            started = now_mono - (now - failure.failed_at) - failure.elapsed
        error = rebuild_error(failure.module, failure.error, failure.message)
        return cls(started, failures, error, failure.failed_at, failure.retry_at)

    def elapsed(self) -> float:
        """Seconds since the first attempt began."""
        return max(0.0, time.monotonic() - self.started)

    async def wait_due(self) -> None:
        """Sleeps until a recorded retry is due (a run resumed mid-backoff)."""
        due, self.retry_at = self.retry_at, None
        if due is not None:
            remaining = due - time.time()
            if remaining > 0:
                await asyncio.sleep(remaining)

    def decide(
        self,
        policy: RetryPolicy | _SeedlessRetryPolicy | None,
        error: Exception,
        seed: tuple[str, str, int, int],
    ) -> tuple[float | None, float | None, float]:
        """Counts a failure and asks the policy: (delay, retry_at, elapsed).

        ``delay`` None means no retry. ``seed`` is (run, step, event id, attempt).
        """
        self.failures += 1
        elapsed = self.elapsed()
        now = time.time()
        self.last_error = error
        self.last_failed_at = now
        delay = (
            None
            if policy is None
            else _ask(policy, elapsed, self.failures, error, _attempt_seed(*seed))
        )
        return delay, None if delay is None else now + delay, elapsed

    def info(self) -> RetryInfo:
        """What ``ctx.retry_info()`` says during the attempt that follows."""
        if self.failures == 0:
            return RetryInfo()
        failed = self.last_failed_at
        return RetryInfo(
            retry_number=self.failures,
            elapsed_seconds=self.elapsed(),
            last_exception=self.last_error,
            last_failed_at=None if failed is None else datetime.fromtimestamp(failed, tz=UTC),
        )
