"""Stop conditions: whether to give up, from the failures so far and the seconds spent.

Stops combine with ``|`` (either) and ``&`` (both). Users import them from
:mod:`workflow.retry_policy`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from ._retry_protocols import StopCondition, flatten, seconds_of, show_call, time_unit_type

__all__ = [
    "stop_after_attempt",
    "stop_after_delay",
    "stop_all",
    "stop_any",
    "stop_before_delay",
    "stop_never",
]


class _Stop(ABC):
    """A stop condition that combines with ``|`` and ``&``."""

    @abstractmethod
    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool: ...

    def __or__(self, other: StopCondition) -> stop_any:
        if not callable(other):
            return NotImplemented
        return stop_any(*flatten(stop_any, (self, other)))

    def __ror__(self, other: StopCondition) -> stop_any:
        if not callable(other):
            return NotImplemented
        return stop_any(*flatten(stop_any, (other, self)))

    def __and__(self, other: StopCondition) -> stop_all:
        if not callable(other):
            return NotImplemented
        return stop_all(*flatten(stop_all, (self, other)))

    def __rand__(self, other: StopCondition) -> stop_all:
        if not callable(other):
            return NotImplemented
        return stop_all(*flatten(stop_all, (other, self)))


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
        return show_call("stop_after_attempt", self.max_attempt_number)


class stop_after_delay(_Stop):
    """Gives up once ``max_delay`` seconds have passed since the first attempt began."""

    def __init__(self, max_delay: time_unit_type) -> None:
        self.max_delay = seconds_of(max_delay, "stop_after_delay(max_delay)", cap=True)

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return elapsed_time >= self.max_delay

    def __repr__(self) -> str:
        return show_call("stop_after_delay", self.max_delay)


class stop_before_delay(_Stop):
    """Gives up when the next retry would start ``max_delay`` seconds or more after the first
    attempt began (the elapsed time plus the upcoming sleep)."""

    def __init__(self, max_delay: time_unit_type) -> None:
        self.max_delay = seconds_of(max_delay, "stop_before_delay(max_delay)", cap=True)

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return elapsed_time + upcoming_sleep >= self.max_delay

    def __repr__(self) -> str:
        return show_call("stop_before_delay", self.max_delay)


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
        return show_call("stop_any", *self.parts)


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
        return show_call("stop_all", *self.parts)


class stop_never(_Stop):
    """Never gives up (bound the retries some other way: a retry condition, a run timeout)."""

    def __call__(
        self, attempts: int, elapsed_time: float, /, *, upcoming_sleep: float = 0.0
    ) -> bool:
        return False

    def __repr__(self) -> str:
        return "stop_never()"
