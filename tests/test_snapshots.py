"""Snapshots: many a run, spaced by bytes, each equal to the pure fold at its seq.

A run's executor writes a snapshot of its folded state once the log since the last one weighs
ten times its size, and one more as it lets go of the run; ``state_at`` at any seq replays
only from the nearest snapshot at or before it. A snapshot is a cache: one that does not
decode, is of another fold version, or does not fit the log is ignored (damage with a
:class:`SnapshotIgnoredWarning`), and the one before it is used. Stores of schema version 2
(one snapshot a run) migrate, tested on ``tests/fixtures/store_v2.sqlite``, which main wrote
at d21b47f (a 40-step ``benchmarks.loop`` run ``old-loop`` and a fork of it at its middle).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import shutil
import sqlite3
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest
from hypothesis import given, settings

from eventstore import Commit, EventStore, NewRun, Record, Snapshot
from tests.conftest import postgres_store
from tests.support import workflow_gen as gen
from tests.support.workflow_gen import Plan
from workflow import (
    Context,
    Event,
    SnapshotIgnoredWarning,
    StartEvent,
    StopEvent,
    Workflow,
    _runner,
    _snapshot,
    step,
)
from workflow._check import check_store
from workflow._fold import FOLD_VERSION, Folded
from workflow._read import fold_run, load_snapshot, run_info, snapshots
from workflow._snapshot import dump_folded

FIXTURE: Final = Path(__file__).resolve().parent / "fixtures" / "store_v2.sqlite"
WINDOW: Final = 20


class Turn(Event):
    i: int
    n: int


class Chat(Workflow):
    """An agent's memory: each turn counts and keeps the last WINDOW messages (bounded state)."""

    @step
    async def turn(self, ctx: Context, ev: StartEvent | Turn) -> Turn | StopEvent:
        i, n = (ev.i, ev.n) if isinstance(ev, Turn) else (0, int(ev["n"]))
        recent = await ctx.store.get("recent", default=[])
        recent.append(f"message {i}: " + "x" * 90)
        del recent[:-WINDOW]
        await ctx.store.set("recent", recent)
        await ctx.store.set("turns", i + 1)
        if i + 1 >= n:
            return StopEvent(result=i + 1)
        return Turn(i=i + 1, n=n)


def same(a: Folded, b: Folded) -> bool:
    """The same state: the same cached JSON and count, and the same context values (a value
    a snapshot keeps by reference to the log is built from it and compared too)."""
    values = {k: v.dump for k, v in a.context.items()} == {k: v.dump for k, v in b.context.items()}
    return dump_folded(a) == dump_folded(b) and a.records == b.records and values


def assert_snapshots_are_the_fold(store: EventStore, run_id: str) -> list[Snapshot]:
    """Every snapshot of the run loads as exactly the pure fold at its seq."""
    info = run_info(store, run_id)
    snaps = snapshots(store, run_id)
    for snap in snaps:
        assert snap.version == FOLD_VERSION
        cached = load_snapshot(store, info, snap)
        pure = fold_run(store, run_id, snap.seq, cached=False)
        assert same(cached, pure), f"snapshot at seq {snap.seq}"
    return snaps


@contextlib.contextmanager
def spacing(min_bytes: int, factor: int, ref_bytes: int | None = None) -> Iterator[None]:
    """Snapshots spaced closer than in production, so that short runs have many; with
    ``ref_bytes``, values kept by reference to the log from that much history on."""
    old = _runner.SNAPSHOT_MIN_BYTES, _runner.SNAPSHOT_FACTOR, _snapshot.REF_MIN_BYTES
    _runner.SNAPSHOT_MIN_BYTES, _runner.SNAPSHOT_FACTOR = min_bytes, factor  # type: ignore[misc]
    if ref_bytes is not None:
        _snapshot.REF_MIN_BYTES = ref_bytes  # type: ignore[misc]
    try:
        yield
    finally:
        _runner.SNAPSHOT_MIN_BYTES, _runner.SNAPSHOT_FACTOR = old[:2]  # type: ignore[misc]
        _snapshot.REF_MIN_BYTES = old[2]  # type: ignore[misc]


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
    return rows


async def chat(store: EventStore, n: int) -> tuple[Chat, str]:
    wf = Chat(store=store, timeout=None)
    handler = wf.run(n=n)
    assert await handler == n
    await store.flush()
    return wf, handler.run_id


# ----------------------------------------------------------------------------- the property


