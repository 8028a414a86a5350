"""The command line: read commands (raw and typed), bad arguments, resume / fork / send, graph."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.flows import Asker, ReportFlow, read_trace
from tests.support.child import child
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
from workflow.cli import _common, cli
from workflow.cli._running import public_event_name

ROOT = Path(__file__).resolve().parent.parent


class Note(Event):
    text: str


class Stages(Workflow):
    """Sets, changes and deletes context keys in two steps (for diffs)."""

    @step
    async def first(self, ctx: Context[Any], ev: StartEvent) -> Note:
        await ctx.store.set("stage", "one")
        await ctx.store.set("scratch", [1, 2])
        return Note(text="a")

    @step
    async def second(self, ctx: Context[Any], ev: Note) -> StopEvent:
        await ctx.store.set("stage", "two")
        await ctx.store.delete("scratch")
        await ctx.store.set("count", 1)
        return StopEvent(result="done")


def invoke(*args: str | Path | int) -> Result:
    """Runs the command line in-process, as the installed script would."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(*args: str | Path | int) -> str:
    """Runs a command that must succeed; returns its stdout."""
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def run_to_end(wf: Workflow, **kwargs: Any) -> str:
    """Runs a workflow until it ends (a failure is fine); returns the run id."""

    async def go() -> str:
        handler = wf.run(**kwargs)
        with contextlib.suppress(Exception):  # a run that fails is what most tests want
            await handler
        return handler.run_id

    try:
        return asyncio.run(go())
    finally:
        wf.store.close()


@pytest.fixture
def report(location: str) -> str:
    """A store holding run 'rep' of ReportFlow, failed in its last step (a file, or a
    PostgreSQL schema: the commands read both alike)."""
    run_to_end(ReportFlow(store=location, timeout=None), run_id="rep")
    return location


def seq_of(db: str | Path, run: str, kind: str, step_name: str | None = None) -> int:
    """The seq of a run's first record of a kind (and step)."""
    for r in json.loads(ok("history", db, run, "--json", "--kind", kind)):
        if step_name is None or r["step"] == step_name:
            return int(r["seq"])
    raise AssertionError(f"no {kind} record")


# ---------------------------------------------------------------------------- runs


def test_runs_table_and_json(report: str) -> None:
    """runs lists each run with its status, workflow and last seq, as a table and as JSON."""
    out = ok("runs", report)
    assert re.search(r"^rep\s+failed\s+tests\.flows:ReportFlow\s+\S+ \S+\s+14\s*$", out, re.M)
    data = json.loads(ok("runs", report, "--json"))
    assert data == [
        {
            "run_id": "rep",
            "status": "failed",
            "workflow": "tests.flows:ReportFlow",
            "started": data[0]["started"],
            "created_us": data[0]["created_us"],
            "first_seq": 1,
            "last_seq": 14,
            "parent_run_id": None,
            "parent_seq": None,
            "waiting_for": [],
        }
    ]


