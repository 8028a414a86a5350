"""What tripped a new user (README only, then an adversarial pass), each fixed at its root.

Each test reproduces one finding of /work/notes/issue12-newuser-findings.md: a start event
no step takes ran until the timeout; a run resumed with another workflow's class was told
to pass ``allow_stranded=True``; the command line blamed ``--workflow`` for a store in a
missing folder and refused an empty file that ``Workflow(store=...)`` takes; Ctrl-C left no
word on how to continue.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventstore import EventStore
from tests.support.child import child
from workflow import (
    Context,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowChangedError,
    WorkflowRuntimeError,
    step,
)
from workflow.cli import cli

ROOT = Path(__file__).resolve().parent.parent


class Topic(StartEvent):
    topic: str


class Other(StartEvent):
    pass


class Draft(Event):
    text: str


class Writer(Workflow):
    @step
    async def draft(self, ev: Topic) -> Draft:
        return Draft(text=f"notes on {ev.topic}")

    @step
    async def publish(self, ctx: Context, ev: Draft) -> StopEvent:
        if not await ctx.store.get("approved", default=False):
            msg = "not approved yet"
            raise RuntimeError(msg)
        return StopEvent(result=ev.text)


class Greeter(Workflow):
    @step
    async def greet(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="hello")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (1, r"start_event must be a StartEvent, not int"),
        (Draft(text="x"), r"start_event must be a StartEvent, not .*Draft"),
        (Other(), r"no step of Writer takes .*Other; its start step takes .*Topic"),
    ],
    ids=["not-an-event", "not-a-start-event", "a-start-event-no-step-takes"],
)
async def test_a_start_event_no_step_takes_is_refused_at_the_call(given: object, said: str) -> None:
    """Such a run could only idle until its timeout (45 s); now run() and submit() say why,
    and record nothing."""
    wf = Writer()  # a custom start event with fields passes validation
    with pytest.raises(WorkflowRuntimeError, match=said):
        wf.run(start_event=given)  # type: ignore[arg-type]
    with pytest.raises(WorkflowRuntimeError, match=said):
        wf.submit(start_event=given)  # type: ignore[arg-type]
    assert wf.runs() == []


def test_a_run_resumed_with_another_workflow_s_class_names_both(tmp_path: Path) -> None:
    """Resuming a Writer run with Greeter names the workflow that recorded it, instead of
    suggesting allow_stranded=True; the run is left as it was."""
    db = tmp_path / "r.db"

    async def failed_run() -> str:
        handler = Writer(store=db).run(start_event=Topic(topic="x"))
        with pytest.raises(RuntimeError):
            await handler
        return handler.run_id

    async def resume_with_greeter(run_id: str) -> None:
        Greeter(store=db).resume(run_id)

    run_id = asyncio.run(failed_run())
    with EventStore(db, readonly=True) as store:
        before = store.last_seq(run_id)
    with pytest.raises(WorkflowChangedError) as err:
        asyncio.run(resume_with_greeter(run_id))
    text = str(err.value)
    assert "was recorded by tests.test_new_user:Writer, not tests.test_new_user:Greeter" in text
    assert "allow_stranded" not in text
    with EventStore(db, readonly=True) as store:
        assert store.last_seq(run_id) == before
    result = CliRunner().invoke(
        cli, ["resume", str(db), run_id, "--workflow", "tests.test_new_user:Greeter"]
    )
    assert result.exit_code == 1
    assert "was recorded by tests.test_new_user:Writer" in result.stderr
    assert "--workflow tests.test_new_user:Writer" in result.stderr


def test_cli_run_into_a_missing_folder_names_the_folder(tmp_path: Path) -> None:
    """A store path in a folder that does not exist is DB's problem, not --workflow's."""
    db = tmp_path / "no" / "such" / "runs.db"
    result = CliRunner().invoke(cli, ["run", str(db), "--workflow", "tests.test_new_user:Greeter"])
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {db}: folder {db.parent} does not exist"
    assert not db.parent.exists()


def test_cli_run_makes_a_store_of_an_empty_file(tmp_path: Path) -> None:
    """An empty file (`touch runs.db`) becomes a store, as Workflow(store=...) makes it; a
    file with content that is not a store is still refused and left as it was."""
    db = tmp_path / "runs.db"
    db.touch()
    result = CliRunner().invoke(cli, ["run", str(db), "--workflow", "tests.test_new_user:Greeter"])
    assert result.exit_code == 0, result.output
    assert "finished: 'hello'" in result.stdout
    text = tmp_path / "notes.db"
    text.write_text("hello")
    refused = CliRunner().invoke(
        cli, ["run", str(text), "--workflow", "tests.test_new_user:Greeter"]
    )
    assert refused.exit_code == 1
    assert "not an event store" in refused.stderr
    assert text.read_text() == "hello"


class Sleepy(Workflow):
    @step
    async def nap(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("napping", True)
        if not await ctx.store.get("awake", default=False):
            Path(os.environ["SLEEPY_READY"]).touch()  # noqa: ASYNC240 - a test's marker
            await asyncio_sleep_long()
        return StopEvent(result="rested")


async def asyncio_sleep_long() -> None:
    await asyncio.sleep(3600)


def _interrupted(tmp_path: Path, *args: str) -> str:
    """Runs ``workflow ARGS`` until the Sleepy step naps, then Ctrl-C (SIGINT); its stderr."""
    ready = tmp_path / "ready"
    ready.unlink(missing_ok=True)
    with child(
        [sys.executable, "-m", "workflow", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "SLEEPY_READY": str(ready)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    return err


def test_ctrl_c_in_cli_run_says_how_to_continue(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) stops `workflow run` (and `recover`) with status 130 and the command
    that continues the run; what was committed is kept and the resume finishes it."""
    db = tmp_path / "r.db"
    spec = "tests.test_new_user:Sleepy"
    err = _interrupted(tmp_path, "run", str(db), "--workflow", spec, "--run-id", "nap-1")
    assert (
        f"run nap-1 was left unfinished; `workflow resume {db} nap-1 --workflow {spec}`"
        " continues it" in err
    )
    err = _interrupted(tmp_path, "recover", str(db), "--workflow", spec)
    assert (
        f"the runs resumed here were left unfinished; `workflow recover {db} --workflow {spec}`"
        " continues them" in err
    )
    result = CliRunner().invoke(
        cli, ["resume", str(db), "nap-1", "--workflow", spec, "--set", "awake=true"]
    )
    assert result.exit_code == 0, result.output
    assert "run nap-1 finished: 'rested'" in result.stdout


