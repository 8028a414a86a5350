"""The shared batch writer's rules, one exact batch at a time, on every backend.

Each test hands :class:`BatchWriter` (over a write connection of the ``store`` fixture's
backend) a batch of operations of its choosing, so what shares a transaction does not
depend on the timing of group commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from eventstore import (
    Commit,
    ConcurrencyError,
    EventStore,
    NewRun,
    Record,
    RunNotFoundError,
)
from eventstore._writer import BatchWriter, Op


def rec(kind: str = "k") -> Record:
    return Record(kind, "s", "{}")


def add(commit: Commit) -> Op:
    return lambda w: w.append(commit)


@pytest.fixture
def writer(store: EventStore) -> Iterator[BatchWriter]:
    """A batch writer on its own write connection to the fixture's store."""
    w = BatchWriter(store._backend.write_sql())
    try:
        yield w
    finally:
        w.close()


def started(writer: BatchWriter, run_id: str = "r1", epoch: int = 1) -> None:
    [(ok, value)] = writer.run_batch(
        [add(Commit(run_id, [rec("run_started")], epoch=epoch, create=NewRun()))]
    )
    assert ok, value


def kinds(store: EventStore, run_id: str = "r1") -> list[tuple[int, str, int]]:
    return [(r.seq, r.kind, r.commit_seq) for r in store.records(run_id)]


def test_a_failed_check_refuses_its_commit_alone(store: EventStore, writer: BatchWriter) -> None:
    """The middle commit's check refuses it; the others land with consecutive seqs."""
    started(writer)

    def refuse() -> None:
        raise ConcurrencyError("stale read", run_id="r1")

    out = writer.run_batch(
        [
            add(Commit("r1", [rec("a"), rec("a")])),
            add(Commit("r1", [rec("b")], check=refuse)),
            add(Commit("r1", [rec("c")])),
        ]
    )
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], ConcurrencyError)
    assert (out[2][1].first_seq, out[2][1].last_seq) == (4, 4)
    assert kinds(store) == [(1, "run_started", 1), (2, "a", 3), (3, "a", 3), (4, "c", 4)]


def test_a_failure_after_writing_reruns_the_batch_without_it(
    store: EventStore, writer: BatchWriter
) -> None:
    """A commit that fails once written is rolled back; the batch runs again without it.

    On PostgreSQL the hooks run before the batch is sent (see ServerWriteSQL): a hook that
    fails leaves its commit out of the one statement, and nothing needs running again."""
    started(writer)
    checks: list[str] = []

    def explode(seq: int) -> None:
        raise ValueError("after writing")

    out = writer.run_batch(
        [
            add(Commit("r1", [rec("a")], check=lambda: checks.append("a"))),
            add(Commit("r1", [rec("b"), rec("b")], on_written=explode)),
            add(Commit("r1", [rec("c")], check=lambda: checks.append("c"))),
        ]
    )
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], ValueError)
    assert kinds(store) == [(1, "run_started", 1), (2, "a", 2), (3, "c", 3)]
    # The first commit was checked again on the rerun (on PostgreSQL there was none).
    assert checks == (["a", "c"] if store.kind == "postgres" else ["a", "a", "c"])


def test_a_database_error_refuses_its_op_alone(store: EventStore, writer: BatchWriter) -> None:
    """An op the database refuses (a NOT NULL payload) is left out; the rest commit."""
    started(writer)
    out = writer.run_batch(
        [
            add(Commit("r1", [rec("a")])),
            lambda w: w.post("r1", None, None),  # type: ignore[arg-type]
            add(Commit("r1", [rec("b")])),
        ]
    )
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], writer.sql.errors)
    assert kinds(store) == [(1, "run_started", 1), (2, "a", 2), (3, "b", 3)]
    assert store.inbox("r1") == []


def test_a_claim_fences_the_commits_after_it(store: EventStore, writer: BatchWriter) -> None:
    """In one batch, a claim refuses later commits under the old epoch, not the new."""
    started(writer, epoch=1)
    out = writer.run_batch(
        [
            add(Commit("r1", [rec("before")], epoch=1)),
            lambda w: w.claim("r1"),
            add(Commit("r1", [rec("stale")], epoch=1)),
            add(Commit("r1", [rec("fresh")], epoch=2)),
        ]
    )
    assert [ok for ok, _ in out] == [True, True, False, True]
    assert out[1][1] == 2
    assert isinstance(out[2][1], ConcurrencyError)
    assert "epoch 1 refused" in str(out[2][1])
    assert [k for _, k, _ in kinds(store)] == ["run_started", "before", "fresh"]
    assert store.run("r1").epoch == 2


def test_creating_a_run_twice_in_one_batch(store: EventStore, writer: BatchWriter) -> None:
    """The first commit creating a run lands; a second one, in the same batch, is refused."""
    out = writer.run_batch(
        [
            add(Commit("r1", [rec("first")], create=NewRun(meta={"n": 1}))),
            add(Commit("r1", [rec("second")], create=NewRun(meta={"n": 2}))),
            add(Commit("r1", [rec("more")])),
        ]
    )
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], ConcurrencyError)
    assert "already exists" in str(out[1][1])
    assert [k for _, k, _ in kinds(store)] == ["first", "more"]
    assert store.run("r1").meta == {"n": 1}


