"""Retry policies: whether a failed step attempt runs again, and after how long.

A policy is three parts, each a small callable, put together by :func:`retry_policy`:

- a **retry condition** looks at the exception (``retry_if_exception_type(...)``, ...);
  conditions combine with ``|`` (either) and ``&`` (both);
- a **wait strategy** gives the delay in seconds before retry number ``n`` (``n`` counts
  from 0 for the first retry): ``wait_fixed``, ``wait_exponential``, ...; waits add up with
  ``+`` (and ``sum()``);
- a **stop condition** ends the retries (``stop_after_attempt``, ``stop_after_delay``, ...);
  stops combine with ``|`` and ``&``.

The names and parameters are LlamaIndex Workflows' (which took them from tenacity), so code
written for ``workflows.retry_policy`` runs unchanged. Two differences make the parts safe to
leave running: no strategy returns a negative delay, and an exponential that outgrows a float
is held at its cap instead of raising ``OverflowError``.

Random waits take ``seed=``: with a seed they draw from their own generator seeded by it, so
the same seed always gives the same delay. :func:`_attempt_seed` derives one from the run,
step, event and attempt, so the same failed attempt always draws the same jitter (what a
resumed run needs to keep the backoff it recorded). Without a seed they use a process-wide
generator.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import random
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "ConstantDelayRetryPolicy",
    "ExponentialBackoffRetryPolicy",
    "RetryCondition",
    "RetryInfo",
    "RetryPolicy",
    "StopCondition",
    "WaitStrategy",
    "retry_all",
    "retry_always",
    "retry_any",
    "retry_if_exception",
    "retry_if_exception_cause_type",
    "retry_if_exception_message",
    "retry_if_exception_type",
    "retry_if_not_exception_message",
    "retry_if_not_exception_type",
    "retry_never",
    "retry_policy",
    "retry_unless_exception_type",
    "stop_after_attempt",
    "stop_after_delay",
    "stop_all",
    "stop_any",
    "stop_before_delay",
    "stop_never",
    "time_unit_type",
    "wait_chain",
    "wait_combine",
    "wait_exponential",
    "wait_exponential_jitter",
    "wait_fixed",
    "wait_full_jitter",
    "wait_incrementing",
    "wait_none",
    "wait_random",
    "wait_random_exponential",
]

# A duration as the parts accept it: seconds (int or float) or a timedelta (tenacity's name).
time_unit_type = int | float | timedelta

# Types an exception predicate matches against, as isinstance() takes them.
_ExcTypes = type[BaseException] | tuple[type[BaseException], ...]

# Draws of unseeded random waits; one generator per process, like the random module's own.
_UNSEEDED: Final = random.Random()


# --------------------------------------------------------------------------- the protocols


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


class _SeedlessRetryPolicy(Protocol):
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


# --------------------------------------------------------------------------- helpers


def _seconds(value: time_unit_type, name: str, *, cap: bool = False) -> float:
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


def _number(value: float, name: str) -> float:
    """A finite numeric parameter (a multiplier or a base) as float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        msg = f"{name} must be a number, not {value!r}"
        raise TypeError(msg)
    if not math.isfinite(value):
        msg = f"{name} must be a finite number, not {value!r}"
        raise ValueError(msg)
    return float(value)


def _index(attempt: int) -> int:
    """Retry numbers below 0 mean the first retry: a caller's off-by-one never goes negative."""
    return attempt if attempt > 0 else 0


def _growth(scale: float, base: float, attempt: int) -> float:
    """``scale * base ** attempt``, infinite (with scale's sign) where a float overflows."""
    if scale == 0:
        return 0.0
    try:
        return scale * base ** _index(attempt)
    except OverflowError:
        return math.copysign(math.inf, scale)


def _clamp(value: float, low: float, high: float) -> float:
    """``value`` held to ``[max(low, 0), high]``; the floor wins where the two cross."""
    return max(low, 0.0, min(value, high))


def _rng(seed: int | None) -> random.Random:
    return _UNSEEDED if seed is None else random.Random(seed)


def _derive(*parts: object) -> int:
    """A 64-bit seed hashed from ``parts``: the same in every process and Python version
    (``hash()`` of a str is salted per process, so it would not do)."""
    text = "\x00".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _attempt_seed(run_id: str, step: str, event_id: int, attempt: int) -> int:
    """The ``next(..., seed=)`` of one failed attempt: stable across processes and versions.

    The same attempt of the same run always gets the same seed, so a recorded delay can be
    recomputed and a replayed decision draws alike.
    """
    return _derive("attempt", run_id, step, event_id, attempt)


