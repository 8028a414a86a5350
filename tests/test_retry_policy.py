"""workflow.retry_policy: the retry, wait and stop parts, their operators, the policy, the
deprecated factories, and a step retried by a composed policy as the log records it."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import re
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

import workflow
from eventstore import EventStore
from workflow import Context, StartEvent, StopEvent, Workflow, WorkflowValidationError, step
from workflow import retry_policy as rp
from workflow.retry_policy import (
    ConstantDelayRetryPolicy,
    ExponentialBackoffRetryPolicy,
    RetryInfo,
    RetryPolicy,
    _ask,
    _attempt_seed,
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
    retry_policy,
    retry_unless_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_all,
    stop_any,
    stop_before_delay,
    stop_never,
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

CONSTANT_WARNING = (
    "ConstantDelayRetryPolicy is deprecated, use "
    "retry_policy(wait=wait_fixed(delay), stop=stop_after_attempt(n)) instead"
)
EXPONENTIAL_WARNING = (
    "ExponentialBackoffRetryPolicy is deprecated, use "
    "retry_policy(wait=wait_exponential(...), stop=stop_after_attempt(n)) instead"
)


def _caused(*chain: BaseException) -> BaseException:
    """``chain[0]`` raised from ``chain[1]``, raised from ``chain[2]``, ..."""
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    return chain[0]


# ----------------------------------------------------------------------------- module surface


def test_module_names_are_llamaindex_names() -> None:
    """The module's __all__ is sorted and holds exactly LlamaIndex 2.26.1's public names."""
    expected = {
        "ConstantDelayRetryPolicy", "ExponentialBackoffRetryPolicy", "RetryCondition",
        "RetryInfo", "RetryPolicy", "StopCondition", "WaitStrategy", "retry_all",
        "retry_always", "retry_any", "retry_if_exception", "retry_if_exception_cause_type",
        "retry_if_exception_message", "retry_if_exception_type",
        "retry_if_not_exception_message", "retry_if_not_exception_type", "retry_never",
        "retry_policy", "retry_unless_exception_type", "stop_after_attempt", "stop_after_delay",
        "stop_all", "stop_any", "stop_before_delay", "stop_never", "time_unit_type",
        "wait_chain", "wait_combine", "wait_exponential", "wait_exponential_jitter",
        "wait_fixed", "wait_full_jitter", "wait_incrementing", "wait_none", "wait_random",
        "wait_random_exponential",
    }  # fmt: skip
    assert rp.__all__ == sorted(rp.__all__)
    assert set(rp.__all__) == expected
    assert all(hasattr(rp, n) for n in expected)
    assert not hasattr(rp, "ComposableRetryPolicy")  # LlamaIndex made the class private


def test_top_level_names_are_the_modules() -> None:
    """workflow's RetryPolicy and the two deprecated factories are the module's own objects."""
    assert workflow.RetryPolicy is RetryPolicy
    assert workflow.ConstantDelayRetryPolicy is ConstantDelayRetryPolicy
    assert workflow.ExponentialBackoffRetryPolicy is ExponentialBackoffRetryPolicy


# ----------------------------------------------------------------------------- retry conditions


def test_exception_type_matches_instances_of_subclasses_and_tuples() -> None:
    """retry_if_exception_type matches isinstance: subclasses count, a tuple means any of."""
    one = retry_if_exception_type(OSError)
    assert one(ConnectionError("refused")) is True
    assert one(ValueError("bad")) is False
    several = retry_if_exception_type((KeyError, TimeoutError))
    assert several(KeyError("k")) is True
    assert several(TimeoutError()) is True
    assert several(RuntimeError()) is False


def test_exception_type_default_is_exception_not_base_exception() -> None:
    """By default every Exception is retried, but not a KeyboardInterrupt."""
    cond = retry_if_exception_type()
    assert cond(RuntimeError()) is True
    assert cond(KeyboardInterrupt()) is False


@pytest.mark.parametrize("cls", [retry_if_not_exception_type, retry_unless_exception_type])
def test_not_exception_type_is_the_negation(cls: type[retry_if_not_exception_type]) -> None:
    """retry_if_not_exception_type and its tenacity alias retry all but the given types."""
    cond = cls((ValueError, KeyError))
    assert cond(ValueError()) is False
    assert cond(KeyError()) is False
    assert cond(RuntimeError()) is True


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(ValueError("an instance"), id="instance"),
        pytest.param("ValueError", id="string"),
        pytest.param((ValueError, int), id="tuple-with-non-exception"),
        pytest.param((), id="empty-tuple"),
    ],
)
@pytest.mark.parametrize(
    "cls",
    [retry_if_exception_type, retry_if_not_exception_type, retry_if_exception_cause_type],
)
def test_exception_types_are_checked_when_built(cls: Any, bad: Any) -> None:
    """A wrong exception_types argument fails at construction, not at the first failure."""
    with pytest.raises(TypeError, match="exception_types must be an exception class"):
        cls(bad)


def test_retry_if_exception_asks_the_predicate() -> None:
    """retry_if_exception retries when the predicate is true, as a bool."""
    cond = retry_if_exception(lambda e: "rate limit" in str(e))
    assert cond(RuntimeError("rate limit hit")) is True
    assert cond(RuntimeError("invalid key")) is False
    assert retry_if_exception(lambda e: 1)(RuntimeError()) is True  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="function of the exception"):
        retry_if_exception("not callable")  # type: ignore[arg-type]


def test_exception_message_exact_and_regex() -> None:
    """message= compares the whole message; match= searches a regex anywhere in it."""
    exact = retry_if_exception_message(message="rate limited")
    assert exact(Exception("rate limited")) is True
    assert exact(Exception("rate limited again")) is False
    regex = retry_if_exception_message(match=r"HTTP 5\d\d")
    assert regex(Exception("upstream said HTTP 503")) is True  # not anchored at the start
    assert regex(Exception("HTTP 404")) is False
    compiled = retry_if_exception_message(match=re.compile(r"^retry-\d+$"))
    assert compiled(Exception("retry-42")) is True
    assert compiled(Exception("retry-later")) is False


def test_exception_message_needs_exactly_one_matcher() -> None:
    """Giving neither or both of message= and match= is a TypeError saying so."""
    with pytest.raises(TypeError, match="missing 1 required argument 'message' or 'match'"):
        retry_if_exception_message()
    with pytest.raises(TypeError, match="either 'message' or 'match', not both"):
        retry_if_exception_message(message="a", match="a")
    with pytest.raises(TypeError, match="retry_if_not_exception_message"):
        retry_if_not_exception_message()


def test_not_exception_message_is_the_negation() -> None:
    """retry_if_not_exception_message retries unless the message matches."""
    by_text = retry_if_not_exception_message(message="permission denied")
    assert by_text(Exception("permission denied")) is False
    assert by_text(Exception("timeout")) is True
    by_regex = retry_if_not_exception_message(match="invalid_api_key|denied")
    assert by_regex(Exception("access denied")) is False
    assert by_regex(Exception("busy")) is True


def test_cause_type_walks_the_explicit_chain_only() -> None:
    """retry_if_exception_cause_type looks down __cause__, not at the error or __context__."""
    cond = retry_if_exception_cause_type(ValueError)
    assert cond(_caused(Exception("top"), RuntimeError("middle"), ValueError("root"))) is True
    assert cond(ValueError("itself")) is False
    implicit = RuntimeError("outer")
    implicit.__context__ = ValueError("during handling")
    assert cond(implicit) is False
    assert cond(_caused(RuntimeError("a"), ConnectionError("b"))) is False


def test_cause_type_ends_on_a_cyclic_chain() -> None:
    """A cause chain that loops back ends the walk instead of spinning forever."""
    a, b = RuntimeError("a"), KeyError("b")
    a.__cause__, b.__cause__ = b, a
    assert retry_if_exception_cause_type(ValueError)(a) is False
    assert retry_if_exception_cause_type(KeyError)(a) is True


def test_any_and_all_and_their_empty_cases() -> None:
    """retry_any is or, retry_all is and; with no conditions any never and all always retries."""
    is_value = retry_if_exception_type(ValueError)
    says_retry = retry_if_exception_message(match="retry")
    either, both = retry_any(is_value, says_retry), retry_all(is_value, says_retry)
    assert [either(e) for e in (ValueError("x"), KeyError("retry"), KeyError("x"))] == [
        True,
        True,
        False,
    ]
    assert [both(e) for e in (ValueError("retry"), ValueError("x"), KeyError("retry"))] == [
        True,
        False,
        False,
    ]
    assert either.retries == (is_value, says_retry)
    assert retry_any()(ValueError()) is False
    assert retry_all()(ValueError()) is True


def test_any_and_all_stop_asking_once_decided() -> None:
    """Conditions are asked left to right and the later ones not at all once the answer is known."""
    asked: list[str] = []

    def cond(name: str, answer: bool) -> retry_if_exception:
        def ask(error: BaseException) -> bool:
            asked.append(name)
            return answer

        return retry_if_exception(ask)

    assert retry_any(cond("a", True), cond("b", True))(ValueError()) is True
    assert retry_all(cond("c", False), cond("d", True))(ValueError()) is False
    assert asked == ["a", "c"]


def test_operators_build_the_named_combinators() -> None:
    """a | b is retry_any(a, b), a & b is retry_all(a, b); chains flatten left to right."""
    a = retry_if_exception_type(ValueError)
    b = retry_if_exception_message(message="retry me")
    c = retry_if_exception_cause_type(TypeError)
    either = a | b | c
    assert isinstance(either, retry_any)
    assert either.retries == (a, b, c)
    both = a & b & c
    assert isinstance(both, retry_all)
    assert both.retries == (a, b, c)
    mixed = (a | b) & c
    assert isinstance(mixed, retry_all)
    assert mixed.retries[1] is c
    cases = [
        ValueError("x"),
        RuntimeError("retry me"),
        _caused(RuntimeError(), TypeError()),
        KeyError(),
    ]
    assert [either(e) for e in cases] == [retry_any(a, b, c)(e) for e in cases]
    assert [either(e) for e in cases] == [True, True, True, False]


def test_operators_accept_plain_functions_on_either_side() -> None:
    """A plain predicate combines with a part from the left or the right."""

    def is_key(e: BaseException) -> bool:
        return isinstance(e, KeyError)

    right = retry_if_exception_type(ValueError) | is_key
    left = is_key | retry_if_exception_type(ValueError)
    assert [right(KeyError()), left(KeyError()), right(ValueError()), left(ValueError())] == [
        True
    ] * 4
    assert isinstance(is_key & retry_always(), retry_all)
    assert (is_key & retry_always()).retries[0] is is_key


def test_operators_refuse_non_callables() -> None:
    """Combining a condition with something that is not one is a TypeError."""
    with pytest.raises(TypeError):
        retry_always() | 3  # type: ignore[operator]
    with pytest.raises(TypeError):
        "x" & retry_never()  # type: ignore[operator]


def test_always_and_never() -> None:
    """retry_always retries anything, retry_never nothing, and both combine."""
    assert retry_always()(Exception()) is True
    assert retry_never()(Exception()) is False
    assert (retry_never() | retry_if_exception_type(ValueError))(ValueError()) is True
    assert (retry_always() & retry_never())(ValueError()) is False


# ----------------------------------------------------------------------------- wait strategies


def test_fixed_and_none() -> None:
    """wait_fixed gives its delay for every retry (a timedelta counts); wait_none gives 0."""
    assert [wait_fixed(3.5)(n) for n in (0, 1, 7)] == [3.5, 3.5, 3.5]
    assert wait_fixed(timedelta(milliseconds=250))(0) == 0.25
    assert wait_fixed(2)(0) == 2.0
    assert isinstance(wait_fixed(2)(0), float)
    assert wait_none()(0) == 0.0
    assert wait_fixed(-1)(0) == 0.0  # never a negative delay


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        pytest.param(lambda: wait_fixed(math.nan), ValueError, "finite", id="fixed-nan"),
        pytest.param(lambda: wait_fixed(math.inf), ValueError, "finite", id="fixed-inf"),
        pytest.param(lambda: wait_fixed("5"), TypeError, "number of seconds",  # type: ignore[arg-type]
                     id="fixed-str"),
        pytest.param(lambda: wait_fixed(True), TypeError, "number of seconds", id="fixed-bool"),
        pytest.param(lambda: wait_exponential(multiplier=math.inf), ValueError, "multiplier",
                     id="exp-multiplier"),
        pytest.param(lambda: wait_exponential(max=math.nan), ValueError, "max", id="exp-max"),
        pytest.param(lambda: wait_random(min=math.inf), ValueError, "min", id="random-min"),
        pytest.param(lambda: wait_exponential_jitter(jitter=math.nan), ValueError, "jitter",
                     id="jitter-nan"),
        pytest.param(lambda: stop_after_delay("10"), TypeError, "max_delay",  # type: ignore[arg-type]
                     id="stop-str"),
        pytest.param(lambda: stop_after_attempt("3"), TypeError, "number of attempts",  # type: ignore[arg-type]
                     id="attempts-str"),
        pytest.param(lambda: stop_after_attempt(math.nan), ValueError, "number of attempts",  # type: ignore[arg-type]
                     id="attempts-nan"),
        pytest.param(lambda: wait_exponential(exp_base="2"), TypeError, "exp_base",  # type: ignore[arg-type]
                     id="exp-base-str"),
    ],
)  # fmt: skip
def test_bad_parameters_fail_when_built(build: Any, error: type[Exception], match: str) -> None:
    """A NaN, an infinite delay or a non-number is refused by name when the part is built."""
    with pytest.raises(error, match=match):
        build()


def test_exponential_grows_and_is_held_to_its_bounds() -> None:
    """wait_exponential gives multiplier * exp_base ** n, at least min and at most max."""
    w = wait_exponential(multiplier=1, exp_base=2, max=100)
    assert [w(n) for n in range(5)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert wait_exponential(multiplier=0.5, exp_base=3, max=50)(2) == 4.5
    assert wait_exponential(multiplier=1, exp_base=10, max=50)(2) == 50.0
    floored = wait_exponential(multiplier=0.5, exp_base=2, max=100, min=2)
    assert [floored(0), floored(1), floored(3)] == [2.0, 2.0, 4.0]
    assert wait_exponential(max=timedelta(seconds=3))(5) == 3.0
    assert wait_exponential()(10) == 60.0  # LlamaIndex's default cap


def test_exponential_past_float_range_stays_at_its_cap() -> None:
    """A retry number so high that the power overflows a float gives max, not OverflowError."""
    assert wait_exponential(max=30)(5000) == 30.0
    assert wait_random_exponential(max=30)(5000, seed=1) <= 30.0
    assert wait_exponential_jitter(max=30)(5000, seed=1) == 30.0
    assert wait_exponential(multiplier=0, max=30)(5000) == 0.0


def test_negative_retry_numbers_mean_the_first_retry() -> None:
    """A retry number below zero is treated as 0 by every indexed strategy."""
    assert wait_exponential()(-3) == wait_exponential()(0) == 1.0
    assert wait_incrementing(start=1, increment=1)(-2) == 1.0
    assert wait_chain(wait_fixed(1), wait_fixed(2))(-1) == 1.0


def test_incrementing_steps_up_to_its_cap_and_never_below_zero() -> None:
    """wait_incrementing gives start + increment * n, capped at max and floored at 0."""
    w = wait_incrementing(start=1, increment=0.5, max=2)
    assert [w(n) for n in (0, 1, 2, 10)] == [1.0, 1.5, 2.0, 2.0]
    down = wait_incrementing(start=-5, increment=-1, max=10)
    assert [down(0), down(3)] == [0.0, 0.0]
    assert wait_incrementing()(3) == 300.0  # tenacity's defaults: start 0, increment 100


def test_random_stays_in_range_and_is_determined_by_its_seed() -> None:
    """wait_random draws from [min, max]; the same seed gives the same delay in any process."""
    w = wait_random(min=1, max=5)
    assert all(1.0 <= w(0) <= 5.0 for _ in range(50))
    assert w(0, seed=42) == w(3, seed=42) == w(0, seed=42)
    assert len({w(0, seed=s) for s in range(20)}) > 1
    # Python's generator is reproducible for a given seed across versions: pin one draw.
    assert wait_random(0, 10)(0, seed=12345) == pytest.approx(4.1661987254534116)


def test_random_seed_does_not_disturb_the_unseeded_draws() -> None:
    """A seeded draw uses its own generator, so it leaves the global random state alone."""
    import random

    random.seed(7)
    expected = random.random()
    random.seed(7)
    wait_random(0, 1)(0, seed=99)
    assert random.random() == expected


def test_exponential_jitter_adds_at_most_jitter_and_respects_max() -> None:
    """wait_exponential_jitter is the exponential plus a draw from [0, jitter], capped at max."""
    assert [wait_exponential_jitter(jitter=0, max=100)(n) for n in range(3)] == [1.0, 2.0, 4.0]
    w = wait_exponential_jitter(initial=1, exp_base=2, max=100, jitter=1)
    for n in range(6):
        assert 2.0**n <= w(n, seed=n) <= 2.0**n + 1
    assert w(3, seed=99) == w(3, seed=99)
    capped = wait_exponential_jitter(initial=10, exp_base=2, max=10, jitter=5)
    assert all(capped(3, seed=s) == 10.0 for s in range(10))


def test_random_exponential_draws_below_the_exponential_bound() -> None:
    """wait_random_exponential draws from [min, min(multiplier * exp_base ** n, max)]."""
    w = wait_random_exponential(multiplier=1, exp_base=2, max=100)
    for n in range(7):
        assert 0.0 <= w(n, seed=n) <= min(2.0**n, 100.0)
    assert w(4, seed=17) == w(4, seed=17)
    floored = wait_random_exponential(multiplier=0.5, exp_base=2, max=100, min=2)
    assert floored(0, seed=11) == 2.0  # the bound is below min: min wins
    assert 2.0 <= floored(4, seed=12) <= 8.0


def test_full_jitter_is_random_exponential() -> None:
    """wait_full_jitter is tenacity's other name for wait_random_exponential."""
    alias = wait_full_jitter(multiplier=1, exp_base=2, max=20)
    assert isinstance(alias, wait_random_exponential)
    assert alias(4, seed=99) == wait_random_exponential(multiplier=1, exp_base=2, max=20)(
        4, seed=99
    )


