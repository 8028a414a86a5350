"""The retry policy's protocols, and the checks and seeds its parts share.

The parts themselves are in :mod:`._retry_conditions`, :mod:`._retry_waits` and
:mod:`._retry_stops`; :mod:`workflow.retry_policy` puts them together and is the module
users import (LlamaIndex's ``workflows.retry_policy``).
"""

from __future__ import annotations

import hashlib
import inspect
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "ExcTypes",
    "RetryCondition",
    "RetryInfo",
    "RetryPolicy",
    "SeedlessRetryPolicy",
    "StopCondition",
    "WaitStrategy",
    "accepts_seed",
    "ask_policy",
    "attempt_seed",
    "clamp",
    "derive_seed",
    "exception_types_of",
    "flatten",
    "growth",
    "number_of",
    "retry_index",
    "rng_for",
    "seconds_of",
    "show_call",
    "time_unit_type",
]

# A duration as the parts accept it: seconds (int or float) or a timedelta (tenacity's name).
time_unit_type = int | float | timedelta

# Types an exception predicate matches against, as isinstance() takes them.
ExcTypes = type[BaseException] | tuple[type[BaseException], ...]

# Draws of unseeded random waits; one generator per process, like the random module's own.
_UNSEEDED: Final = random.Random()


@runtime_checkable
class RetryPolicy(Protocol):
    """What ``@step(retry_policy=...)`` takes: anything with this ``next`` method.

    Policies built by :func:`retry_policy` (and the deprecated
    :func:`ConstantDelayRetryPolicy` / :func:`ExponentialBackoffRetryPolicy`) have it; so can
    a class of your own.
    """

    def next(
        self,
        elapsed_time: float,
        attempts: int,
        error: Exception,
        *,
        seed: int | None = None,
    ) -> float | None:
        """The seconds to wait before the next attempt, or None to give up.

        :param elapsed_time: seconds since the first attempt of this step on this event began.
        :param attempts: failures so far, counting from 1 for the first failure.
        :param error: the exception the failed attempt raised.
        :param seed: an integer the engine derives from the run, step, event and attempt;
            random waits draw from it so a replayed decision is the same decision.
        """


class SeedlessRetryPolicy(Protocol):
    """A policy whose ``next`` predates ``seed=`` (LlamaIndex before 2.19, or a user's own).

    ``@step`` takes it too; the engine calls it without a seed.
    """

    def next(self, elapsed_time: float, attempts: int, error: Exception) -> float | None: ...


class RetryCondition(Protocol):
    """Decides from the exception whether the failed attempt may be retried."""

    def __call__(self, error: BaseException, /) -> bool: ...


class WaitStrategy(Protocol):
    """Gives the delay in seconds before retry ``n`` (0 for the first retry)."""

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float: ...


class StopCondition(Protocol):
    """Decides whether to give up, from the failures so far and the seconds spent.

    ``upcoming_sleep`` is the delay the wait strategy chose for the retry in question.
    """

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """Where the running step attempt stands in its retries (what ``ctx.retry_info()`` gives).

    On the first attempt ``retry_number`` is 0, ``elapsed_seconds`` 0.0 and the last failure
    fields are None; on retry ``n`` they describe the failure just before it. Every field can
    be built from the log's ``step_failed`` records, so it reads the same after a resume:
    ``elapsed_seconds`` counts from the first attempt in whichever process it ran,
    ``last_failed_at`` is the recorded failure time and ``last_exception`` is rebuilt from the
    recorded type and message (without its traceback).

    :param retry_number: 0 on the first attempt, 1 on the first retry, and so on.
    :param elapsed_seconds: seconds since the first attempt began.
    :param last_exception: the exception of the latest failed attempt, or None.
    :param last_failed_at: when it failed, as a timezone-aware UTC datetime, or None.
    """

    retry_number: int = 0
    elapsed_seconds: float = 0.0
    last_exception: Exception | None = None
    last_failed_at: datetime | None = None


