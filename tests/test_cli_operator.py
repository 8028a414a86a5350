"""The small operator commands: ``workflow cancel``, ``workflow --version`` and the
``workflow runs`` filters (``--status``, ``--workflow``, ``--since``, ``--parent``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from eventstore import Commit, EventStore, Record
from tests.conftest import BACKENDS, new_location
from tests.flows import Asker, ReportFlow
from tests.support.child import child
from tests.support.ui_server import waiting_asker
from tests.test_cli import invoke, ok, run_to_end
from tests.test_workers import Doubler
from workflow import WorkflowCancelledError
from workflow._journal import RUN_CANCELLED
from workflow.cli._filters import RunFilter, parse_since, parse_statuses
from workflow.errors import WorkflowCancelledByUser

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A store with a failed ReportFlow run 'rep', its fork 'fork' (finished) and a waiting
    Asker run 'ask'."""
    db = tmp_path / "mixed.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")

    async def more() -> None:
        wf = ReportFlow(store=db, timeout=None)
        at = next(c.seq for c in wf.checkpoints("rep") if c.step == "process")
        h = wf.run_from(("rep", at), updates={"var": 1})
        await h
        wf.store.close()

    asyncio.run(more())
    waiting_asker(db, "ask")
    return db


def run_ids(db: Path, *args: str) -> list[str]:
    return [r["run_id"] for r in json.loads(ok("runs", db, "--json", *args))]


def fork_id(db: Path) -> str:
    (row,) = [r for r in json.loads(ok("runs", db, "--json")) if r["parent_run_id"] == "rep"]
    return str(row["run_id"])


def test_version() -> None:
    """`workflow --version` names the installed package's version."""
    out = ok("--version")
    assert out.strip() == f"workflow, version {version('durable-workflows')}"


