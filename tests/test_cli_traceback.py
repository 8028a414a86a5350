"""Stored tracebacks of failed attempts, shown: ``state`` / ``history --traceback``, their
``--json``, and the data the timeline page embeds."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner, Result

from eventstore import EventStore
from tests.test_cli import WRITER_PY, _no_times, writer_dir
from workflow import (
    Context,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.cli import cli
from workflow.cli._timeline import TRACEBACK, render_page, timeline_data
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed

__all__ = ["writer_dir"]  # the README's writer.py, as a fixture

WF = ("--workflow", "writer:Writer")


def invoke(*args: str | Path | int) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(*args: str | Path | int) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


@pytest.fixture
def failed_draft(writer_dir: Path) -> Path:
    """The README's draft-1: its publish step raised RuntimeError and failed the run."""
    result = invoke("run", "runs.db", *WF, "--run-id", "draft-1", "--data", '{"topic": "sqlite"}')
    assert result.exit_code == 1, result.stderr
    return writer_dir / "runs.db"


def raise_line() -> str:
    """The line of writer.py the README's publish step raises on."""
    lines = WRITER_PY.lstrip().splitlines()
    return f"line {lines.index(next(ln for ln in lines if 'raise' in ln)) + 1}, in publish"


def test_history_traceback_follows_the_failed_line(failed_draft: Path) -> None:
    """history --traceback prints the stored traceback, indented, right under its record."""
    plain = ok("history", "runs.db", "draft-1")
    assert "Traceback" not in plain
    lines = ok("history", "runs.db", "draft-1", "--traceback").splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("10 ") and "step_failed" in ln)
    tb = lines[at + 1 : lines.index(next(ln for ln in lines if ln.startswith("11 ")))]
    assert tb[0] == "     Traceback (most recent call last):"
    assert any(ln.endswith(raise_line()) and "writer.py" in ln for ln in tb)
    assert tb[-1] == "     RuntimeError: not approved yet"
    assert lines[: at + 1] + lines[at + 1 + len(tb) :] == plain.splitlines()


def test_history_json_has_the_traceback(failed_draft: Path) -> None:
    """history --json carries each failure's traceback in its payload, without a flag."""
    rows = json.loads(ok("history", "runs.db", "draft-1", "--kind", "step_failed", "--json"))
    assert len(rows) == 1
    tb = rows[0]["payload"]["traceback"]
    assert tb.startswith("Traceback (most recent call last):\n")
    assert raise_line() in tb
    assert tb.endswith("RuntimeError: not approved yet\n")


def test_state_traceback_shows_the_failed_attempt(failed_draft: Path) -> None:
    """state --traceback ends with the failed attempt of the step in progress and its
    traceback; without the flag the state is as before."""
    plain = ok("state", "runs.db", "draft-1")
    shown = ok("state", "runs.db", "draft-1", "--traceback")
    assert shown.startswith(plain)
    rest = shown[len(plain) :].splitlines()
    assert rest[:3] == [
        "",
        "failed attempts:",
        "  publish #2 attempt 1 at seq 10: RuntimeError: not approved yet",
    ]
    assert rest[3] == "    Traceback (most recent call last):"
    assert any(ln.endswith(raise_line()) for ln in rest)
    assert rest[-1] == "    RuntimeError: not approved yet"


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_state_json_has_the_traceback(failed_draft: Path, typed: bool) -> None:
    """state --json always gives the run's error with its traceback, and the failed
    attempts of the steps in progress, raw or typed."""
    data = json.loads(ok("state", "runs.db", "draft-1", "--json", *(WF if typed else ())))
    error = data["error"]
    assert (error["step"], error["error"], error["message"]) == (
        "publish",
        "RuntimeError",
        "not approved yet",
    )
    assert raise_line() in error["traceback"]
    [failed] = data["failed_attempts"]
    assert {k: failed[k] for k in ("step", "event_id", "attempt", "seq", "retry")} == {
        "step": "publish",
        "event_id": 2,
        "attempt": 1,
        "seq": 10,
        "retry": False,
    }
    assert failed["traceback"] == error["traceback"]


