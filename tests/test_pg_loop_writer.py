"""The event loop's own writer on PostgreSQL: batches sent from the loop's thread without
blocking it, no writer thread; a lost connection, closing mid-call, lazy commits."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import cast

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import Commit, EventStore, NewRun, Record, StoreUnavailableError
from eventstore._backend import Request
from eventstore._loop_writer import LoopWriter
from eventstore._pg_connect import REPLY_SPIN_US
from eventstore._postgres import PostgresWriteSQL, _any_params, _plain_params
from tests.conftest import POSTGRES_URL, postgres_location, postgres_store
from tests.test_engine import Linear

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg() -> Iterator[EventStore]:
    """A store in a fresh PostgreSQL schema."""
    with postgres_store() as es:
        yield es


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "eventstore-writer"]


def _rec(kind: str) -> Record:
    return Record(kind, None, "{}")


async def test_a_loop_writes_its_own_batches_group_committed(pg: EventStore) -> None:
    """Commits from one loop are written by the loop (no writer thread starts), many
    waiting at once share a call, and each gets its own seqs in commit order."""
    before = _writer_threads()
    await pg.append(Commit("r", [_rec("start")], create=NewRun()))
    results = await asyncio.gather(
        *(pg.append(Commit("r", [_rec(f"k{i}")], epoch=0)) for i in range(50))
    )
    assert [r.last_seq for r in results] == list(range(2, 52))
    assert [r.kind for r in pg.records("r")] == ["start"] + [f"k{i}" for i in range(50)]
    assert pg.stats.transactions < 10  # 51 commits, a few calls
    assert _writer_threads() == before


async def test_a_workflow_on_postgres_starts_no_writer_thread(pg: EventStore) -> None:
    """A run's commits and its lease (taken and given back synchronously on the loop's
    thread) all go through the loop's writer."""
    before = _writer_threads()
    wf = Linear(store=pg, timeout=10)
    assert await wf.run(topic="loops") == "hello loops!"
    assert _writer_threads() == before
    assert pg.lease_of(next(iter(pg.runs())).run_id) is None  # given back


async def test_a_lost_connection_fails_its_batch_and_the_next_ones_are_written(
    pg: EventStore,
) -> None:
    """The loop writer's connection ended by the server: the batch then written fails as
    in doubt, and the store goes on writing (through the writer thread, which connects)."""
    await pg.append(Commit("r", [_rec("a")], create=NewRun()))
    writer = pg._committer._loop_writer
    assert writer is not None
    session = cast("PostgresWriteSQL", writer.sql).raw.info.backend_pid
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (session,))
    with pytest.raises(StoreUnavailableError, match="connection to the database was lost"):
        await pg.append(Commit("r", [_rec("b")], epoch=0))
    res = await pg.append(Commit("r", [_rec("c")], epoch=0))
    assert pg.failed is None
    assert [r.kind for r in pg.records("r")] == ["a", "c"]
    assert res.last_seq == 2


async def test_closing_with_a_call_in_flight_writes_it() -> None:
    """A store closed from the loop while its batch is on its way to the server waits for
    the reply: the commit is in the log and its caller is told."""
    with postgres_location() as url:
        pg = EventStore(url)
        await _close_in_flight(pg)
        with EventStore(url, readonly=True) as again:
            assert [r.kind for r in again.records("r")] == ["a", "b", "c"]


async def _close_in_flight(pg: EventStore) -> None:
    await pg.append(Commit("r", [_rec("a")], create=NewRun()))
    pending = pg.submit(Commit("r", [_rec("b")], epoch=0))
    later = pg.submit(Commit("r", [_rec("c")], epoch=0))
    await asyncio.sleep(0)  # handed to the loop writer: the first call is sent
    writer = pg._committer._loop_writer
    assert writer is not None
    assert not writer.idle
    pg.close()
    assert pending.done()
    assert later.done()
    assert pending.result().last_seq == 2
    assert later.result().last_seq == 3


