"""Durable sleep: ``await ctx.sleep(seconds)`` outlives the process that slept.

A sleep under the workflow's ``sleep_threshold`` (default 1 s) just waits. A longer one is a
durable wait whose only answer is its deadline: the step commits a ``waiting`` record (for
the class :class:`DurableSleep`, which nobody sends) and its attempt ends, freeing its worker;
once the deadline passes, the wait is resolved as timed out and the step runs again from the
start, where this ``sleep`` returns at once. Everything a wait has, a sleep has: the live
owner wakes it on time; ``recover()`` and workers take a run whose deadline has passed, also
after the process was gone for longer than the sleep; time spent only sleeping does not count
toward the run's timeout. Code before the sleep runs again (memoize what it pays for).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Final

from ._attempt import Attempt, WaitRequest, WaitSuspend
from ._errors import WorkflowRuntimeError
from ._events import Event

__all__ = ["DEFAULT_SLEEP_THRESHOLD", "DurableSleep", "durable_sleep"]

DEFAULT_SLEEP_THRESHOLD: Final = 1.0


class DurableSleep(Event):
    """What a durable sleep's wait awaits: never sent, so only its deadline resolves it."""


async def durable_sleep(host: Any, att: Attempt, seconds: float) -> None:
    """Sleeps ``seconds`` in attempt ``att`` of the run executed by ``host`` (module docstring).

    :raises WorkflowRuntimeError: ``seconds`` is not a finite, non-negative number.
    """
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if not ok or not math.isfinite(seconds) or seconds < 0:
        msg = f"ctx.sleep() takes a finite, non-negative number of seconds, not {seconds!r}"
        raise WorkflowRuntimeError(msg)
    att.sleep_calls += 1
    # Ids count every sleep of the attempt, short or long, so they stay the same if the
    # threshold changes between runs.
    wid = f"{att.step}:{att.event_id}:sleep:{att.sleep_calls}"
    if wid in host.answers:  # its deadline passed before this re-run: slept already
        att.answers_used.append(wid)
        return
    threshold = host.config.sleep_threshold
    if seconds < threshold:
        await asyncio.sleep(seconds)
        return
    raise WaitSuspend(WaitRequest(wid, DurableSleep, {}, float(seconds)))