def test_unknown_runs_and_bad_records_are_refused_alone(
    store: EventStore, writer: BatchWriter
) -> None:
    """A commit to a missing run, or with a payload that is not text, is refused alone."""
    started(writer)
    out = writer.run_batch(
        [
            add(Commit("nope", [rec()])),
            add(Commit("r1", [Record("k", None, {"not": "text"})])),  # type: ignore[arg-type]
            add(Commit("r1", [rec("ok")])),
            lambda w: w.claim("nope"),
        ]
    )
    assert [ok for ok, _ in out] == [False, False, True, False]
    assert isinstance(out[0][1], RunNotFoundError)
    assert isinstance(out[1][1], TypeError)
    assert isinstance(out[3][1], RunNotFoundError)
    assert kinds(store) == [(1, "run_started", 1), (2, "ok", 2)]


def test_side_effects_are_written_in_commit_order(store: EventStore, writer: BatchWriter) -> None:
    """Status, taken inbox entries and snapshots of one batch apply in commit order."""
    started(writer)
    [(_, (first, _)), (_, (second, _))] = writer.run_batch(
        [lambda w: w.post("r1", '{"e": 1}', "k"), lambda w: w.post("r1", '{"e": 2}', None)]
    )
    ops: list[Op] = [
        add(Commit("r1", [rec()], status="waiting", inbox_taken=[first])),
        add(Commit("r1", [], snapshot=(2, '{"s": 1}'))),
        add(Commit("r1", [rec()], status="running", inbox_taken=[first, second])),
        add(Commit("r1", [], snapshot=(3, '{"s": 2}'))),
        lambda w: w.post("r1", '{"e": 3}', "k"),  # the key was posted: the first entry
    ]
    out = writer.run_batch(ops)
    assert all(ok for ok, _ in out)
    assert out[-1][1] == (first, False)
    assert store.run("r1").status == "running"
    assert store.snapshot("r1") == (3, '{"s": 2}')
    taken = store.query("SELECT id, taken_seq FROM inbox ORDER BY id")
    assert taken == [(first, 2), (second, 3)]


def test_writes_of_another_connection_are_seen(store: EventStore, writer: BatchWriter) -> None:
    """A writer notices another connection's commits: fresh seqs, and its claims fence."""
    started(writer)
    other = BatchWriter(store._backend.write_sql())
    try:
        [(ok, res)] = other.run_batch([add(Commit("r1", [rec("other")]))])
        assert ok
        assert res.first_seq == 2
        [(ok, epoch)] = other.run_batch([lambda w: w.claim("r1")])
        assert (ok, epoch) == (True, 2)
    finally:
        other.close()
    out: list[tuple[bool, Any]] = writer.run_batch(
        [add(Commit("r1", [rec("stale")], epoch=1)), add(Commit("r1", [rec("mine")], epoch=2))]
    )
    assert [ok for ok, _ in out] == [False, True]
    assert kinds(store) == [(1, "run_started", 1), (2, "other", 2), (3, "mine", 3)]


def test_leases_follow_the_rules_within_a_batch(store: EventStore, writer: BatchWriter) -> None:
    """A lease taken earlier in a batch keeps another owner out later in the same batch."""
    out = writer.run_batch(
        [
            lambda w: w.lease("r1", "a", 30_000_000, renew=False),
            lambda w: w.lease("r1", "b", 30_000_000, renew=False),
            lambda w: w.lease("r1", "b", 30_000_000, renew=True),
            lambda w: w.release("r1", "a"),
            lambda w: w.lease("r1", "b", 30_000_000, renew=False),
        ]
    )
    assert [value for _, value in out] == [True, False, False, None, True]
    lease = store.lease_of("r1")
    assert lease is not None
    assert lease[0] == "b"


def test_a_commit_keeps_its_seqs_when_the_log_is_short_of_them(
    store: EventStore, writer: BatchWriter
) -> None:
    """A commit with ``seq`` (an imported run) lands there, the seqs between never used;
    one the log is already past is refused alone, and the next commit follows the kept."""
    started(writer)
    out = writer.run_batch(
        [
            add(Commit("r1", [rec("kept"), rec("kept")], seq=10, ts=123)),
            add(Commit("r1", [rec("late")], seq=5)),
            add(Commit("r1", [rec("next")])),
        ]
    )
    assert [ok for ok, _ in out] == [True, False, True]
    assert (out[0][1].first_seq, out[0][1].last_seq, out[0][1].ts) == (10, 11, 123)
    assert isinstance(out[1][1], ValueError)
    assert "cannot keep seq 5: the log's last seq is 11" in str(out[1][1])
    assert kinds(store) == [
        (1, "run_started", 1),
        (10, "kept", 11),
        (11, "kept", 11),
        (12, "next", 12),
    ]
