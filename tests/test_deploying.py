"""Deploying new code while runs are in flight: versioned classes and upcasters.

Runs are recorded by a real process running one version of a workflow module (written to a
directory of its own), which dies inside a step; the test then loads a changed version of
the same module (an event's field renamed and one added) and resumes, forks and inspects
the old runs with it, with and without an upcaster.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from eventstore import Codec, LogCorruptedError, UpcastError, class_version, split_version, upcaster
from workflow import WorkflowChangedError
from workflow._verify import verify
from workflow.cli import cli
from workflow.ui._actions import Actions

ROOT = Path(__file__).resolve().parent.parent
MODULE = "deployflow"

V1 = """
import os

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Question(Event):
    body: str


async def _paid() -> int:
    return 1


class Flow(Workflow):
    @step
    async def ask(self, ev: StartEvent) -> Question:
        if ev.topic == "early":
            os._exit(3)  # a run left before any Question was recorded
        return Question(body=ev.topic)

    @step
    async def answer(self, ctx: Context, ev: Question) -> StopEvent:
        if ev.body == "paid":
            await ctx.memo("paid", _paid)  # a commit of this attempt: its start is durable
        os._exit(3)  # this version dies here: its runs are left with a Question to answer
"""

V2 = """
from typing import Any, ClassVar

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
    await Flow(store=sys.argv[1]).run(topic=sys.argv[3], run_id=sys.argv[2])


asyncio.run(main())
"""


def _write(root: Path, name: str, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{MODULE}.py"
    path.write_text(textwrap.dedent(text))
    return root


def record_old_run(tmp_path: Path, run_id: str = "old", topic: str = "hi") -> Path:
    """A run recorded by version 1 in a process that died in step ``answer`` (in ``ask``
    for topic ``early``)."""
    db = tmp_path / "runs.db"
    dies(_write(tmp_path / "v1", MODULE, V1), RECORD, db, run_id, topic)
    return db


def dies(root: Path, script: str, db: Path, *args: str, **env: str) -> None:
    """Runs ``script`` on ``db`` with the module in ``root``, which dies (exit 3)."""
    env = {"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin", **env}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(db), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr


@contextlib.contextmanager
def loaded(root: Path) -> Iterator[ModuleType]:
    """The module file in ``root`` imported as :data:`MODULE` (and the modules beside it
    that it imports), for the block only."""
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(root))
        for name in set(sys.modules) - before:
            if name.startswith(MODULE):
                del sys.modules[name]


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


# -- renamed steps and moved classes -----------------------------------------------------------

EVENTS = """
from workflow import Event


class Ask(Event):  # was deployflow:Question
    body: str
"""

V3 = """
from deployflow_events import Ask

from workflow import StartEvent, StopEvent, Workflow, step


class Flow(Workflow):
    {renamed}

    @step
    async def ask(self, ev: StartEvent) -> Ask:
        return Ask(body=ev.topic)

    @step
    async def reply(self, ev: Ask) -> StopEvent:  # was "answer"
        return StopEvent(result=f"replied to {{ev.body}}")