def test_a_fork_shows_the_failure_its_parent_recorded(failed_draft: Path) -> None:
    """A fork given a failed event in progress shows the traceback its parent recorded."""
    with EventStore(failed_draft, readonly=True) as store:
        assert [r.seq for r in store.records("draft-1", kinds=["step_failed"])] == [10]

    async def fork() -> str:
        from writer import Writer  # type: ignore[import-not-found]  # the README's module

        wf = Writer(store=failed_draft)
        handler = wf.run_from(("draft-1", 10))
        with pytest.raises(RuntimeError):
            await handler
        wf.store.close()
        return str(handler.run_id)

    child = asyncio.run(fork())
    with EventStore(failed_draft, readonly=True) as store:
        first = next(iter(store.records(child))).seq
    data = json.loads(ok("state", "runs.db", child, "--at", first, "--json"))
    [failed] = data["failed_attempts"]
    assert (failed["seq"], failed["step"], failed["event_id"]) == (10, "publish", 2)
    # At its end the fork's own failure is the one shown.
    data = json.loads(ok("state", "runs.db", child, "--json"))
    [failed] = data["failed_attempts"]
    assert failed["seq"] > first
    assert data["error"]["traceback"] == failed["traceback"]


def test_a_failure_without_a_stored_traceback_says_so(failed_draft: Path) -> None:
    """A step_failed record without a traceback (none was stored) is shown as such."""
    with sqlite3.connect(failed_draft) as conn:
        (payload,) = conn.execute("SELECT payload FROM log WHERE seq = 10").fetchone()
        p = json.loads(payload)
        del p["traceback"]
        conn.execute("UPDATE log SET payload = ? WHERE seq = 10", (json.dumps(p),))
        conn.execute("DELETE FROM snapshots")
    history = ok("history", "runs.db", "draft-1", "--traceback").splitlines()
    assert history[history.index(next(ln for ln in history if ln.startswith("10 "))) + 1] == (
        "     (no traceback recorded)"
    )
    assert ok("state", "runs.db", "draft-1", "--traceback").endswith(
        "not approved yet\n    (no traceback recorded)\n"
    )
    data = json.loads(ok("state", "runs.db", "draft-1", "--json"))
    assert data["error"]["traceback"] is None
    assert data["failed_attempts"][0]["traceback"] is None