def test_runs_in_a_real_subprocess(report: str) -> None:
    """`python -m workflow runs DB` works as a real process and exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "workflow", "runs", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rep" in proc.stdout
    assert "failed" in proc.stdout
    assert proc.stderr == ""


# ---------------------------------------------------------------------------- history


def test_history_table_has_a_line_a_record(report: str) -> None:
    """history prints a header and one line per record with seq, commit, kind, step and payload."""
    lines = ok("history", report, "rep").splitlines()
    assert lines[0].split() == ["seq", "commit", "time", "kind", "step", "event", "payload"]
    body = lines[2:]
    assert len(body) == 14
    failed = next(ln for ln in body if " step_failed " in ln)
    assert failed.split()[:2] == ["13", "13"]
    assert "finish" in failed
    assert "EventB" in failed
    assert "#3 attempt 1 ValueError: var is not set (no retry)" in failed
    enq = next(ln for ln in body if "tests.flows:EventA(content='first')" in ln)
    assert " enqueued " in enq


def test_history_filters(report: str) -> None:
    """--kind, --step, --from and --to narrow the lines."""
    kinds = ok("history", report, "rep", "--kind", "step_started", "--kind", "step_failed")
    assert [ln.split()[3] for ln in kinds.splitlines()[2:]] == ["step_started"] * 3 + [
        "step_failed"
    ]
    # Several kinds in one --kind, as runs --status takes statuses, give the same lines.
    assert ok("history", report, "rep", "--kind", "step_started,step_failed") == kinds
    assert ok("history", report, "rep", "--kind", "step_started, step_failed") == kinds
    bad = invoke("history", report, "rep", "--kind", "step_started,nope")
    assert bad.exit_code == 2
    assert "unknown kind nope: use " in bad.stderr
    assert "step_started" in bad.stderr.split("use ", 1)[1]
    steps = ok("history", report, "rep", "--step", "process").splitlines()[2:]
    assert {ln.split()[4] for ln in steps} == {"process"}
    window = ok("history", report, "rep", "--from", "5", "--to", "7").splitlines()[2:]
    assert [ln.split()[0] for ln in window] == ["5", "6", "7"]
    # Event types of records after --from are known though their enqueue came before it.
    assert "EventA" in window[2]


def test_history_json(report: str) -> None:
    """--json gives every record with its parsed payload and event type."""
    data = json.loads(ok("history", report, "rep", "--json"))
    assert [r["seq"] for r in data] == list(range(1, 15))
    failed = data[12]
    assert failed["kind"] == "step_failed"
    assert failed["event_type"] == "tests.flows:EventB"
    assert failed["payload"]["message"] == "var is not set"
    assert "Traceback" in failed["payload"]["traceback"]


# ---------------------------------------------------------------------------- checkpoints


def test_checkpoints_table_and_json(report: str) -> None:
    """checkpoints lists one line per commit; --step and --event filter them."""
    lines = ok("checkpoints", report, "rep").splitlines()[2:]
    assert len(lines) == 11
    assert lines[0].split() == ["2", "run_started", "StartEvent"]
    finish = json.loads(ok("checkpoints", report, "rep", "--step", "finish", "--json"))
    assert [c["kind"] for c in finish] == ["dequeued", "step_started", "step_failed", "run_failed"]
    by_event = json.loads(ok("checkpoints", report, "rep", "--event", "EventA", "--json"))
    assert by_event == [
        {
            "run_id": "rep",
            "seq": 6,
            "kind": "step_finished",
            "step": "start",
            "event_types": ["tests.flows:EventA"],
        }
    ]


# ---------------------------------------------------------------------------- state


def test_state_table_shows_in_progress_failure(report: str) -> None:
    """state at the end shows the failed step in progress with its failure and the error."""
    out = ok("state", report, "rep")
    assert out.splitlines()[0] == "run rep (tests.flows:ReportFlow) at seq 14: failed"
    assert "error in step finish: ValueError: var is not set" in out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("finish"))
    assert row.split()[:5] == ["finish", "#3", "EventB", "1", "1"]
    assert "tests.flows:EventB(content='second: first')" in row
    assert "queues: empty" in out
    assert "context: empty" in out


def test_state_at_seq_shows_queue(report: str) -> None:
    """state --at a middle seq shows the event queued for the next step."""
    out = ok("state", report, "rep", "--at", "6")
    assert "at seq 6: " in out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("process"))
    assert row.split()[:3] == ["process", "#2", "EventA"]
    assert "in progress: nothing" in out


def test_state_json(report: str) -> None:
    """state --json gives queues, in-progress entries and context as codec dumps."""
    data = json.loads(ok("state", report, "rep", "--at", "12", "--json"))
    assert data["seq"] == 12
    assert data["status"] == "running"  # what it was at seq 12
    assert data["in_progress"]["finish"] == [
        {
            "event_id": 3,
            "event": {"$t": "model", "c": "tests.flows:EventB", "v": {"content": "second: first"}},
            "attempt": 1,
            "failures": 0,
        }
    ]
    assert data["queues"] == {}
    assert data["context"] == {}


def test_state_typed_with_workflow(report: str) -> None:
    """With --workflow values are decoded by the user's classes and shown by their repr."""
    out = ok("state", report, "rep", "--workflow", "tests.flows:ReportFlow")
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("finish"))
    assert row.rstrip().endswith("EventB(content='second: first')")
    assert "tests.flows:EventB(" not in out
    typed = json.loads(ok("state", report, "rep", "--at", "6", "--json", "--workflow",
                          "tests.flows:ReportFlow"))  # fmt: skip
    expected = ReportFlow(store=report).state_at("rep", 6).to_json()
    assert typed.pop("failed_attempts") == []  # beside it: tracebacks (none failed by seq 6)
    assert typed == json.loads(json.dumps(expected))


def test_a_run_whose_process_died_is_interrupted(tmp_path: Path) -> None:
    """An unfinished run nobody executes any more reads as interrupted, also in runs."""
    db = tmp_path / "dead.db"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.flows", "always_dies", str(db), "run", "dead"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 9
    assert ok("state", db, "dead").splitlines()[0].endswith(": interrupted")
    assert re.search(r"^dead\s+interrupted\s", ok("runs", db), re.M)


def test_history_typed_with_workflow(report: str) -> None:
    """history --workflow shows payload values by their classes' repr."""
    out = ok("history", report, "rep", "--workflow", "tests.flows:ReportFlow")
    assert "#2 EventA(content='first') from #1 attempt 1" in out
    assert "tests.flows:EventA(" not in out


# ---------------------------------------------------------------------------- diff