"""
RENAMED = 'renamed = {"answer": "reply", "deployflow:Question": Ask}'


def _v3(tmp_path: Path, renamed: str) -> Path:
    root = _write(tmp_path / "v3", MODULE, V3.format(renamed=renamed))
    (root / f"{MODULE}_events.py").write_text(textwrap.dedent(EVENTS))
    return root


async def test_renamed_steps_and_moved_classes_take_old_work_everywhere(tmp_path: Path) -> None:
    db = record_old_run(tmp_path, "one")
    record_old_run(tmp_path, "two")
    with loaded(_v3(tmp_path, RENAMED)) as mod:
        wf = mod.Flow(store=str(db))
        assert verify(wf).ok, verify(wf).problems
        assert await wf.resume("one") == "replied to hi"
        # recover (what a service's startup and `workflow recover` do) routes them too.
        (got,) = [r for r in await wf.recover() if r.run_id == "two"]
        assert got.outcome == "resumed"
        assert got.handler is not None
        assert await got.handler == "replied to hi"
    resumed = [json.loads(p) for p in stored_payloads(db) if '"previous"' in p and '"renamed"' in p]
    assert [p["renamed"] for p in resumed] == [{"answer": "reply"}] * 2
    # Without the workflow's code, the command line folds the move from the log alone.
    from eventstore import EventStore
    from workflow._read import fold_run

    with EventStore(db, readonly=True) as store:
        assert fold_run(store, "one", cached=False).in_progress.get("answer", {}) == {}


async def test_a_resume_with_renamed_work_is_folded_the_same_by_the_page(tmp_path: Path) -> None:
    db = record_old_run(tmp_path, "one")
    with loaded(_v3(tmp_path, RENAMED)) as mod:
        wf = mod.Flow(store=str(db))
        handler = wf.resume("one")
        assert await handler == "replied to hi"
    from eventstore import EventStore
    from tests.test_page import page_fold, python_fold
    from workflow.cli._inspect import Viewer
    from workflow.cli._timeline import timeline_data

    view = Viewer()
    with EventStore(db, readonly=True) as store:
        got = page_fold(timeline_data(store, "one", view), tmp_path)
        want = python_fold(store, "one", view)
    assert got["states"] == want


async def test_without_renames_the_refusal_names_the_old_step_and_class(tmp_path: Path) -> None:
    db = record_old_run(tmp_path, "one")
    with loaded(_v3(tmp_path, "")) as mod:
        wf = mod.Flow(store=str(db))
        with pytest.raises(WorkflowChangedError) as err:
            wf.resume("one")
        text = str(err.value)
        assert "'answer', which no longer exists" in text
        # The event's class moved too, so no step of now takes it: the name is left to say.
        assert "say so on the workflow class: Flow.renamed = {'answer': '<its new name>'}" in text
        problems = verify(wf).problems
        assert any("deployflow:Question" in p.message for p in problems), problems
        assert any(p.kind == "route" and p.step == "answer" for p in problems), problems


def test_renames_that_name_no_step_are_refused_when_the_workflow_is_built(
    tmp_path: Path,
) -> None:
    from workflow import StartEvent, StopEvent, Workflow, WorkflowValidationError, step

    class Flow(Workflow):
        renamed: ClassVar[dict[str, Any]] = {"old": "gone"}

        @step
        async def only(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="'gone', which is no step"):
        Flow()
    Flow.renamed = {"only": "only"}
    with pytest.raises(WorkflowValidationError, match="'only' is still a step"):
        Flow()
    Flow.renamed = {"a": "b", "b": "only"}
    assert Flow().__workflow_parts__.renames == {"a": "only", "b": "only"}
    Flow.renamed = {"x:Y": 3}
    with pytest.raises(WorkflowValidationError, match="cannot alias"):
        Flow()


# -- resuming only what fits -------------------------------------------------------------------


async def test_recover_compatible_only_resumes_what_verify_passes_and_lists_the_rest(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path, "late")  # holds a version-1 Question
    record_old_run(tmp_path, "early", topic="early")  # holds only its start event
    with loaded(_write(tmp_path / "v2", MODULE, V2.format(upcaster=""))) as mod:
        wf = mod.Flow(store=str(db))
        found = {r.run_id: r for r in await wf.recover(compatible_only=True)}
        assert found["early"].outcome == "resumed"
        assert found["early"].handler is not None
        assert await found["early"].handler == "early/fr"
        late = found["late"]
        assert late.outcome == "incompatible"
        assert late.handler is None
        assert [p.kind for p in late.problems] == ["decode"] * len(late.problems)
        assert "@upcaster(Question, from_version=1)" in str(late.error)
        assert wf.state_at("late").status == "interrupted"
    # Nothing of the late run ran: no resume was recorded, its log is as the old code left it.
    with contextlib.closing(sqlite3.connect(db)) as con:
        late_kinds = [k for (k,) in con.execute("SELECT kind FROM records WHERE run_id = 'late'")]
    assert "run_resumed" not in late_kinds


def test_cli_recover_check_lists_incompatible_runs_with_the_reason(tmp_path: Path) -> None:
    db = record_old_run(tmp_path, "late")
    root = _write(tmp_path / "v2", MODULE, V2.format(upcaster=""))
    env = {"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin"}
    args = ["-m", "workflow", "recover", str(db), "--workflow", f"{MODULE}:Flow", "--check"]
    proc = subprocess.run(
        [sys.executable, *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["outcome"] == "incompatible"
    assert any("no upcaster turns version 1" in p["message"] for p in row["problems"]), row
    text = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert "incompatible" in text.stdout
    assert "@upcaster(Question, from_version=1)" in text.stdout
    # With an upcaster the same command resumes and finishes it.
    _write(root, MODULE, V2.format(upcaster=UPCASTER))
    done = subprocess.run(
        [sys.executable, *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert (row["outcome"], row["status"], row["result"]) == ("resumed", "finished", "hi/en")


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


def test_an_upcaster_runs_again_at_every_read_of_the_same_stored_value() -> None:
    """Nothing keeps an upcast value: each read of a stored dump (a fold, ``state_at``, a
    resume, the command line) calls the upcasters again, each time on a fresh copy of the
    recorded fields, so an upcaster must be a pure function of them (the README says so)."""

    @dataclasses.dataclass
    class Ticket:
        title: str

    old = Codec()
    old.register(Ticket)
    v1 = old.dump(Ticket("a"))

    @dataclasses.dataclass
    class Ticket:  # type: ignore[no-redef]
        __version__ = 2
        title: str
        serial: int

    new_ticket: Any = Ticket
    seen: list[dict[str, Any]] = []

    @upcaster(Ticket, from_version=1)
    def _v1(f: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(f))
        f["serial"] = len(seen)  # impure: what a second read shows differs
        return f

    new = Codec()
    new.register(Ticket)
    assert new.load(v1) == new_ticket("a", 1)
    assert new.load(v1) == new_ticket("a", 2)
    assert seen == [{"title": "a"}, {"title": "a"}]  # the same recorded fields each time


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


# -- patches for changed step code -------------------------------------------------------------

PATCHED = """
import os
from typing import Any

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step, upcaster


