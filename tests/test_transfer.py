"""A run travels: ``workflow export`` writes it (with the ancestors its fork needs) into a
store file of its own, ``workflow import`` adds that file's runs to another store, and
``state``, ``diff``, ``verify`` and ``fork`` give there what they give on the original."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.flows import Asker
from tests.test_cli import invoke, ok
from tests.test_journal import FIXTURE, load_rows
from tests.test_snapshots import Chat, assert_snapshots_are_the_fold, chat
from workflow import HumanResponseEvent, Worker
from workflow import _journal as J
from workflow._check import check_store
from workflow._errors import RunSuspendedError, WorkflowRuntimeError
from workflow._fold import APPLY, fold
from workflow._folded import STATUS_OF_KIND
from workflow._read import fold_run, run_info, start_state
from workflow._snapshot import dump_folded


@pytest.fixture
def forked(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A store with an unrelated run, a chat run, and a fork of it at its middle."""
    db = tmp_path / "prod.db"

    async def go() -> tuple[str, str, str]:
        store = EventStore(db)
        _, other = await chat(store, 30)
        wf, parent = await chat(store, 400)
        cps = wf.checkpoints(parent)
        fork = wf.run_from(cps[len(cps) // 2])
        assert await fork == 400
        await store.flush()
        await chat(store, 20)  # written after the fork: not its ancestor's
        store.close()
        return other, parent, fork.run_id

    other, parent, fork = asyncio.run(go())
    return db, other, parent, fork


def states(db: Path, run: str) -> dict[int, bytes]:
    """The run's folded state (JSON) at every commit, through its snapshots."""
    with EventStore(db, readonly=True) as store:
        ends = sorted({r.commit_seq for r in store.records(run)})
        return {s: dump_folded(fold_run(store, run, s)) for s in ends}


def test_an_export_reads_exactly_as_the_original(
    forked: tuple[Path, str, str, str], tmp_path: Path
) -> None:
    """The export holds the fork and its parent up to the fork's seq, nothing else, with the
    same seqs, times and snapshots: every state and command reads alike."""
    db, _, parent, fork = forked
    out = tmp_path / "run.db"
    result = invoke("export", db, fork, "-o", out)
    assert result.exit_code == 0, result.stderr
    with EventStore(out, readonly=True) as exported, EventStore(db, readonly=True) as prod:
        assert [r.run_id for r in exported.runs()] == [parent, fork]
        info = exported.run(parent)
        assert info.last_seq == prod.run(fork).parent_seq
        assert info.meta["copied_upto"] == info.last_seq
        assert [tuple(r) for r in exported.records(fork)] == [tuple(r) for r in prod.records(fork)]
        assert check_store(exported).ok
        assert_snapshots_are_the_fold(exported, fork)
        assert exported.snapshot_stats(fork) == prod.snapshot_stats(fork)
    assert states(out, fork) == states(db, fork)
    for args in (["state", fork], ["history", fork, "--json"], ["checkpoints", fork]):
        assert ok(args[0], out, *args[1:]) == ok(args[0], db, *args[1:])
    a, b = sorted(states(db, fork))[3], sorted(states(db, fork))[-4]
    assert ok("diff", out, fork, a, b, "--json") == ok("diff", db, fork, a, b, "--json")
    spec = "tests.test_snapshots:Chat"
    verified = invoke("verify", out, fork, "--workflow", spec)
    assert verified.exit_code == 0, verified.stdout + verified.stderr


def test_a_fork_of_the_export_runs(forked: tuple[Path, str, str, str], tmp_path: Path) -> None:
    """``fork`` works on the export: a new run from one of its checkpoints ends as it should."""
    db, _, _, fork = forked
    out = tmp_path / "run.db"
    ok("export", db, fork, "-o", out)

    async def go() -> None:
        wf = Chat(store=str(out), timeout=None)
        cps = wf.checkpoints(fork)
        again = wf.run_from(cps[10])
        assert await again == 400
        await wf.store.flush()
        assert wf.state_at(again.run_id).context["turns"] == 400
        wf.store.close()

    asyncio.run(go())


def test_import_moves_seqs_past_the_store_and_reads_alike(
    forked: tuple[Path, str, str, str], tmp_path: Path
) -> None:
    """Imported into a store whose log is past the export's seqs, every seq moves by one
    offset (the payloads that name seqs too) and every state reads as it did."""
    db, _, parent, fork = forked
    out = tmp_path / "run.db"
    ok("export", db, fork, "-o", out)
    laptop = tmp_path / "laptop.db"

    async def busy() -> None:
        with EventStore(laptop) as store:
            await chat(store, 500)  # a log longer than the export's

    asyncio.run(busy())
    result = invoke("import", laptop, out)
    assert result.exit_code == 0, result.stderr
    with EventStore(out, readonly=True) as src, EventStore(laptop, readonly=True) as dst:
        offset = dst.run(parent).first_seq - src.run(parent).first_seq  # type: ignore[operator]
        assert offset > 0
        assert dst.run(fork).parent_seq == src.run(fork).parent_seq + offset  # type: ignore[operator]
        assert check_store(dst).ok
        assert_snapshots_are_the_fold(dst, fork)
        for seq, text in states(out, fork).items():
            moved = json.loads(dump_folded(fold_run(dst, fork, seq + offset)))
            original = json.loads(text)
            for key, (value, full, patch, at, full_at, *ref) in original["context"].items():
                shifted = [value, full, patch, at + offset, full_at + offset, *ref]
                assert moved["context"][key] == shifted
            assert moved["seq"] == original["seq"] + offset
            assert moved["exec_us"] == original["exec_us"]  # times kept
    again = invoke("import", laptop, out)
    assert again.exit_code != 0
    assert "already in the target store" in again.output


def test_export_refuses_an_existing_file(forked: tuple[Path, str, str, str]) -> None:
    """An export never overwrites: the file named by -o must not exist."""
    db, other, _, _ = forked
    result = invoke("export", db, other, "-o", db)
    assert result.exit_code == 2
    assert "exists" in result.stderr


def test_exported_ancestors_never_run(tmp_path: Path) -> None:
    """An export of a fork carries its ancestor cut at the fork's seq, unfinished there:
    once imported, ``runs`` marks it an exported ancestor, ``recover`` and workers skip it,
    ``resume`` refuses it, and recover runs only the fork."""
    db, out, laptop = tmp_path / "prod.db", tmp_path / "run.db", tmp_path / "laptop.db"

    async def produce() -> tuple[str, str, int]:
        wf = Asker(store=str(db), timeout=None)
        first = wf.run()
        await first.wait_until_waiting(10)
        wf.send(first.run_id, HumanResponseEvent(response="ada"))
        assert await first == "hello ada"
        cut = wf.checkpoints(first.run_id)[0]  # its start event still queued there
        fork = wf.run_from(cut)
        await fork.wait_until_waiting(10)
        await fork.suspend()
        with pytest.raises(RunSuspendedError):
            await fork
        await wf.store.flush()
        wf.store.close()
        return first.run_id, fork.run_id, cut.seq

    parent, fork, at = asyncio.run(produce())
    ok("export", db, fork, "-o", out)
    asyncio.run(_grow(laptop))
    ok("import", laptop, out)
    rows = {r["run_id"]: r for r in json.loads(ok("runs", laptop, "--json"))}
    with EventStore(laptop, readonly=True) as store:
        moved = store.run(fork).parent_seq
    assert moved is not None
    assert moved > at  # the import moved the seqs past the laptop's
    assert rows[parent]["copied_upto"] == moved
    assert "copied_upto" not in rows[fork]
    text = ok("runs", laptop)
    assert f"ancestor (exported up to seq {moved})" in text

    async def debug() -> None:
        wf = Asker(store=str(laptop), timeout=None)
        assert wf.state_at(parent).status == "interrupted"  # what it was at the cut
        assert wf.pending_runs() == [fork]
        with pytest.raises(WorkflowRuntimeError, match="exported ancestor"):
            wf.resume(parent)
        wf.send(fork, HumanResponseEvent(response="bob"))
        assert Worker(wf)._candidates() == [fork]  # a worker would take the fork alone
        found = wf.recover()
        assert [(r.run_id, r.outcome) for r in found] == [(fork, "resumed")]
        assert found[0].handler is not None
        assert await found[0].handler == "hello bob"
        await wf.store.flush()
        assert wf.pending_runs() == []
        wf.store.close()

    asyncio.run(debug())


async def _grow(db: Path) -> None:
    """Gives a store a log longer than the export's, so that an import moves its seqs."""
    with EventStore(db) as store:
        await chat(store, 40)


def test_export_of_an_encrypted_fork_without_the_key(tmp_path: Path) -> None:
    """Without the key, an encrypted fork exports with its ancestor, payloads copied sealed
    as they are (the cut needs only seqs, the ancestor's status only kinds): with the key the
    export reads as the original. An import that must move seqs needs the key and says so."""
    from eventstore import add_key, load_key_file

    db, keys = tmp_path / "sealed.db", tmp_path / "keys.json"
    add_key(keys)

    async def go() -> tuple[str, str]:
        store = EventStore(db, payload_codec=load_key_file(keys))
        wf, parent = await chat(store, 40)
        cps = wf.checkpoints(parent)
        fork = wf.run_from(cps[len(cps) // 2])
        assert await fork == 40
        await store.flush()
        store.close()
        return parent, fork.run_id

    parent, fork = asyncio.run(go())
    plain, keyed = tmp_path / "plain.db", tmp_path / "keyed.db"
    ok("export", db, fork, "-o", plain)
    ok("--key-file", keys, "export", db, fork, "-o", keyed)
    with EventStore(plain, readonly=True) as exported, EventStore(db, readonly=True) as prod:
        assert [r.run_id for r in exported.runs()] == [parent, fork]
        assert [tuple(r) for r in exported.records(fork)] == [tuple(r) for r in prod.records(fork)]
    runs = {r["run_id"]: r for r in json.loads(ok("runs", "--json", plain))}
    runs_keyed = {r["run_id"]: r for r in json.loads(ok("runs", "--json", keyed))}
    assert runs == runs_keyed
    assert runs[parent]["copied_upto"] == runs_keyed[parent]["copied_upto"]
    with_key = ("--key-file", keys, "state", "--json")
    assert json.loads(ok(*with_key, plain, fork)) == json.loads(ok(*with_key, db, fork))
    assert ok("--key-file", keys, "check", plain).strip() == ""
    target = tmp_path / "busy.db"
    asyncio.run(chat(EventStore(target), 30))  # its seqs are where the export's would go
    moved = invoke("import", target, plain)
    assert moved.exit_code == 1, moved.output
    assert "is encrypted (key id 'k1')" in moved.stderr
    assert "--key-file" in moved.stderr
    with EventStore(target, readonly=True) as busy:
        assert len(busy.runs()) == 1  # refused before anything was written


def test_the_status_from_kinds_alone_is_the_folds_for_every_kind(tmp_path: Path) -> None:
    """The status an encrypted ancestor is exported with when its payloads cannot be read
    (``STATUS_OF_KIND``, from kinds alone) is, after each record of every kind of the golden
    runs, the status the fold gives there."""
    runs = json.loads(FIXTURE.read_text(encoding="utf-8"))["runs"]
    db = tmp_path / "golden.db"
    load_rows(db, runs)
    seen = set()
    with EventStore(db, readonly=True) as store:
        for label in runs:
            info = run_info(store, label)
            state = start_state(store, info, cached=False)
            for r in store.records(label):
                before = state.status
                fold(state, [r])
                assert state.status == STATUS_OF_KIND.get(r.kind, before), (label, r.seq, r.kind)
                seen.add(r.kind)
    assert seen == set(J.KINDS)
    assert set(STATUS_OF_KIND) <= set(APPLY)


def test_import_into_a_missing_store_creates_it(
    forked: tuple[Path, str, str, str], tmp_path: Path
) -> None:
    """``workflow import DB FILE`` with no file at DB creates the store there (as
    ``EventStore(path)`` does) with the export's runs at their seqs; a missing FILE (the two
    arguments swapped, most often) is one line saying which is which, and creates nothing."""
    db, _, parent, fork = forked
    out = tmp_path / "run.db"
    ok("export", db, fork, "-o", out)
    new = tmp_path / "laptop" / "new.db"
    new.parent.mkdir()
    swapped = invoke("import", out, new)
    assert swapped.exit_code == 1
    assert swapped.stderr == (
        f"error: {new}: no such file to import; `workflow import DB FILE` adds the runs of"
        " FILE (an export) to the store DB, which it creates when missing\n"
    )
    assert list(new.parent.iterdir()) == []
    result = invoke("import", new, out)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"imported {parent}, {fork} into {new}\n"
    with EventStore(out, readonly=True) as src, EventStore(new, readonly=True) as dst:
        assert [r.run_id for r in dst.runs()] == [r.run_id for r in src.runs()]
        assert dst.run(fork).first_seq == src.run(fork).first_seq
        assert check_store(dst).ok
    assert states(new, fork) == states(out, fork)