def seconds_of(value: time_unit_type, name: str, *, cap: bool = False) -> float:
    """A duration parameter as float seconds; NaN is refused, infinity only for caps."""
    if isinstance(value, timedelta):
        out = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out = float(value)
    else:
        msg = f"{name} must be a number of seconds or a timedelta, not {value!r}"
        raise TypeError(msg)
    if math.isnan(out) or (math.isinf(out) and not cap):
        msg = f"{name} must be a finite number of seconds, not {value!r}"
        raise ValueError(msg)
    return out


def number_of(value: float, name: str) -> float:
    """A finite numeric parameter (a multiplier or a base) as float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        msg = f"{name} must be a number, not {value!r}"
        raise TypeError(msg)
    if not math.isfinite(value):
        msg = f"{name} must be a finite number, not {value!r}"
        raise ValueError(msg)
    return float(value)


def retry_index(attempt: int) -> int:
    """Retry numbers below 0 mean the first retry: a caller's off-by-one never goes negative."""
    return attempt if attempt > 0 else 0


def growth(scale: float, base: float, attempt: int) -> float:
    """``scale * base ** attempt``, infinite (with scale's sign) where a float overflows."""
    if scale == 0:
        return 0.0
    try:
        return scale * base ** retry_index(attempt)
    except OverflowError:
        return math.copysign(math.inf, scale)


def clamp(value: float, low: float, high: float) -> float:
    """``value`` held to ``[max(low, 0), high]``; the floor wins where the two cross."""
    return max(low, 0.0, min(value, high))


def rng_for(seed: int | None) -> random.Random:
    return _UNSEEDED if seed is None else random.Random(seed)


def derive_seed(*parts: object) -> int:
    """A 64-bit seed hashed from ``parts``: the same in every process and Python version
    (``hash()`` of a str is salted per process, so it would not do)."""
    text = "\x00".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def attempt_seed(run_id: str, step: str, event_id: int, attempt: int) -> int:
    """The ``next(..., seed=)`` of one failed attempt: stable across processes and versions.

    The same attempt of the same run always gets the same seed, so a recorded delay can be
    recomputed and a replayed decision draws alike.
    """
    return derive_seed("attempt", run_id, step, event_id, attempt)


def accepts_seed(policy: RetryPolicy | SeedlessRetryPolicy) -> bool:
    """Whether ``policy.next`` takes ``seed=`` (policies written before it existed do not)."""
    try:
        params = inspect.signature(policy.next).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume the current protocol
        return True
    return any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params)


def ask_policy(
    policy: RetryPolicy | SeedlessRetryPolicy,
    elapsed_time: float,
    attempts: int,
    error: Exception,
    seed: int | None,
) -> float | None:
    """Asks ``policy`` for the next delay the way the engine does, and checks the answer.

    ``seed`` is passed only to a ``next`` that takes it. A delay that is not a finite,
    non-negative number of seconds raises ``ValueError`` naming the policy, rather than
    sleeping forever or not at all.
    """
    delay: object
    if accepts_seed(policy):
        delay = policy.next(elapsed_time, attempts, error, seed=seed)  # type: ignore[call-arg]
    else:
        delay = policy.next(elapsed_time, attempts, error)
    if delay is None:
        return None
    ok = isinstance(delay, int | float) and not isinstance(delay, bool)
    if not ok or not math.isfinite(delay) or delay < 0:
        msg = (
            f"retry policy {policy!r} returned {delay!r} after failure {attempts}:"
            " a delay must be a finite, non-negative number of seconds (or None to stop)"
        )
        raise ValueError(msg)
    return float(delay)


def show_call(name: str, *args: object, **kwargs: object) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def exception_types_of(value: Any, where: str) -> ExcTypes:
    """Checks an ``exception_types`` argument now, rather than at the first failure."""
    items = value if isinstance(value, tuple) else (value,)
    if not items or not all(isinstance(t, type) and issubclass(t, BaseException) for t in items):
        msg = f"{where}: exception_types must be an exception class or a tuple of them: {value!r}"
        raise TypeError(msg)
    return value  # type: ignore[no-any-return]  # checked just above


def flatten(kind: type[Any], parts: Iterable[Any]) -> list[Any]:
    """``(a | b) | c`` as ``retry_any(a, b, c)``: the same decision, a shallower tree."""
    out: list[Any] = []
    for p in parts:
        out.extend(p.parts if type(p) is kind else (p,))
    return out
