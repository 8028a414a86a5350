"""The store's contract, run against a file store and an in-memory store."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any, Literal

import pytest

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    NewRun,
    NotAStoreError,
    ReadOnlyStoreError,
    Record,
    RunNotFoundError,
    SchemaVersionError,
    StoreClosedError,
)


def rec(kind: str = "k", step: str | None = "s", payload: str = "{}") -> Record:
    return Record(kind, step, payload)


def start(store: EventStore, run_id: str = "r1", epoch: int = 1) -> None:
    store.append_sync(Commit(run_id, [rec("run_started", None)], create=NewRun(), epoch=epoch))


def test_append_returns_consecutive_seqs(store: EventStore) -> None:
    """A commit's records get consecutive seqs and carry the seq that ends their commit."""
    start(store)
    res = store.append_sync(Commit("r1", [rec("a"), rec("b"), rec("c")]))
    assert (res.first_seq, res.last_seq) == (2, 4)
    got = list(store.records("r1"))
    assert [r.seq for r in got] == [1, 2, 3, 4]
    assert [r.commit_seq for r in got] == [1, 4, 4, 4]
    assert [r.kind for r in got] == ["run_started", "a", "b", "c"]
    assert all(r.run_id == "r1" for r in got)


async def test_async_append_round_trip(store: EventStore) -> None:
    """Async appends are durable and readable once awaited."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun(meta={"w": 1})))
    await store.append(Commit("r1", [rec("x", payload='{"v": [1, 2]}')]))
    rows = list(store.records("r1"))
    assert rows[-1].data() == {"v": [1, 2]}
    assert store.run("r1").meta == {"w": 1}


def test_records_view_is_plain_sql(store: EventStore) -> None:
    """The log reads with plain SQL through the records view, by the run's public id."""
    start(store, "run-a")
    store.append_sync(Commit("run-a", [rec("enqueued", "step1", '{"e": 1}')]))
    rows = store.query("SELECT * FROM records WHERE run_id = ? ORDER BY seq", ["run-a"])
    assert [r[:4] for r in rows] == [
        (1, "run-a", "run_started", None),
        (2, "run-a", "enqueued", "step1"),
    ]


def test_creating_an_existing_run_is_refused(store: EventStore) -> None:
    """A second commit that creates the same run is refused and writes nothing."""
    start(store)
    with pytest.raises(ConcurrencyError, match="already exists"):
        start(store)
    assert store.head() == 1


def test_commit_to_unknown_run_is_refused(store: EventStore) -> None:
    """Appending to a run that was never created names the run."""
    with pytest.raises(RunNotFoundError, match="nope"):
        store.append_sync(Commit("nope", [rec()]))


def test_stale_epoch_is_fenced(store: EventStore) -> None:
    """After a claim, appends under the older epoch are refused and write nothing."""
    start(store, epoch=1)
    assert store.claim_sync("r1") == 2
    with pytest.raises(ConcurrencyError, match=r"epoch 1 refused.*epoch is 2"):
        store.append_sync(Commit("r1", [rec()], epoch=1))
    assert store.append_sync(Commit("r1", [rec()], epoch=2)).last_seq == 2
    assert store.head() == 2


async def test_refused_commit_leaves_the_rest_of_its_batch(store: EventStore) -> None:
    """One refused commit in a group-commit batch leaves the log without it, the others in."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))

    def refuse() -> None:
        raise ConcurrencyError("refused by check", run_id="r1")

    results = await asyncio.gather(
        store.append(Commit("r1", [rec("a"), rec("a")])),
        store.append(Commit("r1", [rec("b"), rec("b")], check=refuse)),
        store.append(Commit("r1", [rec("c")])),
        return_exceptions=True,
    )
    assert isinstance(results[1], ConcurrencyError)
    assert [r.kind for r in store.records("r1")] == ["run_started", "a", "a", "c"]
    assert [r.seq for r in store.records("r1")] == [1, 2, 3, 4]


async def test_commits_submitted_together_stay_commits_of_their_own(store: EventStore) -> None:
    """submit_many writes its commits in order, each with its own commit seq, or none of
    them when one is refused."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    first, second = await store.submit_many(
        [Commit("r1", [rec("dequeued")]), Commit("r1", [rec("started"), rec("more")])]
    )
    assert (first.first_seq, first.last_seq, second.first_seq, second.last_seq) == (2, 2, 3, 4)
    assert [r.commit_seq for r in store.records("r1")] == [1, 2, 4, 4]

    def refuse() -> None:
        raise ConcurrencyError("refused by check", run_id="r1")

    with pytest.raises(ConcurrencyError):
        await store.submit_many([Commit("r1", [rec("x")]), Commit("r1", [rec("y")], check=refuse)])
    after = await store.append(Commit("r1", [rec("z")]))
    assert [r.kind for r in store.records("r1")][-2:] == ["more", "z"]
    assert after.first_seq == 5


