"""Crash tests of store creation: a service killed on its very first start must start next time.

``tests/crash/creator.py`` forks children that create new stores and SIGKILLs them at random
moments of the creation; afterwards every path must open as a store (or not exist yet, and
then be created), take a commit and pass SQLite's integrity check.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eventstore import Commit, EventStore, NewRun, Record

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
CREATOR = Path(__file__).with_name("creator.py")
TRIAL = re.compile(r"TRIAL (\d+) (killed|exited=-?\d+)(?: racer=(-?\d+))?")


def run_creator(root: Path, trials: int, seed: int) -> list[tuple[int, str, str | None]]:
    """Runs creator.py; returns (trial, outcome, racer status) per trial."""
    proc = subprocess.run(
        [sys.executable, str(CREATOR), str(root), str(trials), str(seed)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    found = [TRIAL.fullmatch(line) for line in proc.stdout.splitlines()[1:]]
    assert all(found), proc.stdout
    return [(int(m[1]), m[2], m[3]) for m in found if m]


def reopen(path: Path) -> str:
    """Opens ``path`` as a store the next start would; returns what it found there first."""
    before = "absent" if not path.exists() else "present"
    with EventStore(path) as store:
        store.append_sync(Commit("r", [Record("k", None, "{}")], create=NewRun()))
        assert [r.seq for r in store.records("r")] == [store.head()]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # INCREMENTAL
    finally:
        conn.close()
    return before


@pytest.mark.parametrize(
    "trials",
    [
        pytest.param(200, id="200-kills", marks=pytest.mark.long),
        pytest.param(2000, id="2000-kills", marks=pytest.mark.slow),
    ],
)
def test_sigkill_during_creation_never_leaves_an_unopenable_file(
    tmp_path: Path, trials: int
) -> None:
    """Kills at random moments of creating a store leave 0 files that cannot be opened."""
    outcomes = run_creator(tmp_path, trials, seed=trials)
    assert len(outcomes) == trials
    # Racers opened the file while the other creator was killed: each one succeeded.
    assert [(n, racer) for n, _, racer in outcomes if racer not in (None, "0")] == []
    assert [(n, o) for n, o, _ in outcomes if o not in ("killed", "exited=0")] == []
    unopenable: list[str] = []
    found: Counter[str] = Counter()
    for n, outcome, racer in outcomes:
        try:
            before = reopen(tmp_path / f"store-{n}.db")
        except Exception as exc:
            unopenable.append(f"store-{n}.db: {type(exc).__name__}: {exc}")
            continue
        if outcome == "killed" and racer is None:
            found[before] += 1
    assert unopenable == []
    # The kills landed across the creation: some before it was done, some too late to stop
    # it. (A kill after the store is published but before the child exits is rare with an
    # atomic publish; the repair of such files is tested on committed fixtures instead.)
    assert found["absent"] > 0, found
    assert any(o == "exited=0" for _, o, _ in outcomes), Counter(o for _, o, _ in outcomes)