class Question(Event):
    __version__ = 2
    text: str
    lang: str


@upcaster(Question, from_version=1)
def _question_v1(fields: dict[str, Any]) -> dict[str, Any]:
    fields["text"] = fields.pop("body")
    fields["lang"] = "en"
    return fields


class Flow(Workflow):
    @step
    async def ask(self, ev: StartEvent) -> Question:
        return Question(text=ev.topic, lang="en")

    @step
    async def answer(self, ctx: Context, ev: Question) -> StopEvent:
        {body}
"""
POLITE = """if await ctx.patched("polite"):
            if os.environ.get("DIE_AFTER_PATCH"):
                os._exit(3)
            return StopEvent(result=f"please, {ev.text}")
        return StopEvent(result=ev.text)"""
DEPRECATED = """ctx.deprecate_patch("polite")
        return StopEvent(result=f"please, {ev.text}")"""

RESUME = """
import asyncio
import sys

from deployflow import Flow


async def main() -> None:
    await Flow(store=sys.argv[1]).resume(sys.argv[2])


asyncio.run(main())
"""


def patch_answers(db: Path, run_id: str) -> list[Any]:
    """The answers a run recorded for patch ``polite``, in order."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT payload FROM records WHERE run_id = ? AND kind = 'memoized' ORDER BY seq",
            (run_id,),
        )
        payloads = [json.loads(p) for (p,) in rows]
    return [p["result"] for p in payloads if p["key"] == "patched:polite"]


def dying(root: Path, script: str, db: Path, *args: str) -> None:
    """:func:`dies`, with the patched module dying once its patch answered True."""
    dies(root, script, db, *args, DIE_AFTER_PATCH="1")


def _patched(tmp_path: Path, body: str = POLITE) -> Path:
    return _write(tmp_path / "patched", MODULE, PATCHED.format(body=body))


async def test_patched_keeps_inputs_started_by_old_code_on_the_old_branch(tmp_path: Path) -> None:
    # Died in `answer` after a commit of its own: its input's start is durable under v1.
    db = record_old_run(tmp_path, "old", topic="paid")
    record_old_run(tmp_path, "early", topic="early")  # died in `ask`: no Question yet
    with loaded(_patched(tmp_path)) as mod:
        wf = mod.Flow(store=str(db))
        assert await wf.resume("old") == "paid"  # the old branch
        # The Question of "early" is made by the new code and first started by it.
        assert await wf.resume("early") == "please, early"
        assert await wf.run(topic="new", run_id="new") == "please, new"
        # Re-executing every recorded attempt takes the recorded branch again.
        report = verify(wf, reexecute=True)
        assert report.ok, report.problems
    assert patch_answers(db, "old") == [False]
    assert patch_answers(db, "early") == [True]
    assert patch_answers(db, "new") == [True]


async def test_a_recorded_answer_holds_in_a_later_session(tmp_path: Path) -> None:
    root = _patched(tmp_path)
    db = tmp_path / "runs.db"
    dying(root, RECORD, db, "run", "hi")
    assert patch_answers(db, "run") == [True]  # durable before the process died
    with loaded(root) as mod:
        # Its input started in the session that died, before this one: without the record
        # it would take the old branch now.
        assert await mod.Flow(store=str(db)).resume("run") == "please, hi"
    assert patch_answers(db, "run") == [True]


async def test_deprecate_patch_refuses_an_input_that_recorded_the_old_branch(
    tmp_path: Path,
) -> None:
    db = record_old_run(tmp_path, "old", topic="paid")
    root = _patched(tmp_path)
    # A session of the patched code answers False for "old" and dies right after.
    polite = POLITE.replace("return StopEvent(result=ev.text)", "os._exit(3)")
    _write(root, MODULE, PATCHED.format(body=polite))
    dying(root, RESUME, db, "old")
    assert patch_answers(db, "old") == [False]
    with loaded(_write(root, MODULE, PATCHED.format(body=DEPRECATED))) as mod:
        wf = mod.Flow(store=str(db))
        with pytest.raises(Exception, match="recorded its old branch") as err:
            await wf.resume("old")
        assert "keep `if await ctx.patched('polite'):`" in str(err.value)
        # A run that never took the old branch goes on with the new code alone.
        assert await wf.run(topic="new") == "please, new"


async def test_deprecate_patch_refuses_an_input_begun_by_code_without_the_patch(
    tmp_path: Path,
) -> None:
    # Version 1 has no patch at all and died in `answer` after a commit of that input: the
    # deploy goes straight to code that deprecates the patch. patched() would answer False
    # there (the input started before), so deprecate_patch refuses it as a recorded False.
    db = record_old_run(tmp_path, "old", topic="paid")
    record_old_run(tmp_path, "early", topic="early")  # died in `ask`: no Question yet
    with loaded(_patched(tmp_path, DEPRECATED)) as mod:
        wf = mod.Flow(store=str(db))
        with pytest.raises(Exception, match="patch 'polite' is deprecated") as err:
            await wf.resume("old")
        text = str(err.value)
        assert "run 'old', step 'answer', event " in text, text
        assert "started before this code ran it" in text, text
        assert "keep `if await ctx.patched('polite'):`" in text, text
        # The Question of "early" is made and first started by the new code: it goes on.
        assert await wf.resume("early") == "please, early"
        assert await wf.run(topic="new") == "please, new"
        assert verify(wf, ["early"], reexecute=True).ok
    assert patch_answers(db, "old") == []  # deprecate_patch records nothing