async def test_group_commit_shares_transactions(store: EventStore) -> None:
    """Many concurrent appenders share transactions: at most one per ten commits."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    before = store.stats

    async def appender() -> None:
        for _ in range(10):
            await store.append(Commit("r1", [rec()] * 4))

    await asyncio.gather(*(appender() for _ in range(100)))
    after = store.stats
    commits = after.operations - before.operations
    assert commits == 1000
    assert after.transactions - before.transactions <= commits / 10
    assert store.last_seq("r1") == 4001


async def test_check_and_on_written_run_in_seq_order(store: EventStore) -> None:
    """A commit's check sees every earlier commit's on_written effect, in seq order."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    written: list[int] = []
    seen: list[list[int]] = []

    def make(i: int) -> Commit:
        return Commit(
            "r1",
            [rec()],
            check=lambda: seen.append(list(written)),
            on_written=lambda seq: written.append(seq),
        )

    await asyncio.gather(*(store.append(make(i)) for i in range(5)))
    assert written == [2, 3, 4, 5, 6]
    assert seen == [written[:i] for i in range(5)]


async def test_lazy_commit_rides_with_the_next(store: EventStore) -> None:
    """A lazy commit becomes durable with the next commit, in submission order."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    before = store.stats.transactions
    lazy = store.submit(Commit("r1", [rec("dequeued")]), lazy=True)
    await store.append(Commit("r1", [rec("step_finished")]))
    assert lazy.done()
    assert store.stats.transactions == before + 1
    assert [r.kind for r in store.records("r1")][1:] == ["dequeued", "step_finished"]


async def test_lazy_commit_is_flushed_on_its_own(store: EventStore) -> None:
    """A lazy commit with nothing to ride with is still written shortly."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    res = await asyncio.wait_for(store.submit(Commit("r1", [rec("dequeued")]), lazy=True), 5)
    assert res.last_seq == 2


async def test_a_lazy_commit_after_a_flush_is_still_written_on_its_own(
    store: EventStore,
) -> None:
    """A lazy commit queued after an earlier lazy one rode with a flush is written too."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    store.submit(Commit("r1", [rec("dequeued")]), lazy=True)
    await store.append(Commit("r1", [rec("step_finished")]))
    res = await asyncio.wait_for(store.submit(Commit("r1", [rec("again")]), lazy=True), 5)
    assert res.last_seq == 4


@pytest.mark.parametrize("store", ["memory", "sqlite"], indirect=True)
async def test_a_woken_tasks_commit_is_written_in_the_iteration_that_woke_it(
    store: EventStore,
) -> None:
    """A commit queued by a task its batch woke is written in that same loop iteration,
    after the task (one iteration a step, not two): a callback scheduled before it was
    queued already finds it durable."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    await store.append(Commit("r1", [rec("a")]))  # woken by its batch
    seen: list[bool] = []
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    loop.call_soon(lambda: seen.append(futures[0].done()))
    later = store.submit(Commit("r1", [rec("b")]))
    futures.append(later)
    await later
    assert seen == [True]
    assert [r.kind for r in store.records("r1")][1:] == ["a", "b"]