def test_diff_shows_context_changes_old_to_new(tmp_path: Path) -> None:
    """diff lists steps, events and context keys added, changed (old → new) and removed."""
    db = tmp_path / "stages.db"
    run_to_end(Stages(store=db), run_id="st")
    a = seq_of(db, "st", "step_finished", "first")
    b = seq_of(db, "st", "run_finished")
    out = ok("diff", db, "st", a, b)
    assert "status: running → finished" in out
    assert "  ~ stage: 'one' → 'two'" in out
    assert "  - scratch (was [1, 2])" in out
    assert "  + count = 1" in out
    assert re.search(r"second\s+#2\s+1\s+finished, emitted #3", out)
    assert re.search(r"\d+\s+second\s+#2\s+tests\.test_cli:Note\(text='a'\)", out)  # consumed
    data = json.loads(ok("diff", db, "st", a, b, "--json"))
    assert data["context"] == {
        "added": {"count": 1},
        "changed": {"stage": {"old": "one", "new": "two"}},
        "removed": {"scratch": [1, 2]},
    }
    assert data["status"] == ["running", "finished"]
    assert [s["outcome"] for s in data["steps"]] == ["started", "finished"]
    assert data["consumed"][0]["event_id"] == 2


def test_diff_compares_encoded_values(tmp_path: Path) -> None:
    """1 and 1.0 and True are different values to diff, though Python calls them equal."""

    class Flip(Workflow):
        @step
        async def a(self, ctx: Context[Any], ev: StartEvent) -> Note:
            await ctx.store.set("x", 1)
            return Note(text="")

        @step
        async def b(self, ctx: Context[Any], ev: Note) -> StopEvent:
            await ctx.store.set("x", True)
            return StopEvent(result=None)

    db = tmp_path / "flip.db"
    run_to_end(Flip(store=db), run_id="f")
    out = ok(
        "diff", db, "f", seq_of(db, "f", "step_finished", "a"), seq_of(db, "f", "run_finished")
    )
    assert "~ x: 1 → True" in out


# ---------------------------------------------------------------------------- raw mode


TMPMOD = '''
"""A workflow the reading process never imports."""

import asyncio
import sys

from workflow import Event, StartEvent, StopEvent, Workflow, step


class EventA(Event):
    content: str
    n: int


class TmpFlow(Workflow):
    @step
    async def begin(self, ev: StartEvent) -> EventA:
        return EventA(content="hello", n=7)

    @step
    async def end(self, ev: EventA) -> StopEvent:
        raise RuntimeError("stop here")


async def main(db: str) -> None:
    handler = TmpFlow(store=db).run(run_id="tmp")
    try:
        await handler
    except RuntimeError:
        pass


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
'''


def write_module(tmp_path: Path, name: str, source: str) -> Path:
    """Writes a Python module into a directory of its own."""
    where = tmp_path / "mods"
    where.mkdir(exist_ok=True)
    (where / f"{name}.py").write_text(textwrap.dedent(source))
    return where


