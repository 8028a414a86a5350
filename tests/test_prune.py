"""Retention: ``wf.prune`` and ``workflow prune`` delete whole runs and give the space back.

Never a fork's ancestors while the fork is kept, never a run waiting for a human unless
asked; a dry run changes nothing; the store's file stays bounded over rounds of runs and
prunes (the checkpoint tables of hundreds of MB that LangGraph and DBOS users report).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventstore import Commit, EventStore, NewRun, Record
from tests.conftest import postgres_location
from tests.flows import Asker, ReportFlow
from workflow import Context, StartEvent, StopEvent, Workflow, step
from workflow._ownership import probe_owners
from workflow._prune import parse_duration, prune_runs
from workflow.cli import cli

PAYLOAD = "x" * 20_000  # a step's result worth keeping a while, as an LLM's answer is


class Heavy(Workflow):
    """Keeps a large value in its context and returns another."""

    @step
    async def work(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("answer", PAYLOAD + str(ev.get("n", 0)))
        return StopEvent(result=PAYLOAD)


class Flaky(Workflow):
    """Fails unless its context holds ``ok``: a failed run to fork from."""

    @step
    async def work(self, ctx: Context, ev: StartEvent) -> StopEvent:
        if not await ctx.store.get("ok", default=False):
            msg = "not ok"
            raise ValueError(msg)
        return StopEvent(result="fine")


def _size(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _table_counts(store: EventStore) -> dict[str, int]:
    return {
        t: store.query(f"SELECT count(*) FROM {t}")[0][0]
        for t in ("runs", "log", "inbox", "snapshots", "leases")
    }


async def _failed_run(wf: Flaky) -> str:
    h = wf.run()
    with pytest.raises(ValueError, match="not ok"):
        await h
    return h.run_id


async def test_size_stays_bounded_over_rounds_of_runs_and_prunes(tmp_path: Path) -> None:
    """Each round writes runs of 20 kB values and prunes them all: the file shrinks after
    every prune, and the last round's store is no larger than the first round's."""
    db = tmp_path / "p.db"
    wf = Heavy(store=db)
    after: list[int] = []
    for round_ in range(5):
        for n in range(15):
            assert await wf.run(n=n) == PAYLOAD
        grown = _size(db)
        report = wf.prune("0s")
        assert len(report.deleted) == 15, round_
        assert wf.runs() == []
        after.append(_size(db))
        assert after[-1] < grown / 4, (round_, grown, after[-1])
        assert report.bytes_after == after[-1]
    assert max(after) <= after[0] + 16 * 4096, after


async def test_a_deleted_run_leaves_no_row_in_any_table(tmp_path: Path) -> None:
    """Records, inbox entries, snapshots, the lease and the run's row all go."""
    db = tmp_path / "p.db"
    wf = Heavy(store=db)
    await wf.run()
    store = wf.store
    (run,) = store.runs()
    store.post_sync(run.run_id, '{"late": 1}')
    assert store.lease_sync(run.run_id, "someone", 0.0)  # lapsed at once: not a live holder
    before = _table_counts(store)
    assert all(before[t] > 0 for t in ("runs", "log", "inbox", "leases")), before
    assert wf.prune("0s").deleted == [run.run_id]
    assert _table_counts(store) == dict.fromkeys(before, 0)


async def test_seqs_are_never_reused_after_the_last_run_is_pruned(tmp_path: Path) -> None:
    """The log's high-water mark survives deleting the records that held it, also for a
    store opened again (another process)."""
    db = tmp_path / "p.db"
    wf = Heavy(store=db)
    await wf.run()
    head = wf.store.head()
    wf.prune("0s")
    wf.store.close()
    again = Heavy(store=db)
    await again.run()
    (run,) = again.store.runs()
    assert run.first_seq is not None
    assert run.first_seq > head


async def test_ancestors_of_a_kept_fork_survive_and_the_fork_still_folds(tmp_path: Path) -> None:
    """A fork of a fork keeps both runs it starts from while it is kept; once it goes
    too, so do they."""
    db = tmp_path / "p.db"
    wf = Flaky(store=db)
    root = await _failed_run(wf)
    mid_h = wf.run_from((root, wf.store.run(root).last_seq or 0))
    with pytest.raises(ValueError, match="not ok"):
        await mid_h
    mid = mid_h.run_id
    leaf_h = wf.run_from((mid, wf.store.run(mid).last_seq or 0), updates={"ok": True})
    assert await leaf_h == "fine"
    leaf = leaf_h.run_id
    other = await _failed_run(wf)  # no fork of it: it goes

    report = wf.prune("0s", statuses=["failed"])
    assert report.deleted == [other]
    assert report.kept_for_forks == sorted([root, mid])
    assert {r.run_id for r in wf.runs()} == {root, mid, leaf}
    state = wf.state_at(leaf)
    assert state.status == "finished"
    assert state.result == "fine"
    assert state.context["ok"] is True

    report = wf.prune("0s", statuses=["failed", "finished"])
    assert sorted(report.deleted) == sorted([root, mid, leaf])
    assert wf.runs() == []