async def test_patched_outside_a_step_or_with_a_bad_id_is_refused() -> None:
    from workflow import Context, StartEvent, StopEvent, Workflow, WorkflowRuntimeError, step

    class Flow(Workflow):
        @step
        async def only(self, ctx: Context, ev: StartEvent) -> StopEvent:
            return StopEvent(result=await ctx.patched(ev.get("pid")))

    assert await Flow().run(pid="x") is True
    with pytest.raises(WorkflowRuntimeError, match="non-empty str"):
        await Flow().run(pid="")
    ctx = Context(Flow())
    with pytest.raises(WorkflowRuntimeError, match="works inside a step"):
        await ctx.patched("x")


# -- a renamed step's collect buffers; forks of work under old names ---------------------------

GATHER_V1 = """
import os

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Left(Event):
    x: str


class Right(Event):
    y: str


async def _paid() -> int:
    return 1


class Flow(Workflow):
    @step
    async def split(self, ctx: Context, ev: StartEvent) -> Left | Right | None:
        ctx.send_event(Left(x=ev.topic))
        ctx.send_event(Right(y=ev.topic.upper()))

    @step(num_workers=1)
    async def gather(self, ctx: Context, ev: Left | Right) -> StopEvent | None:
        if isinstance(ev, Right):
            await ctx.memo("paid", _paid)  # the put of Left is durable before this
            os._exit(3)  # this version dies here, with Left in the buffer
        got = ctx.collect_events(ev, [Left, Right]{bid})
        return None if got is None else StopEvent(result="never")
"""

GATHER_V2 = """
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Left(Event):
    x: str


class Right(Event):
    y: str


class Flow(Workflow):
    {renamed}

    @step
    async def split(self, ctx: Context, ev: StartEvent) -> Left | Right | None:
        ctx.send_event(Left(x=ev.topic))
        ctx.send_event(Right(y=ev.topic.upper()))

    @step(num_workers=1)
    async def join(self, ctx: Context, ev: Left | Right) -> StopEvent | None:  # was "gather"
        got = ctx.collect_events(ev, [Left, Right]{bid})
        if got is None:
            return None
        left, right = got
        return StopEvent(result=left.x + right.y)
"""


def record_gather(tmp_path: Path, bid: str) -> Path:
    """A run of the v1 gather module that died with ``Left`` in step ``gather``'s buffer."""
    db = tmp_path / "runs.db"
    dies(_write(tmp_path / "g1", MODULE, GATHER_V1.format(bid=bid)), RECORD, db, "old", "ab")
    return db


@pytest.mark.parametrize(
    "bid", [pytest.param("", id="default-id"), pytest.param(', buffer_id="lr"', id="given-id")]
)
async def test_a_renamed_steps_buffer_moves_with_it_on_resume_and_fork(
    tmp_path: Path, bid: str
) -> None:
    db = record_gather(tmp_path, bid)
    root = _write(tmp_path / "g2", MODULE, GATHER_V2.format(renamed=RENAMED_GATHER, bid=bid))
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db), timeout=30)  # a buffer left behind: Right waits for Left
        # Where Left sat in gather's buffer and Right was still queued for gather.
        cp = next(c for c in wf.checkpoints("old", step="gather") if c.kind == "step_finished")
        assert cp.step == "gather"
        held = wf.state_at("old", cp.seq)
        assert list(held.queues) == ["gather"]
        assert [k.partition(":")[0] for k in held.collected] == ["gather"]
        assert await wf.run_from(cp) == "abAB"
        (fork,) = [r for r in wf.runs() if r.run_id != "old"]
        # The web UI's fork for a worker records the same moves in its first commit.
        done = await Actions(wf, execute=False).fork("old", cp.seq, {})
        assert await wf.resume(done.run_id) == "abAB"
        assert await wf.resume("old") == "abAB"
        # Every later read of either run sees the moved buffer, empty now.
        assert wf.state_at("old").collected == {} == wf.state_at(fork.run_id).collected
    from eventstore import EventStore
    from tests.test_page import page_fold, python_fold
    from workflow.cli._inspect import Viewer
    from workflow.cli._timeline import timeline_data

    view = Viewer()
    with EventStore(db, readonly=True) as store:
        for run_id in ("old", fork.run_id):
            got = page_fold(timeline_data(store, run_id, view), tmp_path)
            assert got["states"] == python_fold(store, run_id, view), run_id


RENAMED_GATHER = 'renamed = {"gather": "join"}'


