"""Wait strategies: the delay in seconds before retry ``n`` (0 for the first retry).

Waits add up with ``+`` (and ``sum()``); none returns a negative delay, and an exponential
that outgrows a float is held at its cap instead of raising ``OverflowError``. Random waits
draw from ``seed=`` when given one. Users import them from :mod:`workflow.retry_policy`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from ._retry_protocols import (
    WaitStrategy,
    clamp,
    derive_seed,
    flatten,
    growth,
    number_of,
    retry_index,
    rng_for,
    seconds_of,
    show_call,
    time_unit_type,
)

__all__ = [
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


class _Wait(ABC):
    """A wait strategy that adds up with ``+`` and ``sum()``."""

    @abstractmethod
    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float: ...

    def __add__(self, other: WaitStrategy) -> wait_combine:
        if not callable(other):
            return NotImplemented
        return wait_combine(*flatten(wait_combine, (self, other)))

    def __radd__(self, other: WaitStrategy | int) -> _Wait:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # sum() starts from 0
        if not callable(other):
            return NotImplemented
        return wait_combine(*flatten(wait_combine, (other, self)))


class wait_fixed(_Wait):
    """Waits ``wait`` seconds before every retry."""

    def __init__(self, wait: time_unit_type) -> None:
        self.wait = max(seconds_of(wait, "wait_fixed(wait)"), 0.0)

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return self.wait

    def __repr__(self) -> str:
        return show_call("wait_fixed", self.wait)


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
        self.multiplier = number_of(multiplier, "wait_exponential(multiplier)")
        self.exp_base = number_of(exp_base, "wait_exponential(exp_base)")
        self.max = seconds_of(max, "wait_exponential(max)", cap=True)
        self.min = seconds_of(min, "wait_exponential(min)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return clamp(growth(self.multiplier, self.exp_base, attempt), self.min, self.max)

    def __repr__(self) -> str:
        return show_call(
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
        self.start = seconds_of(start, "wait_incrementing(start)")
        self.increment = seconds_of(increment, "wait_incrementing(increment)")
        self.max = seconds_of(max, "wait_incrementing(max)", cap=True)

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return clamp(self.start + self.increment * retry_index(attempt), 0.0, self.max)

    def __repr__(self) -> str:
        return show_call(
            "wait_incrementing", start=self.start, increment=self.increment, max=self.max
        )


class wait_random(_Wait):
    """Waits a uniformly random number of seconds between ``min`` and ``max``."""

    def __init__(self, min: time_unit_type = 0, max: time_unit_type = 1) -> None:
        self.min = seconds_of(min, "wait_random(min)")
        self.max = seconds_of(max, "wait_random(max)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        return max(rng_for(seed).uniform(self.min, self.max), 0.0)

    def __repr__(self) -> str:
        return show_call("wait_random", min=self.min, max=self.max)


class wait_exponential_jitter(_Wait):
    """Waits ``initial * exp_base ** n`` plus a random ``[0, jitter]`` seconds, at most ``max``."""

    def __init__(
        self,
        initial: float = 1,
        exp_base: float = 2,
        max: float = 60,
        jitter: float = 1,
    ) -> None:
        self.initial = number_of(initial, "wait_exponential_jitter(initial)")
        self.exp_base = number_of(exp_base, "wait_exponential_jitter(exp_base)")
        self.max = seconds_of(max, "wait_exponential_jitter(max)", cap=True)
        self.jitter = number_of(jitter, "wait_exponential_jitter(jitter)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        base = growth(self.initial, self.exp_base, attempt)
        return clamp(base + rng_for(seed).uniform(0, self.jitter), 0.0, self.max)

    def __repr__(self) -> str:
        return show_call(
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
        self.multiplier = number_of(multiplier, f"{type(self).__name__}(multiplier)")
        self.exp_base = number_of(exp_base, f"{type(self).__name__}(exp_base)")
        self.max = seconds_of(max, f"{type(self).__name__}(max)", cap=True)
        self.min = seconds_of(min, f"{type(self).__name__}(min)")

    def __call__(self, attempt: int, /, *, seed: int | None = None) -> float:
        high = clamp(growth(self.multiplier, self.exp_base, attempt), self.min, self.max)
        return max(rng_for(seed).uniform(self.min, high), 0.0)

    def __repr__(self) -> str:
        return show_call(
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
        n = retry_index(attempt)
        return self.strategies[min(n, len(self.strategies) - 1)](n, seed=seed)

    def __repr__(self) -> str:
        return show_call("wait_chain", *self.strategies)


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
            s(attempt, seed=None if seed is None else derive_seed("combine", seed, i))
            for i, s in enumerate(self.parts)
        )

    def __repr__(self) -> str:
        return show_call("wait_combine", *self.parts)
