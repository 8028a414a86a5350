"""Context values a snapshot keeps by reference to the log.

A value that grows by appends (a list of N items, one a step) would outweigh the log if each
snapshot copied it; a snapshot keeps it as its last full write and the patches since, in the
run's own log, once those weigh enough and at most a few times the value. A read folds on
from the nearest snapshot without building the value, and builds it from the log only when
it is read: a damaged record then raises ``LogCorruptedError`` naming the key and the seq.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from eventstore import Commit, EventStore, LogCorruptedError, NewRun
from tests.test_snapshots import assert_snapshots_are_the_fold, same
from workflow import Context, Event, StartEvent, StopEvent, Workflow, _snapshot, step
from workflow import _journal as journal
from workflow._fold import Folded, fold
from workflow._log_refs import deferred_writes
from workflow._read import fold_run, snapshots
from workflow._snapshot import dump_folded

ITEM: Final = "y" * 100
STEPS: Final = 600


class More(Event):
    i: int
    n: int


class Grower(Workflow):
    """Appends a 100-byte item to a list each step (``benchmarks.loop``); fails once at
    step ``fail_at`` while ``fail_at`` is set."""

    fail_at: int | None = None

    @step
    async def grow(self, ctx: Context[Any], ev: StartEvent | More) -> More | StopEvent:
        i, n = (ev.i, ev.n) if isinstance(ev, More) else (0, int(ev["n"]))
        if i == type(self).fail_at:
            raise RuntimeError(f"failing at step {i}")
        items = await ctx.store.get("items", default=[])
        items.append(ITEM)
        await ctx.store.set("items", items)
        await ctx.store.set("steps", i + 1)
        if i + 1 >= n:
            return StopEvent(result=len(items))
        return More(i=i + 1, n=n)


def grown(db: Path, n: int = STEPS) -> str:
    """Runs Grower for ``n`` steps on the store at ``db``; returns the run id."""

    async def go() -> str:
        wf = Grower(store=str(db), timeout=None)
        handler = wf.run(n=n)
        assert await handler == n
        await wf.store.flush()
        wf.store.close()
        return handler.run_id

    return asyncio.run(go())


def kept(snapshot_data: str) -> list[Any]:
    """How a snapshot keeps the list: its context entry."""
    entry: list[Any] = orjson.loads(snapshot_data)["context"]["items"]
    return entry


@pytest.fixture(scope="module")
def growing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("refs") / "grow.db"
    return db, grown(db)


def test_a_growing_list_is_kept_by_reference_and_snapshots_stay_small(
    growing: tuple[Path, str],
) -> None:
    """The list's snapshots refer to the log instead of copying it: many snapshots, each
    the pure fold at its seq, weighing a few percent of the log in all."""
    db, run = growing
    with EventStore(db, readonly=True) as store:
        snaps = assert_snapshots_are_the_fold(store, run)
        assert len(snaps) > 5
        refs = [kept(s.data) for s in snaps[1:]]
        assert all(e[0] is None and e[-1] == "log" for e in refs)
        ((log_bytes,),) = store.query(
            "SELECT sum(length(payload)) FROM records WHERE run_id = ?", (run,)
        )
        assert sum(len(s.data) for s in snaps) <= log_bytes / 20


def test_any_seq_reads_the_list_exactly(growing: tuple[Path, str]) -> None:
    """At every commit a read through the snapshots gives the pure fold, the list built
    from the log when it is read; ``state_at`` gives the list itself."""
    db, run = growing
    with EventStore(db, readonly=True) as store:
        ends = sorted({r.commit_seq for r in store.records(run)})
        for seq in ends[:: max(1, len(ends) // 60)] + ends[-3:]:
            cached, pure = fold_run(store, run, seq), fold_run(store, run, seq, cached=False)
            assert same(cached, pure), seq
        wf = Grower(store=store)
        middle = ends[len(ends) // 2]
        state = wf.state_at(run, middle)
        assert state.context["items"] == [ITEM] * state.context["steps"]
        assert wf.state_at(run).context["items"] == [ITEM] * STEPS


def test_a_fork_and_a_resume_build_the_list_from_the_log(tmp_path: Path) -> None:
    """A fork at the middle starts from the list as it was there, and a failed run resumed
    from its snapshot goes on from the whole list."""
    db = tmp_path / "grow.db"

    async def go() -> None:
        Grower.fail_at = 450
        wf = Grower(store=str(db), timeout=None)
        first = wf.run(n=STEPS)
        with pytest.raises(RuntimeError, match="failing at step 450"):
            await first
        await wf.store.flush()
        snap = snapshots(wf.store, first.run_id)[-1]
        assert kept(snap.data)[-1] == "log"  # the resume reads the list by reference
        Grower.fail_at = None
        again = wf.resume(first.run_id)
        assert await again == STEPS
        cps = wf.checkpoints(first.run_id)
        fork = wf.run_from(cps[len(cps) // 2])
        assert await fork == STEPS
        await wf.store.flush()
        for run in (first.run_id, fork.run_id):
            assert wf.state_at(run).context["items"] == [ITEM] * STEPS
            assert_snapshots_are_the_fold(wf.store, run)
        wf.store.close()

    try:
        asyncio.run(go())
    finally:
        Grower.fail_at = None


def test_a_damaged_record_under_a_reference_raises_when_the_value_is_read(
    tmp_path: Path,
) -> None:
    """A read at a seq whose list is kept by reference folds without building it; reading
    the list then meets the damaged patch and names the key and its record's seq."""
    db = tmp_path / "grow.db"
    run = grown(db)
    with EventStore(db, readonly=True) as store:
        snap = next(s for s in snapshots(store, run) if kept(s.data)[3] > kept(s.data)[4])
        _, _, _, upto, full_seq, _ = kept(snap.data)
        ((seq,),) = store.query(
            "SELECT min(seq) FROM records WHERE run_id = ? AND kind = 'state_set'"
            " AND seq > ? AND seq <= ? AND payload LIKE '%\"items\"%'",
            (run, full_seq, upto),
        )
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute('UPDATE log SET payload = \'{"key": "items", "patch"\' WHERE seq = ?', (seq,))
        conn.commit()
    with EventStore(db, readonly=True) as store:
        state = Grower(store=store).state_at(run, snap.seq)
        assert state.context["steps"] > 0  # what is not built from the damage reads
        with pytest.raises(LogCorruptedError, match=rf"context key 'items'.*seq {seq}") as exc:
            state.context["items"]
        assert exc.value.seq == seq