FAN_V1 = """
import os

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class A(Event):
    n: int


async def _paid() -> int:
    return 1


class Flow(Workflow):
    @step
    async def split(self, ctx: Context, ev: StartEvent) -> A | None:
        ctx.send_event(A(n=1))
        ctx.send_event(A(n=2))

    @step(num_workers=1)
    async def gather(self, ctx: Context, ev: A) -> StopEvent | None:
        if ev.n == 2:
            await ctx.memo("paid", _paid)  # the put of A(n=1) is durable before this
            os._exit(3)  # this version dies here, with 1 of 2 A in the buffer
        got = ctx.collect_events(ev, [A, A])
        return None if got is None else StopEvent(result="never")
"""

FAN_V2 = """
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class A(Event):
    n: int


class Flow(Workflow):
    renamed = {"gather": "combine"}

    @step
    async def split(self, ctx: Context, ev: StartEvent) -> A | None:
        ctx.send_event(A(n=1))
        ctx.send_event(A(n=2))

    @step(num_workers=1)
    async def combine(self, ctx: Context, ev: A) -> StopEvent | None:  # was "gather"
        got = ctx.collect_events(ev, [A, A])
        return None if got is None else StopEvent(result=sum(e.n for e in got))
"""


def _cli(root: Path, *args: str) -> str:
    """``workflow ARGS`` in a process of its own with the module in ``root``."""
    env = {"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "workflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_renamed_steps_buffer_of_one_class_twice_moves_on_resume_and_fork(
    tmp_path: Path,
) -> None:
    # The user's case: [A, A] names one class twice, a list no order of a subset of the
    # step's classes spells; the move found no id and left the buffer, and the resume hung.
    db = tmp_path / "fan.db"
    dies(_write(tmp_path / "f1", MODULE, FAN_V1), RECORD, db, "f1", "x")
    root = _write(tmp_path / "f2", MODULE, FAN_V2)
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db))
        cp = next(c for c in wf.checkpoints("f1", step="gather") if c.kind == "step_finished")
        assert [k.partition(":")[0] for k in wf.state_at("f1").collected] == ["gather"]
    flow = f"{MODULE}:Flow"
    forked = _cli(root, "fork", str(db), "f1", "--at", str(cp.seq), "--workflow", flow)
    assert forked.endswith(" finished: 3\n"), forked  # 1 + 2: the A held and the A queued
    resumed = _cli(root, "resume", str(db), "f1", "--workflow", flow)
    assert resumed == "run f1 finished: 3\n", resumed
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db))
        assert wf.state_at("f1").collected == {}  # one buffer, emptied: none left half full
        assert [r.status for r in wf.runs()] == ["finished"] * 2


GATHER_RENAMED_CLASS = """
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Leftie(Event):  # was deployflow:Left: renamed, not only moved
    x: str


class Right(Event):
    y: str


class Flow(Workflow):
    renamed = {{"deployflow:Left": Leftie{step}}}

    @step
    async def split(self, ctx: Context, ev: StartEvent) -> Leftie | Right | None:
        ctx.send_event(Leftie(x=ev.topic))
        ctx.send_event(Right(y=ev.topic.upper()))

    @step(num_workers=1)
    async def {name}(self, ctx: Context, ev: Leftie | Right) -> StopEvent | None:
        got = ctx.collect_events(ev, [Leftie, Right])
        if got is None:
            return None
        left, right = got
        return StopEvent(result=type(left).__name__ + ":" + left.x + right.y)
"""


@pytest.mark.parametrize(
    ("step", "name"),
    [
        pytest.param("", "gather", id="class-only"),
        pytest.param(', "gather": "join"', "join", id="and-step"),
    ],
)
async def test_a_class_renamed_inside_a_collect_buffer_moves_with_it(
    tmp_path: Path, step: str, name: str
) -> None:
    # Version 1 died with Left in step gather's buffer (its default id a digest of the
    # classes' names); version 2 renames the class (and maybe the step).
    db = record_gather(tmp_path, "")
    root = _write(tmp_path / "g2", MODULE, GATHER_RENAMED_CLASS.format(step=step, name=name))
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db), timeout=30)  # a buffer left behind: Right waits for Left
        cp = next(c for c in wf.checkpoints("old", step="gather") if c.kind == "step_finished")
        assert verify(wf).ok, verify(wf).problems
        assert await wf.run_from(cp) == "Leftie:abAB"
        done = await Actions(wf, execute=False).fork("old", cp.seq, {})  # the web UI's fork
        assert await wf.resume(done.run_id) == "Leftie:abAB"
        assert await wf.resume("old") == "Leftie:abAB"
        assert wf.state_at("old").collected == {}
        forks = [r.run_id for r in wf.runs() if r.run_id != "old"]
    (resumed,) = [p for k, p in records_of(db, "old") if k == "run_resumed"]
    assert resumed["classes"] == {"Left": "Leftie"}
    ((old_key, new_key),) = resumed["buffers"].items()
    assert old_key.startswith("gather:")
    assert new_key.startswith(f"{name}:")
    text = _cli(root, "history", str(db), "old", "--kind", "run_resumed", "--full")
    assert "renamed classes Left -> Leftie" in text, text
    from eventstore import EventStore
    from tests.test_page import page_fold, python_fold
    from workflow.cli._inspect import Viewer
    from workflow.cli._timeline import timeline_data

    view = Viewer()
    with EventStore(db, readonly=True) as store:
        for run_id in ("old", *forks):
            got = page_fold(timeline_data(store, run_id, view), tmp_path)
            assert got["states"] == python_fold(store, run_id, view), run_id