@settings(max_examples=25, deadline=None)
@given(plan=gen.plans())
def test_every_snapshot_is_the_pure_fold_at_its_seq(plan: Plan) -> None:
    """Whatever a workflow does, each snapshot equals the pure fold at its seq, and a read
    through snapshots equals the pure fold at every commit (values kept by reference to the
    log from a small size on, so that generated runs keep some)."""

    async def body(es: EventStore) -> None:
        wf = gen.build(plan)(store=es, timeout=10.0)
        handler = wf.run(seed=plan.seed)
        with contextlib.suppress(Exception):  # failing plans leave snapshots too
            await handler
        await es.flush()
        run_id = handler.run_id
        snaps = assert_snapshots_are_the_fold(es, run_id)
        assert snaps, "the executor leaves a snapshot as it lets go of the run"
        ends = sorted({r.commit_seq for r in es.records(run_id)})
        for seq in ends:
            assert same(fold_run(es, run_id, seq), fold_run(es, run_id, seq, cached=False))

    with (
        spacing(0, 1, ref_bytes=64),
        tempfile.TemporaryDirectory() as d,
        EventStore(Path(d) / "run.db") as es,
    ):
        asyncio.run(body(es))


@pytest.mark.long  # a long run: make test-long (CI runs it)
async def test_snapshots_are_spaced_by_bytes(tmp_path: Path) -> None:
    """A long run with a bounded state keeps a snapshot every ten times its size of log:
    they weigh at most a tenth of the log, and a read at any seq replays a bounded span."""
    store = EventStore(tmp_path / "chat.db")
    _, run_id = await chat(store, 1500)
    snaps = assert_snapshots_are_the_fold(store, run_id)
    assert len(snaps) > 5
    sizes = dict(
        store.query("SELECT seq, length(payload) FROM records WHERE run_id = ?", (run_id,))
    )
    for before, snap in itertools.pairwise(snaps[:-1]):
        between = sum(b for s, b in sizes.items() if before.seq < s <= snap.seq)
        assert between >= 10 * len(snap.data), f"snapshot at {snap.seq} follows too closely"
    spaced = sum(len(s.data) for s in snaps[:-1])  # the last is the executor's as it ended
    assert spaced <= sum(sizes.values()) / 10
    assert snaps[-1].seq == store.last_seq(run_id)
    assert snaps[-1].records == len(sizes)
    store.close()


class Counted(Workflow):
    """The chat's loop that, every tenth turn, counts the Record objects alive after a full
    garbage collection: what the executor keeps of its durable commits to fold."""

    alive: ClassVar[list[int]] = []

    @step
    async def turn(self, ctx: Context, ev: StartEvent | Turn) -> Turn | StopEvent:
        i, n = (ev.i, ev.n) if isinstance(ev, Turn) else (0, int(ev["n"]))
        if i % 10 == 9:
            gc.collect()
            Counted.alive.append(sum(type(o) is Record for o in gc.get_objects()))
        await ctx.store.set("turns", i + 1)
        return StopEvent(result=i + 1) if i + 1 >= n else Turn(i=i + 1, n=n)


@pytest.mark.long  # a long run, garbage collector counted: make test-long (CI runs it)
async def test_commits_kept_to_fold_are_not_record_objects(tmp_path: Path) -> None:
    """The executor keeps its durable commits until a snapshot folds them as plain tuples
    (which the garbage collector stops tracking), not as Record objects: those, held for a
    snapshot's worth of steps, made the collector run and scan the whole heap once they
    reached its old generation (a fifth of a loop step's time)."""
    Counted.alive = []
    wf = Counted(store=EventStore(tmp_path / "s.db"), timeout=120)
    assert await wf.run(n=120) == 120
    wf.store.close()
    # Kept Records were five more a step, up to a snapshot's worth (all 120 steps here);
    # others alive (a step's own, the process's other tests') stay as many.
    assert len(Counted.alive) == 12
    assert max(Counted.alive) - min(Counted.alive) <= 5, Counted.alive


