"""``deprecate_patch`` lets through the inputs begun by code that had deprecated the patch.

Each session's start record (``run_started``, a fork's, ``run_resumed``) names the patches
its workflow class declares in ``deprecated_patches``; an input first started in such a
session never took the old branch, so a resume refuses it neither at run time nor in a
static ``verify``. Runs are recorded by real processes SIGKILLed while a step holds (the
step waits forever once its start is durable), with three versions of one module: code
that deprecates the patch (and declares it), code that keeps ``ctx.patched``, and code
from before the patch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter

from eventstore import Commit, EventStore, LogCorruptedError, NewRun, Record
from tests.support.child import child
from tests.support.ui_server import wait_for
from tests.test_deploying import ROOT, _cli, _write, loaded
from workflow import DeprecatedPatchError, Workflow
from workflow import _journal as J
from workflow._fold import Folded
from workflow._read import fold_run
from workflow._snapshot import SnapshotError, dump_folded, load_folded
from workflow._verify import verify
from workflow.errors import WorkflowValidationError

MODULE = "deployflow"

FLOW = """
import asyncio
import os

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Question(Event):
    text: str


async def _hold(where: str) -> None:
    if os.environ.get("HOLD") == where:
        await asyncio.Event().wait()  # the parent kills the process here


class Flow(Workflow):
    {declared}

    @step
    async def ask(self, ev: StartEvent) -> Question:
        await _hold("ask")
        return Question(text=ev.topic)

    @step
    async def answer(self, ctx: Context, ev: Question) -> StopEvent:
        await _hold("answer")
        {body}
"""
DEPRECATING = """ctx.deprecate_patch("polite")
        return StopEvent(result=f"please, {ev.text}")"""
KEEPING = """if await ctx.patched("polite"):
            return StopEvent(result=f"please, {ev.text}")
        return StopEvent(result=ev.text)"""
BEFORE = """return StopEvent(result=ev.text)  # before the patch: the old code"""
DECLARED = "deprecated_patches = {'polite': 'answer'}"

SCRIPT = """
import asyncio
import sys

from deployflow import Flow


async def main() -> None:
    wf = Flow(store=sys.argv[1])
    if sys.argv[3] == "resume":
        await wf.resume(sys.argv[2])
    else:
        await wf.run(topic=sys.argv[3], run_id=sys.argv[2])


asyncio.run(main())
"""


def version(root: Path, body: str, *, declared: bool = False) -> Path:
    """The module's directory with ``body`` in step ``answer`` (declaring the patch)."""
    text = FLOW.format(body=body, declared=DECLARED if declared else "pass")
    return _write(root, MODULE, text)