async def test_a_fork_under_old_step_names_without_renames_is_refused(tmp_path: Path) -> None:
    db = record_gather(tmp_path, "")
    with loaded(_write(tmp_path / "g2", MODULE, GATHER_V2.format(renamed="", bid=""))) as mod:
        wf = mod.Flow(store=str(db))
        cp = next(c for c in wf.checkpoints("old", step="gather") if c.kind == "step_finished")
        with pytest.raises(WorkflowChangedError, match="'gather', which no longer exists") as err:
            wf.run_from(cp)
        # Its events still decode and step "join" takes them: the refusal spells the mapping.
        hint = "if it was renamed, say so on the workflow class: Flow.renamed = {'gather': 'join'}"
        assert hint in str(err.value)
        with pytest.raises(WorkflowChangedError, match="'gather', which no longer exists") as err:
            wf.resume("old")
        assert hint in str(err.value)
        route = [p for p in verify(wf).problems if p.kind == "route"]
        assert route, verify(wf).problems
        assert all(hint in p.message for p in route), route


def test_history_text_shows_the_moves_a_resume_recorded(tmp_path: Path) -> None:
    db = record_gather(tmp_path, "")
    root = _write(tmp_path / "g2", MODULE, GATHER_V2.format(renamed=RENAMED_GATHER, bid=""))
    flow = f"{MODULE}:Flow"
    assert _cli(root, "resume", str(db), "old", "--workflow", flow) == "run old finished: 'abAB'\n"
    (resumed,) = [p for k, p in records_of(db, "old") if k == "run_resumed"]
    ((old_key, new_key),) = resumed["buffers"].items()
    assert old_key.startswith("gather:")
    assert new_key.startswith("join:")
    for args in ((), ("--workflow", flow)):  # with the code or without it
        text = _cli(root, "history", str(db), "old", "--kind", "run_resumed", "--full", *args)
        (line,) = [ln for ln in text.splitlines() if "run_resumed" in ln]
        assert "moved steps gather -> join" in line, line
        assert f"moved buffers {old_key} -> {new_key}" in line, line


# -- typed state model versions ----------------------------------------------------------------

NOTES_V1 = """
import os

from pydantic import BaseModel

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Notes(BaseModel):
    title: str = ""
    items: list[str] = []


class Next(Event):
    n: int


class Flow(Workflow):
    @step
    async def begin(self, ctx: Context[Notes], ev: StartEvent) -> Next:
        await ctx.store.set("title", ev.topic)
        await ctx.store.set("items", ["a"])
        return Next(n=1)

    @step
    async def more(self, ctx: Context[Notes], ev: Next) -> Next | StopEvent:
        if ev.n == 2:
            os._exit(3)  # this version dies here, its state written in version 1
        items = await ctx.store.get("items")
        items.append("b")  # written as a patch, in version 1
        await ctx.store.set("items", items)
        return Next(n=2)
"""

NOTES_V2 = """
from typing import Any

from pydantic import BaseModel

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step, upcaster


class Notes(BaseModel):
    __version__ = 2
    name: str = ""  # was "title"
    items: list[str] = []
    lang: str = ""  # new
{upcaster}

class Next(Event):
    n: int


class Flow(Workflow):
    @step
    async def begin(self, ctx: Context[Notes], ev: StartEvent) -> Next:
        await ctx.store.set("name", ev.topic)
        await ctx.store.set("items", ["a"])
        return Next(n=1)

    @step
    async def more(self, ctx: Context[Notes], ev: Next) -> Next | StopEvent:
        items = await ctx.store.get("items")
        items.append("bc"[ev.n - 1])  # a patch, in version 2 after a resume
        await ctx.store.set("items", items)
        if ev.n == 1:
            return Next(n=2)
        state = await ctx.store.get_state()
        return StopEvent(result=f"{{state.name}}:{{','.join(state.items)}}:{{state.lang}}")
"""

NOTES_UPCASTER = """

@upcaster(Notes, from_version=1)
def _notes_v1(fields: dict[str, Any]) -> dict[str, Any]:
    fields["name"] = fields.pop("title", "")  # none at a seq before the first write
    fields["lang"] = "en"
    return fields
"""


def record_notes(tmp_path: Path) -> Path:
    """A run of the state model's version 1 that died after writing its state twice."""
    db = tmp_path / "runs.db"
    dies(_write(tmp_path / "n1", MODULE, NOTES_V1), RECORD, db, "old", "hi")
    return db


