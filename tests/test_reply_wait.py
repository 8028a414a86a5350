"""When the event loop busy-waits for a PostgreSQL call's reply and when it sleeps
(eventstore/_loop_writer.py's _ReplyWait), and the URL parameter that bounds the wait.

No server: the choice is a function of the round trips measured, fed here by hand; the
PostgreSQL tests (tests/test_pg_loop_writer.py) run it against a real one.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from eventstore import EventStore, StoreURLError
from eventstore._loop_writer import _ReplyWait
from eventstore._pg_connect import REPLY_SPIN_US, reply_spin_s, split
from workflow.cli import cli

US = 1e-6


def run(wait: _ReplyWait, calls: int, busy_s: float, asleep_s: float) -> list[bool]:
    """The ways ``calls`` calls take when a busy call's cycle measures ``busy_s`` and a
    sleeping one's ``asleep_s``."""
    ways = []
    for _ in range(calls):
        way = wait.busy()
        wait.took(way, busy_s if way else asleep_s)
        ways.append(way)
    return ways


def busy_calls(ways: list[bool]) -> list[int]:
    return [i + 1 for i, way in enumerate(ways) if way]


def test_without_a_bound_the_loop_always_sleeps() -> None:
    wait = _ReplyWait(0.0)
    assert not any(run(wait, 200, 1 * US, 1_000 * US))


def test_it_starts_with_a_burst_of_busy_calls_and_keeps_waiting_busily_if_faster() -> None:
    """The first 5 calls of each 64 take the other way; the first cycle of each switch is
    not kept (it measures the switch: caches cold after sleeping)."""
    wait = _ReplyWait(500 * US)
    ways = run(wait, 64, 325 * US, 450 * US)
    # 6 and 7 sleep: 6's cycle is a switch's, 7's the first sleeping one kept.
    assert busy_calls(ways) == [1, 2, 3, 4, 5, *range(8, 65)]
    ways = run(wait, 64, 325 * US, 450 * US)  # from now on busy, sleeping in bursts
    assert [i for i, way in enumerate(ways, 65) if not way] == [65, 66, 67, 68, 69]


def test_a_slower_busy_wait_is_left_and_tried_ever_less_often() -> None:
    """On cores other processes want, a busy wait makes the next call later (each costs
    milliseconds there): sleep, and try a burst of busy calls again after 64 calls, then
    128, 256, ... while they keep measuring much worse."""
    wait = _ReplyWait(500 * US)
    ways = run(wait, 1024, 2_000 * US, 700 * US)
    assert busy_calls(ways) == [b + k for b in (1, 65, 193, 449, 961) for k in range(5)]
    assert wait.period == 1024


def test_a_gain_within_ten_percent_is_not_worth_the_cpu() -> None:
    """Steps that take milliseconds: the wait is a small part of a cycle, so neither way
    is clearly faster and the loop sleeps."""
    assert sum(run(_ReplyWait(500 * US), 256, 5_100 * US, 5_400 * US)) == 20
    assert sum(run(_ReplyWait(500 * US), 256, 410 * US, 450 * US)) == 20
    assert sum(run(_ReplyWait(500 * US), 256, 400 * US, 460 * US)) == 5 + 57 + 3 * 59


def test_once_busy_it_stays_so_until_sleeping_is_faster() -> None:
    """Hysteresis: a busy wait taken at a gain of more than 10% is left only once it
    measures slower than sleeping, not as soon as the gain falls under 10%."""
    wait = _ReplyWait(500 * US)
    run(wait, 65, 300 * US, 450 * US)
    assert wait.prefer_busy
    assert sum(run(wait, 128, 430 * US, 450 * US)) == 128 - 10  # asleep: 66-69, 129-133, 193
    assert sum(run(wait, 128, 470 * US, 450 * US)) < 40


def test_cycles_of_a_loop_with_nothing_to_write_are_not_kept() -> None:
    wait = _ReplyWait(500 * US)
    run(wait, 64, 325 * US, 450 * US)
    run(wait, 64, 0.5, 0.5)  # the loop was idle between these calls
    assert list(wait.busy_s) == [pytest.approx(325 * US)] * 16
    assert not wait.asleep_s  # its burst measured nothing it keeps
    assert wait.prefer_busy


def test_the_choice_follows_the_load() -> None:
    wait = _ReplyWait(500 * US)
    assert sum(run(wait, 128, 325 * US, 450 * US)) > 100
    assert sum(run(wait, 320, 2_000 * US, 700 * US)[-128:]) == 0  # the machine got busy
    # and quiet again: the next busy burst (call 513) finds it so, and busy waits resume
    assert sum(run(wait, 256, 325 * US, 450 * US)[-128:]) == 118
    assert wait.period == 64


def test_reply_spin_us_is_the_store_s_and_never_reaches_libpq() -> None:
    url = "postgresql://dw@h1/db?reply_spin_us=250&schema=s1&application_name=a"
    conninfo, schema = split(url)
    assert "reply_spin_us" not in conninfo
    assert "application_name" in conninfo
    assert schema == "s1"
    assert reply_spin_s(url) == pytest.approx(250 * US)
    assert reply_spin_s("postgresql://dw@h1/db") == pytest.approx(REPLY_SPIN_US * US)
    assert reply_spin_s("postgresql://dw@h1/db?reply_spin_us=0") == 0.0
    assert reply_spin_s("postgresql://dw@h1/db?reply_spin_us=100000") == pytest.approx(0.1)


@pytest.mark.parametrize("value", ["", "x", "-1", "1.5", "1e3", "100001", "\uff11\uff12"])
def test_a_bad_reply_spin_us_is_refused_before_connecting(value: str) -> None:
    """Named in the error, and refused before any connection is tried (the host here
    does not exist: connecting would fail differently, and only after a timeout)."""
    url = f"postgresql://dw@no-such-host.invalid/db?reply_spin_us={value}"
    with pytest.raises(StoreURLError, match=r"reply_spin_us= parameter must be a whole number"):
        reply_spin_s(url)
    with pytest.raises(ValueError, match=r"reply_spin_us="):  # a ValueError, as before
        EventStore(url)


@pytest.mark.parametrize("key", ["schema", "reply_spin_us"])
def test_a_parameter_of_ours_given_twice_is_refused(key: str) -> None:
    """Which one was meant? libpq would take the last; a store in the wrong schema would
    be a store of its own."""
    url = f"postgresql://dw@no-such-host.invalid/db?{key}=a1&x=1&{key}=0"
    with pytest.raises(StoreURLError, match=rf"gives \?{key}= more than once"):
        split(url)
    with pytest.raises(StoreURLError, match=rf"gives \?{key}= more than once"):
        EventStore(url)


def test_the_command_line_says_what_is_wrong_with_the_url_in_one_line() -> None:
    result = CliRunner().invoke(
        cli, ["runs", "postgresql://dw@no-such-host.invalid/db?reply_spin_us=abc"]
    )
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: the URL's ?reply_spin_us= parameter must be a whole number of microseconds"
        " from 0 to 100000, not 'abc'"
    )
