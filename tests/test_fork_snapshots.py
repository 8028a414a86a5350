"""A fork's snapshots: they refer to the fork's own log only, never to its parent's.

A fork's log does not hold its parent's records (it names its parent and folds onto the
parent's state at the fork's seq). A value the parent's snapshot kept by reference to the
parent's log is built as the fork begins, and the fork's snapshots copy it until the fork
writes it whole; snapshots that earlier versions wrote naming the parent's records are
ignored as they load, and the log is folded instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import orjson
import pytest
from click.testing import CliRunner

from eventstore import Commit, EventStore, Snapshot
from tests.support.child import child
from tests.test_snapshots import assert_snapshots_are_the_fold, same, spacing
from workflow import Context, Event, SnapshotIgnoredWarning, StartEvent, StopEvent, Workflow, step
from workflow._fold import FOLD_VERSION
from workflow._read import fold_run, run_info, snapshots
from workflow._snapshot import dump_folded
from workflow.cli import cli

ROOT: Final = Path(__file__).resolve().parent.parent
ITEM: Final = "z" * 100
GROW: Final = 320  # steps that append to the list: 32 KB, kept by reference from 16 KB on
STEPS: Final = 420  # then steps that write only the counter


class Step(Event):
    i: int


class Phased(Workflow):
    """Appends a 100-byte item to ``items`` for ``GROW`` steps, then only counts ``steps``
    up to ``STEPS``: a fork in the second phase never writes the list. ``stall_at``: the
    step that stays busy (a process to kill in it)."""

    stall_at: ClassVar[int | None] = None

    @step
    async def go(self, ctx: Context[Any], ev: StartEvent | Step) -> Step | StopEvent:
        i = ev.i if isinstance(ev, Step) else 0
        if i == type(self).stall_at:
            await asyncio.sleep(3600)
        if i < GROW:
            items = await ctx.store.get("items", default=[])
            items.append(ITEM)
            await ctx.store.set("items", items)
        await ctx.store.set("steps", i + 1)
        if i + 1 >= STEPS:
            return StopEvent(result=len(await ctx.store.get("items")))
        return Step(i=i + 1)


@pytest.fixture
def close_spacing() -> Iterator[None]:
    """Snapshots every few KB of log, so that a fork writes many; values by reference from
    16 KB of history (the production threshold)."""
    with spacing(4096, 2):
        yield


def parent_run(db: Path) -> str:
    """A finished run of Phased on ``db``; its id."""

    async def go() -> str:
        wf = Phased(store=str(db), timeout=None)
        handler = wf.run()
        assert await handler == GROW
        await wf.store.flush()
        wf.store.close()
        return handler.run_id

    return asyncio.run(go())


def fork_points(store: EventStore, run: str) -> list[int]:
    """Seqs to fork the run at: early (the list still copied by its snapshots), while the
    list grows by reference, in the counting phase, and at the end (the fork ends at once)."""
    cps = Phased(store=store).checkpoints(run)
    ref_at = next(
        s.seq for s in snapshots(store, run) if entry(s.data, "items")[-1] == "log"
    )  # forks after it start from a list kept by reference to the parent's log
    last_append = max(
        r.seq for r in store.records(run, kinds=["state_set"]) if '"items"' in r.payload
    )
    growing = [cp.seq for cp in cps if ref_at < cp.seq < last_append]
    return [cps[5].seq, growing[len(growing) // 2], cps[-40].seq, cps[-1].seq]


def entry(snapshot_data: str, key: str) -> list[Any]:
    """A context key's entry in a snapshot: [value, ...] or [None, ..., "log"]."""
    found: list[Any] = orjson.loads(snapshot_data)["context"][key]
    return found


def expected_items(steps: int) -> list[str]:
    return [ITEM] * min(steps, GROW)