def test_chain_uses_one_strategy_per_retry_then_repeats_the_last() -> None:
    """wait_chain's i-th strategy serves retry i, the last one every later retry."""
    w = wait_chain(wait_fixed(1), wait_fixed(2), wait_fixed(5))
    assert [w(n) for n in range(5)] == [1.0, 2.0, 5.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="at least one"):
        wait_chain()


def test_chain_asks_a_strategy_with_the_retry_number_and_seed() -> None:
    """The chosen strategy sees the retry's own number (as in tenacity) and the seed."""
    w = wait_chain(wait_fixed(1), wait_exponential(max=100))
    assert [w(1), w(3)] == [2.0, 8.0]
    r = wait_chain(wait_random(0, 10))
    assert r(0, seed=5) == wait_random(0, 10)(0, seed=5)


def test_combine_and_plus_add_delays() -> None:
    """wait_combine sums its strategies; + builds it, flattened; sum() works from 0."""
    combined = wait_combine(wait_fixed(1.5), wait_incrementing(start=1, increment=1))
    assert [combined(0), combined(2)] == [2.5, 4.5]
    a, b, c = wait_fixed(1), wait_fixed(2), wait_none()
    plus = a + b + c
    assert isinstance(plus, wait_combine)
    assert plus.strategies == (a, b, c)
    total: Any = sum([a, b, c])
    assert total(0) == 3.0
    assert wait_combine()(0) == 0