def _accepts_seed(policy: RetryPolicy | _SeedlessRetryPolicy) -> bool:
    """Whether ``policy.next`` takes ``seed=`` (policies written before it existed do not)."""
    try:
        params = inspect.signature(policy.next).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume the current protocol
        return True
    return any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params)


def _ask(
    policy: RetryPolicy | _SeedlessRetryPolicy,
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
    if _accepts_seed(policy):
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


def _show(name: str, *args: object, **kwargs: object) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def _exception_types(value: Any, where: str) -> _ExcTypes:
    """Checks an ``exception_types`` argument now, rather than at the first failure."""
    items = value if isinstance(value, tuple) else (value,)
    if not items or not all(isinstance(t, type) and issubclass(t, BaseException) for t in items):
        msg = f"{where}: exception_types must be an exception class or a tuple of them: {value!r}"
        raise TypeError(msg)
    return value  # type: ignore[no-any-return]  # checked just above


# --------------------------------------------------------------------------- retry conditions


class _Condition(ABC):
    """A retry condition that combines with ``|`` and ``&``."""

    @abstractmethod
    def __call__(self, error: BaseException, /) -> bool: ...

    def __or__(self, other: RetryCondition) -> retry_any:
        if not callable(other):
            return NotImplemented
        return retry_any(*_flat(retry_any, (self, other)))

    def __ror__(self, other: RetryCondition) -> retry_any:
        if not callable(other):
            return NotImplemented
        return retry_any(*_flat(retry_any, (other, self)))

    def __and__(self, other: RetryCondition) -> retry_all:
        if not callable(other):
            return NotImplemented
        return retry_all(*_flat(retry_all, (self, other)))

    def __rand__(self, other: RetryCondition) -> retry_all:
        if not callable(other):
            return NotImplemented
        return retry_all(*_flat(retry_all, (other, self)))


def _flat(kind: type[Any], parts: Iterable[Any]) -> list[Any]:
    """``(a | b) | c`` as ``retry_any(a, b, c)``: the same decision, a shallower tree."""
    out: list[Any] = []
    for p in parts:
        out.extend(p.parts if type(p) is kind else (p,))
    return out


class retry_if_exception(_Condition):
    """Retries when ``predicate(error)`` is true."""

    def __init__(self, predicate: Callable[[BaseException], bool]) -> None:
        if not callable(predicate):
            msg = f"retry_if_exception takes a function of the exception, not {predicate!r}"
            raise TypeError(msg)
        self.predicate = predicate

    def __call__(self, error: BaseException, /) -> bool:
        return bool(self.predicate(error))

    def __repr__(self) -> str:
        return _show(type(self).__name__, self.predicate)


class retry_if_exception_type(_Condition):
    """Retries when the exception is an instance of ``exception_types`` (subclasses count)."""

    def __init__(self, exception_types: _ExcTypes = Exception) -> None:
        self.exception_types = _exception_types(exception_types, type(self).__name__)

    def __call__(self, error: BaseException, /) -> bool:
        return isinstance(error, self.exception_types)

    def __repr__(self) -> str:
        return _show(type(self).__name__, self.exception_types)


class retry_if_not_exception_type(retry_if_exception_type):
    """Retries unless the exception is an instance of ``exception_types``."""

    def __call__(self, error: BaseException, /) -> bool:
        return not isinstance(error, self.exception_types)


class retry_unless_exception_type(retry_if_not_exception_type):
    """Retries unless the exception is an instance of ``exception_types`` (tenacity's name)."""


class retry_if_exception_message(_Condition):
    """Retries when ``str(error)`` equals ``message``, or when the regex ``match`` is found in it.

    Give exactly one of the two. ``match`` is searched anywhere in the message (a ``str`` is
    compiled; a compiled pattern is used as it is).
    """

    def __init__(
        self, message: str | None = None, match: str | re.Pattern[str] | None = None
    ) -> None:
        name = type(self).__name__
        if message is None and match is None:
            msg = f"{name}() missing 1 required argument 'message' or 'match'"
            raise TypeError(msg)
        if message is not None and match is not None:
            msg = f"{name}() takes either 'message' or 'match', not both"
            raise TypeError(msg)
        self.message = message
        self.match = match
        self._pattern = re.compile(match) if isinstance(match, str) else match

    def _matches(self, error: BaseException) -> bool:
        text = str(error)
        if self._pattern is None:
            return text == self.message
        return self._pattern.search(text) is not None

    def __call__(self, error: BaseException, /) -> bool:
        return self._matches(error)

    def __repr__(self) -> str:
        if self.match is None:
            return _show(type(self).__name__, message=self.message)
        return _show(type(self).__name__, match=self.match)


class retry_if_not_exception_message(retry_if_exception_message):
    """Retries unless the message equals ``message`` (or contains a match of ``match``)."""

    def __call__(self, error: BaseException, /) -> bool:
        return not self._matches(error)


class retry_if_exception_cause_type(_Condition):
    """Retries when an exception in the ``raise ... from`` chain is of ``exception_types``.

    The chain is ``error.__cause__``, its ``__cause__``, and so on; the error itself and the
    implicit ``__context__`` do not count (as in tenacity). A cyclic chain ends the walk.
    """

    def __init__(self, exception_types: _ExcTypes = Exception) -> None:
        self.exception_types = _exception_types(exception_types, type(self).__name__)

    def __call__(self, error: BaseException, /) -> bool:
        seen = {id(error)}
        cause = error.__cause__
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, self.exception_types):
                return True
            seen.add(id(cause))
            cause = cause.__cause__
        return False

    def __repr__(self) -> str:
        return _show(type(self).__name__, self.exception_types)