def records_of(db: Path, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT kind, payload FROM records WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        return [(k, json.loads(p)) for k, p in rows]


async def test_an_old_state_model_version_upcasts_on_read_resume_and_fork(tmp_path: Path) -> None:
    db = record_notes(tmp_path)
    before = stored_payloads(db)
    started = records_of(db, "old")[0][1]
    assert started["state"] == "deployflow:Notes"  # version 1: no suffix
    root = _write(tmp_path / "n2", MODULE, NOTES_V2.format(upcaster=NOTES_UPCASTER))
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db))
        # Read before any newer code resumed it: upcast as it is decoded.
        assert dict(wf.state_at("old").context) == {"name": "hi", "items": ["a", "b"], "lang": "en"}
        shown = CliRunner().invoke(
            cli, ["state", str(db), "old", "--workflow", f"{MODULE}:Flow", "--json"]
        )
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["context"]["name"] == "hi", shown.output
        # The text shows the same, upcast; the log's version 1 without the workflow.
        flow = ["--workflow", f"{MODULE}:Flow"]
        text = CliRunner().invoke(cli, ["state", str(db), "old", *flow])
        assert text.exit_code == 0, text.output
        context = text.output.partition("context:")[2].partition("waiters:")[0]
        assert sorted(k for k in ("name", "lang", "title") if k in context) == ["lang", "name"]
        raw = CliRunner().invoke(cli, ["state", str(db), "old"]).output
        assert "title" in raw.partition("context:")[2].partition("waiters:")[0], raw
        cp = next(c for c in wf.checkpoints("old", step="more") if c.kind == "step_finished")
        args = ["diff", str(db), "old", str(wf.checkpoints("old")[0].seq), str(cp.seq), *flow]
        changed = CliRunner().invoke(cli, args)
        assert changed.exit_code == 0, changed.output
        assert "title" not in changed.output, changed.output
        assert "'hi'" in changed.output, changed.output
        raw = CliRunner().invoke(cli, args[:-2]).output
        assert "title" in raw, raw
        # Re-executed, the recorded attempts write what the upcast model has them write.
        report = verify(wf, ["old"], reexecute=True)
        assert report.ok, report.problems
        assert report.attempts_reexecuted == 2
        assert await wf.resume("old") == "hi:a,b,c:en"
        assert await wf.run_from(cp) == "hi:a,b,c:en"
        done = await Actions(wf, execute=False).fork("old", cp.seq, {})  # the web UI's
        assert await wf.resume(done.run_id) == "hi:a,b,c:en"
        assert await wf.run(topic="new") == "new:a,b,c:"  # a new run is version 2 from its start
    assert stored_payloads(db)[: len(before)] == before  # the log is never rewritten
    # The resume's commit names version 2 and writes what changed, whole; the patch after it
    # is version 2's, applied to version 2's value.
    kinds = records_of(db, "old")
    i = next(n for n, (k, _) in enumerate(kinds) if k == "run_resumed")
    assert kinds[i][1]["state"] == "deployflow:Notes@2"
    written = {p["key"]: p.get("value") for k, p in kinds[i + 1 : i + 4] if k == "state_set"}
    assert written == {"name": "hi", "lang": "en"}
    assert ("state_deleted", {"key": "title"}) in kinds[i + 1 : i + 4]
    from eventstore import EventStore
    from tests.test_page import page_fold, python_fold
    from workflow._read import fold_run
    from workflow.cli._inspect import Viewer
    from workflow.cli._timeline import timeline_data

    view = Viewer()
    with EventStore(db, readonly=True) as store:
        # Without the code, the log alone folds to version 2's keys.
        assert sorted(fold_run(store, "old", cached=False).context) == ["items", "lang", "name"]
        got = page_fold(timeline_data(store, "old", view), tmp_path)
        assert got["states"] == python_fold(store, "old", view)


STRICT_NOTES_UPCASTER = """

@upcaster(Notes, from_version=1)
def _notes_v1(fields: dict[str, Any]) -> dict[str, Any]:
    fields["name"] = fields.pop("title")  # raises on a dict without it
    fields["lang"] = "en"
    return fields
"""


async def test_state_upcasters_are_called_only_on_recorded_fields(tmp_path: Path) -> None:
    # An upcaster written as the README's, `fields.pop("title")`, is never handed an empty
    # context: a read at a seq before the first write has no stored payload to upcast.
    db = record_notes(tmp_path)
    root = _write(tmp_path / "n2", MODULE, NOTES_V2.format(upcaster=STRICT_NOTES_UPCASTER))
    flow = ["--workflow", f"{MODULE}:Flow"]
    with loaded(root) as mod:
        wf = mod.Flow(store=str(db))
        first = wf.checkpoints("old")[0].seq
        assert dict(wf.state_at("old", first).context) == {}
        shown = CliRunner().invoke(
            cli, ["state", str(db), "old", "--at", str(first), *flow, "--json"]
        )
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["context"] == {}, shown.output
        last = wf.checkpoints("old")[-1].seq
        args = ["diff", str(db), "old", str(first), str(last), *flow]
        changed = CliRunner().invoke(cli, args)
        assert changed.exit_code == 0, changed.output
        assert "title" not in changed.output, changed.output
        assert dict(wf.state_at("old").context) == {"name": "hi", "items": ["a", "b"], "lang": "en"}
        assert verify(wf, ["old"], reexecute=True).ok
        # A fork at the run's first seq has nothing to upcast: it runs from an empty state.
        assert await wf.run_from(wf.checkpoints("old")[0]) == "hi:a,b,c:"
        assert await wf.resume("old") == "hi:a,b,c:en"