def test_plus_accepts_a_plain_function_and_refuses_non_callables() -> None:
    """A plain wait function adds from either side; adding a number is a TypeError."""

    def one(attempt: int, *, seed: int | None = None) -> float:
        return 1.0

    assert (wait_fixed(2) + one)(0) == 3.0
    assert (one + wait_fixed(2))(0) == 3.0
    with pytest.raises(TypeError):
        wait_fixed(1) + 5  # type: ignore[operator]
    with pytest.raises(TypeError):
        5 + wait_fixed(1)


def test_combine_is_seeded_and_draws_each_part_independently() -> None:
    """A seeded sum is the same every time, and two random parts are not the same draw twice."""
    r = wait_random(0, 1)
    both = r + r
    assert both(3, seed=123) == both(3, seed=123)
    assert (r + r)(3, seed=123) == wait_combine(r, r)(3, seed=123)
    assert any(both(0, seed=s) != 2 * r(0, seed=s) for s in range(10))
    mixed = wait_random(0, 1) + wait_random_exponential(multiplier=0.5, max=10)
    assert mixed(3, seed=7) == mixed(3, seed=7)


# ----------------------------------------------------------------------------- stop conditions


def test_after_attempt_counts_failures() -> None:
    """stop_after_attempt(n) gives up once n attempts have failed; 0 gives up at once."""
    s = stop_after_attempt(3)
    assert [s(n, 0.0) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert stop_after_attempt(0)(1, 0.0) is True
    assert stop_after_attempt(1)(1, 0.0) is True


def test_after_and_before_delay() -> None:
    """stop_after_delay looks at the elapsed time; stop_before_delay adds the upcoming sleep."""
    after = stop_after_delay(10)
    assert [after(1, t) for t in (9.9, 10.0, 15.0)] == [False, True, True]
    assert after(1, 9.9, upcoming_sleep=100) is False
    assert stop_after_delay(timedelta(minutes=1))(1, 59.0) is False
    before = stop_before_delay(5)
    assert before(1, 4.4, upcoming_sleep=0.5) is False
    assert before(1, 4.5, upcoming_sleep=0.5) is True
    assert before(1, 5.0) is True


def test_stop_any_all_never_and_operators() -> None:
    """stop_any is or and stop_all is and (| and & build them, flattened); stop_never never."""
    by_attempt, by_delay = stop_after_attempt(3), stop_after_delay(10)
    either, both = by_attempt | by_delay, by_attempt & by_delay
    assert isinstance(either, stop_any)
    assert isinstance(both, stop_all)
    assert [either(3, 1.0), either(1, 10.0), either(1, 1.0)] == [True, True, False]
    assert [both(3, 10.0), both(3, 1.0)] == [True, False]
    assert stop_any(by_attempt, by_delay)(1, 10.0) == either(1, 10.0)
    never = stop_never()
    assert (by_attempt | by_delay | never).stops == (by_attempt, by_delay, never)
    assert stop_never()(10**6, 1e9) is False
    assert stop_any()(5, 5.0) is False
    assert stop_all()(5, 5.0) is True


def test_stop_combinators_pass_the_upcoming_sleep_on() -> None:
    """A stop_before_delay inside stop_any / stop_all still sees the upcoming sleep."""
    s = stop_never() | stop_before_delay(5)
    assert s(1, 4.0, upcoming_sleep=0.5) is False
    assert s(1, 4.0, upcoming_sleep=1.0) is True
    assert (stop_before_delay(5) & stop_after_attempt(1))(1, 4.0, upcoming_sleep=2) is True


# ----------------------------------------------------------------------------- the policy


def test_defaults_wait_five_seconds_and_allow_three_attempts() -> None:
    """retry_policy() retries every exception after 5 s and gives up at the third failure."""
    p = retry_policy()
    assert type(p).__name__ == "_ComposableRetryPolicy"
    assert isinstance(p, RetryPolicy)
    err = Exception("fail")
    assert [p.next(0.0, n, err) for n in (1, 2, 3)] == [5.0, 5.0, None]
    assert p.next(0.0, 0, err) == 5.0


def test_failure_n_asks_the_wait_for_retry_n_minus_one() -> None:
    """Failure 1 gets the wait's first delay, failure 2 its second, and so on."""
    p = retry_policy(
        wait=wait_chain(wait_fixed(1), wait_fixed(2), wait_fixed(3)), stop=stop_never()
    )
    assert [p.next(0.0, n, Exception()) for n in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 3.0]
    assert p.next(0.0, 0, Exception()) == p.next(0.0, -5, Exception()) == 1.0
    exp = retry_policy(
        wait=wait_exponential(multiplier=0.5, exp_base=3), stop=stop_after_attempt(4)
    )
    assert [exp.next(0.0, n, Exception()) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, None]


def test_a_refused_error_is_not_retried_and_the_wait_is_not_asked() -> None:
    """When the retry condition says no, next() is None without consulting wait or stop."""

    def wait(attempt: int, *, seed: int | None = None) -> float:
        raise AssertionError("the wait was asked")

    p = retry_policy(retry=retry_if_exception_type(ConnectionError), wait=wait)
    assert p.next(0.0, 1, ValueError("permanent")) is None


def test_stop_sees_the_upcoming_delay() -> None:
    """stop_before_delay inside a policy gives up when the next sleep would pass the limit."""
    p = retry_policy(wait=wait_fixed(0.5), stop=stop_before_delay(5))
    assert p.next(4.4, 1, Exception()) == 0.5
    assert p.next(4.5, 1, Exception()) is None
    inc = retry_policy(wait=wait_incrementing(start=1, increment=1), stop=stop_before_delay(5))
    assert inc.next(2.0, 2, Exception()) == 2.0
    assert inc.next(2.0, 3, Exception()) is None


def test_stop_after_delay_in_a_policy() -> None:
    """stop_after_delay ends the retries on elapsed time whatever the attempt count."""
    p = retry_policy(wait=wait_fixed(1), stop=stop_after_delay(10))
    assert p.next(9.0, 100, Exception()) == 1.0
    assert p.next(10.0, 1, Exception()) is None


def test_seed_reaches_the_wait() -> None:
    """next(..., seed=) draws the same random delay for the same seed."""
    p = retry_policy(wait=wait_random(0, 10) + wait_fixed(1), stop=stop_after_attempt(5))
    a = p.next(0.0, 2, Exception(), seed=42)
    assert a == p.next(0.0, 2, Exception(), seed=42)
    assert a is not None
    assert 1.0 <= a <= 11.0
    assert len({p.next(0.0, 2, Exception(), seed=s) for s in range(10)}) > 1


def test_a_user_wait_below_zero_becomes_zero() -> None:
    """A wait function of the user's that returns a negative delay retries at once."""
    p = retry_policy(wait=lambda n, *, seed=None: -2.0)
    assert p.next(0.0, 1, Exception()) == 0.0


def test_an_infinite_delay_fails_loudly_unless_the_stop_gives_up() -> None:
    """A wait that would sleep forever raises ValueError naming it; a stop that ends first wins."""
    endless = wait_exponential(max=math.inf)
    p = retry_policy(wait=endless, stop=stop_never())
    assert p.next(0.0, 3, Exception()) == 4.0
    with pytest.raises(ValueError, match=r"wait_exponential\(.*\) gave inf seconds for retry 4999"):
        p.next(0.0, 5000, Exception())
    assert (
        retry_policy(wait=endless, stop=stop_before_delay(60)).next(0.0, 5000, Exception()) is None
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"retry": ValueError}, r"retry_if_exception_type\(ValueError\)",
                     id="retry-class"),
        pytest.param({"retry": "ValueError"}, "retry part", id="retry-str"),
        pytest.param({"wait": 5}, r"wait_fixed\(5\)", id="wait-number"),
        pytest.param({"stop": 3}, r"stop_after_attempt\(3\)", id="stop-number"),
    ],
)  # fmt: skip
def test_parts_of_the_wrong_kind_are_refused(kwargs: dict[str, Any], match: str) -> None:
    """retry_policy() names the part it expected when given a class or a number instead."""
    with pytest.raises(TypeError, match=match):
        retry_policy(**kwargs)