class Retrier(Workflow):
    """A step that fails twice the same way, then succeeds on its third attempt."""

    calls: ClassVar[dict[str, int]] = {}  # outside the context: failed attempts count too

    @step(retry_policy=retry_policy(wait=wait_fixed(0.01), stop=stop_after_attempt(3)))
    async def work(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        calls = self.calls[ctx.run_id] = self.calls.get(ctx.run_id, 0) + 1
        if calls < 3:
            msg = "not yet"
            raise ConnectionError(msg)
        return StopEvent(result="done")


def retried(db: Path) -> str:
    """A Retrier run in ``db`` that failed twice and finished; its id."""

    async def go() -> str:
        handler = Retrier(store=db, timeout=None).run()
        assert await handler == "done"
        return str(handler.run_id)

    return asyncio.run(go())


def test_state_shows_a_retried_failure_and_forgets_it_once_done(tmp_path: Path) -> None:
    """While a failed step waits for its retry, state --traceback shows the failure (will
    retry); once the step finished no failed attempt is left."""
    db = tmp_path / "r.db"
    run = retried(db)
    with EventStore(db, readonly=True) as store:
        failed = [r.seq for r in store.records(run, kinds=["step_failed"])]
    assert len(failed) == 2
    shown = ok("state", db, run, "--at", failed[0], "--traceback")
    assert f"  work #1 attempt 1 at seq {failed[0]}: ConnectionError: not yet (will retry)" in shown
    assert "    ConnectionError: not yet" in shown
    assert ok("state", db, run, "--traceback").endswith("failed attempts: none\n")


# ---------------------------------------------------------------------------- timeline


def test_timeline_data_carries_the_traceback(failed_draft: Path) -> None:
    """The page embeds each failed attempt's traceback, and its step_failed record points
    at it; the written page holds the text."""
    with EventStore(failed_draft, readonly=True) as store:
        data = timeline_data(store, "draft-1")
        stored = json.loads(next(iter(store.records("draft-1", kinds=["step_failed"]))).payload)
    kinds = data["kinds"]
    rec = data["rec"]
    [i] = [i for i, k in enumerate(rec["k"]) if kinds[k] == "step_failed"]
    assert rec["seq"][i] == 10
    index = rec["a"][i][3]
    assert data["tb"][index] == stored["traceback"]
    page = render_page(data)
    assert json.dumps(stored["traceback"])[1:-1].replace("<", "\\u003c") in page


def test_timeline_embeds_a_repeated_traceback_once(tmp_path: Path) -> None:
    """Retries that fail alike share one embedded traceback."""
    db = tmp_path / "r.db"
    run = retried(db)
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, run)
    kinds, rec = data["kinds"], data["rec"]
    failures = [rec["a"][i] for i, k in enumerate(rec["k"]) if kinds[k] == "step_failed"]
    assert len(failures) == 2
    assert failures[0][3] == failures[1][3] == 0
    assert len(data["tb"]) == 1
    assert data["tb"][0].endswith("ConnectionError: not yet\n")


def test_timeline_keeps_the_end_of_a_huge_traceback(failed_draft: Path) -> None:
    """A traceback longer than the page keeps is cut from the front: its end says where."""
    huge = "Traceback (most recent call last):\n" + "  frame\n" * 10_000 + "RuntimeError: x\n"
    with sqlite3.connect(failed_draft) as conn:
        (payload,) = conn.execute("SELECT payload FROM log WHERE seq = 10").fetchone()
        p = json.loads(payload)
        p["traceback"] = huge
        conn.execute("UPDATE log SET payload = ? WHERE seq = 10", (json.dumps(p),))
    with EventStore(failed_draft, readonly=True) as store:
        data = timeline_data(store, "draft-1")
    [tb] = data["tb"]
    assert tb == "…\n" + huge[-TRACEBACK:]
    assert re.search(r"RuntimeError: x\n$", tb)


# ---------------------------------------------------------------------------- README


def _tb_normal(text: str) -> str:
    """Output with times, the engine's own frames, paths before file names and caret lines
    (which differ across Python versions) taken out; the user's frames stay exact."""
    out: list[str] = []
    frame_indent: int | None = None
    for line in _no_times(text).splitlines():
        indent = len(line) - len(line.lstrip())
        if frame_indent is not None and indent > frame_indent:
            continue  # the engine frame's source line
        frame_indent = None
        if re.match(r'\s*File "[^"]*/workflow/\w+\.py", line \d+', line):
            frame_indent = indent
            continue
        if re.fullmatch(r"\s*[~^]+\s*", line):
            continue
        out.append(re.sub(r'File "[^"]*/([\w.]+\.py)"', r'File "\1"', line))
    return "\n".join(out)


def test_readme_shows_history_traceback(failed_draft: Path) -> None:
    """The README's --traceback example is what the command prints for its writer.py."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    command = "$ workflow history writer.db draft-1 --kind step_failed --traceback\n"
    start = readme.index(command) + len(command)
    shown = readme[start : readme.index("```", start)]
    out = ok("history", "runs.db", "draft-1", "--kind", "step_failed", "--traceback")
    assert _tb_normal(out) == _tb_normal(shown)
    assert 'File "writer.py", line 19, in publish' in _tb_normal(out)
