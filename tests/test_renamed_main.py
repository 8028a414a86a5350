"""A script's run (classes recorded as ``__main__:X``) taken by code that renamed its class
and its step: ``renamed`` keyed by another module's name still matches, and the hints say
which step takes the work and that a class can be mapped in ``renamed``.

The run is recorded by a real ``python flows.py`` process that dies inside step ``answer``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_deploying import ROOT, loaded
from workflow import WorkflowChangedError
from workflow._verify import verify

SCRIPT = """
import asyncio
import os
import sys

from workflow import Event, StartEvent, StopEvent, Workflow, step


class Query(Event):
    text: str


class Support(Workflow):
    @step
    async def ask(self, ev: StartEvent) -> Query:
        return Query(text=ev.topic)

    @step
    async def answer(self, ev: Query) -> StopEvent:
        os._exit(3)


async def main() -> None:
    await Support(store=sys.argv[1]).run(topic="tea", run_id="r1")


asyncio.run(main())
"""

NEW = """
from typing import Any, ClassVar

from workflow import Event, StartEvent, StopEvent, Workflow, step


class Question(Event):  # was Query, in the script
    text: str


class Support(Workflow):
    renamed: ClassVar[dict[str, Any]] = {RENAMED}

    @step
    async def ask(self, ev: StartEvent) -> Question:
        return Question(text=ev.topic)

    @step
    async def reply(self, ev: Question) -> StopEvent:  # was "answer"
        return StopEvent(result=f"re: {ev.text}")
"""


def _recorded(tmp_path: Path) -> Path:
    db = tmp_path / "runs.db"
    script = tmp_path / "flows.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, str(script), str(db)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr
    return db


def _new(tmp_path: Path, renamed: str) -> Path:
    root = tmp_path / "new"
    root.mkdir(exist_ok=True)
    (root / "deployflow.py").write_text(textwrap.dedent(NEW.replace("RENAMED", renamed)))
    return root


async def test_a_class_renamed_from_a_scripts_run_matches_by_its_class_name(
    tmp_path: Path,
) -> None:
    db = _recorded(tmp_path)
    mapping = '"answer": "reply", "legacy:Query": Question'
    with loaded(_new(tmp_path, mapping)) as mod:
        wf = mod.Support(store=str(db))
        assert verify(wf, ["r1"]).ok, verify(wf, ["r1"]).problems
        assert await wf.resume("r1") == "re: tea"


async def test_the_hints_name_the_step_that_takes_the_work_and_the_class_mapping(
    tmp_path: Path,
) -> None:
    db = _recorded(tmp_path)
    with loaded(_new(tmp_path, '"legacy:Query": Question')) as mod:
        wf = mod.Support(store=str(db))
        with pytest.raises(WorkflowChangedError) as err:
            wf.resume("r1")
        # The event decodes (its class is mapped): the one step that takes it is named.
        assert "Support.renamed = {'answer': 'reply'}" in str(err.value), err.value
        assert "<its new name>" not in str(err.value)
    with loaded(_new(tmp_path, "")) as mod:
        wf = mod.Support(store=str(db))
        with pytest.raises(WorkflowChangedError) as err:
            wf.resume("r1")
        text = str(err.value)
        assert "{'answer': '<its new name>'}" in text, text
        assert "map its event's class too if that moved: {'__main__:Query': NewClass}" in text
        decode = [p.message for p in verify(wf, ["r1"]).problems if p.kind == "decode"]
        assert decode, verify(wf, ["r1"]).problems
        assert all("renamed = {'module:Query': NewClass}" in m for m in decode), decode
        assert all("neither" in m or "nor" not in m for m in decode), decode