def test_repr_shows_the_parts() -> None:
    """A policy's repr reads as the call that built it (for logs and error messages)."""
    p = retry_policy(
        retry=retry_if_exception_type(ValueError) | retry_if_exception_message(match="again"),
        wait=wait_fixed(1) + wait_random(0, 1),
        stop=stop_after_attempt(3),
    )
    assert repr(p) == (
        "retry_policy(retry=retry_any(retry_if_exception_type(<class 'ValueError'>),"
        " retry_if_exception_message(match='again')), wait=wait_combine(wait_fixed(1.0),"
        " wait_random(min=0.0, max=1.0)), stop=stop_after_attempt(3))"
    )


# ----------------------------------------------------------------------------- seeds and _ask


def test_attempt_seed_is_stable_and_distinguishes_each_part() -> None:
    """The engine's jitter seed is a pinned 64-bit function of run, step, event and attempt."""
    seed = _attempt_seed("run-1", "fetch", 3, 2)
    assert seed == 5038871618500312035  # a recorded run recomputes the same seed forever
    assert 0 <= seed < 2**64
    others = {
        _attempt_seed("run-2", "fetch", 3, 2),
        _attempt_seed("run-1", "fetch2", 3, 2),
        _attempt_seed("run-1", "fetch", 4, 2),
        _attempt_seed("run-1", "fetch", 3, 3),
        _attempt_seed("run-1", "fetch3", 2, 2),  # no ambiguity in how the parts join
    }
    assert seed not in others
    assert len(others) == 5