class retry_any(_Condition):
    """Retries when any of the conditions does (what ``a | b`` builds); none: never."""

    def __init__(self, *retries: RetryCondition) -> None:
        self.parts = retries

    @property
    def retries(self) -> tuple[RetryCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(self, error: BaseException, /) -> bool:
        return any(r(error) for r in self.parts)

    def __repr__(self) -> str:
        return _show(type(self).__name__, *self.parts)


class retry_all(_Condition):
    """Retries when every condition does (what ``a & b`` builds); none: always."""

    def __init__(self, *retries: RetryCondition) -> None:
        self.parts = retries

    @property
    def retries(self) -> tuple[RetryCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(self, error: BaseException, /) -> bool:
        return all(r(error) for r in self.parts)

    def __repr__(self) -> str:
        return _show(type(self).__name__, *self.parts)


class retry_always(_Condition):
    """Retries every exception."""

    def __call__(self, error: BaseException, /) -> bool:
        return True

    def __repr__(self) -> str:
        return "retry_always()"


class retry_never(_Condition):
    """Retries no exception."""

    def __call__(self, error: BaseException, /) -> bool:
        return False

    def __repr__(self) -> str:
        return "retry_never()"


# --------------------------------------------------------------------------- wait strategies


class _Wait(ABC):
    """A wait strategy that adds up with ``+`` and ``sum()``."""

    @abstractmethod
    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float: ...

    def __add__(self, other: WaitStrategy) -> wait_combine:
        if not callable(other):
            return NotImplemented
        return wait_combine(*_flat(wait_combine, (self, other)))

    def __radd__(self, other: WaitStrategy | int) -> _Wait:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # sum() starts from 0
        if not callable(other):
            return NotImplemented
        return wait_combine(*_flat(wait_combine, (other, self)))


class wait_fixed(_Wait):
    """Waits ``wait`` seconds before every retry."""

    def __init__(self, wait: time_unit_type) -> None:
        self.wait = max(_seconds(wait, "wait_fixed(wait)"), 0.0)

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return self.wait

    def __repr__(self) -> str:
        return _show("wait_fixed", self.wait)


class wait_none(wait_fixed):
    """Retries at once."""

    def __init__(self) -> None:
        super().__init__(0)

    def __repr__(self) -> str:
        return "wait_none()"


class wait_exponential(_Wait):
    """Waits ``multiplier * exp_base ** n`` seconds before retry ``n``, held to [min, max]."""

    def __init__(
        self,
        multiplier: int | float = 1,
        exp_base: int | float = 2,
        max: time_unit_type = 60,
        min: time_unit_type = 0,
    ) -> None:
        self.multiplier = _number(multiplier, "wait_exponential(multiplier)")
        self.exp_base = _number(exp_base, "wait_exponential(exp_base)")
        self.max = _seconds(max, "wait_exponential(max)", cap=True)
        self.min = _seconds(min, "wait_exponential(min)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return _clamp(_growth(self.multiplier, self.exp_base, attempt), self.min, self.max)

    def __repr__(self) -> str:
        return _show(
            "wait_exponential",
            multiplier=self.multiplier,
            exp_base=self.exp_base,
            max=self.max,
            min=self.min,
        )


class wait_incrementing(_Wait):
    """Waits ``start + increment * n`` seconds before retry ``n``, at most ``max``, never < 0."""

    def __init__(
        self,
        start: time_unit_type = 0,
        increment: time_unit_type = 100,
        max: time_unit_type = math.inf,
    ) -> None:
        self.start = _seconds(start, "wait_incrementing(start)")
        self.increment = _seconds(increment, "wait_incrementing(increment)")
        self.max = _seconds(max, "wait_incrementing(max)", cap=True)

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return _clamp(self.start + self.increment * _index(attempt), 0.0, self.max)

    def __repr__(self) -> str:
        return _show("wait_incrementing", start=self.start, increment=self.increment, max=self.max)


class wait_random(_Wait):
    """Waits a uniformly random number of seconds between ``min`` and ``max``."""

    def __init__(self, min: time_unit_type = 0, max: time_unit_type = 1) -> None:
        self.min = _seconds(min, "wait_random(min)")
        self.max = _seconds(max, "wait_random(max)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return max(_rng(seed).uniform(self.min, self.max), 0.0)

    def __repr__(self) -> str:
        return _show("wait_random", min=self.min, max=self.max)


class wait_exponential_jitter(_Wait):
    """Waits ``initial * exp_base ** n`` plus a random ``[0, jitter]`` seconds, at most ``max``."""

    def __init__(
        self,
        initial: float = 1,
        exp_base: float = 2,
        max: float = 60,
        jitter: float = 1,
    ) -> None:
        self.initial = _number(initial, "wait_exponential_jitter(initial)")
        self.exp_base = _number(exp_base, "wait_exponential_jitter(exp_base)")
        self.max = _seconds(max, "wait_exponential_jitter(max)", cap=True)
        self.jitter = _number(jitter, "wait_exponential_jitter(jitter)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        base = _growth(self.initial, self.exp_base, attempt)
        return _clamp(base + _rng(seed).uniform(0, self.jitter), 0.0, self.max)

    def __repr__(self) -> str:
        return _show(
            "wait_exponential_jitter",
            initial=self.initial,
            exp_base=self.exp_base,
            max=self.max,
            jitter=self.jitter,
        )


class wait_random_exponential(_Wait):
    """Waits a random time between ``min`` and the exponential bound of ``wait_exponential``.

    The "full jitter" of exponential backoff: retries of many runs spread over the whole
    interval instead of bunching at its end.
    """

    def __init__(
        self,
        multiplier: int | float = 1,
        exp_base: int | float = 2,
        max: time_unit_type = 60,
        min: time_unit_type = 0,
    ) -> None:
        self.multiplier = _number(multiplier, f"{type(self).__name__}(multiplier)")
        self.exp_base = _number(exp_base, f"{type(self).__name__}(exp_base)")
        self.max = _seconds(max, f"{type(self).__name__}(max)", cap=True)
        self.min = _seconds(min, f"{type(self).__name__}(min)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        high = _clamp(_growth(self.multiplier, self.exp_base, attempt), self.min, self.max)
        return max(_rng(seed).uniform(self.min, high), 0.0)

    def __repr__(self) -> str:
        return _show(
            type(self).__name__,
            multiplier=self.multiplier,
            exp_base=self.exp_base,
            max=self.max,
            min=self.min,
        )


# tenacity's other name for the same strategy.
wait_full_jitter = wait_random_exponential


class wait_chain(_Wait):
    """Uses the first strategy for the first retry, the second for the second, ...; the last
    one for every retry after that. Each is asked with the retry's own number ``n``."""

    def __init__(self, *strategies: WaitStrategy) -> None:
        if not strategies:
            msg = "wait_chain needs at least one wait strategy"
            raise ValueError(msg)
        self.strategies = strategies

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        n = _index(attempt)
        return self.strategies[min(n, len(self.strategies) - 1)](n, seed=seed)

    def __repr__(self) -> str:
        return _show("wait_chain", *self.strategies)


class wait_combine(_Wait):
    """Waits the sum of the strategies' delays (what ``a + b`` builds).

    With a seed, each strategy draws from its own seed derived from it, so two random waits
    added together are independent draws, and the sum is still the same for the same seed.
    """

    def __init__(self, *strategies: WaitStrategy) -> None:
        self.parts = strategies

    @property
    def strategies(self) -> tuple[WaitStrategy, ...]:
        """The strategies whose delays are added."""
        return self.parts

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return sum(
            s(attempt, seed=None if seed is None else _derive("combine", seed, i))
            for i, s in enumerate(self.parts)
        )

    def __repr__(self) -> str:
        return _show("wait_combine", *self.parts)


# --------------------------------------------------------------------------- stop conditions


class _Stop(ABC):
    """A stop condition that combines with ``|`` and ``&``."""

    @abstractmethod
    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool: ...

    def __or__(self, other: StopCondition) -> stop_any:
        if not callable(other):
            return NotImplemented
        return stop_any(*_flat(stop_any, (self, other)))

    def __ror__(self, other: StopCondition) -> stop_any:
        if not callable(other):
            return NotImplemented
        return stop_any(*_flat(stop_any, (other, self)))

    def __and__(self, other: StopCondition) -> stop_all:
        if not callable(other):
            return NotImplemented
        return stop_all(*_flat(stop_all, (self, other)))

    def __rand__(self, other: StopCondition) -> stop_all:
        if not callable(other):
            return NotImplemented
        return stop_all(*_flat(stop_all, (other, self)))


class stop_after_attempt(_Stop):
    """Gives up once ``max_attempt_number`` attempts have failed (so at most that many run)."""

    def __init__(self, max_attempt_number: int) -> None:
        n = max_attempt_number
        if not isinstance(n, int | float) or isinstance(n, bool):
            msg = f"stop_after_attempt takes a number of attempts, not {n!r}"
            raise TypeError(msg)
        if math.isnan(n):
            msg = f"stop_after_attempt takes a number of attempts, not {n!r}"
            raise ValueError(msg)
        self.max_attempt_number = max_attempt_number

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return attempts >= self.max_attempt_number

    def __repr__(self) -> str:
        return _show("stop_after_attempt", self.max_attempt_number)


class stop_after_delay(_Stop):
    """Gives up once ``max_delay`` seconds have passed since the first attempt began."""

    def __init__(self, max_delay: time_unit_type) -> None:
        self.max_delay = _seconds(max_delay, "stop_after_delay(max_delay)", cap=True)

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return elapsed_time >= self.max_delay

    def __repr__(self) -> str:
        return _show("stop_after_delay", self.max_delay)


class stop_before_delay(_Stop):
    """Gives up when the next retry would start ``max_delay`` seconds or more after the first
    attempt began (the elapsed time plus the upcoming sleep)."""

    def __init__(self, max_delay: time_unit_type) -> None:
        self.max_delay = _seconds(max_delay, "stop_before_delay(max_delay)", cap=True)

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return elapsed_time + upcoming_sleep >= self.max_delay

    def __repr__(self) -> str:
        return _show("stop_before_delay", self.max_delay)


class stop_any(_Stop):
    """Gives up when any of the conditions does (what ``a | b`` builds); none: never."""

    def __init__(self, *stops: StopCondition) -> None:
        self.parts = stops

    @property
    def stops(self) -> tuple[StopCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return any(s(attempts, elapsed_time, upcoming_sleep=upcoming_sleep) for s in self.parts)

    def __repr__(self) -> str:
        return _show("stop_any", *self.parts)


class stop_all(_Stop):
    """Gives up when every condition does (what ``a & b`` builds); none: at once."""

    def __init__(self, *stops: StopCondition) -> None:
        self.parts = stops

    @property
    def stops(self) -> tuple[StopCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return all(s(attempts, elapsed_time, upcoming_sleep=upcoming_sleep) for s in self.parts)

    def __repr__(self) -> str:
        return _show("stop_all", *self.parts)


class stop_never(_Stop):
    """Never gives up (bound the retries some other way: a retry condition, a run timeout)."""

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return False

    def __repr__(self) -> str:
        return "stop_never()"


# --------------------------------------------------------------------------- the policy

_DEFAULT_WAIT: Final = wait_fixed(5)
_DEFAULT_STOP: Final = stop_after_attempt(3)


class _ComposableRetryPolicy:
    """A retry condition, a wait strategy and a stop condition, asked in that order."""

    def __init__(
        self, retry: RetryCondition | None, wait: WaitStrategy, stop: StopCondition
    ) -> None:
        self.retry = retry
        self.wait = wait
        self.stop = stop

    def next(
        self,
        elapsed_time: float,
        attempts: int,
        error: Exception,
        *,
        seed: int | None = None,
    ) -> float | None:
        """The delay before the next attempt, or None when the error or the stop says no.

        Failure ``attempts`` (1 for the first) asks the wait strategy for retry
        ``attempts - 1``; the stop condition sees the failures, the elapsed time and that
        delay.
        """
        if self.retry is not None and not self.retry(error):
            return None
        retry = _index(attempts - 1)
        delay = max(float(self.wait(retry, seed=seed)), 0.0)
        if self.stop(attempts, elapsed_time, upcoming_sleep=delay):
            return None
        if not math.isfinite(delay):
            # Sleeping forever would hang the run without a word; say which part did it.
            msg = (
                f"wait strategy {self.wait!r} gave {delay!r} seconds for retry {retry}:"
                " a delay must be finite (cap it with max=, or stop earlier)"
            )
            raise ValueError(msg)
        return delay

    def __repr__(self) -> str:
        return _show("retry_policy", retry=self.retry, wait=self.wait, stop=self.stop)


def _require(part: object, role: str, hint: str) -> None:
    if not callable(part) or isinstance(part, type):
        msg = f"retry_policy({role}=...) takes a {role} part such as {hint}, not {part!r}"
        raise TypeError(msg)


def retry_policy(
    retry: RetryCondition | None = None,
    wait: WaitStrategy = _DEFAULT_WAIT,
    stop: StopCondition = _DEFAULT_STOP,
) -> RetryPolicy:
    """Builds a retry policy from a retry condition, a wait strategy and a stop condition.

    ``retry=None`` retries every exception. The defaults wait 5 seconds between attempts
    and give up after the third failure::

        @step(retry_policy=retry_policy(
            retry=retry_if_exception_type((TimeoutError, ConnectionError)),
            wait=wait_exponential(multiplier=1, max=30) + wait_random(0, 1),
            stop=stop_after_attempt(5) | stop_after_delay(120),
        ))

    :raises TypeError: a part is not a callable part (an exception class given as ``retry``,
        a number given as ``wait`` or ``stop``).
    """
    if retry is not None:
        _require(retry, "retry", "retry_if_exception_type(ValueError)")
    _require(wait, "wait", "wait_fixed(5)")
    _require(stop, "stop", "stop_after_attempt(3)")
    return _ComposableRetryPolicy(retry, wait, stop)


def ConstantDelayRetryPolicy(maximum_attempts: int = 3, delay: float = 5) -> RetryPolicy:
    """Retries after ``delay`` seconds until ``maximum_attempts`` attempts have failed.

    .. deprecated:: Use ``retry_policy(wait=wait_fixed(delay),
       stop=stop_after_attempt(maximum_attempts))``; this builds exactly that.
    """
    warnings.warn(
        "ConstantDelayRetryPolicy is deprecated, use "
        "retry_policy(wait=wait_fixed(delay), stop=stop_after_attempt(n)) instead",
        DeprecationWarning,
        stacklevel=2,
    )
    return retry_policy(wait=wait_fixed(delay), stop=stop_after_attempt(maximum_attempts))


def ExponentialBackoffRetryPolicy(
    maximum_attempts: int = 5,
    initial_delay: float = 1.0,
    multiplier: float = 2.0,
    max_delay: float = 60.0,
    jitter: bool = True,
) -> RetryPolicy:
    """Retries after ``initial_delay * multiplier ** n`` seconds (at most ``max_delay``).

    With ``jitter`` each delay is drawn between 0 and that bound (full jitter). Gives up once
    ``maximum_attempts`` attempts have failed.

    .. deprecated:: Use ``retry_policy(wait=wait_exponential(...),
       stop=stop_after_attempt(n))``, or ``wait_random_exponential(...)`` for the jitter.
    """
    warnings.warn(
        "ExponentialBackoffRetryPolicy is deprecated, use "
        "retry_policy(wait=wait_exponential(...), stop=stop_after_attempt(n)) instead",
        DeprecationWarning,
        stacklevel=2,
    )
    wait: WaitStrategy
    if jitter:
        wait = wait_random_exponential(multiplier=initial_delay, exp_base=multiplier, max=max_delay)
    else:
        wait = wait_exponential(multiplier=initial_delay, exp_base=multiplier, max=max_delay)
    return retry_policy(wait=wait, stop=stop_after_attempt(maximum_attempts))
