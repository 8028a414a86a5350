"""JSON typed on the command line (``--data``, ``--set``) and posted to the UI's actions is
read exactly: an integer beyond 64 bits stays that integer, and what no float holds is
refused, never stored rounded (:func:`workflow.cli._common.loads_exact`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.test_cli import invoke, ok
from workflow.cli._common import loads_exact

BIG = 123456789012345678901234567890


def test_loads_exact_keeps_big_integers_and_refuses_what_no_float_holds() -> None:
    assert loads_exact(f'{{"n": {BIG}, "f": 1.5, "m": -{BIG}}}') == {"n": BIG, "f": 1.5, "m": -BIG}
    assert type(loads_exact("1.0")) is float
    assert type(loads_exact("1")) is int
    with pytest.raises(ValueError, match="beyond what a float holds"):
        loads_exact('{"x": 1e400}')
    for constant in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(ValueError, match="is not JSON"):
            loads_exact(f'{{"x": {constant}}}')
    with pytest.raises(ValueError, match="Expecting property name"):
        loads_exact("{nope")


def _first_commit(db: Path, run_id: str) -> int:
    with EventStore(db, readonly=True) as store:
        return next(r.seq for r in store.records(run_id) if r.seq == r.commit_seq)


def test_run_data_and_fork_set_keep_a_big_integer(tmp_path: Path) -> None:
    db = tmp_path / "exact.db"
    spec = "tests.flows:EchoesTypes"
    ran = ok("run", db, "--workflow", spec, "--run-id", "r", "--data", json.dumps({"n": BIG}))
    assert f"n={BIG} (int)" in ran, ran
    at = _first_commit(db, "r")
    forked = ok("fork", db, "r", "--at", at, "--workflow", spec, "--set", f"x={BIG}")
    assert f"x={BIG} (int)" in forked, forked


def test_a_number_no_float_holds_is_refused_naming_the_option(tmp_path: Path) -> None:
    db = tmp_path / "exact.db"
    spec = "tests.flows:EchoesTypes"
    result = invoke("run", db, "--workflow", spec, "--data", '{"n": 1e400}')
    assert result.exit_code != 0
    assert "--data" in result.stderr, result.stderr
    assert "beyond what a float holds" in result.stderr, result.stderr
    ok("run", db, "--workflow", spec, "--run-id", "r")
    at = _first_commit(db, "r")
    result = invoke("fork", db, "r", "--at", at, "--workflow", spec, "--set", "x=NaN")
    assert result.exit_code != 0
    assert "--set" in result.stderr, result.stderr
    assert "NaN is not JSON" in result.stderr, result.stderr