def test_ask_passes_the_seed_only_to_a_next_that_takes_it() -> None:
    """The engine's call works with policies written before seed= existed."""

    class Old:
        def next(self, elapsed_time: float, attempts: int, error: Exception) -> float | None:
            return 1 if attempts < 2 else None

    class Kw:
        def next(self, *args: Any, **kwargs: Any) -> float | None:
            return float(kwargs["seed"])

    assert _ask(Old(), 0.0, 1, Exception(), seed=9) == 1.0
    assert _ask(Old(), 0.0, 2, Exception(), seed=9) is None
    assert _ask(Kw(), 0.0, 1, Exception(), seed=9) == 9.0
    p = retry_policy(wait=wait_random(0, 10))
    assert _ask(p, 0.0, 1, Exception(), seed=4) == p.next(0.0, 1, Exception(), seed=4)


@pytest.mark.parametrize(
    "delay",
    [
        pytest.param(-1.0, id="negative"),
        pytest.param(math.nan, id="nan"),
        pytest.param(math.inf, id="inf"),
        pytest.param("5", id="str"),
        pytest.param(True, id="bool"),
    ],
)
def test_ask_refuses_a_delay_that_is_not_a_duration(delay: Any) -> None:
    """A policy answering with something other than seconds or None is a ValueError naming it."""

    class Bad:
        def next(self, elapsed_time: float, attempts: int, error: Exception) -> Any:
            return delay

        def __repr__(self) -> str:
            return "Bad()"

    with pytest.raises(ValueError, match=r"retry policy Bad\(\) returned .* after failure 1"):
        _ask(Bad(), 0.0, 1, Exception(), seed=None)


