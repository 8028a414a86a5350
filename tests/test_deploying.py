"""Deploying new code while runs are in flight: versioned classes and upcasters.

Runs are recorded by a real process running one version of a workflow module (written to a
directory of its own), which dies inside a step; the test then loads a changed version of
the same module (an event's field renamed and one added) and resumes, forks and inspects
the old runs with it, with and without an upcaster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from eventstore import Codec, LogCorruptedError, UpcastError, class_version, split_version, upcaster
from workflow import WorkflowChangedError
from workflow._verify import verify
from workflow.cli import cli

ROOT = Path(__file__).resolve().parent.parent
MODULE = "deployflow"

V1 = """
import os

from workflow import Event, StartEvent, StopEvent, Workflow, step


class Question(Event):
    body: str


class Flow(Workflow):
    @step
    async def ask(self, ev: StartEvent) -> Question:
        return Question(body=ev.topic)

    @step
    async def answer(self, ev: Question) -> StopEvent:
        os._exit(3)  # this version dies here: its runs are left with a Question to answer
"""

V2 = """
from typing import Any

from workflow import Event, StartEvent, StopEvent, Workflow, step, upcaster


class Question(Event):
    __version__ = 2
    text: str  # was "body"
    lang: str  # new
{upcaster}

class Flow(Workflow):
    @step
    async def ask(self, ev: StartEvent) -> Question:
        return Question(text=ev.topic, lang="fr")

    @step
    async def answer(self, ev: Question) -> StopEvent:
        return StopEvent(result=f"{{ev.text}}/{{ev.lang}}")
"""

UPCASTER = """

@upcaster(Question, from_version=1)
def _question_v1(fields: dict[str, Any]) -> dict[str, Any]:
    fields["text"] = fields.pop("body")
    fields["lang"] = "en"
    return fields
"""

RECORD = """
import asyncio
import sys

from deployflow import Flow


async def main() -> None:
    await Flow(store=sys.argv[1]).run(topic="hi", run_id=sys.argv[2])


asyncio.run(main())
"""


def _write(root: Path, name: str, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{MODULE}.py"
    path.write_text(textwrap.dedent(text))
    return root


def record_old_run(tmp_path: Path, run_id: str = "old") -> Path:
    """A run recorded by version 1 in a process that died in step ``answer``."""
    v1 = _write(tmp_path / "v1", MODULE, V1)
    db = tmp_path / "runs.db"
    env = {"PYTHONPATH": f"{v1}:{ROOT}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", RECORD, str(db), run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    return db


@contextlib.contextmanager
def loaded(root: Path) -> Iterator[ModuleType]:
    """The module file in ``root`` imported as :data:`MODULE`, for the block only."""
    spec = importlib.util.spec_from_file_location(MODULE, root / f"{MODULE}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(MODULE, None)


def pending_events(wf: Any, run_id: str) -> list[Any]:
    """The events of a run's state still to be handled, in progress or queued."""
    state = wf.state_at(run_id)
    events = [e.event for es in state.in_progress.values() for e in es]
    return events + [e for es in state.queues.values() for e in es]