async def test_a_read_replays_only_from_the_nearest_snapshot(tmp_path: Path) -> None:
    """The log before the nearest snapshot is not read: a seq in the middle of a long run
    reads even when every record before that snapshot is damaged."""
    path = tmp_path / "chat.db"
    store = EventStore(path)
    _, run_id = await chat(store, 1500)
    snaps = snapshots(store, run_id)
    middle = snaps[len(snaps) // 2]
    seq = middle.seq + 7
    want = dump_folded(fold_run(store, run_id, seq, cached=False))
    store.close()
    sql(path, "UPDATE log SET payload = '{' WHERE seq < ? AND seq > 1", (middle.seq,))
    with EventStore(path, readonly=True) as damaged, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dump_folded(fold_run(damaged, run_id, seq)) == want
        assert Chat(store=damaged).state_at(run_id, seq).context["turns"] > 1


@pytest.mark.postgres
async def test_snapshots_on_postgres_are_the_fold_and_serve_reads() -> None:
    """On PostgreSQL too, the executor's snapshots are kept many a run through the shared
    writer, each equal to the pure fold, and a read at any seq folds on from one."""
    with postgres_store() as store:
        _, run_id = await chat(store, 400)
        snaps = assert_snapshots_are_the_fold(store, run_id)
        assert len(snaps) > 3
        for snap in snaps[1:-1]:
            seq = snap.seq + 4
            assert same(fold_run(store, run_id, seq), fold_run(store, run_id, seq, cached=False))


# ----------------------------------------------------------------------------- unfit ones


@pytest.fixture
def chat_db(tmp_path: Path) -> tuple[Path, str, list[Snapshot]]:
    path = tmp_path / "chat.db"

    async def go() -> str:
        with EventStore(path) as store:
            return (await chat(store, 1500))[1]

    run_id = asyncio.run(go())
    with EventStore(path, readonly=True) as store:
        snaps = snapshots(store, run_id)
    return path, run_id, snaps


def spoil(path: Path, run_id: str, snaps: list[Snapshot], change: str) -> tuple[int, bytes]:
    """Applies ``change`` to the 4th snapshot and damages every record before the 3rd, so
    that only a read from the 3rd succeeds; returns (a seq past the 4th, its pure fold)."""
    seq = snaps[3].seq + 3
    with EventStore(path, readonly=True) as store:
        want = dump_folded(fold_run(store, run_id, seq, cached=False))
    sql(path, change, (snaps[3].seq,))
    sql(path, "UPDATE log SET payload = '{' WHERE seq < ? AND seq > 1", (snaps[2].seq,))
    return seq, want


def test_a_damaged_snapshot_is_ignored_for_the_one_before(
    chat_db: tuple[Path, str, list[Snapshot]],
) -> None:
    """A snapshot that does not decode is warned about and the one before it is used."""
    path, run_id, snaps = chat_db
    change = "UPDATE snapshots SET data = substr(data, 2) WHERE seq = ?"
    seq, want = spoil(path, run_id, snaps, change)
    bad = snaps[3]
    with (
        EventStore(path, readonly=True) as store,
        pytest.warns(SnapshotIgnoredWarning, match=f"seq {bad.seq}.*not JSON"),
    ):
        assert dump_folded(fold_run(store, run_id, seq)) == want


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE snapshots SET version = version + 1 WHERE seq = ?",
        "UPDATE snapshots SET data = replace(data, '\"v\":3', '\"v\":99') WHERE seq = ?",
    ],
    ids=["fold-version", "format"],
)
def test_a_stale_snapshot_is_ignored_silently(
    chat_db: tuple[Path, str, list[Snapshot]], change: str
) -> None:
    """A snapshot of another fold version (or format) is of no use here, not damage."""
    path, run_id, snaps = chat_db
    seq, want = spoil(path, run_id, snaps, change)
    with EventStore(path, readonly=True) as store, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dump_folded(fold_run(store, run_id, seq)) == want


def test_a_snapshot_not_at_a_commit_end_is_ignored(
    chat_db: tuple[Path, str, list[Snapshot]],
) -> None:
    """A snapshot whose seq does not end a commit of the run is not trusted."""
    path, run_id, snaps = chat_db
    bad = snaps[3]
    (mid,) = sql(path, "SELECT max(seq) FROM log WHERE seq < commit_seq AND seq < ?", (bad.seq,))[0]
    text = bad.data.replace(f'"seq":{bad.seq},', f'"seq":{mid},', 1)
    sql(path, "UPDATE snapshots SET seq = ?, data = ? WHERE seq = ?", (mid, text, bad.seq))
    with EventStore(path, readonly=True) as store:
        want = dump_folded(fold_run(store, run_id, mid + 1, cached=False))
        with pytest.warns(SnapshotIgnoredWarning, match="does not end a commit"):
            assert dump_folded(fold_run(store, run_id, mid + 1)) == want
        report = check_store(store, run_id)
    assert [(p.what, p.seq) for p in report.problems] == [("snapshot", mid)]


def test_check_compares_every_snapshot(chat_db: tuple[Path, str, list[Snapshot]]) -> None:
    """``workflow check`` folds the log and compares it with each snapshot, its count too."""
    path, _, snaps = chat_db
    with EventStore(path, readonly=True) as store:
        assert check_store(store).ok
    sql(path, "UPDATE snapshots SET records = records + 1 WHERE seq = ?", (snaps[2].seq,))
    sql(
        path,
        "UPDATE snapshots SET data = replace(data, 'message', 'massage') WHERE seq = ?",
        (snaps[4].seq,),
    )
    with EventStore(path, readonly=True) as store:
        report = check_store(store)
    assert [(p.what, p.seq) for p in report.problems] == [
        ("snapshot", snaps[2].seq),
        ("snapshot", snaps[4].seq),
    ]
    assert "count of records" in report.problems[0].message
    assert "context" in report.problems[1].message