def test_runs_filters(mixed: Path) -> None:
    """Each filter keeps only the runs it names, alone and combined; the table says when
    nothing matched."""
    child = fork_id(mixed)
    assert sorted(run_ids(mixed)) == sorted(["rep", child, "ask"])
    assert run_ids(mixed, "--status", "failed") == ["rep"]
    assert sorted(run_ids(mixed, "--status", "failed,waiting")) == ["ask", "rep"]
    assert sorted(run_ids(mixed, "--workflow", "tests.flows:ReportFlow")) == sorted(["rep", child])
    assert run_ids(mixed, "--workflow", "Asker") == ["ask"]
    assert run_ids(mixed, "--workflow", "tests.flows:Nope") == []
    assert run_ids(mixed, "--parent", "rep") == [child]
    assert sorted(run_ids(mixed, "--since", "1h")) == sorted(["rep", child, "ask"])
    assert run_ids(mixed, "--since", "2999-01-01") == []
    assert run_ids(mixed, "--status", "finished", "--workflow", "ReportFlow") == [child]
    result = invoke("runs", mixed, "--status", "timed_out")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no runs match" in result.stderr
    table = ok("runs", mixed, "--status", "waiting")
    assert "ask" in table
    assert "waiting for HumanResponseEvent" in table
    assert "rep" not in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "done"], "unknown status done: use running, waiting, interrupted"),
        (["--since", "yesterday"], "'yesterday' is neither a duration ago (30m, 2h, 7d)"),
        (["--since", "5 parsecs"], "is neither a duration ago"),
    ],
)
def test_runs_filters_refuse_bad_values(mixed: Path, args: list[str], message: str) -> None:
    """A bad filter value is one line naming it, exit code 2, nothing listed."""
    result = invoke("runs", mixed, *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_filter_parsing() -> None:
    """Durations count back from now; ISO times without a zone are UTC."""
    now = 1_800_000_000.0
    assert parse_since("30m", now) == int((now - 1800) * 1e6)
    assert parse_since("2h", now) == int((now - 7200) * 1e6)
    assert parse_since("1.5d", now) == int((now - 1.5 * 86400) * 1e6)
    assert parse_since("1970-01-02") == 86400 * 1_000_000
    assert parse_since("1970-01-01T01:00+01:00") == 0
    assert parse_statuses("failed, finished") == {"failed", "finished"}
    with pytest.raises(ValueError, match="unknown status"):
        parse_statuses(",")
    assert RunFilter(parent="rep") != RunFilter()


def test_cancel_a_waiting_run_then_resume_it(mixed: Path) -> None:
    """A waiting run is cancelled (it then lists as cancelled) and `resume --cancelled`
    continues it: the waiter is still there to answer."""
    out = ok("cancel", mixed, "ask")
    assert out.startswith("cancelled run ask (run_cancelled at seq ")
    assert run_ids(mixed, "--status", "cancelled") == ["ask"]
    last = json.loads(ok("history", mixed, "ask", "--json"))[-1]
    assert last["kind"] == "run_cancelled"

    async def go() -> None:
        wf = Asker(store=mixed, timeout=None)
        with pytest.raises(Exception, match="cancelled"):
            wf.resume("ask")
        h = wf.resume("ask", cancelled=True)
        await h.wait_until_waiting(30)
        assert h.is_done() is False
        await h.cancel_run()
        with pytest.raises(WorkflowCancelledError):
            await h
        wf.store.close()

    asyncio.run(go())


def test_cancel_refuses_ended_and_unknown_runs(mixed: Path) -> None:
    """Cancelling a run that ended, or one that does not exist, is one line, exit 1, and
    writes nothing."""
    before = json.loads(ok("history", mixed, "rep", "--json"))
    result = invoke("cancel", mixed, "rep")
    assert result.exit_code == 1
    assert "run 'rep' has already failed; there is nothing to cancel" in result.stderr
    assert json.loads(ok("history", mixed, "rep", "--json")) == before
    result = invoke("cancel", mixed, "nope")
    assert result.exit_code == 1
    assert "nope" in result.stderr
    result = invoke("cancel", mixed.parent / "missing.db", "rep")
    assert result.exit_code == 1
    assert "no such file" in result.stderr
    assert not (mixed.parent / "missing.db").exists()


GATED = """
import asyncio, sys
from pathlib import Path
from workflow import StartEvent, StopEvent, Workflow, step

class Gated(Workflow):
    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        Path(sys.argv[2]).write_text("started")
        while not Path(sys.argv[3]).exists():
            await asyncio.sleep(0.02)
        return StopEvent(result="went through")

async def main() -> None:
    h = Gated(store=sys.argv[1], timeout=None).run(run_id="live")
    try:
        print("RESULT", await h, flush=True)
    except Exception as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)

asyncio.run(main())
"""


def test_cancel_a_run_another_process_executes(tmp_path: Path) -> None:
    """A run executing in another process is cancelled from outside while its step is in
    flight (the gate never opens): that process stops the step within a second, nothing
    of it lands, and its handler raises WorkflowCancelledByUser with the reason given, as
    for a cancel of its own (not "lost the run")."""
    db, started, gate = tmp_path / "live.db", tmp_path / "started", tmp_path / "gate"
    script = tmp_path / "gated.py"
    script.write_text(GATED)
    with child(
        [sys.executable, str(script), str(db), str(started), str(gate)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        out = ok("cancel", db, "live", "--reason", "wrong input")
        assert "cancelled run live" in out
        stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
    assert stdout.startswith("ERROR WorkflowCancelledByUser"), (stdout, stderr)
    assert "run 'live' was cancelled: wrong input" in stdout
    kinds = [r["kind"] for r in json.loads(ok("history", db, "live", "--json"))]
    assert kinds[-1] == "run_cancelled"
    assert "step_finished" not in kinds
    assert "run_finished" not in kinds
    assert run_ids(db, "--status", "cancelled") == ["live"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancel_reaches_a_process_awaiting_a_waiting_run(backend: str, tmp_path: Path) -> None:
    """A run that only waits for an answer commits nothing until it comes: cancelled from
    another shell, the process awaiting it still raises WorkflowCancelledByUser (with the
    reason) within a second or so, and lets go of the run, so `resume --cancelled` takes
    it at once. It used to wait forever, holding the run."""
    with new_location(backend, tmp_path) as db:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "ASKER_STAYS": "1", "DW_LEASE_TTL": "30"}
        with child(
            [sys.executable, "-m", "tests.flows", "asker", db, "run", "ask"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        ) as proc:  # fmt: skip
            deadline = time.monotonic() + HANG_GUARD_S
            while not waiting(db, "ask"):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the run never waited"
                time.sleep(0.05)
            ok("cancel", db, "ask", "--reason", "nobody will answer")
            stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 1, (stdout, stderr)
        assert "ERROR WorkflowCancelledByUser: run 'ask' was cancelled: nobody will answer" in (
            stdout
        )
        (line,) = [ln for ln in ok("history", db, "ask").splitlines() if "run_cancelled" in ln]
        assert line.rstrip().endswith("via workflow cancel: nobody will answer"), line
        assert f" by {socket.gethostname()}:" in line
        resumed = invoke(
            "resume", db, "ask", "--workflow", "tests.flows:Asker", "--cancelled", "--wait", "0"
        )
        assert resumed.exit_code == 0, resumed.stderr
        assert "was cancelled" in resumed_line(db, "ask")


def test_a_handler_cancel_records_its_reason(tmp_path: Path) -> None:
    """`handler.cancel_run(reason=...)` gives the reason to whoever awaits the handler and
    records it, with the process and `via handler`, in `run_cancelled`."""
    db = tmp_path / "h.db"

    async def go() -> None:
        wf = Asker(store=db, timeout=None)
        h = wf.run(run_id="ask")
        await h.wait_until_waiting(HANG_GUARD_S)
        await h.cancel_run(reason="the user closed the tab")
        with pytest.raises(WorkflowCancelledByUser, match="was cancelled: the user closed the tab"):
            await h
        wf.store.close()

    asyncio.run(go())
    (line,) = [ln for ln in ok("history", db, "ask").splitlines() if "run_cancelled" in ln]
    by = f"by {socket.gethostname()}:{os.getpid()}"
    assert line.rstrip().endswith(f"{by} via handler: the user closed the tab"), line
    (rec,) = [r for r in json.loads(ok("history", db, "ask", "--json")) if r["step"] is None][-1:]
    assert rec["payload"]["reason"] == "the user closed the tab"


def waiting(db: str | Path, run: str) -> bool:
    """Whether RUN of the store at DB exists and only waits for an event."""
    result = invoke("runs", db, "--json", "--status", "waiting")
    return result.exit_code == 0 and run in [r["run_id"] for r in json.loads(result.stdout)]


GATED_SPEC = "tests.flows:Gated"
HANG_GUARD_S = 120.0  # only ever reached when something is broken: nothing here is timed


@contextlib.contextmanager
def gated(db: Path, gate: Path, out: Path) -> Iterator[subprocess.Popen[str]]:
    """`workflow run` of a Gated run 'live' in a process of its own, yielded once its step
    is in flight and its start is durable (nothing of it commits until the gate opens; its
    step blocks its event loop, so it cannot notice a cancel before then)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with out.open("wb") as fh, child(
        [sys.executable, "-m", "workflow", "run", str(db), "--workflow", GATED_SPEC,
         "--run-id", "live", "--timeout", "600",
         "--data", json.dumps({"gate": str(gate), "block": True})],
        cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
    ) as proc:  # fmt: skip
        deadline = time.monotonic() + HANG_GUARD_S
        blocking = Path(f"{gate}.blocking")
        while not blocking.exists() or "step_started" not in history_kinds(db):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.02)
        yield proc


def history_kinds(db: Path) -> list[str]:
    result = invoke("history", db, "live", "--json")
    return [r["kind"] for r in json.loads(result.stdout)] if result.exit_code == 0 else []


def test_resume_right_after_cancel_waits_for_the_cancelled_executor(tmp_path: Path) -> None:
    """Cancel, then resume at once: the cancelled `workflow run` (another process, in its step
    until the test opens the gate) still holds the run, so `resume --cancelled` says it
    waits for it, then takes the run as soon as that executor lets go and runs it to the
    end; without waiting it is refused naming that process, not as "owned"."""
    db, gate = tmp_path / "gated.db", tmp_path / "gate"
    with gated(db, gate, tmp_path / "first.out") as first:
        assert "cancelled run live" in ok("cancel", db, "live", "--reason", "redo it")
        args: list[str | Path] = ["resume", db, "live", "--workflow", GATED_SPEC, "--cancelled"]
        refused = invoke(*args, "--wait", "0")
        assert refused.exit_code == 1, refused.stdout
        assert (
            "run 'live' was cancelled, but the executor that was running it (another"
            f" process, pid {first.pid}) still holds it: it lets go within a second"
        ) in refused.stderr
        assert "owned by another live executor" not in refused.stderr
        err = tmp_path / "resumer.err"
        with (
            err.open("wb") as fh,
            (tmp_path / "resumer.out").open("wb") as out,
            child(
                [sys.executable, "-m", "workflow", *map(str, args), "--wait", str(HANG_GUARD_S)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=fh,
            ) as resumer,
        ):  # fmt: skip
            deadline = time.monotonic() + HANG_GUARD_S
            while "is still being cancelled" not in err.read_text():  # it says so first
                assert resumer.poll() is None, err.read_text()
                assert time.monotonic() < deadline, "the resume never said it waits"
                time.sleep(0.02)
            assert f"(another process, pid {first.pid} holds it): waiting up to 120 s" in (
                err.read_text()
            )
            gate.write_text("go")  # the first executor's step ends; its commit is refused
            assert resumer.wait(timeout=HANG_GUARD_S) == 0, err.read_text()
        assert (tmp_path / "resumer.out").read_text() == "run live finished: 'through'\n"
        assert first.wait(timeout=HANG_GUARD_S) == 1
    # The `workflow run` whose run was cancelled says so (the run did not fail).
    said = (tmp_path / "first.out").read_text()
    resume = f"workflow resume {db} live --cancelled --workflow {GATED_SPEC}"
    assert f"run live cancelled: redo it (`{resume}` continues it)" in said, said
    assert "failed" not in said
    kinds = history_kinds(db)
    assert kinds.count("run_cancelled") == 1
    assert kinds.index("run_cancelled") < kinds.index("run_resumed")
    assert kinds[-1] == "run_finished"


def test_resume_after_cancel_gives_up_saying_what_holds_the_run(tmp_path: Path) -> None:
    """A cancelled executor that does not let go within --wait (its step is still in
    flight) makes `resume --cancelled` give up with an error naming the process that holds
    the run, when it lets go and how long the resume waited; the run is left as it was."""
    db, gate = tmp_path / "gated.db", tmp_path / "gate"
    with gated(db, gate, tmp_path / "first.out") as first:
        try:
            ok("cancel", db, "live")
            before = history_kinds(db)
            result = invoke(
                "resume", db, "live", "--workflow", GATED_SPEC, "--cancelled", "--wait", "0.3"
            )
            assert result.exit_code == 1, result.stdout
            assert "run live is still being cancelled" in result.stderr  # it said it waits
            assert f"(another process, pid {first.pid}) still holds it" in result.stderr
            lets_go = "it lets go within a second, or once the step in flight ends if that"
            assert lets_go in result.stderr
            assert "waited 0.3 s for it; resume again then" in result.stderr
            assert history_kinds(db) == before
        finally:
            gate.write_text("go")
            first.wait(timeout=HANG_GUARD_S)


def resumed_line(db: str | Path, run: str) -> str:
    """The payload text of RUN's last ``run_resumed`` line in `workflow history`, which
    `workflow timeline` gives the same record too."""
    (*_, line) = [ln for ln in ok("history", db, run).splitlines() if " run_resumed " in ln]
    text = line.split(" run_resumed ", 1)[1].strip()
    page = json.loads(ok("timeline", db, run, "--json"))
    rec, kind = page["rec"], page["kinds"].index("run_resumed")
    (*_, shown) = [x for k, x in zip(rec["k"], rec["x"], strict=True) if k == kind]
    assert shown == text, (shown, text)
    return text


def test_history_shows_a_cancel_by_its_kind_and_the_resume_as_of_cancelled(
    tmp_path: Path,
) -> None:
    """`workflow history` shows who cancelled a run and how (`workflow cancel` without a
    reason), and a `run_cancelled` of an earlier version, whose payload is empty, by its
    kind alone (no `{}`); the resume that follows says the run was cancelled."""
    db = tmp_path / "c.db"
    waiting_asker(db, "ask")
    ok("cancel", db, "ask")
    (line,) = [ln for ln in ok("history", db, "ask").splitlines() if "run_cancelled" in ln]
    assert line.rstrip().endswith(f"by {socket.gethostname()}:{os.getpid()} via workflow cancel")
    assert run_ids(db, "--status", "cancelled") == ["ask"]
    waiting_asker(db, "old")
    with EventStore(db) as store:  # as an earlier version recorded it
        epoch = store.claim_sync("old")
        old = Record(RUN_CANCELLED, None, "{}")
        store.append_sync(Commit("old", [old], epoch=epoch, status="cancelled"))
    (line,) = [ln for ln in ok("history", db, "old").splitlines() if "run_cancelled" in ln]
    assert line.rstrip().endswith("run_cancelled"), line
    ok("resume", db, "ask", "--workflow", "tests.flows:Asker", "--cancelled", "--wait", "30")
    assert resumed_line(db, "ask").endswith(", was cancelled")


def test_history_says_a_died_run_was_interrupted_as_runs_listed_it(tmp_path: Path) -> None:
    """A run whose process died is listed `interrupted` by `workflow runs`; the line of the
    resume that continues it in `workflow history` says it was interrupted, not "running"
    (the status the log still held)."""
    db = tmp_path / "d.db"
    died = subprocess.run(
        [sys.executable, "-m", "tests.flows", "dies_once", str(db), "run", "dead"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert died.returncode == 9, died.stderr
    assert run_ids(db, "--status", "interrupted") == ["dead"]
    assert "finished" in ok("resume", db, "dead", "--workflow", "tests.flows:DiesOnce")
    assert resumed_line(db, "dead") == "epoch 2, was interrupted"


def test_history_says_a_submitted_run_was_submitted_as_runs_listed_it(tmp_path: Path) -> None:
    """A submitted run no worker took yet is listed `submitted` (its log says running); the
    resume that first takes it up says so in `workflow history`."""
    db = tmp_path / "s.db"
    run = Doubler(store=db, timeout=None).submit(n=2)
    assert run_ids(db, "--status", "submitted") == [run]
    ok("resume", db, run, "--workflow", "tests.test_workers:Doubler")
    assert resumed_line(db, run) == "epoch 2, was submitted"


def test_history_says_a_run_killed_while_waiting_was_waiting(tmp_path: Path) -> None:
    """A run whose process was killed while it waited for an answer is listed `waiting`
    (not interrupted: it has nothing to do but wait); the resume that takes the answer up
    says it was waiting."""
    db = tmp_path / "w.db"
    with child(
        [sys.executable, "-m", "tests.flows", "asker", str(db), "run", "ask"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ASKER_STAYS": "1"},
    ) as proc:
        deadline = time.monotonic() + HANG_GUARD_S
        while not db.exists() or run_ids(db, "--status", "waiting") != ["ask"]:
            assert proc.poll() is None
            assert time.monotonic() < deadline, "the run never waited"
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    assert run_ids(db, "--status", "waiting") == ["ask"]
    answer = ["--event", "workflow:HumanResponseEvent", "--data", '{"response": "x"}']
    ok("send", db, "ask", *answer)
    assert "hello x" in ok("resume", db, "ask", "--workflow", "tests.flows:Asker")
    assert resumed_line(db, "ask") == "epoch 2, was waiting"
