"""A step's records of work begun (``dequeued``, ``step_started``) ride with the commit that
follows them, as one operation of the writer, and stay commits of their own.

One operation per step (one submission, one write of all its rows) is what the engine's
per-step cost needs; the log must not show it: the same kinds, in the same seq order, with
the same commit boundaries as when each was submitted alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Literal

import orjson
import pytest

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    NewRun,
    Record,
    RunNotFoundError,
    StoredRecord,
)
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step

BOUND = 20.0  # seconds: only a hang comes near it
STEPS = 30


class Again(Event):
    i: int


class Loop(Workflow):
    """One step looping STEPS times, appending to a list in the context."""

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i = ev.i if isinstance(ev, Again) else 0
        items = await ctx.store.get("items", default=[])
        items.append(i)
        await ctx.store.set("items", items)
        return Again(i=i + 1) if i + 1 < STEPS else StopEvent(result=len(items))


def _by_commit(records: list[StoredRecord]) -> list[list[str]]:
    """The run's commits, each as the kinds of its records in seq order."""
    groups: dict[int, list[str]] = {}
    for r in records:
        groups.setdefault(r.commit_seq, []).append(r.kind)
    return list(groups.values())


async def test_a_steps_records_keep_their_commits_and_order(tmp_path: Path) -> None:
    """Every step of the loop: a commit of its dequeue, one of its start, one of its
    outcome, in that seq order; seqs consecutive, each commit's records ending at its
    commit_seq."""
    store = EventStore(tmp_path / "log.db")
    try:
        wf = Loop(store=store, timeout=None)
        handler = wf.run()
        assert await handler == STEPS
        records = list(store.records(handler.run_id))
    finally:
        store.close()
    seqs = [int(r.seq) for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for r in records:  # a commit's records end at its commit_seq, which is one of them
        assert r.commit_seq >= r.seq
        assert any(o.seq == r.commit_seq for o in records)
    commits = _by_commit(records)
    assert commits[0] == ["run_started", "enqueued"]
    steps = commits[1:]
    outcome = ["step_finished", "state_set", "enqueued"]
    expected = [["dequeued"], ["step_started"], outcome] * (STEPS - 1)
    expected += [["dequeued"], ["step_started"], ["step_finished", "state_set", "run_finished"]]
    assert steps == expected


async def test_a_step_costs_one_operation_of_the_writer(tmp_path: Path) -> None:
    """The loop's steps each cost one operation and one transaction of the writer (its
    dequeue and start ride with its outcome), not one operation per commit."""
    store = EventStore(tmp_path / "log.db")
    try:
        wf = Loop(store=store, timeout=None)
        await wf.run()  # the first run pays for the store's setup
        before = store.stats
        assert await wf.run() == STEPS
        after = store.stats
    finally:
        store.close()
    operations = after.operations - before.operations
    transactions = after.transactions - before.transactions
    # One per step, plus the run's first commit and its last snapshot.
    assert operations <= STEPS + 3
    assert transactions <= STEPS + 3


class Slow(Workflow):
    """A step that waits for the test before it returns."""

    release: asyncio.Event

    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        await self.release.wait()
        return StopEvent(result="done")


async def test_a_long_attempts_start_is_written_while_it_runs(tmp_path: Path) -> None:
    """Records of work begun that no commit comes for are written on their own soon (the
    attempt is in progress in the log while it runs), not held until the attempt ends."""
    store = EventStore(tmp_path / "log.db")
    try:
        wf = Slow(store=store, timeout=None)
        wf.release = asyncio.Event()
        handler = wf.run()
        async with asyncio.timeout(BOUND):
            while True:
                with contextlib.suppress(RunNotFoundError):  # not created yet
                    kinds = [r.kind for r in store.records(handler.run_id)]
                    if "step_started" in kinds:
                        break
                await asyncio.sleep(0.01)
        assert kinds[-2:] == ["dequeued", "step_started"]
        assert not handler.done()
        assert wf.state_at(handler.run_id).in_progress["only"][0].attempt == 1
        wf.release.set()
        assert await handler == "done"
        kinds = [r.kind for r in store.records(handler.run_id)]
    finally:
        store.close()
    assert kinds.count("step_started") == 1
    assert kinds.index("step_started") < kinds.index("step_finished")


class Item(Event):
    i: int


class Counter(Workflow):
    """Four workers doing get/set of one key: their commits conflict and re-run."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        await ctx.store.set("total", 0)
        for i in range(20):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def add(self, ctx: Context, ev: Item) -> StopEvent | None:
        total = await ctx.store.get("total")
        await asyncio.sleep(0)  # let other workers read the same total
        await ctx.store.set("total", total + ev.i)
        seen = await ctx.store.get("seen", default=0) + 1
        await ctx.store.set("seen", seen)
        return StopEvent(result=total + ev.i) if seen == 20 else None


@pytest.mark.parametrize("durability", ["normal", "full"])
async def test_a_conflicted_attempts_start_precedes_its_conflict(
    tmp_path: Path, durability: Literal["normal", "full"]
) -> None:
    """A commit refused for stale reads leaves its attempt's start records to the commit
    that follows (its conflict): each attempt's ``step_started`` is written once, before
    its ``step_conflicted`` or ``step_finished``, every dequeue before its starts.
    ``durability`` "full" writes on the writer thread, "normal" on the loop."""
    store = EventStore(tmp_path / "log.db", durability=durability)
    try:
        await _conflicts_in_order(store)
    finally:
        store.close()


async def test_start_records_precede_conflicts_on_every_backend(store: EventStore) -> None:
    """The same on every backend: in memory, in a file, on a server."""
    await _conflicts_in_order(store)


async def _conflicts_in_order(store: EventStore) -> None:
    wf = Counter(store=store, timeout=60)
    handler = wf.run()
    assert await handler == sum(range(20))
    records = list(store.records(handler.run_id))
    started: dict[tuple[int, int], int] = {}
    dequeued: dict[int, int] = {}
    ended: dict[tuple[int, int], int] = {}
    for r in records:
        if r.step != "add":
            continue
        p = orjson.loads(r.payload)
        if r.kind == "dequeued":
            dequeued[p["id"]] = int(r.seq)
        elif r.kind == "step_started":
            assert (p["id"], p["attempt"]) not in started
            started[p["id"], p["attempt"]] = int(r.seq)
        elif r.kind in ("step_conflicted", "step_finished"):
            ended[p["id"], p["attempt"]] = int(r.seq)
    assert any(r.kind == "step_conflicted" for r in records)
    assert sorted(started) == sorted(ended)
    for (ev_id, attempt), seq in started.items():
        assert dequeued[ev_id] < seq < ended[ev_id, attempt]
    wf.state_at(handler.run_id)  # the log folds


def _run(store: EventStore, run_id: str) -> None:
    store.append_sync(Commit(run_id, [Record("run_started", None, "{}")], epoch=1, create=NewRun()))


async def test_commits_submitted_together_stay_commits_of_their_own(tmp_path: Path) -> None:
    """``submit_many``: each commit gets its seqs and its commit boundary; one whose check
    refuses it refuses them all (nothing of them is written)."""
    store = EventStore(tmp_path / "log.db")
    try:
        _run(store, "r")
        first = Commit("r", [Record("a", "s", "{}")], epoch=1)
        second = Commit("r", [Record("b", "s", "{}"), Record("c", "s", "{}")], epoch=1)
        results = await store.submit_many([first, second])
        assert [(int(r.first_seq), int(r.last_seq)) for r in results] == [(2, 2), (3, 4)]
        rows = [(r.kind, int(r.seq), int(r.commit_seq)) for r in store.records("r")]
        assert rows[1:] == [("a", 2, 2), ("b", 3, 4), ("c", 4, 4)]

        def refuse() -> None:
            raise ConcurrencyError("no")

        refused = Commit("r", [Record("d", "s", "{}")], epoch=1, check=refuse)
        with pytest.raises(ConcurrencyError, match="no"):
            await store.submit_many([Commit("r", [Record("e", "s", "{}")], epoch=1), refused])
        stale = Commit("r", [Record("f", "s", "{}")], epoch=7)
        with pytest.raises(ConcurrencyError, match="epoch"):
            await store.submit_many([stale, Commit("r", [Record("g", "s", "{}")], epoch=1)])
        assert [r.kind for r in store.records("r")][1:] == ["a", "b", "c"]
        # The last may end the run: its status is written with it.
        done = Commit("r", [Record("h", None, "{}")], epoch=1, status="finished")
        await store.submit_many([Commit("r", [Record("i", "s", "{}")], epoch=1), done])
        assert store.run("r").status == "finished"
        assert [r.kind for r in store.records("r")][-2:] == ["i", "h"]
    finally:
        store.close()


def _commits_of(store: EventStore, run_id: str) -> list[list[str]]:
    return _by_commit(list(store.records(run_id)))


@pytest.mark.parametrize("joined", [True, False])
async def test_the_last_commit_may_be_refused_alone(store: EventStore, joined: bool) -> None:
    """``submit_many(last_alone=True)``: a last commit refused by its check, or failing
    once written (where the transaction may hold part of it), leaves the others written,
    once each, and its error is its result; an earlier one refused refuses them all.
    ``joined``: commits of one run written as one statement, else one by one (always, on a
    server's backend)."""
    _run(store, "r")
    _run(store, "other")
    # A status on an earlier commit makes them go one by one.
    status = None if joined else "running"

    def refuse() -> None:
        raise ConcurrencyError("stale")

    def explode(seq: object) -> None:
        raise RuntimeError("after writing")

    for name, last in (
        ("check", Commit("r", [Record("x", "s", "{}")], epoch=1, check=refuse)),
        ("written", Commit("r", [Record("y", "s", "{}")], epoch=1, on_written=explode)),
    ):
        before = Commit("r", [Record(f"{name}1", "s", "{}")], epoch=1, status=status)
        also = Commit("r", [Record(f"{name}2", "s", "{}")], epoch=1)
        # Another run's commit in the same transaction is written once all the same.
        neighbour = Commit("other", [Record(name, "s", "{}")], epoch=1)
        results, _ = await asyncio.gather(
            store.submit_many([before, also, last], last_alone=True), store.submit(neighbour)
        )
        assert isinstance(results[-1], ConcurrencyError | RuntimeError)
        assert [type(r).__name__ for r in results[:-1]] == ["AppendResult"] * 2
    assert _commits_of(store, "other")[1:] == [["check"], ["written"]]
    assert _commits_of(store, "r")[1:] == [["check1"], ["check2"], ["written1"], ["written2"]]
    if store.kind != "postgres":  # a server fences each commit on its own
        stale = Commit("r", [Record("z", "s", "{}")], epoch=9)
        with pytest.raises(ConcurrencyError, match="epoch"):
            await store.submit_many(
                [stale, Commit("r", [Record("w", "s", "{}")], epoch=1)], last_alone=True
            )
    assert _commits_of(store, "r")[1:] == [["check1"], ["check2"], ["written1"], ["written2"]]
    seqs = [int(r.seq) for r in store.records("r")]
    assert seqs == sorted(set(seqs))


@pytest.mark.parametrize("joined", [True, False])
async def test_records_that_are_not_text_are_refused_before_anything_is_written(
    store: EventStore, joined: bool
) -> None:
    """A record whose kind or payload is not a str refuses its commit: the last one alone
    with ``last_alone`` (the others written, the TypeError its result), else every commit
    submitted with it. ``joined`` as above."""
    _run(store, "r")
    status = None if joined else "running"
    bad = Record("bad", "s", b"{}")  # type: ignore[arg-type]
    kinds = Record(1, "s", "{}")  # type: ignore[arg-type]
    for i, wrong in enumerate((bad, kinds)):
        before = Commit("r", [Record(f"ok{i}", "s", "{}")], epoch=1, status=status)
        last = Commit("r", [Record(f"fine{i}", "s", "{}"), wrong], epoch=1)
        results = await store.submit_many([before, last], last_alone=True)
        assert isinstance(results[-1], TypeError)
        assert "str kind and a JSON text payload" in str(results[-1])
        assert type(results[0]).__name__ == "AppendResult"
    first = Commit("r", [bad], epoch=1, status=status)
    with pytest.raises(TypeError, match="JSON text payload"):
        await store.submit_many([first, Commit("r", [Record("after", "s", "{}")], epoch=1)])
    assert _commits_of(store, "r")[1:] == [["ok0"], ["ok1"]]


class Entered(Workflow):
    """A step that says it began, then waits for the test."""

    entered: asyncio.Event
    release: asyncio.Event

    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        self.entered.set()
        await self.release.wait()
        return StopEvent(result="done")


async def test_a_store_closed_under_pending_start_records(tmp_path: Path) -> None:
    """The store closed while an attempt's start records wait to ride with its commit: the
    run fails with the store's error, and nothing is left raising in the loop's callbacks
    (the records' own write, due later, is told to the run as a failed commit)."""
    loop = asyncio.get_running_loop()
    raised: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: raised.append(context))
    store = EventStore(tmp_path / "log.db")
    wf = Entered(store=store, timeout=None)
    wf.entered, wf.release = asyncio.Event(), asyncio.Event()
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        await wf.entered.wait()
    store.close()
    await asyncio.sleep(0.2)  # past the records' deadline (LAZY_FLUSH_S)
    wf.release.set()
    with pytest.raises(Exception, match="closed"):
        async with asyncio.timeout(BOUND):
            await handler
    assert raised == []


async def test_a_flush_of_the_store_writes_held_start_records(tmp_path: Path) -> None:
    """``store.flush()`` writes every commit queued so far, lazy ones included: also the
    start records an executor holds back for its next commit."""
    store = EventStore(tmp_path / "log.db")
    try:
        wf = Entered(store=store, timeout=None)
        wf.entered, wf.release = asyncio.Event(), asyncio.Event()
        handler = wf.run()
        async with asyncio.timeout(BOUND):
            await wf.entered.wait()
        await store.flush()
        kinds = [r.kind for r in store.records(handler.run_id)]
        assert kinds[-2:] == ["dequeued", "step_started"]
        wf.release.set()
        assert await handler == "done"
        kinds = [r.kind for r in store.records(handler.run_id)]
        assert kinds.count("step_started") == 1
    finally:
        store.close()