@pytest.mark.parametrize("store", ["memory", "sqlite"], indirect=True)
async def test_a_lazy_commit_queued_by_a_woken_task_still_waits_for_its_deadline(
    store: EventStore,
) -> None:
    """The flush that follows a batch leaves lazy commits waiting for a commit to join,
    and they are still written on their own in time."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
    await store.append(Commit("r1", [rec("a")]))
    before = store.stats.transactions
    lazy = store.submit(Commit("r1", [rec("dequeued")]), lazy=True)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not lazy.done()
    assert store.stats.transactions == before
    res = await asyncio.wait_for(lazy, 5)
    assert res.last_seq == 3


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_then_is_told_each_outcome_in_commit_order_before_waiters(
    tmp_path: Path, durability: Literal["normal", "full"]
) -> None:
    """then(ok, value) runs for each commit in commit order, before any waiter goes on; a
    failure it was told is not reported as an exception nobody retrieved."""
    told: list[tuple[bool, Any]] = []
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx))

    def refuse() -> None:
        raise ConcurrencyError("refused by check", run_id="r1")

    with EventStore(tmp_path / "then.db", durability=durability) as store:
        await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))

        def tell(ok: bool, value: Any) -> None:
            told.append((ok, value))

        store.submit(Commit("r1", [rec("a")]), lazy=True, then=tell)
        store.submit(Commit("r1", [rec("b")], check=refuse), then=tell)
        last = store.submit_many([Commit("r1", [rec("c")]), Commit("r1", [rec("d")])], then=tell)
        results = await last
        assert len(told) == 3  # every then ran before this waiter went on
        assert [ok for ok, _ in told] == [True, False, True]
        assert told[0][1].last_seq == 2
        assert isinstance(told[1][1], ConcurrencyError)
        assert told[2][1] == results
        assert [r.kind for r in store.records("r1")] == ["run_started", "a", "c", "d"]
    told.clear()  # the refusal's traceback holds the futures: let them go
    gc.collect()
    assert unretrieved == []


def test_read_ranges_kinds_and_pages(store: EventStore) -> None:
    """Reads filter by seq range and kind and page by key without losing records."""
    start(store, "a")
    start(store, "b")
    for i in range(25):
        store.append_sync(Commit("a" if i % 2 else "b", [rec("even" if i % 4 == 0 else "odd")]))
    a = [r.seq for r in store.records("a")]
    assert a == [r.seq for r in store.records("a", page=3)]
    assert [r.seq for r in store.records("a", after=a[2], upto=a[5])] == a[3:6]
    evens = list(store.records("b", kinds=["even"], page=2))
    assert evens
    assert all(r.kind == "even" for r in evens)
    assert [r.seq for r in store.records(page=4)] == list(range(1, 28))
    assert store.head() == 27
    assert store.last_seq("a") == a[-1]


def test_runs_lists_runs_with_their_extent(store: EventStore) -> None:
    """runs() lists every run with status, first and last seq and its parent."""
    start(store, "p")
    store.append_sync(Commit("p", [rec()], status="finished"))
    store.append_sync(
        Commit(
            "f",
            [rec("run_started", None)],
            create=NewRun(parent_run_id="p", parent_seq=1, status="running"),
        )
    )
    runs = {r.run_id: r for r in store.runs()}
    assert runs["p"].status == "finished"
    assert (runs["p"].first_seq, runs["p"].last_seq) == (1, 2)
    assert (runs["f"].parent_run_id, runs["f"].parent_seq) == ("p", 1)
    assert store.get_run("zzz") is None
    with pytest.raises(RunNotFoundError):
        store.run("zzz")


def test_inbox_posts_once_per_key_and_is_taken_by_a_commit(store: EventStore) -> None:
    """An idempotency key posts an event once; a commit marks entries taken."""
    start(store)
    first = store.post_sync("r1", '{"e": 1}', key="k1")
    assert store.post_sync("r1", '{"e": 1}', key="k1") == first
    store.post_sync("r1", '{"e": 2}')
    pending = store.inbox("r1")
    assert [e.payload for e in pending] == ['{"e": 1}', '{"e": 2}']
    store.append_sync(Commit("r1", [rec("enqueued")], inbox_taken=[first]))
    assert [e.payload for e in store.inbox("r1")] == ['{"e": 2}']


def test_snapshot_is_kept_with_its_commit(store: EventStore) -> None:
    """A commit's snapshot is stored with the seq of that commit."""
    start(store)
    store.append_sync(Commit("r1", [rec(), rec()]))
    store.append_sync(Commit("r1", [], snapshot=(3, '{"s": 1}')))
    assert store.snapshot("r1") == (3, '{"s": 1}')
    assert store.head() == 3


