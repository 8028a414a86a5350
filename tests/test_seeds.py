"""The seed scripts (``tests/seeds/``: the user report and the PR this project started from,
verbatim but for their import line) print what their users expected, in this process, in a
subprocess, and with the context dict written by one process and restored by another.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from eventstore import EventStore
from tests.support.seed_halves import seed_source
from workflow import Workflow

ROOT = Path(__file__).parent.parent
SEEDS = Path(__file__).parent / "seeds"

# Variants of the context seed: the reporter's closing advice, a serializer on both calls.
VARIANTS: dict[str, list[tuple[str, str]]] = {
    serializer: [
        ("from workflow import Context,", f"from workflow import {serializer}, Context,"),
        ("ctx.to_dict()", f"ctx.to_dict(serializer={serializer}())"),
        (
            "Context.from_dict(w, json.loads(ctx))",
            f"Context.from_dict(w, json.loads(ctx), serializer={serializer}())",
        ),
    ]
    for serializer in ("JsonSerializer", "PickleSerializer", "JsonPickleSerializer")
}

# verbose=True prints each step as LlamaIndex Workflows 2.26 does (the reports were written
# with llama-index-core 0.12's "Running step start" lines): which steps run is what matters.
CHECKPOINT_SEED_OUT = """\
First run:
[start:0] started from StartEvent
[start:0] complete with MiddleEvent
[finish:0] started from MiddleEvent
[finish:0] complete with StopEvent
[result] StopEvent(content='foo bar')
From checkpoint:
[finish:0] started from MiddleEvent
[finish:0] complete with StopEvent
[result] StopEvent(content='foo bar')
"""

FIRST_HALF_OUT = """\
[start:0] started from StartEvent
[start:0] complete with EventA
[process:0] started from EventA
[process:0] complete with EventB
[finish:0] started from EventB
"""
SECOND_HALF_OUT = """\
----------------------------------------
[finish:0] started from EventB
[finish:0] complete with StopEvent
[result] StopEvent(result='end: second: first')
'end: second: first'
OK
"""


def _env(store: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKFLOW_STORE"}
    if store is not None:
        env["WORKFLOW_STORE"] = str(store)
    return env


def _python(args: list[str], store: Path | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=_env(store),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(autouse=True)
def _no_store_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKFLOW_STORE", raising=False)


def test_checkpoint_seed_runs_only_finish_from_its_json_checkpoint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Seed 1, the user report: the checkpoint after ``start`` survives model_dump /
    model_validate, and running from it runs ``finish`` only, without a hang."""
    runpy.run_path(str(SEEDS / "seed_checkpoints.py"), run_name="__main__")
    assert capsys.readouterr().out == CHECKPOINT_SEED_OUT


def test_checkpoint_seed_in_a_subprocess_and_on_a_store_file(tmp_path: Path) -> None:
    """The same as a script, in memory and twice on one store file (WORKFLOW_STORE): each
    process lists the checkpoints of the runs it started."""
    script = str(SEEDS / "seed_checkpoints.py")
    assert _python([script]) == CHECKPOINT_SEED_OUT
    db = tmp_path / "runs.db"
    assert _python([script], db) == CHECKPOINT_SEED_OUT
    assert _python([script], db) == CHECKPOINT_SEED_OUT
    with EventStore(db, readonly=True) as es:
        runs = es.runs()
    assert len(runs) == 4  # two runs and two forks
    assert [r.status for r in runs] == ["finished"] * 4


