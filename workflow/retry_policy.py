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
the same seed always gives the same delay. :func:`attempt_seed` derives one from the run,
step, event and attempt, so the same failed attempt always draws the same jitter (what a
resumed run needs to keep the backoff it recorded). Without a seed they use a process-wide
generator.

The parts live in modules of their own (:mod:`._retry_conditions`, :mod:`._retry_waits`,
:mod:`._retry_stops`, the protocols in :mod:`._retry_protocols`); every name is imported
from here, as from LlamaIndex's one module.
"""

from __future__ import annotations

import math
import warnings
from typing import Final

from ._retry_conditions import (
    retry_all,
    retry_always,
    retry_any,
    retry_if_exception,
    retry_if_exception_cause_type,
    retry_if_exception_message,
    retry_if_exception_type,
    retry_if_not_exception_message,
    retry_if_not_exception_type,
    retry_never,
    retry_unless_exception_type,
)
from ._retry_protocols import (
    RetryCondition,
    RetryInfo,
    RetryPolicy,
    SeedlessRetryPolicy,
    StopCondition,
    WaitStrategy,
    ask_policy,
    attempt_seed,
    derive_seed,
    retry_index,
    show_call,
    time_unit_type,
)
from ._retry_stops import (
    stop_after_attempt,
    stop_after_delay,
    stop_all,
    stop_any,
    stop_before_delay,
    stop_never,
)
from ._retry_waits import (
    wait_chain,
    wait_combine,
    wait_exponential,
    wait_exponential_jitter,
    wait_fixed,
    wait_full_jitter,
    wait_incrementing,
    wait_none,
    wait_random,
    wait_random_exponential,
)

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

# The engine's names from before the parts had modules of their own, kept for importers.
_ask = ask_policy
_attempt_seed = attempt_seed
_derive = derive_seed
_SeedlessRetryPolicy = SeedlessRetryPolicy

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
        retry = retry_index(attempts - 1)
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
        return show_call("retry_policy", retry=self.retry, wait=self.wait, stop=self.stop)


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
