"""Crash tests: a subprocess appends and dies mid-write; the log must stay whole and gap-free.

The appender (``tests/crash/appender.py``) prints one line per acknowledged commit. After it
is killed (SIGKILL at a random moment, or ``os._exit`` right before or after a chosen
``COMMIT``), the test reopens the store and checks what the store promised: every
acknowledged commit is there and whole, no commit is partial, seqs are ``1..n`` without a
gap, and SQLite's own integrity check passes.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from eventstore import EventStore, StoredRecord

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
APPENDER = Path(__file__).with_name("appender.py")
RUN_ID = "crash-run"
CRASH_STATUS = 137  # what appender.py exits with at a crash point
STARTUP_TIMEOUT_S = 20.0


@dataclass
class Appender:
    """A running appender subprocess and the acknowledgements it printed so far."""

    proc: subprocess.Popen[bytes]
    acks: list[tuple[int, int]] = field(default_factory=list)  # (last_seq, commit number)
    first_ack: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    err: str | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith(b"\n"):
                break  # cut by the kill: not a complete acknowledgement
            seq, number = line.split()
            self.acks.append((int(seq), int(number)))
            self.first_ack.set()

    def wait_first_ack(self) -> None:
        if not self.first_ack.wait(STARTUP_TIMEOUT_S):
            self.kill()
            pytest.fail(f"the appender acknowledged nothing: {self.stderr()}")

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.finish()

    def finish(self) -> int:
        """Waits for the process to end, then collects its output and closes the pipes."""
        code = self.proc.wait(STARTUP_TIMEOUT_S)
        if self.reader is not None:
            self.reader.join(STARTUP_TIMEOUT_S)
        if self.err is None:
            assert self.proc.stdout is not None
            assert self.proc.stderr is not None
            self.err = self.proc.stderr.read().decode(errors="replace")
            self.proc.stdout.close()
            self.proc.stderr.close()
        return code

    def stderr(self) -> str:
        return "(still running)" if self.err is None else self.err


def start_appender(path: Path, *args: str, env: dict[str, str] | None = None) -> Appender:
    """Starts appender.py on ``path`` with the repo root on PYTHONPATH."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, str(APPENDER), str(path), "--run-id", RUN_ID, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
    )
    app = Appender(proc)
    # Drain stdout as it comes: a full pipe would block the child in print, not in SQLite.
    app.reader = threading.Thread(target=app._read, daemon=True)
    app.reader.start()
    return app


def commits_of(records: list[StoredRecord]) -> dict[int, list[StoredRecord]]:
    """Checks that the records are whole commits with seqs 1..n; returns them by number.

    Each commit_seq group must be one commit (one number in every payload), with as many
    records as its payload says, consecutive seqs ending at commit_seq, and indexes 0..n-1.
    """
    assert [r.seq for r in records] == list(range(1, len(records) + 1)), "seqs have a gap"
    groups: dict[int, list[StoredRecord]] = defaultdict(list)
    for r in records:
        groups[r.commit_seq].append(r)
    by_number: dict[int, list[StoredRecord]] = {}
    for commit_seq, group in groups.items():
        payloads = [orjson.loads(r.payload) for r in group]
        numbers = {p["c"] for p in payloads}
        assert len(numbers) == 1, f"commit {commit_seq} mixes commits {numbers}"
        (number,) = numbers
        size = payloads[0]["n"]
        assert len(group) == size, f"commit {number} is partial: {len(group)} of {size} records"
        assert [p["i"] for p in payloads] == list(range(size))
        assert [r.seq for r in group] == list(range(commit_seq - size + 1, commit_seq + 1))
        by_number[number] = group
    # One appender writes commits 1, 2, 3... in order: what survives is a prefix.
    assert sorted(by_number) == list(range(1, len(by_number) + 1))
    return by_number


def check_after_crash(path: Path, acks: list[tuple[int, int]]) -> dict[int, list[StoredRecord]]:
    """Reopens the store after a crash and checks every promise; returns the commits."""
    with EventStore(path) as store:
        records = list(store.records(RUN_ID)) if store.get_run(RUN_ID) else []
        assert store.head() == len(records)
    commits = commits_of(records)
    for last_seq, number in acks:
        assert number in commits, f"acknowledged commit {number} was lost"
        assert commits[number][-1].seq == last_seq
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    return commits


@pytest.mark.long  # five appenders killed at random moments: make test-long
def test_sigkill_at_random_moments_keeps_acknowledged_commits(tmp_path: Path) -> None:
    """SIGKILL at random moments loses no acknowledged commit and leaves no partial one."""
    rng = random.Random(20240611)
    for trial in range(5):
        path = tmp_path / f"trial-{trial}.db"
        durability = "full" if trial % 2 else "normal"
        app = start_appender(
            path,
            "--seed",
            str(rng.randrange(2**32)),
            "--group",
            str(rng.randint(1, 4)),
            "--durability",
            durability,
        )
        app.wait_first_ack()
        time.sleep(rng.uniform(0.02, 0.4))
        assert app.kill() == -signal.SIGKILL, app.stderr()
        commits = check_after_crash(path, app.acks)
        assert len(commits) >= len(app.acks) > 0


@pytest.mark.parametrize(
    ("crash_at", "durability", "group"),
    [
        pytest.param("before_commit", "normal", 3, id="before-commit-normal"),
        pytest.param("after_commit", "normal", 3, id="after-commit-normal"),
        pytest.param("before_commit", "full", 1, id="before-commit-full"),
        pytest.param("after_commit", "full", 1, id="after-commit-full"),
    ],
)
def test_crash_around_commit(tmp_path: Path, crash_at: str, durability: str, group: int) -> None:
    """A crash right before COMMIT loses the transaction's commits; right after keeps them."""
    path = tmp_path / "log.db"
    done = 4  # transactions committed before the one that crashes
    app = start_appender(
        path,
        "--group",
        str(group),
        "--durability",
        durability,
        env={"CRASH_AT": crash_at, "CRASH_AFTER": str(done)},
    )
    assert app.finish() == CRASH_STATUS, app.stderr()
    # With durability "normal" the event loop writes each group in one transaction; with
    # "full" the writer thread may split a group, hence groups of one there.
    acked = [number for _, number in app.acks]
    assert acked == list(range(1, done * group + 1))
    commits = check_after_crash(path, app.acks)
    expected = done * group if crash_at == "before_commit" else (done + 1) * group
    assert sorted(commits) == list(range(1, expected + 1))


def test_reader_sees_whole_commits_while_appending(tmp_path: Path) -> None:
    """A read-only store in another process reads whole commits while the appender writes."""
    path = tmp_path / "log.db"
    app = start_appender(path, "--group", "3", "--pause", "0.001")
    try:
        app.wait_first_ack()
        with EventStore(path, readonly=True) as reader:
            seen = 0
            for _ in range(8):
                acked = list(app.acks)
                records = list(reader.records(RUN_ID, page=7))  # pages split commits
                commits = commits_of(records)
                assert {number for _, number in acked} <= set(commits)
                assert len(records) >= seen
                seen = len(records)
                time.sleep(0.05)
            assert app.proc.poll() is None, app.stderr()
    finally:
        app.kill()
    assert seen > 0