def kinds(db: Path, run_id: str) -> list[tuple[str, str | None]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as con:
        try:
            rows = con.execute(
                "SELECT kind, step FROM records WHERE run_id = ? ORDER BY seq", (run_id,)
            )
            return list(rows)
        except sqlite3.OperationalError:  # the schema is not created yet
            return []


def payloads(db: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT payload FROM records WHERE run_id = ? AND kind = ? ORDER BY seq",
            (run_id, kind),
        )
        return [json.loads(p) for (p,) in rows]


def held(root: Path, db: Path, run_id: str, step: str, how: str = "resume") -> None:
    """Runs (``how``: a topic) or resumes ``run_id`` with the module in ``root`` in a real
    process, and SIGKILLs it once a new start of ``step`` is in the store (the step then
    waits forever: it never finishes)."""
    before = kinds(db, run_id).count(("step_started", step))
    env = {"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin", "HOLD": step}
    with child(
        [sys.executable, "-c", SCRIPT, str(db), run_id, how],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as proc:

        def started() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return kinds(db, run_id).count(("step_started", step)) > before

        wait_for(started, f"a durable start of {step!r} in run {run_id!r}")
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def patch_problems(wf: Workflow, run_id: str) -> list[str]:
    return [p.message for p in verify(wf, [run_id]).problems if p.kind == "patch"]


async def test_an_input_begun_by_the_deprecating_code_resumes_with_that_code(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    new = version(tmp_path / "new", DEPRECATING, declared=True)
    for run_id in ("r", "checked"):  # each start is durable, then the process dies
        held(new, db, run_id, "answer", how=run_id)
    with loaded(new) as mod:
        wf = mod.Flow(store=str(db))
        assert await wf.resume("r") == "please, r"
        assert patch_problems(wf, "checked") == []  # verify agrees: nothing to refuse
        (found,) = await wf.recover(compatible_only=True)
        assert (found.run_id, found.outcome) == ("checked", "resumed"), found.problems
        assert found.handler is not None
        assert await found.handler == "please, checked"
    assert payloads(db, "r", "memoized") == []  # deprecate_patch records nothing
    with loaded(version(tmp_path / "keeping", KEEPING)) as mod:
        # Re-executed by code with the patch (a rollback's check): the attempts of the
        # declaring code took the new branch, and the replay does too.
        report = verify(mod.Flow(store=str(db)), ["r", "checked"], reexecute=True)
        assert report.ok, report.problems
        assert report.attempts_reexecuted >= 2
    for kind in ("run_started", "run_resumed"):
        (session,) = payloads(db, "r", kind)
        assert session["deprecated_patches"] == ["polite"]
        TypeAdapter(J.PAYLOADS[kind]).validate_json(orjson.dumps(session), strict=True)
    text = _cli(new, "history", str(db), "r", "--kind", "run_resumed")
    (line,) = [ln for ln in text.splitlines() if "run_resumed" in ln]
    assert "deprecates patches polite" in line, line


async def test_an_input_begun_before_the_declaration_is_still_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    held(version(tmp_path / "before", BEFORE), db, "r", "answer", how="hi")
    assert "deprecated_patches" not in payloads(db, "r", "run_started")[0]
    with loaded(version(tmp_path / "new", DEPRECATING, declared=True)) as mod:
        wf = mod.Flow(store=str(db))
        (problem,) = patch_problems(wf, "r")
        assert "in a session of code that did not declare the patch" in problem
        with pytest.raises(DeprecatedPatchError, match="did not declare the patch"):
            await wf.resume("r")
        assert wf.state_at("r").status == "interrupted"
        # The declaring session that refused it changes nothing: still refused.
        assert len(patch_problems(wf, "r")) == 1
    with loaded(version(tmp_path / "keeping", KEEPING)) as mod:
        assert await mod.Flow(store=str(db)).resume("r") == "hi"  # the old branch


async def test_code_with_the_patch_resuming_such_an_input_takes_the_new_branch(
    tmp_path: Path,
) -> None:
    # A rollback to code that keeps `ctx.patched`: the input was begun by code without the
    # old branch, so its answer is True (the deprecating code's own branch).
    db = tmp_path / "runs.db"
    held(version(tmp_path / "new", DEPRECATING, declared=True), db, "r", "answer", how="hi")
    with loaded(version(tmp_path / "keeping", KEEPING)) as mod:
        assert await mod.Flow(store=str(db)).resume("r") == "please, hi"
    assert [p["result"] for p in payloads(db, "r", "memoized")] == [True]


async def test_an_input_begun_by_a_session_that_undeclared_it_is_refused(tmp_path: Path) -> None:
    # The declaring code begins the run; code from before the patch (no declaration) takes
    # over and begins `answer`'s input, which may have run the old code: the declaration
    # of the first session does not cover it, nor does the next declaring session.
    db = tmp_path / "runs.db"
    new = version(tmp_path / "new", DEPRECATING, declared=True)
    held(new, db, "r", "ask", how="hi")
    held(version(tmp_path / "before", BEFORE), db, "r", "answer")
    sessions = payloads(db, "r", "run_resumed")
    assert [s.get("deprecated_patches") for s in sessions] == [None]
    with loaded(new) as mod:
        wf = mod.Flow(store=str(db))
        (problem,) = patch_problems(wf, "r")
        assert "in-progress event 2 would be refused" in problem
        with pytest.raises(DeprecatedPatchError, match="did not declare the patch"):
            await wf.resume("r")
        with EventStore(db, readonly=True) as store:
            folded = fold_run(store, "r", None, cached=False)
        marks = folded.deprecated["polite"]
        assert len(marks) == 3  # declared, not declared, declared again
        assert marks[0] == fold_run_first(db)
    with loaded(version(tmp_path / "keeping", KEEPING)) as mod:
        assert await mod.Flow(store=str(db)).resume("r") == "hi"


def fold_run_first(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as con:
        ((seq,),) = con.execute(
            "SELECT seq FROM records WHERE run_id = 'r' AND kind = 'run_started'"
        )
        return int(seq)


async def test_a_fork_goes_by_the_session_that_began_each_input(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    new = version(tmp_path / "new", DEPRECATING, declared=True)
    held(new, db, "by-new", "answer", how="hi")
    held(version(tmp_path / "before", BEFORE), db, "by-old", "answer", how="yo")
    with loaded(new) as mod:
        wf = mod.Flow(store=str(db))
        fork = wf.run_from(("by-new", wf.state_at("by-new").seq))
        assert await fork == "please, hi"
        (started,) = payloads(db, fork.run_id, "run_started")
        assert started["deprecated_patches"] == ["polite"]
        assert started["parent"]["run_id"] == "by-new"
        # An input the parent began with code that could take the old branch: refused.
        refused = wf.run_from(("by-old", wf.state_at("by-old").seq))
        with pytest.raises(DeprecatedPatchError):
            await refused


async def test_undeclared_deprecate_patch_still_refuses_what_it_cannot_tell(
    tmp_path: Path,
) -> None:
    # Without the declaration the session's record names nothing: the input began before
    # the resuming session, so deprecate_patch refuses it, as before.
    db = tmp_path / "runs.db"
    undeclared = version(tmp_path / "undeclared", DEPRECATING)
    held(undeclared, db, "r", "answer", how="hi")
    assert "deprecated_patches" not in payloads(db, "r", "run_started")[0]
    with loaded(undeclared) as mod, pytest.raises(DeprecatedPatchError):
        await mod.Flow(store=str(db)).resume("r")


def test_declared_sessions_survive_a_snapshot_and_old_snapshots_read_as_none() -> None:
    s = Folded("r", seq=9, first_seq=1, session=9)
    s.deprecated = {"polite": [1, 5, 9], "other": [5]}
    s.started = {"answer": {2: 3}}
    back = load_folded(dump_folded(s))
    assert back.deprecated == s.deprecated
    assert back == s
    old = json.loads(dump_folded(s))
    old["v"] = 7
    del old["deprecated"]
    assert load_folded(json.dumps(old)).deprecated == {}
    for bad in ([5, 1], ["1"], [True]):
        broken = json.loads(dump_folded(s))
        broken["deprecated"] = {"polite": bad}
        with pytest.raises(SnapshotError, match="deprecated patch"):
            load_folded(json.dumps(broken))


def test_bad_deprecated_patches_are_refused_when_the_workflow_is_built(tmp_path: Path) -> None:
    with loaded(version(tmp_path / "bad", BEFORE)) as mod:
        bad = type("Bad", (mod.Flow,), {"deprecated_patches": "polite"})
        with pytest.raises(WorkflowValidationError, match="must be a set of patch ids"):
            bad()


def test_an_old_fixture_store_opens_folds_and_forks_with_declaring_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.loop import LoopFlow

    copy = tmp_path / "old.db"
    shutil.copy(Path(__file__).resolve().parent / "fixtures" / "store_v2.sqlite", copy)
    with EventStore(copy) as store:
        assert fold_run(store, "old-loop").deprecated == {}  # no session declared any
    monkeypatch.setattr(LoopFlow, "deprecated_patches", {"polite"}, raising=False)

    async def fork() -> None:
        wf = LoopFlow(store=str(copy), timeout=None)
        assert await wf.resume("old-loop") == 40  # finished: its stored result
        handler = wf.run_from(wf.checkpoints("old-loop")[30])
        assert await handler == 40
        await wf.store.flush()
        (started,) = [r for r in wf.store.records(handler.run_id) if r.kind == "run_started"]
        assert json.loads(started.payload)["deprecated_patches"] == ["polite"]
        assert fold_run(wf.store, handler.run_id).deprecated == {"polite": [started.seq]}
        wf.store.close()

    asyncio.run(fork())


def test_a_session_start_with_malformed_deprecated_patches_is_named(tmp_path: Path) -> None:
    with EventStore(tmp_path / "runs.db") as store:
        payload = {"workflow": "m:F", "fingerprint": "", "start": None, "parent": None}
        bad = Record("run_started", None, json.dumps({**payload, "deprecated_patches": [1]}))
        store.append_sync(Commit("r", [bad], epoch=1, create=NewRun(meta={}, status="running")))
        with pytest.raises(LogCorruptedError, match="are not all ids"):
            fold_run(store, "r", cached=False)