async def test_waiting_runs_are_kept_unless_asked(tmp_path: Path) -> None:
    """A run waiting for a human's answer survives every prune but one that asks for it."""
    db = tmp_path / "p.db"
    wf = Asker(store=db)
    h = wf.run(run_id="asks")
    await h.wait_until_waiting()
    await h.suspend()
    with contextlib.suppress(Exception):
        await h
    assert [(r.run_id, r.status) for r in wf.runs()] == [("asks", "waiting")]
    every = ["finished", "failed", "cancelled", "timed_out", "interrupted"]
    report = wf.prune("0s", statuses=every)
    assert report.deleted == []
    assert report.kept_waiting == ["asks"]
    with pytest.raises(ValueError, match="include_waiting"):
        wf.prune("0s", statuses=["waiting"])
    assert [r.run_id for r in wf.runs()] == ["asks"]
    report = wf.prune("0s", include_waiting=True)
    assert report.deleted == ["asks"]
    assert wf.runs() == []


async def test_only_runs_older_than_the_cutoff_go(tmp_path: Path) -> None:
    """Age is since a run's last record: a fresh run stays; 31 days on, a 30d prune takes it."""
    db = tmp_path / "p.db"
    wf = Heavy(store=db)
    await wf.run()
    assert wf.prune("30d").deleted == []
    assert wf.prune(3600.0).deleted == []
    store, owners = wf.store, probe_owners(wf.store)
    later = time.time_ns() // 1000 + int(parse_duration("31d") * 1e6)
    report = prune_runs(store, owners, older_than="30d", now_us=later, dry_run=True)
    assert len(report.deleted) == 1
    assert len(store.runs()) == 1
    assert len(prune_runs(store, owners, older_than="30d", now_us=later).deleted) == 1
    assert store.runs() == []


async def test_prune_of_a_workflow_leaves_other_workflows_runs(tmp_path: Path) -> None:
    """``wf.prune`` deletes its own workflow's runs; the command prunes the whole store."""
    db = tmp_path / "p.db"
    heavy, report_flow = Heavy(store=db), ReportFlow(store=db)
    await heavy.run()
    h = report_flow.run()
    with pytest.raises(ValueError, match="var"):
        await h
    assert len(heavy.prune("0s").deleted) == 1
    assert [r.run_id for r in report_flow.runs()] == [h.run_id]