# ----------------------------------------------------------------------------- the writer


def test_a_store_keeps_many_snapshots_a_run(tmp_path: Path) -> None:
    """Snapshots accumulate, written with their commits; one at the same seq is replaced."""
    with EventStore(tmp_path / "s.db") as store:
        store.append_sync(Commit("r", [Record("a"), Record("b")], create=NewRun()))
        store.append_sync(Commit("r", [Record("c")], snapshot=Snapshot(2, "two", 7, 2)))
        store.append_sync(Commit("r", [Record("d")], snapshot=(3, "three")))
        assert store.find_snapshot("r") == Snapshot(3, "three", 0, None)
        assert store.find_snapshot("r", 2) == Snapshot(2, "two", 7, 2)
        assert store.find_snapshot("r", 3, below=3) == Snapshot(2, "two", 7, 2)
        assert store.find_snapshot("r", 1) is None
        assert store.find_snapshot("r", version=0) == Snapshot(3, "three", 0, None)
        store.append_sync(Commit("r", [], snapshot=Snapshot(3, "three again", 7, 3)))
        assert store.find_snapshot("r") == Snapshot(3, "three again", 7, 3)
        assert store.find_snapshot("r", version=0) is None
        assert store.find_snapshot("r", version=7) == Snapshot(3, "three again", 7, 3)
        assert store.snapshot_stats("r") == (2, len("two") + len("three again"))
        assert [s.seq for s in snapshots(store, "r")] == [2, 3]


# ----------------------------------------------------------------------------- old stores


def test_a_version_2_store_migrates_and_reads_alike(tmp_path: Path) -> None:
    """The fixture store (schema 2, one snapshot a run) migrates to schema 3: its snapshots
    are kept, of fold version 1 (older than this fold's, so passed over); reads, check and
    resume work."""
    copy = tmp_path / "old.db"
    shutil.copy(FIXTURE, copy)
    with EventStore(copy, readonly=True) as old:  # read as it is, without migrating
        assert old.query("SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
        legacy = old.find_snapshot("old-loop")
        assert legacy is not None
        assert (legacy.version, legacy.records) == (1, None)
        latest = dump_folded(fold_run(old, "old-loop", cached=False))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert dump_folded(fold_run(old, "old-loop")) == latest
    with EventStore(copy) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [("3",)]
        runs = [r.run_id for r in store.runs()]
        assert "old-loop" in runs
        assert len(runs) == 2
        for run_id in runs:
            # Kept as they were; folded by an older fold version, they are passed over.
            assert [snap.version for snap in snapshots(store, run_id)] == [1]
        assert FOLD_VERSION > 1
        assert check_store(store).ok
        assert dump_folded(fold_run(store, "old-loop")) == latest

    from benchmarks.loop import LoopFlow

    async def more() -> None:
        wf = LoopFlow(store=str(copy), timeout=None)
        assert await wf.resume("old-loop") == 40
        middle = wf.checkpoints("old-loop")[30]
        fork = wf.run_from(middle)
        assert await fork == 40
        await wf.store.flush()
        assert_snapshots_are_the_fold(wf.store, fork.run_id)
        wf.store.close()

    asyncio.run(more())


@pytest.mark.postgres
def test_a_version_2_postgres_store_migrates() -> None:
    """A PostgreSQL store of schema 2 gets the snapshot columns and key; its row is kept."""
    import psycopg

    from eventstore._postgres import SCHEMA_VERSION, _split

    with postgres_store() as first:
        first.append_sync(Commit("r", [Record("a")], create=NewRun()))
        url = first._backend._url  # type: ignore[attr-defined]
        raw, schema = _split(url)
        with psycopg.connect(raw, autocommit=True) as conn:  # back to what version 2 made
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute("DROP TABLE snapshots")
            conn.execute(
                "CREATE TABLE snapshots (rid bigint PRIMARY KEY, seq bigint NOT NULL,"
                " data text NOT NULL)"
            )
            conn.execute("INSERT INTO snapshots SELECT rid, 1, 'old' FROM runs")
            conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        with EventStore(url, readonly=True) as old:
            assert old.find_snapshot("r") == Snapshot(1, "old", 1, None)
        with EventStore(url) as store:
            assert store.find_snapshot("r") == Snapshot(1, "old", 1, 1)
            store.append_sync(Commit("r", [Record("b")], snapshot=Snapshot(2, "new", 1, 2)))
            assert [s.seq for s in snapshots(store, "r")] == [1, 2]
            version = store.query("SELECT value FROM meta WHERE key = 'schema_version'")
            assert version == [(str(SCHEMA_VERSION),)]  # and on, past 3