def test_sync_api_from_threads(store: EventStore) -> None:
    """Sync appends from several threads all land, with gap-free seqs."""
    start(store)

    def work() -> None:
        for _ in range(20):
            store.append_sync(Commit("r1", [rec()]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.seq for r in store.records("r1")] == list(range(1, 82))


def test_closed_store_refuses_work(store: EventStore) -> None:
    """A closed store raises StoreClosedError for reads and writes."""
    start(store)
    store.close()
    with pytest.raises(StoreClosedError):
        store.append_sync(Commit("r1", [rec()]))
    with pytest.raises(StoreClosedError):
        store.runs()


def test_reopen_sees_everything(tmp_path: Path) -> None:
    """A new store object on the same file reads what the first one wrote."""
    path = tmp_path / "s.db"
    with EventStore(path) as a:
        start(a)
        a.append_sync(Commit("r1", [rec("x")], status="done"))
    with EventStore(path) as b:
        assert [r.kind for r in b.records("r1")] == ["run_started", "x"]
        assert b.run("r1").status == "done"
        b.append_sync(Commit("r1", [rec("y")]))
        assert b.head() == 3


def test_full_durability_appends(tmp_path: Path) -> None:
    """durability='full' stores commits like 'normal' does."""
    with EventStore(tmp_path / "f.db", durability="full") as s:
        start(s)
        assert s.append_sync(Commit("r1", [rec()])).last_seq == 2
        sync = s.query("PRAGMA synchronous")
    assert sync == [(2,)]


async def test_full_durability_async_group_commit(tmp_path: Path) -> None:
    """With durability='full' async appends go through the writer thread and group."""
    with EventStore(tmp_path / "f.db", durability="full") as s:
        await s.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
        results = await asyncio.gather(*(s.append(Commit("r1", [rec()])) for _ in range(50)))
        assert sorted(r.last_seq for r in results) == list(range(2, 52))
        assert s.stats.transactions < 51


def test_bad_durability_is_refused() -> None:
    """An unknown durability names the accepted ones."""
    with pytest.raises(ValueError, match="'normal' or 'full'"):
        EventStore(durability="fast")  # type: ignore[arg-type]


def test_new_file_is_private(tmp_path: Path) -> None:
    """A new store file is readable and writable by its owner only."""
    path = tmp_path / "p.db"
    EventStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_wal_mode(tmp_path: Path) -> None:
    """File stores use the WAL journal."""
    with EventStore(tmp_path / "w.db") as s:
        assert s.query("PRAGMA journal_mode") == [("wal",)]


# ---------------------------------------------------------------- read-only and bad files


def test_readonly_never_creates(tmp_path: Path) -> None:
    """Opening a missing file read-only is an error and creates nothing."""
    path = tmp_path / "missing.db"
    with pytest.raises(NotAStoreError, match="no such file"):
        EventStore(path, readonly=True)
    assert not path.exists()


def test_readonly_reads_and_refuses_writes(tmp_path: Path) -> None:
    """A read-only store reads while another store writes, and refuses writes."""
    path = tmp_path / "r.db"
    with EventStore(path) as w:
        start(w)
        with EventStore(path, readonly=True) as r:
            assert [x.kind for x in r.records("r1")] == ["run_started"]
            w.append_sync(Commit("r1", [rec("more")]))
            assert r.last_seq("r1") == 2
            with pytest.raises(ReadOnlyStoreError):
                r.append_sync(Commit("r1", [rec()]))


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


@pytest.mark.parametrize("readonly", [False, True], ids=["rw", "ro"])
def test_refuses_file_that_is_not_sqlite(tmp_path: Path, readonly: bool) -> None:
    """A file that is not SQLite is refused by name and left byte-for-byte untouched."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello, this is not a database\n" * 10)
    before = _bytes(path)
    with pytest.raises(NotAStoreError, match=r"notes\.txt.*not an SQLite database"):
        EventStore(path, readonly=readonly)
    assert _bytes(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("readonly", [False, True], ids=["rw", "ro"])
def test_refuses_sqlite_file_that_is_not_a_store(tmp_path: Path, readonly: bool) -> None:
    """An SQLite database of another application is refused and left untouched."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.execute("INSERT INTO people VALUES ('ada')")
    conn.commit()
    conn.close()
    before = _bytes(path)
    with pytest.raises(NotAStoreError, match=r"other\.db.*without the event store's tables"):
        EventStore(path, readonly=readonly)
    assert _bytes(path) == before


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    """A store written by a newer schema version is refused and left untouched."""
    path = tmp_path / "new.db"
    EventStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = _bytes(path)
    with pytest.raises(SchemaVersionError, match="schema version 999"):
        EventStore(path)
    assert _bytes(path) == before


def test_refuses_a_truncated_header(tmp_path: Path) -> None:
    """A file cut inside the SQLite header is refused as truncated."""
    path = tmp_path / "cut.db"
    path.write_bytes(b"SQLite fo")
    with pytest.raises(NotAStoreError, match="truncated"):
        EventStore(path)
    assert path.read_bytes() == b"SQLite fo"


def test_empty_file_becomes_a_store(tmp_path: Path) -> None:
    """An empty file (an empty SQLite database) is initialised as a new store."""
    path = tmp_path / "empty.db"
    path.touch()
    with EventStore(path) as s:
        start(s)
        assert s.head() == 1


def test_memory_stores_are_private(tmp_path: Path) -> None:
    """Two in-memory stores never see each other's runs."""
    with EventStore() as a, EventStore(":memory:") as b:
        start(a)
        assert b.runs() == []
        assert [r.run_id for r in a.runs()] == ["r1"]


def test_memory_store_is_shared_with_reader_threads() -> None:
    """An in-memory store's readers in other threads see what the writer wrote."""
    with EventStore() as s:
        start(s)
        out: list[int] = []
        t = threading.Thread(target=lambda: out.append(s.head()))
        t.start()
        t.join()
        assert out == [1]


async def test_commit_failing_after_writing_is_undone_whole(store: EventStore) -> None:
    """A commit that fails after its records were written is undone; the others stay."""
    await store.append(Commit("r1", [rec("run_started", None)], create=NewRun()))

    def explode(seq: object) -> None:
        raise ValueError("after writing")

    results = await asyncio.gather(
        store.append(Commit("r1", [rec("a")])),
        store.append(Commit("r1", [rec("b"), rec("b")], on_written=explode)),
        store.append(Commit("r1", [rec("c")])),
        return_exceptions=True,
    )
    assert isinstance(results[1], ValueError)
    assert [r.kind for r in store.records("r1")] == ["run_started", "a", "c"]
    assert [r.seq for r in store.records("r1")] == [1, 2, 3]


def test_close_after_the_event_loop_ended(tmp_path: Path) -> None:
    """Closing a store whose last appends came from a finished event loop works."""
    es = EventStore(tmp_path / "late.db")

    async def main() -> None:
        await es.append(Commit("r1", [rec("run_started", None)], create=NewRun()))
        es.submit(Commit("r1", [rec("lazy")]), lazy=True)

    asyncio.run(main())
    es.close()
    with EventStore(tmp_path / "late.db") as again:
        assert [r.kind for r in again.records("r1")] == ["run_started", "lazy"]


def test_migrates_a_version_1_store(tmp_path: Path) -> None:
    """A store of schema version 1 gains the leases table and keeps its records."""
    path = tmp_path / "old.db"
    with EventStore(path) as s:
        start(s)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE leases")
    conn.execute("DROP TABLE snapshots")  # as version 1 made it: one a run
    conn.execute("CREATE TABLE snapshots (rid INTEGER PRIMARY KEY, seq INTEGER, data TEXT)")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with EventStore(path) as s:
        assert [r.kind for r in s.records("r1")] == ["run_started"]
        assert s.query("SELECT value FROM meta WHERE key = 'schema_version'") == [("3",)]
        assert s.lease_sync("r1", "me", 5.0)


def test_leases_keep_owners_apart(store: EventStore) -> None:
    """A lease is held by one owner until it expires or is released; renewal needs it."""
    start(store)
    assert store.lease_sync("r1", "a", 30.0)
    assert not store.lease_sync("r1", "b", 30.0)
    assert store.lease_sync("r1", "a", 30.0, renew=True)
    assert not store.lease_sync("r1", "b", 30.0, renew=True)
    store.release_sync("r1", "a")
    assert store.lease_sync("r1", "b", 0.0)  # expires at once
    assert store.lease_sync("r1", "a", 30.0)  # so another owner may take it
    assert not store.lease_sync("r1", "b", 30.0, renew=True)
    lease = store.lease_of("r1")
    assert lease is not None
    assert lease[0] == "a"