async def test_without_a_state_upcaster_resume_refuses_and_names_it(tmp_path: Path) -> None:
    db = record_notes(tmp_path)
    before = stored_payloads(db)
    with loaded(_write(tmp_path / "n2", MODULE, NOTES_V2.format(upcaster=""))) as mod:
        wf = mod.Flow(store=str(db))
        with pytest.raises(WorkflowChangedError) as err:
            wf.resume("old")
        text = str(err.value)
        assert "state model deployflow:Notes" in text
        assert "stored at version 1" in text
        assert "@upcaster(Notes, from_version=1)" in text
        assert "allow_stranded" not in text  # no work could be left undone: nothing runs
        cp = wf.checkpoints("old")[-1]
        with pytest.raises(WorkflowChangedError, match="no upcaster turns version 1"):
            wf.run_from(cp)
        context = wf.state_at("old").context
        assert sorted(context) == ["items", "title"]  # the keys as stored
        with pytest.raises(LogCorruptedError, match="no upcaster turns version 1") as state_err:
            context["items"]
        assert isinstance(state_err.value.__cause__, UpcastError)
        problems = verify(wf).problems
        assert any("@upcaster(Notes, from_version=1)" in p.message for p in problems), problems
        found = {r.run_id: r for r in await wf.recover(compatible_only=True)}
        assert found["old"].outcome == "incompatible"
    assert stored_payloads(db) == before


# -- the web UI shows an old run's state upcast, as the command line does ---------------------


def notes_server_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A run of the state model's version 1 (died after writing its state twice), and the
    directory of version 2's module (with an upcaster that needs its old field), importable
    by the servers the test starts."""
    db = record_notes(tmp_path)
    root = _write(tmp_path / "n2", MODULE, NOTES_V2.format(upcaster=STRICT_NOTES_UPCASTER))
    monkeypatch.setenv("PYTHONPATH", f"{root}:{ROOT}")
    return db, root


@pytest.mark.long  # a UI server and processes: make test-long (CI runs it)
def test_the_ui_data_and_state_routes_send_an_old_runs_context_upcast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.ui_server import get, serving

    db, root = notes_server_run(tmp_path, monkeypatch)
    flow = f"{MODULE}:Flow"
    with serving(db, "--workflow", flow) as base:
        _, _, body = get(base + "/runs/old/data")
        data = json.loads(body)
        # The page's fold keeps the log's keys; beside it, the context the workflow shows.
        uctx = data["uctx"]
        ((last_ci, texts),) = [u for u in uctx if u[0] == max(c for c, _ in uctx)]
        assert last_ci <= len(data["commits"]["seq"]) - 1
        assert sorted(texts) == ["items", "lang", "name"]
        assert "hi" in texts["name"]
        assert "en" in texts["lang"]
        assert "'b'" in texts["items"]
        assert all(c >= 0 for c, _ in uctx)  # the run's start: nothing recorded to upcast
        _, _, body = get(base + "/runs/old/state")
        assert sorted(json.loads(body)["context"]) == ["items", "lang", "name"]
        # A live page that holds the data gets the upcast contexts whole with its patch.
        n = len(data["rec"]["seq"])
        held = (
            f"nrec={n}&ncommits={len(data['commits']['seq'])}&attempts_from=0&waits_from=0"
            f"&ntb=0&next_event=0&seq={data['rec']['seq'][-1]}"
        )
        _, _, body = get(base + "/runs/old/data?" + held)
        assert json.loads(body)["uctx"] == uctx
    with serving(db) as base:  # no workflow: the context as the log has it
        _, _, body = get(base + "/runs/old/data")
        assert "uctx" not in json.loads(body)
        _, _, body = get(base + "/runs/old/state")
        assert sorted(json.loads(body)["context"]) == ["items", "title"]
    assert (
        _cli(root, "resume", str(db), "old", "--workflow", flow)
        == "run old finished: 'hi:a,b,c:en'\n"
    )
    with serving(db, "--workflow", flow) as base:
        data = json.loads(get(base + "/runs/old/data")[2])
        # From the resume on the log holds version 2: the page's own fold is shown again.
        resumed = next(
            ci
            for ci, first in enumerate(data["commits"]["first"])
            if data["kinds"][data["rec"]["k"][first]] == "run_resumed"
        )
        assert data["uctx"][-1] == [resumed, None]
        # A run of today's code has nothing to upcast: none is sent.
        with loaded(root) as mod:
            flow_cls = mod.Flow

            async def new_run() -> None:
                await flow_cls(store=str(db)).run(topic="new", run_id="new")

            asyncio.run(new_run())
        assert "uctx" not in json.loads(get(base + "/runs/new/data")[2])