def stored_payloads(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return [row[0] for row in con.execute("SELECT payload FROM records ORDER BY seq")]


async def test_an_upcaster_lets_old_runs_resume_fork_and_show_with_new_code(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path)
    before = stored_payloads(db)
    assert any('"c":"deployflow:Question","v":{"body":"hi"}' in p for p in before)
    with loaded(_write(tmp_path / "v2", MODULE, V2.format(upcaster=UPCASTER))) as mod:
        wf = mod.Flow(store=str(db))
        assert pending_events(wf, "old") == [mod.Question(text="hi", lang="en")]
        cp = next(c for c in wf.checkpoints("old") if "deployflow:Question" in c.event_types)
        assert await wf.resume("old") == "hi/en"
        assert await wf.run_from(cp) == "hi/en"
        # New runs write the new version, and read it back without an upcaster.
        assert await wf.run(topic="new") == "new/fr"
        shown = CliRunner().invoke(
            cli, ["state", str(db), "old", "--at", str(cp.seq), "--workflow", f"{MODULE}:Flow"]
        )
        assert shown.exit_code == 0, shown.output
        assert "text='hi'" in shown.output or '"text": "hi"' in shown.output, shown.output
    after = stored_payloads(db)
    assert after[: len(before)] == before  # the log is never rewritten
    assert any('"c":"deployflow:Question@2","v":{"text":"new","lang":"fr"}' in p for p in after)


async def test_without_an_upcaster_resume_refuses_and_names_what_is_missing(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path)
    before = stored_payloads(db)
    with loaded(_write(tmp_path / "v2", MODULE, V2.format(upcaster=""))) as mod:
        wf = mod.Flow(store=str(db))
        with pytest.raises(WorkflowChangedError) as err:
            wf.resume("old")
        text = str(err.value)
        assert "deployflow:Question" in text
        assert "stored at version 1" in text
        assert "now version 2" in text
        assert "@upcaster(Question, from_version=1)" in text
        # Reading the state says the same (the typed state decodes events as they are read).
        with pytest.raises(LogCorruptedError, match="no upcaster turns version 1") as state_err:
            pending_events(wf, "old")
        cause = state_err.value.__cause__
        assert isinstance(cause, UpcastError)
        assert (cause.stored, cause.current) == (1, 2)
        report = verify(wf)
        assert not report.ok
        assert any("@upcaster(Question, from_version=1)" in p.message for p in report.problems)
    assert stored_payloads(db) == before


# -- the codec alone ---------------------------------------------------------------------------


def test_unversioned_classes_are_written_as_before() -> None:
    @dataclasses.dataclass
    class Plain:
        a: int

    codec = Codec()
    codec.register(Plain)
    assert class_version(Plain) == 1
    text = codec.encode(Plain(1))
    assert '"c":"tests.test_deploying:test_unversioned_classes_are_written_as_before.' in text
    assert "@" not in text
    assert split_version("m:C") == ("m:C", 1)
    assert split_version("m:C@12") == ("m:C", 12)
    with pytest.raises(ValueError, match="bad version"):
        split_version("m:C@x")


def test_upcasters_chain_one_version_at_a_time_and_never_change_the_stored_dump() -> None:
    @dataclasses.dataclass
    class Item:
        name: str
        tags: list[str]

    old = Codec()
    old.register(Item)
    v1 = old.dump(Item("a", ["x"]))

    @dataclasses.dataclass
    class Item:  # type: ignore[no-redef]
        __version__ = 3
        title: str
        tags: list[str]
        count: int

    new_item: Any = Item  # the class of version 3, as mypy sees it
    calls: list[int] = []

    @upcaster(Item, from_version=1)
    def _v1(f: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        f["title"] = f.pop("name")
        f["tags"].append("v1")
        return f

    @upcaster(Item, from_version=2)
    def _v2(f: dict[str, Any]) -> dict[str, Any]:
        calls.append(2)
        return {**f, "count": len(f["tags"])}

    new = Codec()
    new.register(Item)
    kept = json.dumps(v1)
    assert new.load(v1) == new_item("a", ["x", "v1"], 2)
    assert json.dumps(v1) == kept  # the upcaster's change of a list did not reach the dump
    assert calls == [1, 2]
    v3 = new.dump(new_item("b", [], 0))
    assert v3["c"].endswith("@3")
    v2 = {**v3, "c": v3["c"][:-2] + "@2", "v": {"title": "b", "tags": ["y"]}}
    assert new.load(v2) == new_item("b", ["y"], 1)


def test_bad_versions_and_upcasters_are_refused_clearly() -> None:
    @dataclasses.dataclass
    class Thing:
        __version__ = 2
        a: int

    with pytest.raises(ValueError, match=r"from_version must be 1\.\.1"):
        upcaster(Thing, from_version=2)

    @upcaster(Thing, from_version=1)
    def _one(f: dict[str, Any]) -> dict[str, Any]:
        return f

    with pytest.raises(ValueError, match="already has an upcaster from version 1"):
        upcaster(Thing, from_version=1)(lambda f: f)

    codec = Codec()
    codec.register(Thing)
    newer = codec.dump(Thing(1))
    newer["c"] = newer["c"].replace("@2", "@5")
    with pytest.raises(UpcastError, match="newer than this code's") as err:
        codec.load(newer)
    assert (err.value.stored, err.value.current) == (5, 2)

    @dataclasses.dataclass
    class Odd:
        __version__ = "2"
        a: int

    with pytest.raises(TypeError, match="should be an int >= 1"):
        class_version(Odd)