def test_the_demo_keeps_its_store_and_its_commands_work(tmp_path: Path) -> None:
    """`make demo` tells the story and ends with commands that look at the run: they work
    on the store it kept."""
    demo = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    out = demo.stdout
    assert "publish: the process dies here" in out
    assert "result: published:" in out
    # The history it prints is `workflow history`'s, decoded: values, not the log's JSON.
    story = out.split("The run's history", 1)[1].split("The state at seq", 1)[0]
    assert "pages_fetched = 3" in story
    assert "epoch 2, was interrupted" in story
    assert '{"key":' not in story
    assert "commit" in story.splitlines()[1]
    assert f"The store is kept at {tmp_path / 'runs.db'}" in out
    commands = [ln.split() for ln in out.splitlines()[-3:]]
    assert ["runs" in commands[0], "history" in commands[1], "timeline" in commands[2]] == [
        True
    ] * 3
    for command in commands:
        shown = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
        assert shown.returncode == 0, (command, shown.stderr)
    history = subprocess.run(commands[1], capture_output=True, text=True, check=True).stdout
    assert "run_resumed" in history
    assert "run_finished" in history


def test_a_module_that_exits_on_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script whose command-line code runs at import (and exits) is named with what to do,
    instead of the command ending with the script's own usage line."""
    (tmp_path / "exits_at_import.py").write_text(
        "import sys\nsys.exit('usage: exits_at_import.py DB')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, ["graph", "--workflow", "exits_at_import:Flow"])
    assert result.exit_code == 2
    assert (
        "cannot import 'exits_at_import': it exits while it is imported"
        " (sys.exit('usage: exits_at_import.py DB')); put its script code under"
        ' `if __name__ == "__main__":`'
    ) in result.stderr


async def test_send_refuses_what_is_not_an_event(tmp_path: Path) -> None:
    """`wf.send(run_id, {...})` is refused at the call, as `handler.ctx.send_event` refuses
    it; before, the dict was recorded and parked, and the wait went on."""
    wf = Writer(store=tmp_path / "r.db", disable_validation=True)
    run_id = wf.submit(start_event=Topic(topic="x"))
    with pytest.raises(WorkflowRuntimeError, match="send takes an Event, not dict"):
        wf.send(run_id, {"response": "x"})  # type: ignore[arg-type]
    assert wf.store.inbox(run_id) == []


STRANDING_V1 = """
from workflow import Event, StartEvent, StopEvent, Workflow, step

class Mid(Event):
    n: int = 1

class Flow(Workflow):
    @step
    async def start(self, ev: StartEvent) -> Mid:
        return Mid()

    @step
    async def finish(self, ev: Mid) -> StopEvent:
        raise RuntimeError("v1 fails here")
"""

STRANDING_V2 = """
from workflow import Event, StartEvent, StopEvent, Workflow, step

class Mid(Event):
    n: int = 1

class Flow(Workflow):
    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="v2")
"""


def test_cli_resume_of_stranded_work_names_its_flag(tmp_path: Path) -> None:
    """`workflow resume` of a run whose pending work has no step now says to pass
    --allow-stranded (the command's own flag, not the Python keyword), and that flag
    proceeds."""
    db = tmp_path / "runs.db"
    for version, text in (("v1", STRANDING_V1), ("v2", STRANDING_V2)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "stranding.py").write_text(text)

    def workflow_cli(version: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(tmp_path / version)}
        return subprocess.run(
            [sys.executable, "-m", "workflow", *args, "--workflow", "stranding:Flow"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    ran = workflow_cli("v1", "run", str(db), "--run-id", "r1")
    assert "v1 fails here" in ran.stdout + ran.stderr
    refused = workflow_cli("v2", "resume", str(db), "r1")
    assert refused.returncode == 1, refused
    assert "pass --allow-stranded to proceed" in refused.stderr
    assert "allow_stranded=True" not in refused.stderr
    proceeded = workflow_cli("v2", "resume", str(db), "r1", "--allow-stranded", "--timeout", "1")
    assert "stranded" not in proceeded.stderr, proceeded.stderr


def test_a_workflow_module_not_found_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--workflow flows:Flow`` run from another folder than flows.py's says where the
    module was looked for, so the reader knows to change folder or set PYTHONPATH; a module
    that is found but fails its own import is reported as it failed."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the folder it runs in
    (tmp_path / "readme_broken_flows.py").write_text("import no_such_dependency\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(cli, ["run", "w.db", "--workflow", "readme_flows:Flow"])
    assert result.exit_code == 2
    assert (
        "cannot import 'readme_flows': ModuleNotFoundError: No module named 'readme_flows'"
        f" (looked for in the current folder, {elsewhere}, and on PYTHONPATH)"
    ) in result.stderr
    monkeypatch.chdir(tmp_path)
    broken = CliRunner().invoke(cli, ["run", "w.db", "--workflow", "readme_broken_flows:Flow"])
    assert broken.exit_code == 2
    assert "No module named 'no_such_dependency' (see" in broken.stderr
    assert not (tmp_path / "w.db").exists()