# ----------------------------------------------------------------------------- RetryInfo


def test_retry_info_defaults_describe_a_first_attempt() -> None:
    """RetryInfo() is the first attempt's: retry 0, nothing elapsed, no failure yet; frozen."""
    first = RetryInfo()
    assert first == RetryInfo(0, 0.0, None, None)
    assert [f.name for f in dataclasses.fields(RetryInfo)] == [
        "retry_number",
        "elapsed_seconds",
        "last_exception",
        "last_failed_at",
    ]
    when = datetime(2026, 1, 2, tzinfo=UTC)
    err = ValueError("boom")
    later = RetryInfo(retry_number=1, elapsed_seconds=0.5, last_exception=err, last_failed_at=when)
    assert (later.retry_number, later.last_exception, later.last_failed_at) == (1, err, when)
    with pytest.raises(dataclasses.FrozenInstanceError):
        later.retry_number = 2  # type: ignore[misc]


# ----------------------------------------------------------------------------- deprecated factories


def test_constant_delay_warns_and_builds_the_composed_policy() -> None:
    """ConstantDelayRetryPolicy warns (at the caller's line) and retries after its delay."""
    with pytest.warns(DeprecationWarning, match=re.escape(CONSTANT_WARNING)) as caught:
        p = ConstantDelayRetryPolicy(maximum_attempts=5, delay=4.2)
    assert caught[0].filename == __file__
    assert type(p).__name__ == "_ComposableRetryPolicy"
    assert [p.next(elapsed_time=0.0, attempts=n, error=Exception()) for n in (1, 4, 5, 999)] == [
        4.2,
        4.2,
        None,
        None,
    ]
    with pytest.warns(DeprecationWarning, match=re.escape(CONSTANT_WARNING)):
        default = ConstantDelayRetryPolicy()
    assert [default.next(0.0, n, Exception()) for n in (2, 3)] == [5.0, None]