async def test_lazy_commits_wait_for_one_that_is_not(pg: EventStore) -> None:
    """A lazy commit rides with the next commit that is not lazy (one call), or goes
    alone once its wait is over."""
    await pg.append(Commit("r", [_rec("a")], create=NewRun()))
    calls = pg.stats.transactions
    lazy = pg.submit(Commit("r", [_rec("lazy")], epoch=0), lazy=True)
    await asyncio.sleep(0.001)
    assert not lazy.done()
    await pg.append(Commit("r", [_rec("eager")], epoch=0))
    assert lazy.done()
    assert pg.stats.transactions == calls + 1
    alone = pg.submit(Commit("r", [_rec("alone")], epoch=0), lazy=True)
    assert (await asyncio.wait_for(alone, 5)).last_seq == 4
    assert [r.kind for r in pg.records("r")] == ["a", "lazy", "eager", "alone"]


def test_another_loop_writes_through_the_writer_thread(pg: EventStore) -> None:
    """Only one loop at a time has the loop writer; a loop on another thread while that
    one runs hands its batches to the writer thread, and both are written."""
    ready, done = threading.Event(), threading.Event()

    async def first() -> None:
        await pg.append(Commit("a", [_rec("a0")], create=NewRun()))
        ready.set()
        await asyncio.to_thread(done.wait, 10)  # the other loop runs meanwhile
        await pg.append(Commit("a", [_rec("a1")], epoch=0))

    def second() -> None:
        ready.wait(10)

        async def go() -> None:
            await pg.append(Commit("b", [_rec("b0")], create=NewRun()))

        asyncio.run(go())
        done.set()

    other = threading.Thread(target=second)
    other.start()
    asyncio.run(first())
    other.join(10)
    assert [r.kind for r in pg.records("a")] == ["a0", "a1"]
    assert [r.kind for r in pg.records("b")] == ["b0"]
    assert _writer_threads()


async def test_a_call_the_server_refuses_whole_fails_its_batch_alone(pg: EventStore) -> None:
    """A call the server refuses as a whole (a NUL in a payload: text cannot hold one)
    tells each op of its batch why; nothing of it is written and the next call is."""
    await pg.append(Commit("r", [_rec("a")], create=NewRun()))
    with pytest.raises(psycopg.DataError):
        await pg.append(Commit("r", [Record("bad", None, '"\x00"')], epoch=0))
    res = await pg.append(Commit("r", [_rec("c")], epoch=0))
    assert res.last_seq == 2
    assert [r.kind for r in pg.records("r")] == ["a", "c"]
    assert pg._committer._loop_writer is not None
    assert pg._committer._loop_writer.usable


def test_the_writer_moves_to_the_next_loop_once_the_first_closed(pg: EventStore) -> None:
    """The loop writer keeps its socket watched between calls; a loop that closed leaves
    it to the next loop, which watches it from its first call (no writer thread)."""
    before = _writer_threads()

    async def commit(kind: str, **kw: object) -> int:
        res = await pg.append(Commit("r", [_rec(kind)], **kw))  # type: ignore[arg-type]
        return res.last_seq

    assert asyncio.run(commit("a", create=NewRun())) == 1
    assert asyncio.run(commit("b", epoch=0)) == 2

    async def many() -> list[int]:
        return [await commit(f"c{i}", epoch=0) for i in range(3)]

    assert asyncio.run(many()) == [3, 4, 5]
    assert _writer_threads() == before
    assert [r.kind for r in pg.records("r")] == ["a", "b", "c0", "c1", "c2"]


_texts_st = st.one_of(st.none(), st.text(alphabet='ab,"\\{} N\u00e9', max_size=6))


@st.composite
def _plain_batches(draw: st.DrawFn) -> list[Request]:
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        records = [
            Record(draw(st.text(max_size=4)), draw(_texts_st), draw(st.text(max_size=6)))
            for _ in range(draw(st.integers(0, 3)))
        ]
        epoch = draw(st.one_of(st.none(), st.integers(0, 3)))
        status = draw(st.one_of(st.none(), st.sampled_from(["running", "done"])))
        commit = Commit(draw(st.sampled_from(["r", 'r"1', "r,2"])), records, epoch=epoch,
                        status=status)  # fmt: skip
        requests.append(Request("append", commit.run_id, commit, draw(st.integers(0, 2**60))))
    return requests


@given(_plain_batches())
def test_a_batch_of_plain_appends_is_sent_as_the_general_path_sends_it(
    requests: list[Request],
) -> None:
    """The fast path for a step's commits (plain appends) gives the write function the
    same arguments as the path for any batch."""
    assert _plain_params(requests) == _any_params(requests)