@pytest.mark.parametrize("variant", ["", *VARIANTS])
def test_context_seed_runs_only_the_failed_step(
    variant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 2: after ``finish`` fails, the context through JSON, with ``var`` set, runs
    ``finish`` only and returns ``'end: second: first'`` (also with a serializer)."""
    code = compile(seed_source(variant), str(SEEDS / "seed_context.py"), "exec")
    exec(code, {"__name__": "__main__"})
    assert capsys.readouterr().out == FIRST_HALF_OUT + SECOND_HALF_OUT


def test_context_seed_as_a_script(tmp_path: Path) -> None:
    """The seed as its user runs it, in memory and on a store file."""
    script = str(SEEDS / "seed_context.py")
    assert _python([script]) == FIRST_HALF_OUT + SECOND_HALF_OUT
    db = tmp_path / "runs.db"
    assert _python([script], db) == FIRST_HALF_OUT + SECOND_HALF_OUT
    with EventStore(db, readonly=True) as es:
        (run,) = es.runs()  # resumed where it failed: one run
        assert run.status == "finished"


@pytest.mark.parametrize("variant", ["", "JsonSerializer"])
def test_context_seed_dict_written_by_one_process_restored_by_another(
    tmp_path: Path, variant: str
) -> None:
    """The dict one process wrote restores in another on its own in-memory store: its
    state is imported as a new run, where only ``finish`` runs."""
    file = tmp_path / "ctx.json"
    out = _python(["-m", "tests.support.seed_halves", "write", str(file), variant])
    assert out == FIRST_HALF_OUT
    data = json.loads(file.read_text("utf-8"))
    assert data["status"] == "failed"
    assert [s for s, progs in data["run"]["in_progress"].items() if progs] == ["finish"]
    out = _python(["-m", "tests.support.seed_halves", "read", str(file), variant])
    assert out == SECOND_HALF_OUT


def test_context_seed_across_processes_on_a_shared_store(tmp_path: Path) -> None:
    """With a shared store file the second process binds to the failed run itself and
    resumes it: ``finish`` runs again, with the update recorded first."""
    file, db = tmp_path / "ctx.json", tmp_path / "shared.db"
    assert _python(["-m", "tests.support.seed_halves", "write", str(file)], db) == FIRST_HALF_OUT
    assert _python(["-m", "tests.support.seed_halves", "read", str(file)], db) == SECOND_HALF_OUT
    run_id = json.loads(file.read_text("utf-8"))["run_id"]
    with EventStore(db, readonly=True) as es:
        (run,) = es.runs()
        assert run.run_id == run_id
        kinds = [(r.kind, r.step) for r in es.records(run_id)]
    started = [step for kind, step in kinds if kind == "step_started"]
    assert started == ["start", "process", "finish", "finish"]
    # The update (var) is recorded by the operator before the failed step runs again.
    resumed = kinds.index(("run_resumed", None))
    assert kinds[resumed + 1] == ("state_set", None)


def test_workflow_store_env_makes_a_store_less_workflow_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WORKFLOW_STORE names the store of workflows created without one; unset, each gets
    its own in-memory store."""
    db = tmp_path / "env.db"
    monkeypatch.setenv("WORKFLOW_STORE", str(db))
    wf = Workflow(disable_validation=True)
    assert wf.store.path == str(db)
    assert Workflow(disable_validation=True).store is wf.store
    monkeypatch.setenv("WORKFLOW_STORE", "")
    assert Workflow(disable_validation=True).store.memory
    monkeypatch.delenv("WORKFLOW_STORE")
    a, b = Workflow(disable_validation=True), Workflow(disable_validation=True)
    assert a.store.memory
    assert a.store is not b.store


@pytest.mark.postgres
def test_workflow_store_env_takes_a_postgresql_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """WORKFLOW_STORE may name a PostgreSQL database: the seed runs there unchanged."""
    import uuid

    import psycopg

    from tests.conftest import POSTGRES_URL

    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = f"{POSTGRES_URL}?schema={schema}"
    try:
        monkeypatch.setenv("WORKFLOW_STORE", url)
        wf = Workflow(disable_validation=True)
        assert wf.store.kind == "postgres"
        assert Workflow(disable_validation=True).store is wf.store
        wf.store.close()
        env = {**os.environ, "WORKFLOW_STORE": url}
        proc = subprocess.run(
            [sys.executable, str(SEEDS / "seed_context.py")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == FIRST_HALF_OUT + SECOND_HALF_OUT
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_context_dict_written_by_an_earlier_version_restores() -> None:
    """A context dict is the user's data: one this library wrote (format version 1, kept
    in tests/fixtures) restores in a new process and runs only ``finish``."""
    fixture = ROOT / "tests" / "fixtures" / "seed_context_dict_v1.json"
    data = json.loads(fixture.read_text("utf-8"))
    assert (data["format"], data["version"]) == ("durable-workflows.context", 1)
    assert _python(["-m", "tests.support.seed_halves", "read", str(fixture)]) == SECOND_HALF_OUT