def test_exponential_backoff_warns_and_builds_the_composed_policy() -> None:
    """ExponentialBackoffRetryPolicy warns and backs off initial_delay * multiplier ** n."""
    with pytest.warns(DeprecationWarning, match=re.escape(EXPONENTIAL_WARNING)) as caught:
        p = ExponentialBackoffRetryPolicy(
            initial_delay=0.5, multiplier=3, max_delay=10, jitter=False
        )
    assert caught[0].filename == __file__
    assert type(p).__name__ == "_ComposableRetryPolicy"
    assert [p.next(0.0, n, Exception()) for n in (1, 2, 3, 4, 5)] == [0.5, 1.5, 4.5, 10.0, None]


def test_exponential_backoff_jitters_by_default_and_replays_by_seed() -> None:
    """By default the delay is drawn in [0, bound] (full jitter), the same for the same seed."""
    with pytest.warns(DeprecationWarning, match="ExponentialBackoffRetryPolicy is deprecated"):
        p = ExponentialBackoffRetryPolicy()
    for n in range(1, 5):
        seed = _attempt_seed("run-abc", "my_step", 7, n)
        delay = p.next(0.0, n, Exception(), seed=seed)
        assert delay is not None
        assert 0.0 <= delay <= 2.0 ** (n - 1)
        assert delay == p.next(0.0, n, Exception(), seed=seed)
    assert p.next(0.0, 5, Exception(), seed=1) is None  # maximum_attempts=5
    with pytest.warns(DeprecationWarning, match="ExponentialBackoffRetryPolicy is deprecated"):
        capped = ExponentialBackoffRetryPolicy(maximum_attempts=20, jitter=False)
    assert capped.next(0.0, 10, Exception()) == 60.0  # max_delay defaults to 60


def test_nothing_in_the_package_warns_on_import() -> None:
    """Importing workflow and its retry module emits no deprecation warning of its own."""
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(rp)
    assert rp.retry_policy is not None


# ----------------------------------------------------------------------------- @step