async def test_the_executor_keeps_a_large_value_it_wrote_whole_undecoded(tmp_path: Path) -> None:
    """The executor's copy of its own log keeps the list's large full writes by reference
    (not decoded: about 15 us a step of an agent's growing memory), and still gives the
    exact value when read from it: the state of the run as this process ran it."""
    wf = Grower(store=str(tmp_path / "s.db"), timeout=None)
    handler = wf.run(n=STEPS)
    assert await handler == STEPS
    host = handler.ctx.__context_link__.host
    assert host is not None
    entry = host.folded.context["items"]
    assert entry.is_unread  # its last full write (over 16 KB) was never decoded here
    assert entry.full_bytes >= _snapshot.REF_MIN_BYTES
    assert await handler.ctx.store.get("items") == [ITEM] * STEPS  # built from the log
    assert handler.ctx.to_dict()["state"]["items"] == [ITEM] * STEPS
    await wf.store.flush()
    assert_snapshots_are_the_fold(wf.store, handler.run_id)
    wf.store.close()


@pytest.mark.parametrize(
    "key",
    ['a","value":', 'q"uo\\te', "ключ 🔑", "", '","patch":'],
    ids=["value-separator", "quote-backslash", "unicode", "empty", "patch-separator"],
)
def test_a_deferred_write_names_its_key_exactly(tmp_path: Path, key: str) -> None:
    """The executor's fold reads a large full write's key from its payload's start without
    decoding its value, whatever the key holds; a patch, however large, and a write under
    the size a snapshot copies are decoded as before."""
    big = ["z" * 100] * 200  # about 20 KB: kept by reference
    with EventStore(tmp_path / "s.db") as store:
        run = "r"
        written = [
            journal.state_set_value("s", key, big),
            journal.state_set_patch("s", key, [["append", [], {"value": "x" * 20_000}]]),
            journal.state_set_value("s", "small", [1, 2.0, True]),
        ]
        store.append_sync(Commit(run, written, create=NewRun()))
        records = list(store.records(run))
        defer = deferred_writes(store, run)
        state = Folded(run)
        assert defer(state, records[0])
        entry = state.context[key]
        assert entry.is_unread
        assert entry.seq == entry.full_seq == records[0].seq
        assert entry.full_bytes == len(records[0].payload)
        assert not defer(state, records[1])  # a patch
        assert not defer(state, records[2])  # small: a snapshot may copy it
        deferred = fold(Folded(run), records, defer=defer)
        pure = fold(Folded(run), records)
        assert deferred.context[key].dump == pure.context[key].dump
        assert deferred.context[key].dump == [*big, {"value": "x" * 20_000}]
        assert dump_folded(deferred) == dump_folded(pure)