@pytest.mark.parametrize(
    ("bad", "match"),
    [("30", "bad duration"), ("3x", "bad duration"), ("-1d", "bad duration"), ("", "bad")],
)
def test_bad_durations_are_a_clear_error(bad: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_duration(bad)


async def test_bad_input_to_wf_prune_is_refused_before_anything_goes(tmp_path: Path) -> None:
    wf = Heavy(store=tmp_path / "p.db")
    await wf.run()
    with pytest.raises(ValueError, match="bad duration '1 month'"):
        wf.prune("1 month")
    with pytest.raises(ValueError, match="must not be negative"):
        wf.prune(-5.0)
    with pytest.raises(ValueError, match="cannot prune runs by status running"):
        wf.prune("0s", statuses=["running"])
    with pytest.raises(TypeError, match="older_than takes"):
        wf.prune(None)  # type: ignore[arg-type]
    assert len(wf.runs()) == 1


async def test_cli_prune_dry_run_changes_nothing_then_prunes(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    wf = Heavy(store=db)
    await wf.run()
    await wf.run()
    wf.store.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    runner = CliRunner()
    dry = runner.invoke(cli, ["prune", str(db), "--older-than", "0s", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.count("would delete ") == 3  # two runs and the summary line
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert len(EventStore(db, readonly=True).runs()) == 2

    done = runner.invoke(cli, ["prune", str(db), "--older-than", "0s", "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert len(data["deleted"]) == 2
    assert data["bytes_after"] < data["bytes_before"]
    assert EventStore(db, readonly=True).runs() == []
    checked = runner.invoke(cli, ["check", str(db)])
    assert checked.exit_code == 0, checked.output  # the pruned file is whole


def test_cli_prune_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = tmp_path / "missing.db"
    result = runner.invoke(cli, ["prune", str(missing), "--older-than", "30d"])
    assert result.exit_code != 0
    assert "no such file" in result.output
    assert not missing.exists()  # a typo never creates a store
    empty = tmp_path / "empty.db"
    empty.touch()
    result = runner.invoke(cli, ["prune", str(empty), "--older-than", "30d"])
    assert result.exit_code != 0
    assert "an empty file, not a store" in result.output
    assert empty.stat().st_size == 0

    db = tmp_path / "p.db"
    EventStore(db).close()
    bad = runner.invoke(cli, ["prune", str(db), "--older-than", "30 days"])
    assert bad.exit_code == 2
    assert "bad duration '30 days'" in bad.output
    waiting = runner.invoke(cli, ["prune", str(db), "--older-than", "1d", "--status", "waiting"])
    assert waiting.exit_code == 2
    assert "--include-waiting" in waiting.output
    unknown = runner.invoke(cli, ["prune", str(db), "--older-than", "1d", "--status", "done"])
    assert unknown.exit_code == 2
    assert "cannot prune runs by status done" in unknown.output


@pytest.mark.postgres
async def test_prune_on_postgres(tmp_path: Path) -> None:
    """The same rules on PostgreSQL: forks keep their parents, every table's rows go, the
    tables are vacuumed, seqs go on from the last one."""
    del tmp_path
    with postgres_location() as url:
        wf = Flaky(store=url)
        try:
            root = await _failed_run(wf)
            fork = wf.run_from((root, wf.store.run(root).last_seq or 0), updates={"ok": True})
            assert await fork == "fine"
            other = await _failed_run(wf)
            wf.store.post_sync(other, '{"late": 1}')
            head = wf.store.head()
            report = wf.prune("0s", statuses=["failed"])
            assert report.deleted == [other]
            assert report.kept_for_forks == [root]
            assert report.bytes_after is None
            assert wf.state_at(fork.run_id).result == "fine"
            counts = _table_counts(wf.store)
            assert counts["runs"] == 2
            assert counts["inbox"] == 0
            report = wf.prune("0s", statuses=["failed", "finished"])
            assert sorted(report.deleted) == sorted([root, fork.run_id])
            assert _table_counts(wf.store) == dict.fromkeys(counts, 0)
            again = await _failed_run(wf)
            first = wf.store.run(again).first_seq
            assert first is not None
            assert first > head
        finally:
            wf.store.close()


def _new_run(store: EventStore, run_id: str, parent: str | None = None) -> int:
    create = NewRun(status="finished", parent_run_id=parent, parent_seq=1 if parent else None)
    return int(store.append_sync(Commit(run_id, [Record("k", None, "{}")], create=create)).last_seq)


def test_store_delete_keeps_changed_held_and_parent_runs(store: EventStore) -> None:
    """The store's own rules, on every backend: a run whose last seq is not the one the
    caller saw, one a live lease holds, and the parent of a run not deleted are kept."""
    seen = {r: _new_run(store, r) for r in ("plain", "changed", "held", "parent")}
    child = _new_run(store, "child", parent="parent")
    store.append_sync(Commit("changed", [Record("k", None, "{}")]))
    assert store.lease_sync("held", "worker-1", 60.0)
    assert store.delete_runs(seen) == ["plain"]
    assert {r.run_id for r in store.runs()} == {"changed", "held", "parent", "child"}
    both = {"child": child, "parent": seen["parent"]}
    assert store.delete_runs(both) == ["child", "parent"]
    assert store.delete_runs({"nope": None}) == []
    store.reclaim()
    assert {r.run_id for r in store.runs()} == {"changed", "held"}


def test_run_keys_are_never_reused_after_the_newest_run_is_pruned(tmp_path: Path) -> None:
    """A run's integer key (which caches and owners' locks use) is never handed out again,
    also by a store opened anew."""
    db = tmp_path / "p.db"
    with EventStore(db) as store:
        seen = {r: _new_run(store, r) for r in ("a", "b")}
        top = store.run("b").rid
        assert store.delete_runs({"b": seen["b"]}) == ["b"]
        _new_run(store, "c")
        assert store.run("c").rid == top + 1
    with EventStore(db) as store:
        assert store.delete_runs({"c": store.run("c").last_seq}) == ["c"]
        assert store.delete_runs({"a": seen["a"]}) == ["a"]  # the newest is older than the floor
    with EventStore(db) as store:
        _new_run(store, "d")
        assert store.run("d").rid == top + 2