def assert_fork_reads_right(store: EventStore, fork: str) -> int:
    """Every snapshot of the fork refers only to its own log and is the pure fold; at every
    commit after the fork's first snapshot a read goes through a snapshot of the fork and
    gives the pure fold and the list itself. Returns how many snapshots refer to the log."""
    info = run_info(store, fork)
    assert info.first_seq is not None
    snaps = assert_snapshots_are_the_fold(store, fork)
    refs = 0
    for snap in snaps:
        items = entry(snap.data, "items")
        if items[-1] == "log":
            refs += 1
            assert items[4] >= info.first_seq, f"snapshot {snap.seq} refers to seq {items[4]}"
    if not snaps:
        return refs
    wf = Phased(store=store)
    ends = sorted({r.commit_seq for r in store.records(fork) if r.seq > snaps[0].seq})
    with warnings.catch_warnings():
        warnings.simplefilter("error", SnapshotIgnoredWarning)  # no snapshot is unfit
        for seq in [*ends[:: max(1, len(ends) // 25)], *ends[-2:]]:
            found = store.find_snapshot(fork, seq, version=FOLD_VERSION)
            assert found is not None
            assert found.seq >= info.first_seq  # the snapshot path, not the parent's fold
            assert same(fold_run(store, fork, seq), fold_run(store, fork, seq, cached=False))
            state = wf.state_at(fork, seq)
            assert state.context["items"] == expected_items(state.context["steps"]), seq
    return refs


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_forks_at_several_seqs_snapshot_their_own_log(
    tmp_path: Path, close_spacing: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Forks of a long run at several seqs finish right and log no error; their snapshots
    refer to their own log only, and reads at every seq after the fork agree with the pure
    fold through them."""
    db = tmp_path / "f.db"
    caplog.set_level(logging.ERROR)
    parent = parent_run(db)
    with EventStore(db, readonly=True) as store:
        points = fork_points(store, parent)

    async def go() -> list[str]:
        wf = Phased(store=str(db), timeout=None)
        forks = []
        for seq in points:
            handler = wf.run_from((parent, seq))
            assert await handler == GROW
            forks.append(handler.run_id)
        await wf.store.flush()
        wf.store.close()
        return forks

    forks = asyncio.run(go())
    assert errors(caplog) == []
    with EventStore(db, readonly=True) as store:
        refs = [assert_fork_reads_right(store, fork) for fork in forks]
        for fork in forks:
            state = Phased(store=store).state_at(fork)
            assert state.context["items"] == expected_items(STEPS)
        counting = snapshots(store, forks[2])
    assert refs[1] > 0  # a fork that writes the list refers to its own writes
    # A fork that never writes the list copies it: its log holds none of it.
    assert counting
    assert all(entry(s.data, "items")[0] == expected_items(STEPS) for s in counting)


def test_a_fork_killed_in_a_step_resumes_from_its_snapshots(
    tmp_path: Path, close_spacing: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A fork whose process is SIGKILLed mid-run resumes from its own snapshots (the list
    built from its own log) and finishes right; nothing is logged as an error."""
    db = tmp_path / "k.db"
    caplog.set_level(logging.ERROR)
    parent = parent_run(db)
    with EventStore(db, readonly=True) as store:
        at = fork_points(store, parent)[1]
    err = tmp_path / "fork_proc.err"
    with (
        err.open("w") as err_file,
        child(
            [sys.executable, "-m", "tests.support.fork_proc", str(db), parent, str(at), "400"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err_file,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        ) as proc,
    ):
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["READY"], line
        fork = line[1]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert "Traceback" not in err.read_text()  # the killed process logged no error either
    with EventStore(db, readonly=True) as store:
        assert any(entry(s.data, "items")[-1] == "log" for s in snapshots(store, fork))
        assert_fork_reads_right(store, fork)

    async def resume() -> None:
        wf = Phased(store=str(db), timeout=None)
        assert await wf.resume(fork) == GROW
        await wf.store.flush()
        wf.store.close()

    asyncio.run(resume())
    assert errors(caplog) == []
    with EventStore(db, readonly=True) as store:
        assert_fork_reads_right(store, fork)
        assert Phased(store=store).state_at(fork).context["items"] == expected_items(STEPS)


def test_the_cli_fork_snapshots_its_own_log(
    tmp_path: Path, close_spacing: None, caplog: pytest.LogCaptureFixture
) -> None:
    """``workflow fork`` goes the way ``run_from`` does: its snapshots refer to its own log."""
    db = tmp_path / "c.db"
    caplog.set_level(logging.ERROR)
    parent = parent_run(db)
    with EventStore(db, readonly=True) as store:
        at = fork_points(store, parent)[1]
    spec = "tests.test_fork_snapshots:Phased"
    result = CliRunner().invoke(
        cli, ["fork", str(db), parent, "--at", str(at), "--workflow", spec, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert errors(caplog) == []
    with EventStore(db, readonly=True) as store:
        (fork,) = [r.run_id for r in store.runs() if r.parent_run_id == parent]
        assert assert_fork_reads_right(store, fork) > 0
        assert Phased(store=store).state_at(fork).context["items"] == expected_items(STEPS)


@pytest.mark.parametrize("where", ["parent-seq", "not-a-full-write"])
def test_a_snapshot_whose_reference_the_fork_cannot_resolve_is_ignored(
    tmp_path: Path, close_spacing: None, where: str
) -> None:
    """A fork's snapshot as earlier versions wrote it (the list by reference to the
    parent's log), or one whose reference names no full write of the key, is ignored with
    a warning: the read folds the log and gives the list."""
    db = tmp_path / "o.db"
    parent = parent_run(db)
    with EventStore(db, readonly=True) as store:
        at = fork_points(store, parent)[2]
        parent_ref = next(
            entry(s.data, "items")
            for s in reversed(snapshots(store, parent))
            if s.seq <= at and entry(s.data, "items")[-1] == "log"
        )

    async def go() -> str:
        wf = Phased(store=str(db), timeout=None)
        handler = wf.run_from((parent, at))
        assert await handler == GROW
        await wf.store.flush()
        wf.store.close()
        return handler.run_id

    fork = asyncio.run(go())
    with EventStore(db) as store:
        info = run_info(store, fork)
        taken = {s.seq for s in snapshots(store, fork)}
        seq = next(
            r.commit_seq
            for r in store.records(fork)
            if r.commit_seq not in taken and r.commit_seq > (info.first_seq or 0) + 50
        )
        pure = fold_run(store, fork, seq, cached=False)
        data = orjson.loads(dump_folded(pure))
        if where == "parent-seq":
            data["context"]["items"] = parent_ref  # what earlier versions wrote
        else:
            steps_write = next(
                r.seq for r in store.records(fork, kinds=["state_set"]) if '"steps"' in r.payload
            )
            data["context"]["items"] = [None, 1, 0, steps_write, steps_write, "log"]
        bad = Snapshot(seq, orjson.dumps(data).decode(), FOLD_VERSION, pure.records)
        store.append_sync(Commit(fork, [], snapshot=bad))
        found = store.find_snapshot(fork, seq, version=FOLD_VERSION)
        assert found is not None
        assert found.data == bad.data
        reason = "outside the run's log" if where == "parent-seq" else "not its full write"
        with pytest.warns(SnapshotIgnoredWarning, match=f"seq {seq}.*{reason}"):
            cached = fold_run(store, fork, seq)
        assert same(cached, pure)
        with pytest.warns(SnapshotIgnoredWarning, match=reason):
            state = Phased(store=store).state_at(fork, seq)
        assert state.context["items"] == expected_items(STEPS)