def test_step_accepts_any_object_with_next() -> None:
    """@step takes a composed policy, a deprecated one and a class of the user's own."""

    class Mine:
        def next(self, elapsed_time: float, attempts: int, error: Exception) -> float | None:
            return None

    async def body(ev: StartEvent) -> StopEvent:
        return StopEvent()

    def host() -> type[Workflow]:  # a free function is a step of the class it is added to
        return type("Host", (Workflow,), {})

    step(workflow=host(), retry_policy=retry_policy())(body)
    step(workflow=host(), retry_policy=Mine())(body)
    with pytest.warns(DeprecationWarning, match="ConstantDelayRetryPolicy is deprecated"):
        step(workflow=host(), retry_policy=ConstantDelayRetryPolicy(delay=0))(body)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(wait_fixed(1), id="a-wait-part"),
        pytest.param(retry_policy, id="the-uncalled-factory"),
        pytest.param(type(retry_policy()), id="a-class"),
        pytest.param(3, id="a-number"),
    ],
)
def test_step_refuses_what_has_no_next(bad: Any) -> None:
    """@step(retry_policy=...) refuses an object without a next() method, naming the fix."""
    with pytest.raises(WorkflowValidationError, match=r"must have a next\(elapsed_time"):
        step(retry_policy=bad)


# ----------------------------------------------------------------------------- the engine


class Unreachable(Workflow):
    """A step that raises ``failures[i]`` on attempt i + 1 and succeeds after them."""

    failures: ClassVar[list[type[Exception]]] = []

    @step(
        retry_policy=retry_policy(
            retry=retry_if_exception_type(ConnectionError)
            | retry_if_exception_message(match="^again"),
            wait=wait_chain(wait_fixed(0.01), wait_fixed(0.02)) + wait_incrementing(0, 0.01),
            stop=stop_after_attempt(4) | stop_after_delay(60),
        )
    )
    async def fetch(self, ctx: Context, ev: StartEvent) -> StopEvent:
        n = await ctx.store.get("n", default=0)
        await ctx.store.set("n", n + 1)  # failed attempts leave no writes: n stays 0
        self.calls = getattr(self, "calls", 0) + 1
        kinds = type(self).failures
        if self.calls <= len(kinds):
            raise kinds[self.calls - 1](
                "again" if kinds[self.calls - 1] is RuntimeError else "down"
            )
        return StopEvent(result=(self.calls, n))


def _failures(store: EventStore, run_id: str) -> list[tuple[int, bool, float | None, str]]:
    failed = [r.data() for r in store.records(run_id, kinds=["step_failed"])]
    return [(p["attempt"], p["retry"], p["delay"], p["error"]) for p in failed]


async def test_composed_policy_retries_until_the_stop_and_records_each_delay(
    store: EventStore,
) -> None:
    """Four failures: three retries after 0.01, 0.03 and 0.04 s, then the run fails."""
    Unreachable.failures = [ConnectionError] * 10
    wf = Unreachable(store=store, timeout=30)
    h = wf.run()
    with pytest.raises(ConnectionError, match="down"):
        await h
    assert _failures(store, h.run_id) == [
        (1, True, 0.01, "ConnectionError"),
        (2, True, pytest.approx(0.03), "ConnectionError"),
        (3, True, pytest.approx(0.04), "ConnectionError"),
        (4, False, None, "ConnectionError"),
    ]
    assert wf.calls == 4
    assert wf.state_at(h.run_id).status == "failed"


async def test_composed_policy_stops_at_a_refused_error(store: EventStore) -> None:
    """A retried error, one retried by message, then a refused type: the third ends the run."""
    Unreachable.failures = [ConnectionError, RuntimeError, ValueError]
    wf = Unreachable(store=store, timeout=30)
    h = wf.run()
    with pytest.raises(ValueError, match="down"):
        await h
    assert _failures(store, h.run_id) == [
        (1, True, 0.01, "ConnectionError"),
        (2, True, pytest.approx(0.03), "RuntimeError"),
        (3, False, None, "ValueError"),
    ]


async def test_composed_policy_lets_the_step_succeed(store: EventStore) -> None:
    """Two failures then a success: the result comes from the third attempt, state clean."""
    Unreachable.failures = [ConnectionError, ConnectionError]
    wf = Unreachable(store=store, timeout=30)
    h = wf.run()
    assert await h == (3, 0)
    assert [f[:3] for f in _failures(store, h.run_id)] == [
        (1, True, 0.01),
        (2, True, pytest.approx(0.03)),
    ]
    assert wf.state_at(h.run_id).context == {"n": 1}


class Forever(Workflow):
    """A step whose wait strategy would sleep forever after its first failure."""

    @step(retry_policy=retry_policy(wait=lambda n, *, seed=None: math.inf, stop=stop_never()))
    async def start(self, ev: StartEvent) -> StopEvent:
        msg = "down"
        raise ConnectionError(msg)


async def test_an_infinite_delay_fails_the_run_instead_of_hanging(store: EventStore) -> None:
    """A policy that would sleep forever ends the run with its ValueError."""
    h = Forever(store=store).run()
    with pytest.raises(ValueError, match="a delay must be finite"):
        await asyncio.wait_for(h, 20)  # a guard against a hang, not a speed assertion