def run_module(where: Path, code: str, timeout: float = 60) -> None:
    """Runs Python code in a subprocess with ``where`` and the project importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr


def test_raw_mode_reads_without_the_users_module(tmp_path: Path) -> None:
    """A store written by code this process never imported shows class names and fields."""
    where = write_module(tmp_path, "tmpmod", TMPMOD)
    db = tmp_path / "tmp.db"
    run_module(where, f"import asyncio, tmpmod; asyncio.run(tmpmod.main({str(db)!r}))")
    assert "tmpmod" not in sys.modules
    history = ok("history", db, "tmp")
    assert "tmpmod:EventA(content='hello', n=7)" in history
    state = ok("state", db, "tmp")
    row = next(ln for ln in state.splitlines() if ln.strip().startswith("end"))
    assert row.split()[:3] == ["end", "#2", "EventA"]
    assert row.rstrip().endswith("tmpmod:EventA(content='hello', n=7)")
    data = json.loads(ok("state", db, "tmp", "--json"))
    assert data["in_progress"]["end"][0]["event"] == {
        "$t": "model",
        "c": "tmpmod:EventA",
        "v": {"content": "hello", "n": 7},
    }
    out = ok("diff", db, "tmp", 1, data["seq"])
    assert "tmpmod:EventA(content='hello', n=7)" in out
    ok("checkpoints", db, "tmp", "--event", "tmpmod:EventA")
    assert "tmpmod" not in sys.modules


# ---------------------------------------------------------------------------- bad arguments


@pytest.fixture
def not_a_store(tmp_path: Path) -> Path:
    """A text file where a store is expected."""
    path = tmp_path / "notes.txt"
    path.write_text("hello, I am not SQLite\n")
    return path


BAD = [
    pytest.param(["state", "{missing}", "rep"], "no such file", id="no-such-file"),
    pytest.param(["history", "{text}", "rep"], "not an event store", id="not-a-store"),
    pytest.param(["runs", "{dir}"], "not an event store", id="a-directory"),
    pytest.param(["state", "{db}", "nope"], "no run 'nope'", id="unknown-run"),
    pytest.param(["history", "{db}", "nope"], "no run 'nope'", id="unknown-run-history"),
    pytest.param(["checkpoints", "{db}", "nope"], "no run 'nope'", id="unknown-run-checkpoints"),
    pytest.param(["state", "{db}", "rep", "--at", "0"], "no state at seq 0", id="seq-before-run"),
    pytest.param(["state", "{db}", "rep", "--at", "999"], "past the end", id="seq-past-end"),
    pytest.param(["diff", "{db}", "rep", "0", "5"], "no state at seq 0", id="diff-before-run"),
    pytest.param(["diff", "{db}", "rep", "9", "5"], "A <= B", id="diff-reversed"),
    pytest.param(["state", "{db}", "rep", "--at", "x"], "not a valid integer", id="seq-not-int"),
    pytest.param(["state", "{db}"], "Missing argument 'RUN'", id="missing-argument"),
    pytest.param(["frobnicate"], "No such command", id="unknown-command"),
    pytest.param(["history", "{db}", "rep", "--kind", "nope"], "nope", id="unknown-kind"),
    pytest.param(["history", "{db}", "rep", "--from", "9", "--to", "2"], "after", id="from-to"),
    pytest.param(
        ["state", "{db}", "rep", "--workflow", "nosuchmodule:Flow"],
        "cannot import 'nosuchmodule'",
        id="workflow-module-missing",
    ),
    pytest.param(
        ["state", "{db}", "rep", "--workflow", "tests.flows:Nope"],
        "has no attribute 'Nope'",
        id="workflow-class-missing",
    ),
    pytest.param(
        ["state", "{db}", "rep", "--workflow", "tests.flows"],
        "is not MODULE:NAME",
        id="workflow-spec-malformed",
    ),
    pytest.param(
        ["state", "{db}", "rep", "--workflow", "tests.flows:EventA"],
        "not a Workflow subclass",
        id="workflow-not-a-workflow",
    ),
    pytest.param(
        ["resume", "{db}", "rep", "--workflow", "tests.flows:ReportFlow", "--set", "var"],
        "not KEY=JSON",
        id="set-without-value",
    ),
    pytest.param(
        ["resume", "{db}", "rep", "--workflow", "tests.flows:ReportFlow", "--set", "var=yes"],
        "is not JSON",
        id="set-not-json",
    ),
    pytest.param(
        ["resume", "{db}", "nope", "--workflow", "tests.flows:ReportFlow"],
        "no run 'nope'",
        id="resume-unknown-run",
    ),
    pytest.param(
        ["resume", "{missing}", "rep", "--workflow", "tests.flows:ReportFlow"],
        "no such file",
        id="resume-no-such-file",
    ),
    pytest.param(
        ["fork", "{db}", "rep", "--at", "0", "--workflow", "tests.flows:ReportFlow"],
        "no state at seq 0",
        id="fork-before-run",
    ),
    pytest.param(
        ["send", "{db}", "rep", "--event", "tests.flows:EventA", "--data", "[1]"],
        "JSON object",
        id="send-data-not-object",
    ),
    pytest.param(
        ["send", "{db}", "rep", "--event", "tests.flows:EventA", "--data", "{}"],
        "content",
        id="send-data-invalid",
    ),
    pytest.param(
        ["send", "{db}", "rep", "--event", "tests.flows:ReportFlow"],
        "not an Event subclass",
        id="send-not-an-event",
    ),
    pytest.param(
        ["send", "{db}", "rep", "--event", "tests.flows:EventA", "--data", '{"content": "x"}'],
        "has failed",
        id="send-to-ended-run",
    ),
    pytest.param(["graph", "--workflow", "tests.flows:EventA"], "not a Workflow", id="graph-bad"),
    pytest.param(["timeline", "{db}", "nope"], "no run 'nope'", id="timeline-unknown-run"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_arguments_give_one_line(
    args: list[str], message: str, report: str, not_a_store: Path, tmp_path: Path
) -> None:
    """A bad argument gives one line on stderr, no traceback, and a non-zero exit code."""
    places = {
        "{db}": str(report),
        "{missing}": str(tmp_path / "missing.db"),
        "{text}": str(not_a_store),
        "{dir}": str(tmp_path),
    }
    result = invoke(*[places.get(a, a) for a in args])
    assert result.exit_code != 0
    assert result.stdout == ""
    err = result.stderr
    assert err.count("\n") == 1, err
    assert err.startswith("error: ")
    assert message in err
    assert "Traceback" not in err
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "missing.db").exists()  # reading never creates a store


def test_help_and_no_command() -> None:
    """--help lists the commands; no command at all prints the help and fails."""
    out = ok("--help")
    for name in ("runs", "history", "checkpoints", "state", "diff", "resume", "fork", "send"):
        assert name in out
    bare = invoke()
    assert bare.exit_code != 0
    assert "Commands:" in bare.stderr


def test_unexpected_errors_are_one_line_too(report: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug of ours still shows one line (and WORKFLOW_DEBUG=1 shows the traceback)."""

    def boom(*args: Any, **kwargs: Any) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr("workflow.cli._app.fold_run", boom)
    result = invoke("state", report, "rep")
    assert result.exit_code == 1
    assert (
        result.stderr == "error: KeyError: 'surprise' (set WORKFLOW_DEBUG=1 to see the traceback)\n"
    )


