"""Appends commits to an event store until killed: the subprocess side of the crash tests.

Run as ``python tests/crash/appender.py PATH [options]`` with the repo root on PYTHONPATH.
Commit ``c`` (numbered from 1) holds ``n`` records (1-5, from a seeded RNG), each with the
payload ``{"c": c, "n": n, "i": i}``, so that a reader can tell whether a commit is whole.
Commit 1 creates the run. Each acknowledged commit is printed as ``LAST_SEQ C`` on its own
line, flushed, only after its ``append`` returned: every printed line is a promise the
store made that the test can check after the process is killed.

``CRASH_AT=before_commit|after_commit`` with ``CRASH_AFTER=N`` makes the process exit with
status 137 (``os._exit``, nothing flushed or closed: like SIGKILL) right before or right
after the ``COMMIT`` of its (N+1)-th write transaction. The store has no hook for this, so
this script replaces :func:`eventstore._sqlite.connect` in this process only, with a copy
that builds its connections from :class:`CrashingConnection`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import sys
from typing import Any

import orjson

import eventstore._sqlite as _sqlite
from eventstore import Commit, EventStore, NewRun, Record

CRASH_STATUS = 137
_original_connect = _sqlite.connect


class CrashingConnection(sqlite3.Connection):
    """An sqlite3 connection that exits the process around the COMMIT chosen by env vars."""

    crash_at: str | None = None
    crash_after = 0
    commits = 0  # write transactions committed by every writer connection of this process

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if sql != "COMMIT" or self.crash_at is None:
            return super().execute(sql, parameters)
        due = CrashingConnection.commits >= self.crash_after
        if due and self.crash_at == "before_commit":
            os._exit(CRASH_STATUS)
        cursor = super().execute(sql, parameters)
        CrashingConnection.commits += 1
        if due and self.crash_at == "after_commit":
            os._exit(CRASH_STATUS)
        return cursor


def crashing_connect(
    target: str,
    *,
    uri: bool,
    readonly: bool,
    durability: str,
    memory: bool,
    busy_timeout_ms: int = _sqlite.BUSY_TIMEOUT_MS,
) -> sqlite3.Connection:
    """A copy of :func:`eventstore._sqlite.connect` that builds a :class:`CrashingConnection`."""
    conn = sqlite3.connect(
        target,
        uri=uri,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_ms / 1e3,
        factory=CrashingConnection,
    )
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    if readonly:
        conn.execute("PRAGMA query_only = 1")
    elif memory:
        conn.execute("PRAGMA synchronous = OFF")
    else:
        conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
    return conn


_PRAGMAS = ("busy_timeout", "synchronous", "query_only", "journal_mode", "foreign_keys")


def _settings(conn: sqlite3.Connection) -> dict[str, Any]:
    return {p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in _PRAGMAS}


def install_crash_hook(path: str, durability: str) -> None:
    """Swaps in :func:`crashing_connect` after checking it configures like the original.

    The check keeps the copy honest: if the library's ``connect`` changes its pragmas, the
    crash tests fail here instead of silently testing a differently configured connection.
    """
    crash_at = os.environ.get("CRASH_AT")
    if crash_at is None:
        return
    if crash_at not in ("before_commit", "after_commit"):
        sys.exit(f"unknown CRASH_AT={crash_at!r}")
    CrashingConnection.crash_at = crash_at
    CrashingConnection.crash_after = int(os.environ.get("CRASH_AFTER", "0"))
    kw: dict[str, Any] = {"uri": False, "readonly": False, "durability": durability}
    ours = crashing_connect(path, memory=False, **kw)
    theirs = _original_connect(path, memory=False, **kw)
    try:
        mine, original = _settings(ours), _settings(theirs)
    finally:
        ours.close()
        theirs.close()
    if mine != original:
        sys.exit(f"the crash hook's connection differs from the store's: {mine} != {original}")
    _sqlite.connect = crashing_connect


def commit(run_id: str, number: int, size: int) -> Commit:
    """Commit ``number`` with ``size`` records whose payloads say which commit they belong to."""
    records = [
        Record(
            "item", f"step-{number % 7}", orjson.dumps({"c": number, "n": size, "i": i}).decode()
        )
        for i in range(size)
    ]
    create = NewRun(meta={"writer": "appender"}) if number == 1 else None
    return Commit(run_id, records, create=create)


async def append_forever(
    store: EventStore, run_id: str, rng: random.Random, args: argparse.Namespace
) -> None:
    """Appends groups of ``args.group`` concurrent commits until ``args.max_commits``."""
    number = 0
    out = sys.stdout
    while args.max_commits is None or number < args.max_commits:
        commits = []
        for _ in range(args.group):
            number += 1
            commits.append(commit(run_id, number, rng.randint(1, 5)))
        # The first commit of a group creates the run, so a group goes out in order.
        results = await asyncio.gather(*(store.append(c) for c in commits))
        first = number - len(commits) + 1
        out.write("".join(f"{r.last_seq} {first + k}\n" for k, r in enumerate(results)))
        out.flush()
        if args.pause:
            await asyncio.sleep(args.pause)


def main() -> None:
    """Parses the options, opens the store, installs the crash hook and appends."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--run-id", default="crash-run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group", type=int, default=1, help="commits submitted together")
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    parser.add_argument("--max-commits", type=int, default=None)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between groups")
    args = parser.parse_args()
    store = EventStore(args.path, durability=args.durability)
    # Installed after the schema exists: only the appends' transactions are counted.
    install_crash_hook(args.path, args.durability)
    asyncio.run(append_forever(store, args.run_id, random.Random(args.seed), args))
    store.close()


if __name__ == "__main__":
    main()