def test_other_batches_take_the_general_path() -> None:
    """A batch with an op that is not a plain append is not the fast path's."""
    plain = Request("append", "r", Commit("r", [_rec("a")], epoch=0))
    for other in (
        Request("claim", "r"),
        Request("append", "r", Commit("r", [_rec("a")], create=NewRun())),
        Request("append", "r", Commit("r", [_rec("a")], seq=7)),
        Request("append", "r", Commit("r", [_rec("a")], inbox_taken=[3])),
        Request("append", "r", Commit("r", [_rec("a")], snapshot=(1, "{}"))),
    ):
        assert _plain_params([plain, other]) is None


# --------------------------------------------------------------- busy waits for a reply


def _loop_writer(pg: EventStore) -> LoopWriter:
    writer = pg._committer._loop_writer
    assert writer is not None
    return writer


def _count_turns(writer: LoopWriter) -> list[int]:
    """Counts the busy wait's turns (each schedules the next through ``self._spin``)."""
    turns = [0]
    spin = writer._spin

    def counted() -> None:
        turns[0] += 1
        spin()

    writer._spin = counted  # type: ignore[method-assign]
    return turns


async def test_a_run_s_calls_are_waited_for_both_ways_and_written_in_order() -> None:
    """A store's first calls wait busily (the opening burst), and the loop tries each way
    in bursts from then on; either way each commit lands, in order, and no turn of a busy
    wait outlives its call's reply."""
    with postgres_store() as pg:
        await pg.append(Commit("r", [_rec("a")], create=NewRun()))
        writer = _loop_writer(pg)
        turns = _count_turns(writer)
        for i in range(80):
            await pg.append(Commit("r", [_rec(f"k{i}")], epoch=0))
            assert writer._spin_turn is None  # the reply came: its wait ended
        wait = writer.reply_wait
        assert wait.spin_s == pytest.approx(REPLY_SPIN_US / 1e6)
        assert turns[0] > 0
        assert wait.busy_s
        assert wait.asleep_s
        assert [r.kind for r in pg.records("r")] == ["a"] + [f"k{i}" for i in range(80)]


async def test_reply_spin_us_0_never_waits_busily() -> None:
    with postgres_location() as url:
        pg = EventStore(f"{url}&reply_spin_us=0")
        try:
            await pg.append(Commit("r", [_rec("a")], create=NewRun()))
            writer = _loop_writer(pg)
            turns = _count_turns(writer)
            for i in range(20):
                await pg.append(Commit("r", [_rec(f"k{i}")], epoch=0))
            assert turns[0] == 0
            assert not writer.reply_wait.busy_s
            assert len(writer.reply_wait.asleep_s) == 16  # the last 16 calls' cycles
        finally:
            pg.close()


async def test_a_busy_wait_lets_the_loop_s_other_tasks_run_and_a_late_reply_lands() -> None:
    """A call held up by the server (its seq row locked by another session) while the
    loop waits busily for up to 0.1 s (a store's first calls do): the loop's other tasks
    run during the wait itself, between its turns, and the reply, which outlasts the
    wait, is read once it comes."""
    with postgres_location() as url:
        pg = EventStore(f"{url}&reply_spin_us=100000")
        try:
            await pg.append(Commit("r", [_rec("a")], create=NewRun()))
            writer = _loop_writer(pg)
            during = 0  # ticks of another task while a busy wait went on

            async def ticker() -> None:
                nonlocal during
                while True:
                    during += writer._spin_turn is not None
                    await asyncio.sleep(0)

            with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
                schema = url.rsplit("schema=", 1)[1]
                admin.execute("BEGIN")
                admin.execute(f"SELECT 1 FROM \"{schema}\".meta WHERE key = 'last_seq' FOR UPDATE")
                commit = pg.submit(Commit("r", [_rec("b")], epoch=0))
                counting = asyncio.create_task(ticker())
                await asyncio.sleep(0.25)
                assert not commit.done()
                assert writer._busy  # this call is waited for busily
                assert during > 10
                admin.execute("COMMIT")
            assert (await asyncio.wait_for(commit, 10)).last_seq == 2
            counting.cancel()
            assert [r.kind for r in pg.records("r")] == ["a", "b"]
        finally:
            pg.close()