# ---------------------------------------------------------------------------- progress


def test_progress_bar_on_a_terminal_for_large_logs(
    report: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a large log draws a progress bar on stderr when stderr is a terminal."""
    monkeypatch.setattr(_common, "_stderr_is_tty", lambda: True)
    monkeypatch.setattr(_common, "PROGRESS_MIN", 5)
    result = invoke("history", report, "rep")
    assert result.exit_code == 0
    assert "reading" in result.stderr
    # A fold that cannot start from the run's cached state shows one too.
    assert "folding" in invoke("state", report, "rep", "--at", "5").stderr
    monkeypatch.setattr(_common, "PROGRESS_MIN", 1_000)
    assert invoke("history", report, "rep").stderr == ""


# ---------------------------------------------------------------------------- concurrent


LOOPMOD = """
import asyncio
import sys

from workflow import Event, StartEvent, StopEvent, Workflow, step


class Tick(Event):
    n: int


class Loop(Workflow):
    @step
    async def tick(self, ev: StartEvent | Tick) -> Tick | StopEvent:
        n = ev.n if isinstance(ev, Tick) else 0
        await asyncio.sleep(0.004)
        if n >= 150:
            return StopEvent(result=n)
        return Tick(n=n + 1)


async def main(db: str) -> None:
    print("started", flush=True)
    await Loop(store=db, timeout=None).run(run_id="loop")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
"""


def test_reads_while_another_process_writes(tmp_path: Path) -> None:
    """Every read command works on a store another process is appending to."""
    where = write_module(tmp_path, "loopmod", LOOPMOD)
    db = tmp_path / "loop.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
    with child([sys.executable, "-m", "loopmod", str(db)], env=env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while not db.exists() or '"loop"' not in invoke("runs", db, "--json").stdout:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        seqs: list[int] = []
        statuses: set[str] = set()
        while proc.poll() is None and len(seqs) < 40:
            state = json.loads(ok("state", db, "loop", "--json"))
            seqs.append(state["seq"])
            statuses.add(state["status"])
            lines = json.loads(ok("history", db, "loop", "--json"))
            assert [r["seq"] for r in lines] == sorted(r["seq"] for r in lines)
            assert lines[-1]["seq"] == lines[-1]["commit_seq"]  # whole commits only
            ok("checkpoints", db, "loop")
            ok("diff", db, "loop", 1, state["seq"])
        assert proc.wait(timeout=60) == 0
    assert seqs == sorted(seqs)
    assert "running" in statuses  # the writer's ownership is seen from this process
    assert json.loads(ok("state", db, "loop", "--json"))["status"] == "finished"


# ---------------------------------------------------------------------------- resume / fork / send


def test_resume_end_to_end(report: str) -> None:
    """resume --set writes the key first and re-runs only the failed step."""
    out = ok("resume", report, "rep", "--workflow", "tests.flows:ReportFlow", "--set", "var=true")
    assert out == "run rep finished: 'end: second: first'\n"
    assert read_trace(report) == ["start", "process", "finish", "finish"]
    assert "finished" in ok("runs", report)
    state = json.loads(ok("state", report, "rep", "--json"))
    assert state["context"] == {"var": True}
    # The resume's line says how the run had ended, in history and timeline alike.
    from tests.test_cli_operator import resumed_line

    assert resumed_line(report, "rep") == "epoch 2, had failed"


def test_resume_that_fails_again_exits_1(report: str) -> None:
    """A resumed run that fails again says so on one line and exits 1."""
    result = invoke("resume", report, "rep", "--workflow", "tests.flows:ReportFlow")
    assert result.exit_code == 1
    assert result.stdout == "run rep failed: ValueError: var is not set\n"
    assert "Traceback" not in result.stdout + result.stderr


def test_fork_end_to_end(report: str) -> None:
    """fork starts a new run from a checkpoint; runs shows its parent; the parent is unchanged."""
    before = ok("history", report, "rep", "--json")
    result = json.loads(
        ok("fork", report, "rep", "--at", "12", "--workflow", "tests.flows:ReportFlow",
           "--set", 'var="yes"', "--json")
    )  # fmt: skip
    assert result["status"] == "finished"
    assert result["result"] == "end: second: first"
    child = result["run_id"]
    runs = {r["run_id"]: r for r in json.loads(ok("runs", report, "--json"))}
    assert runs[child]["parent_run_id"] == "rep"
    assert runs[child]["parent_seq"] == 12
    assert re.search(rf"^{child}\s+finished\s+.*\srep@12\s*$", ok("runs", report), re.M)
    assert ok("history", report, "rep", "--json") == before
    assert read_trace(report) == ["start", "process", "finish", "finish"]  # only finish again
    state = ok("state", report, child)
    assert "forked from rep at seq 12" in state


def test_send_then_resume_end_to_end(tmp_path: Path) -> None:
    """send records an event for a waiting run; resume then answers its waiter."""
    db = tmp_path / "ask.db"

    async def start() -> str:
        wf = Asker(store=db, timeout=None)
        handler = wf.run(run_id="ask")
        await handler.wait_until_waiting(10)
        await handler.suspend()
        wf.store.close()
        return handler.run_id

    asyncio.run(start())
    state = ok("state", db, "ask")
    assert state.splitlines()[0] == "run ask (tests.flows:Asker) at seq 7: waiting"
    assert re.search(r"ask\s+#1\s+HumanResponseEvent", state)
    sent = ok(
        "send", db, "ask", "--event", "workflow:HumanResponseEvent", "--data",
        '{"response": "Ada"}',
    )  # fmt: skip
    assert sent.startswith("sent HumanResponseEvent(response='Ada') to run ask (inbox entry 1)")
    assert "inbox: 1 external event(s) not yet taken in" in ok("state", db, "ask")
    out = ok("resume", db, "ask", "--workflow", "tests.flows:Asker")
    assert out == "run ask finished: 'hello Ada'\n"
    history = ok("history", db, "ask", "--kind", "wait_resolved", "--full")
    assert "answered by #2 HumanResponseEvent(response='Ada')" in history


def test_resume_leaves_a_run_that_only_waits(tmp_path: Path) -> None:
    """A resumed run that ends up waiting is left resumable, with a hint to send the event."""
    db = tmp_path / "ask.db"
    run = ok("run", db, "--workflow", "tests.flows:Asker", "--run-id", "a1")
    # The public name of the engine's event, in the command to send it.
    assert run.startswith("run a1 is waiting for workflow:HumanResponseEvent;"), run
    assert "workflow._events" not in run
    assert f"`workflow send {db} a1 --event workflow:HumanResponseEvent --data JSON`" in run
    assert json.loads(ok("state", db, "a1", "--json"))["status"] == "waiting"
    again = ok("resume", db, "a1", "--workflow", "tests.flows:Asker", "--json")
    assert json.loads(again) == {
        "run_id": "a1",
        "status": "waiting",
        "waiting_for": ["workflow._events:HumanResponseEvent"],
    }


def test_the_waiting_hint_quotes_the_store_for_a_shell(tmp_path: Path) -> None:
    """The hint's command can be pasted into a shell: a store whose name a shell would split
    or expand (a space; a PostgreSQL URL's `?`) is quoted."""
    db = tmp_path / "my runs?.db"
    run = ok("run", db, "--workflow", "tests.flows:Asker", "--run-id", "a1")
    assert f"`workflow send '{db}' a1 --event workflow:HumanResponseEvent --data JSON`" in run


def test_the_waiting_hint_names_a_users_event_by_its_own_module(tmp_path: Path) -> None:
    """A wait for the user's own event class is hinted by its module; the hint's command
    sends it and the resume finishes the run."""
    db = tmp_path / "approve.db"
    run = ok("run", db, "--workflow", "tests.flows:AwaitsApproval", "--run-id", "p1")
    hint = f"`workflow send {db} p1 --event tests.flows:Approved --data JSON`"
    assert run.startswith("run p1 is waiting for tests.flows:Approved;"), run
    assert hint in run
    ok("send", db, "p1", "--event", "tests.flows:Approved", "--data", '{"by": "Bo"}')
    out = ok("resume", db, "p1", "--workflow", "tests.flows:AwaitsApproval")
    assert out == "run p1 finished: 'approved by Bo'\n"


def test_public_event_name_only_renames_what_the_workflow_namespace_exports() -> None:
    """Private engine modules give way to ``workflow:`` only for a class it exports."""
    assert public_event_name("workflow._events:HumanResponseEvent") == (
        "workflow:HumanResponseEvent"
    )
    assert public_event_name("workflow._events:StartEvent") == "workflow:StartEvent"
    assert public_event_name("workflow._events:NoSuchEvent") == "workflow._events:NoSuchEvent"
    assert public_event_name("tests.flows:Approved") == "tests.flows:Approved"
    assert public_event_name("workflow.nowhere:Event") == "workflow.nowhere:Event"
    assert public_event_name("Approved") == "Approved"


def test_send_through_the_workflow(tmp_path: Path) -> None:
    """send --workflow uses wf.send, and --key records the event once."""
    db = tmp_path / "ask.db"
    ok("run", db, "--workflow", "tests.flows:Asker", "--run-id", "a2")
    args: list[str | Path] = ["send", db, "a2", "--event", "workflow:HumanResponseEvent", "--data",
            '{"response": "Bo"}', "--key", "k1", "--json"]  # fmt: skip
    first = json.loads(ok(*args, "--workflow", "tests.flows:Asker"))
    second = json.loads(ok(*args))
    assert first["inbox_id"] == second["inbox_id"]
    assert (
        ok("resume", db, "a2", "--workflow", "tests.flows:Asker") == "run a2 finished: 'hello Bo'\n"
    )


# ---------------------------------------------------------------------------- graph


def test_graph_mermaid_html_and_json(tmp_path: Path) -> None:
    """graph prints Mermaid, writes a self-contained page, and gives the steps as JSON."""
    text = ok("graph", "--workflow", "tests.flows:ReportFlow")
    assert text.startswith("flowchart TD\n")
    assert "    step_start -->|EventA| step_process\n" in text
    assert "    step_finish -->|StopEvent| wf_stop\n" in text
    assert "    wf_start -->|StartEvent| step_start\n" in text
    page = tmp_path / "flow.html"
    ok("graph", "--workflow", "tests.flows:ReportFlow", "-o", page)
    html = page.read_text()
    assert "<svg" in html
    assert "http" not in html
    assert "step_process --&gt;|EventB| step_finish" in html
    mmd = tmp_path / "flow.mmd"
    ok("graph", "--workflow", "tests.flows:ReportFlow", "-o", mmd)
    assert mmd.read_text() == text
    data = json.loads(ok("graph", "--workflow", "tests.flows:Asker", "--json"))
    assert data["steps"]["ask"]["accepts"] == ["workflow._events:StartEvent"]


# ---------------------------------------------------------------------------- README


WRITER_PY = '''
"""A two-step workflow whose second step fails until someone approves the draft."""

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Draft(Event):
    text: str


class Writer(Workflow):
    @step
    async def draft(self, ctx: Context, ev: StartEvent) -> Draft:
        await ctx.store.set("stage", "drafted")
        return Draft(text=f"notes on {ev.topic}")

    @step
    async def publish(self, ctx: Context, ev: Draft) -> StopEvent:
        if not await ctx.store.get("approved", default=False):
            raise RuntimeError("not approved yet")
        await ctx.store.set("stage", "published")
        return StopEvent(result=ev.text.upper())
'''


@pytest.fixture
def writer_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory holding the README's writer.py, as the working directory."""
    (tmp_path / "writer.py").write_text(WRITER_PY.lstrip())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("writer", None)


def _no_times(text: str) -> str:
    # Times and dates change from run to run; everything else in the README is exact.
    text = re.sub(r"\+\d+\.\d{3}", "+0.000", text)
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "2025-01-01 00:00:00", text)


def test_readme_debugging_walkthrough(writer_dir: Path) -> None:
    """The commands of the README's "Debugging a run" give the output it shows."""
    wf = ("--workflow", "writer:Writer")
    result = invoke("run", "writer.db", *wf, "--run-id", "draft-1", "--data", '{"topic": "sqlite"}')
    assert result.exit_code == 1, result.stderr
    assert result.stdout == "run draft-1 failed: RuntimeError: not approved yet\n"
    assert _no_times(ok("runs", "writer.db")) == README["runs"]
    assert _no_times(ok("history", "writer.db", "draft-1")) == README["history"]
    assert ok("state", "writer.db", "draft-1") == README["state"]
    assert ok("state", "writer.db", "draft-1", "--at", "7", *wf) == README["state-at"]
    assert ok("checkpoints", "writer.db", "draft-1", "--step", "publish") == README["checkpoints"]
    resumed = ok("resume", "writer.db", "draft-1", *wf, "--set", "approved=true")
    assert resumed == "run draft-1 finished: 'NOTES ON SQLITE'\n"
    assert ok("diff", "writer.db", "draft-1", "11", "17") == README["diff"]
    fork = ok("fork", "writer.db", "draft-1", "--at", "8", *wf, "--set", "approved=true")
    child = re.fullmatch(
        r"forked run draft-1 at seq 8 as (\w+)\nrun \1 finished: 'NOTES ON SQLITE'\n", fork
    )
    assert child is not None
    runs = _no_times(ok("runs", "writer.db")).replace(
        child.group(1), "5a92cbecb85d436f9cb26d8fd0baabb3"
    )
    assert runs == README["runs-after"]
    assert re.fullmatch(
        r"wrote draft-1\.html \(12 commits, \d+ KiB\)\n", ok("timeline", "writer.db", "draft-1")
    )
    assert (writer_dir / "draft-1.html").exists()
    assert ok("graph", *wf) == README["graph"]


# The README's outputs, as `workflow` printed them (times and dates normalised to these).
README = {
    "runs": """\
run      status    workflow       started (UTC)        last seq    parent
-------  --------  -------------  -------------------  ----------  --------
draft-1  failed    writer:Writer  2025-01-01 00:00:00  11
""",
    "history": """\
seq  commit  time      kind             step     event               payload
---  ------  --------  ---------------  -------  ------------------  ----------------------------------------
1    2       +0.000    run_started                                   writer:Writer start #1 StartEvent(topic='sqlite')
2    2       +0.000    enqueued         draft    StartEvent          #1 StartEvent(topic='sqlite') from start
3    3       +0.000    dequeued         draft    StartEvent          #1 worker 0
4    4       +0.000    step_started     draft    StartEvent          #1 attempt 1
5    7       +0.000    step_finished    draft    StartEvent          #1 attempt 1 emitted #2
6    7       +0.000    state_set        draft                        stage = 'drafted'
7    7       +0.000    enqueued         publish  Draft               #2 writer:Draft(text='notes on sqlite') from #1 attempt 1
8    8       +0.000    dequeued         publish  Draft               #2 worker 0
9    9       +0.000    step_started     publish  Draft               #2 attempt 1
10   10      +0.000    step_failed      publish  Draft               #2 attempt 1 RuntimeError: not approved yet (no retry)
11   11      +0.000    run_failed       publish                      RuntimeError: not approved yet
""",  # noqa: E501 (the README shows the lines as they are)
    "state": """\
run draft-1 (writer:Writer) at seq 11: failed
error in step publish: RuntimeError: not approved yet

queues: empty

in progress:
  step     event    type    attempts    failures    value
  -------  -------  ------  ----------  ----------  ------------------------------------
  publish  #2       Draft   1           1           writer:Draft(text='notes on sqlite')

context:
  key    value
  -----  ---------
  stage  'drafted'

waiters: none
""",
    "state-at": """\
run draft-1 (writer:Writer) at seq 7: running

queues:
  step     event    type    value
  -------  -------  ------  -----------------------------
  publish  #2       Draft   Draft(text='notes on sqlite')

in progress: nothing

context:
  key    value
  -----  ---------
  stage  'drafted'

waiters: none
""",
    "checkpoints": """\
seq    kind          step     events
-----  ------------  -------  --------
8      dequeued      publish
9      step_started  publish
10     step_failed   publish
11     run_failed    publish
""",
    "diff": """\
run draft-1: seq 11 → seq 17
status: failed → finished

events enqueued: none

events consumed: none

step attempts:
  seq    step     event    attempt    outcome
  -----  -------  -------  ---------  --------------------
  14     publish  #2       2          started
  15     publish  #2       2          finished, emitted #3

context:
  + approved = True
  ~ stage: 'drafted' → 'published'

result: StopEvent(result='NOTES ON SQLITE')
""",
    "runs-after": """\
run                               status    workflow       started (UTC)        last seq    parent
--------------------------------  --------  -------------  -------------------  ----------  ---------
draft-1                           finished  writer:Writer  2025-01-01 00:00:00  17
5a92cbecb85d436f9cb26d8fd0baabb3  finished  writer:Writer  2025-01-01 00:00:00  23          draft-1@8
""",  # noqa: E501 (the README shows the lines as they are)
    "graph": """\
flowchart TD
    wf_start(["run()"])
    step_draft["draft"]
    step_publish["publish"]
    wf_stop(["result"])
    wf_start -->|StartEvent| step_draft
    step_draft -->|Draft| step_publish
    step_publish -->|StopEvent| wf_stop
""",
}


def test_readme_shows_these_outputs() -> None:
    """The README's "Debugging a run" shows exactly the outputs checked above."""
    text = _no_times((Path(__file__).resolve().parent.parent / "README.md").read_text())
    for key, block in README.items():
        assert _no_times(block).strip() in text, f"README block {key!r} is not the output"


def test_a_dict_result_is_shown_in_its_own_key_order() -> None:
    """``run … finished: {...}`` shows a dict as the step built it (reprlib sorts keys),
    still bounded: nested levels and long dicts are cut."""
    from workflow.cli._render import show_typed

    assert show_typed({"total": 3, "ids": [1, 2], "count": {"z": 1, "a": 2}}) == (
        "{'total': 3, 'ids': [1, 2], 'count': {'z': 1, 'a': 2}}"
    )
    many = show_typed({f"k{i:02}": i for i in range(25, 0, -1)}, 2000)
    assert many.startswith("{'k25': 25, 'k24': 24,")
    assert many.endswith(", ...}")
    assert show_typed({"a": {"b": {"c": {"d": {"e": 1}}}}}) == "{'a': {'b': {'c': {'d': {...}}}}}"
