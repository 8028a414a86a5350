"""A deploy that deprecates a patch never fails a run its code cannot finish.

Runs are recorded by a real process of version 1 (no patch), which dies inside step
``answer`` after a commit of that input (``tests.test_deploying``). The code deployed next
calls ``ctx.deprecate_patch("polite")``: its refusal stops the run unfailed and resumable,
code that keeps the patch finishes it, and a workflow that declares ``deprecated_patches``
has such runs listed by a static verify and left alone by ``recover --check``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from tests.support.ui_server import wait_for
from tests.test_deploying import (
    DEPRECATED,
    MODULE,
    PATCHED,
    POLITE,
    ROOT,
    _write,
    loaded,
    record_old_run,
)
from workflow import DeprecatedPatchError, Worker, WorkflowRuntimeError
from workflow._patch_check import declared_patches
from workflow._verify import verify
from workflow.errors import WorkflowValidationError

DECLARED = "class Flow(Workflow):\n    deprecated_patches = {'polite': 'answer'}\n"


def _module(root: Path, body: str, *, declared: bool = False) -> Path:
    text = PATCHED.format(body=body)
    if declared:
        text = text.replace("class Flow(Workflow):\n", DECLARED)
    return _write(root, MODULE, text)


def kinds(db: Path, run_id: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT kind FROM records WHERE run_id = ? ORDER BY seq", (run_id,))
        return [k for (k,) in rows]


async def test_a_refusal_stops_the_run_unfailed_and_code_with_the_patch_finishes_it(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path, "old", topic="paid")
    # The step catches the refusal and goes on: the run is stopped all the same.
    caught = DEPRECATED.replace(
        'ctx.deprecate_patch("polite")',
        'try:\n            ctx.deprecate_patch("polite")\n        except Exception:\n'
        "            pass",
    )
    for body in (DEPRECATED, caught):
        with loaded(_module(tmp_path / "v3", body)) as mod:
            wf = mod.Flow(store=str(db))
            with pytest.raises(DeprecatedPatchError, match="patch 'polite' is deprecated") as err:
                await wf.resume("old")
            assert isinstance(err.value, WorkflowRuntimeError)
            assert (err.value.run_id, err.value.step, err.value.patch_id) == (
                "old",
                "answer",
                "polite",
            )
            assert "not failed, and is left resumable" in str(err.value)
            assert wf.state_at("old").status == "interrupted"
            assert wf.pending_runs() == ["old"]
    assert "run_failed" not in kinds(db, "old")
    # The code that still has the old branch finishes it, the old way.
    with loaded(_module(tmp_path / "v2", POLITE)) as mod:
        assert await mod.Flow(store=str(db)).resume("old") == "paid"


async def test_declared_deprecated_patches_are_checked_by_verify_and_recover(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path, "old", topic="paid")
    record_old_run(tmp_path, "early", topic="early")  # died in `ask`: no Question yet
    with loaded(_module(tmp_path / "v3", DEPRECATED, declared=True)) as mod:
        wf = mod.Flow(store=str(db))
        for reexecute in (False, True):
            report = verify(wf, ["old"], reexecute=reexecute)
            (problem,) = [p for p in report.problems if p.kind == "patch"]
            assert problem.step == "answer"
            assert "in-progress event 2 would be refused by" in problem.message
            assert "ctx.deprecate_patch('polite')" in problem.message
        assert verify(wf, ["early"]).ok
        before = kinds(db, "old")
        found = {r.run_id: r for r in await wf.recover(compatible_only=True)}
        assert found["old"].outcome == "incompatible"
        assert "deprecate_patch('polite')" in str(found["old"].error)
        assert kinds(db, "old") == before  # nothing of it ran
        assert found["early"].outcome == "resumed"
        assert found["early"].handler is not None
        assert await found["early"].handler == "please, early"
    # Without the declaration only running the step tells: the resume stops it, unfailed.
    with loaded(_module(tmp_path / "v3b", DEPRECATED)) as mod:
        wf = mod.Flow(store=str(db))
        assert verify(wf, ["old"], reexecute=True).ok
        (again,) = await wf.recover(compatible_only=True)
        assert again.outcome == "resumed"
        assert again.handler is not None
        with pytest.raises(DeprecatedPatchError):
            await again.handler
        assert wf.state_at("old").status == "interrupted"


def test_cli_recover_says_a_refused_run_is_interrupted_not_failed(tmp_path: Path) -> None:
    db = record_old_run(tmp_path, "old", topic="paid")
    root = _module(tmp_path / "v3", DEPRECATED)
    env = {"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin"}
    args = ["-m", "workflow", "recover", str(db), "--workflow", f"{MODULE}:Flow", "--json"]

    def run(*more: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, *args, *more]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    proc = run()
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["outcome"], row["status"]) == ("resumed", "interrupted"), row
    assert "DeprecatedPatchError" in row["error"]
    _module(root, DEPRECATED, declared=True)
    proc = run("--check")
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["outcome"] == "incompatible", row
    assert [p["kind"] for p in row["problems"]] == ["patch"]
    _module(root, POLITE)  # the code that keeps the patch finishes it
    proc = run("--check")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["outcome"], row["status"], row["result"]) == ("resumed", "finished", "paid")


def test_bad_deprecated_patches_are_refused_clearly() -> None:
    class Good:
        deprecated_patches: ClassVar[dict[str, object]] = {"a": ("s", "t"), "b": "u"}

    class AnySet:
        deprecated_patches = frozenset({"a"})

    class Bad:
        deprecated_patches = "a"

    assert declared_patches(Good) == {"a": frozenset({"s", "t"}), "b": frozenset({"u"})}
    assert declared_patches(AnySet) == {"a": None}
    with pytest.raises(WorkflowValidationError, match="must be a set of patch ids"):
        declared_patches(Bad)


async def test_a_worker_claims_a_refused_run_once_and_leaves_it_resumable(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path, "old", topic="paid")
    with loaded(_module(tmp_path / "v3", DEPRECATED)) as mod:
        wf = mod.Flow(store=str(db))
        worker = Worker(wf, poll_interval=0.01)
        task = asyncio.create_task(worker.run())
        claimed = lambda: "run_resumed" in kinds(db, "old")  # noqa: E731
        await asyncio.to_thread(wait_for, claimed, "the worker to claim the run")
        # Many more polls: the refused run is not claimed again (each claim would count a
        # start toward its recovery limit).
        await asyncio.sleep(0.3)
        worker.stop()
        await task
        assert kinds(db, "old").count("run_resumed") == 1
        assert wf.state_at("old").status == "interrupted"
    with loaded(_module(tmp_path / "v2", POLITE)) as mod:
        assert await mod.Flow(store=str(db)).resume("old") == "paid"
