"""Runs started by ``python script.py`` continue in programs that import ``script``, and back.

A script run as ``python mainflow.py`` records its classes as ``__main__:X``; a test, a
service or ``workflow ... --workflow mainflow:Flow`` imports them as ``mainflow:X``. Each
test runs the script (tests/support/main_module_script.py, copied to a temp directory) in a real
subprocess that dies or fails mid-run, and continues the run from the other side.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

from eventstore import Codec, Commit, EventStore, NewRun, Record, UnknownClassError, class_name
from workflow import (
    Context,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowChangedError,
    WorkflowRuntimeError,
    _buffers,
    step,
)
from workflow._fold import Folded, fold
from workflow._snapshot import dump_folded, load_folded

SCRIPT = Path(__file__).parent / "support" / "main_module_script.py"
OLD_LOG = Path(__file__).with_name("main_module_old_log.json")
MODULE = "mainflow"
EXPECTED = {"total": 303, "marks": [1, 2], "note": "right 2"}


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's script as ``mainflow.py`` in tmp_path, importable as ``mainflow``."""
    path = tmp_path / f"{MODULE}.py"
    shutil.copy(SCRIPT, path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [k for k in os.environ if k.startswith("MAINFLOW_")]:
        monkeypatch.delenv(name)
    sys.modules.pop(MODULE, None)
    yield path
    sys.modules.pop(MODULE, None)


def imported() -> ModuleType:
    """The script imported as a module, as another program would."""
    return importlib.import_module(MODULE)


def run_script(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs ``python mainflow.py ARGS`` in the script's directory."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAINFLOW_")}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_cli(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m workflow ARGS`` in the script's directory."""
    return subprocess.run(
        [sys.executable, "-m", "workflow", *args],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def crashed_script_run(script: Path, run_id: str = "r1") -> Path:
    """A fan-in run of ``python mainflow.py`` killed (SIGKILL) with its buffer half full."""
    db = script.parent / "runs.db"
    proc = run_script(script, str(db), "run", run_id, MAINFLOW_CRASH="1")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return db


def collected_buffers(db: Path, run_id: str) -> list[str]:
    """The buffer ids of the run's ``collected`` records, read with plain SQL."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT payload FROM records WHERE run_id = ? AND kind = 'collected' ORDER BY seq",
            (run_id,),
        ).fetchall()
    return [json.loads(p)["buf"] for (p,) in rows]


async def test_script_run_resumes_in_an_importer(script: Path) -> None:
    """A fan-in killed under ``python script.py`` finishes when resumed from an importer."""
    db = crashed_script_run(script)
    mod = imported()
    state = mod.flow(db).state_at("r1")
    assert state.status == "interrupted"
    [buffer] = state.collected.values()
    assert [type(e) for es in buffer.values() for e in es] == [mod.Left]
    assert await mod.flow(db).resume("r1") == EXPECTED


async def test_script_run_forks_in_an_importer(script: Path) -> None:
    """A checkpoint found by an imported class forks the script's run to the same result."""
    db = crashed_script_run(script)
    mod = imported()
    wf = mod.flow(db)
    asks = wf.checkpoints("r1", event=mod.Ask)
    assert len(asks) == 2  # the commits that enqueued Ask(1) and Ask(2)
    assert await wf.run_from(asks[-1]) == EXPECTED
    assert await wf.run_from(asks[0]) == EXPECTED


async def test_script_run_recovers_in_an_importer(script: Path) -> None:
    """``recover()`` of an importer picks up the script's run and finishes it."""
    db = crashed_script_run(script)
    wf = imported().flow(db)
    [recovery] = wf.recover()
    assert (recovery.run_id, recovery.outcome, recovery.error) == ("r1", "resumed", None)
    assert recovery.handler is not None
    assert await recovery.handler == EXPECTED


async def test_importer_run_resumes_under_the_script(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run an importer started (``mainflow:X``) finishes under ``python mainflow.py``."""
    db = script.parent / "runs.db"
    monkeypatch.setenv("MAINFLOW_FAIL", "1")
    with pytest.raises(RuntimeError, match="failed in round 2"):
        await imported().flow(db).run(run_id="r2")
    proc = run_script(script, str(db), "resume", "r2")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == EXPECTED


async def test_buffer_ids_do_not_name_modules(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script and an importer write the same buffer id and fingerprint, naming no module."""
    db = crashed_script_run(script, "by-script")
    monkeypatch.setenv("MAINFLOW_FAIL", "1")
    with pytest.raises(RuntimeError):
        await imported().flow(db).run(run_id="by-import")
    ids = set(collected_buffers(db, "by-script")) | set(collected_buffers(db, "by-import"))
    assert len(ids) == 1
    [buf] = ids
    assert len(buf) == 16
    assert MODULE not in buf
    assert "__main__" not in buf
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT payload FROM records WHERE kind = 'run_started'").fetchall()
    assert len({json.loads(p)["fingerprint"] for (p,) in rows}) == 1  # one graph, two names


def test_cli_resumes_a_script_run(script: Path) -> None:
    """``workflow resume --workflow mainflow:Flow`` finishes a run of ``python mainflow.py``."""
    db = crashed_script_run(script)
    proc = run_cli(script, "resume", str(db), "r1", "--workflow", "mainflow:Flow", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["result"]) == ("finished", EXPECTED)


def test_cli_recovers_a_script_run(script: Path) -> None:
    """``workflow recover --workflow mainflow:Flow`` finishes a run of ``python mainflow.py``."""
    db = crashed_script_run(script)
    proc = run_cli(script, "recover", str(db), "--workflow", "mainflow:Flow", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert (row["run_id"], row["outcome"], row["status"]) == ("r1", "resumed", "finished")
    assert row["result"] == EXPECTED


def test_cli_forks_a_script_run(script: Path) -> None:
    """``workflow fork --workflow mainflow:Flow`` forks a run of ``python mainflow.py``."""
    db = crashed_script_run(script)
    with sqlite3.connect(db) as conn:
        [(seq,)] = conn.execute(
            "SELECT max(commit_seq) FROM records WHERE run_id = 'r1' AND kind = 'collected'"
        ).fetchall()
    args = ["fork", str(db), "r1", "--at", str(seq), "--workflow", "mainflow:Flow", "--json"]
    proc = run_cli(script, *args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert (out["status"], out["result"]) == ("finished", EXPECTED)


def test_cli_send_answers_a_script_wait(script: Path) -> None:
    """An answer sent as ``mainflow:Answer`` reaches a wait recorded as ``__main__:Answer``."""
    db = script.parent / "runs.db"
    proc = run_script(script, str(db), "ask", "q1")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    sent = run_cli(
        script, "send", str(db), "q1", "--event", "mainflow:Answer", "--data", '{"name": "ada"}'
    )
    assert sent.returncode == 0, sent.stderr
    spec = ["--workflow", "mainflow:AskFlow", "--timeout", "30", "--json"]
    proc = run_cli(script, "resume", str(db), "q1", *spec)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["status"], out["result"]) == ("finished", "hello ada")


async def test_importer_answers_a_script_wait(script: Path) -> None:
    """``wf.send`` of an imported answer class resumes a wait of ``python mainflow.py``."""
    db = script.parent / "runs.db"
    proc = run_script(script, str(db), "ask", "q2")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    mod = imported()
    wf = mod.AskFlow(store=db, timeout=30)
    wf.send("q2", mod.Answer(name="ada"))
    assert await wf.resume("q2") == "hello ada"


async def test_script_answers_an_importer_wait(script: Path) -> None:
    """A wait an importer recorded (``mainflow:Answer``) is answered under the script."""
    db = script.parent / "runs.db"
    handler = imported().AskFlow(store=db, timeout=30).run(run_id="q3")
    await handler.wait_until_waiting(timeout=30)
    await handler.suspend()
    proc = run_script(script, str(db), "answer", "q3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == "hello ada"


# ------------------------------------------------------------------ the log of earlier versions


def load_old_log(db: Path, rename: dict[str, str] | None = None) -> None:
    """Writes the runs of tests/main_module_old_log.json, recorded by the code before module-free
    buffer ids (``join:__main__:Left,__main__:Right``), into a new store at ``db``.

    ``rename`` replaces class names in the payloads (a class the program no longer has).
    """
    doc = json.loads(OLD_LOG.read_text())
    with EventStore(db) as store:
        for run in doc["runs"]:
            for i, commit in enumerate(run["commits"]):
                records = []
                for kind, step, payload in commit:
                    text = json.dumps(payload)
                    for old, new in (rename or {}).items():
                        text = text.replace(f'"{old}"', f'"{new}"')
                    records.append(Record(kind, step, text))
                last = i == len(run["commits"]) - 1
                store.append_sync(
                    Commit(
                        run["run_id"],
                        records,
                        epoch=1,
                        create=NewRun(meta={"workflow": run["workflow"]}, status="running")
                        if i == 0
                        else None,
                        status=run["status"] if last and run["status"] != "running" else None,
                    )
                )


def test_old_log_holds_old_buffer_ids() -> None:
    """The fixture is what the earlier code wrote: buffer ids and take lists name modules."""
    doc = json.loads(OLD_LOG.read_text())
    bufs = {
        p["buf"]
        for run in doc["runs"]
        for commit in run["commits"]
        for kind, _, p in commit
        if kind == "collected"
    }
    assert bufs == {"join:__main__:Left,__main__:Right", "join:mainflow:Left,mainflow:Right"}


async def test_old_script_run_resumes_in_an_importer(script: Path) -> None:
    """A half-filled buffer of an old ``__main__`` run fires when an importer resumes it."""
    db = script.parent / "old.db"
    load_old_log(db)
    mod = imported()
    wf = mod.flow(db)
    [buffer] = wf.state_at("main-run").collected.values()
    assert [type(e) for es in buffer.values() for e in es] == [mod.Left]
    assert await wf.resume("main-run") == EXPECTED


def test_old_importer_run_resumes_under_the_script(script: Path) -> None:
    """A half-filled buffer of an old ``mainflow`` run fires under ``python mainflow.py``."""
    db = script.parent / "old.db"
    load_old_log(db)
    proc = run_script(script, str(db), "resume", "import-run")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == EXPECTED


def test_old_script_run_resumes_with_the_cli(script: Path) -> None:
    """``workflow resume --workflow mainflow:Flow`` finishes an old ``__main__`` run."""
    db = script.parent / "old.db"
    load_old_log(db)
    proc = run_cli(script, "resume", str(db), "main-run", "--workflow", "mainflow:Flow", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == EXPECTED


class Flow(Workflow):
    """Another program's ``Flow``: the same class name as the script's, other steps."""

    @step
    async def elsewhere(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result=None)


def test_old_script_runs_are_pending_for_their_importer_only(script: Path) -> None:
    """An old ``__main__:Flow`` run (its first record lists its steps) is pending for the
    program that imports the script, not for another module's ``Flow``; a run too old to
    list its steps is pending for both (nothing tells them apart), and resuming says more."""
    db = script.parent / "old.db"
    load_old_log(db)
    with EventStore(db) as store:
        bare = {"workflow": "__main__:Flow", "fingerprint": "0", "start": None, "parent": None}
        store.append_sync(
            Commit(
                "bare-run",
                [Record("run_started", None, json.dumps(bare))],
                epoch=1,
                create=NewRun(meta={"workflow": "__main__:Flow"}, status="running"),
            )
        )
    assert imported().flow(str(db)).pending_runs() == ["main-run", "bare-run"]
    assert Flow(store=db).pending_runs() == ["bare-run"]


def test_old_snapshot_buffers_load_under_new_ids(tmp_path: Path) -> None:
    """A cached state of the earlier shape (v2) keys its buffers as the fold keys them now.

    Its buffers split by module name (the bug) are one buffer, in the log's order.
    """

    def left(module: str, round_: int) -> dict[str, Any]:
        return {"$t": "model", "c": f"{module}:Left", "v": {"round": round_}}

    data = json.loads(dump_folded(Folded("r")))
    data["v"] = 2
    data["buffers"] = {
        "join:__main__:Left,__main__:Right": {"__main__:Left": [[7, left("__main__", 2), 30]]},
        "join:mainflow:Left,mainflow:Right": {"mainflow:Left": [[5, left("mainflow", 1), 27]]},
    }
    loaded = load_folded(json.dumps(data))
    key = "join:" + _buffers.default_buffer_id("join", ["Left", "Right"])
    ids = {b: {t: [e.id for e in es] for t, es in d.items()} for b, d in loaded.buffers.items()}
    assert ids == {key: {"Left": [5, 7]}}
    # The fold of the old records keys the same buffer the same way.
    db = tmp_path / "old.db"
    load_old_log(db)
    with EventStore(db) as store:
        folded = fold(Folded("main-run"), store.records("main-run"))
    assert {b: list(d) for b, d in folded.buffers.items()} == {key: ["Left"]}


# ------------------------------------------------------------------ a class that is gone


async def test_unknown_context_class_fails_at_resume(script: Path) -> None:
    """A context value of a class the program no longer has is refused at resume, by name."""
    db = script.parent / "old.db"
    load_old_log(db, rename={"__main__:Mark": "__main__:Vanished"})
    wf = imported().flow(db)
    with pytest.raises(
        UnknownClassError, match=r"__main__:Vanished.*Workflow\(types=\[Vanished\]\)"
    ):
        wf.resume("main-run")
    assert wf.runs()[0].status == "interrupted"  # nothing was taken over or changed
    [recovery] = wf.recover()
    assert recovery.outcome == "stranded"
    assert "Workflow(types=[Vanished])" in str(recovery.error)


async def test_unknown_event_class_fails_at_resume(script: Path) -> None:
    """A queued event of a class the program no longer has is refused at resume, by name."""
    db = script.parent / "old.db"
    load_old_log(db, rename={"__main__:Ask": "__main__:Gone"})
    wf = imported().flow(db)
    with pytest.raises(WorkflowChangedError, match=r"__main__:Gone.*types=\[Gone\]"):
        wf.resume("main-run")


# ------------------------------------------------------------------ buffer ids


class Part(Event):
    n: int


class Whole(Event):
    n: int


def _ns(events: list[Event]) -> list[int]:
    return [e.n for e in events if isinstance(e, Part | Whole)]


class Pairs(Workflow):
    """Two steps collect into buffers of the same ``buffer_id``: each step has its own."""

    @step
    async def start(self, ctx: Context[Any], ev: StartEvent) -> Part | Whole | None:
        for n in (1, 2):
            ctx.send_event(Part(n=n))
            ctx.send_event(Whole(n=n * 10))
        return None

    @step
    async def parts(self, ctx: Context[Any], ev: Part | Whole) -> StopEvent | None:
        got = ctx.collect_events(ev, [Part, Part], buffer_id="pair")
        if got is None:
            return None
        wholes = await ctx.store.get("wholes", default=None)
        if wholes is None:
            await ctx.store.set("parts", _ns(got))
            return None
        return StopEvent(result=[_ns(got), list(wholes)])

    @step
    async def wholes(self, ctx: Context[Any], ev: Part | Whole) -> StopEvent | None:
        got = ctx.collect_events(ev, [Whole, Whole], buffer_id="pair")
        if got is None:
            return None
        parts = await ctx.store.get("parts", default=None)
        if parts is None:
            await ctx.store.set("wholes", _ns(got))
            return None
        return StopEvent(result=[list(parts), _ns(got)])


async def test_buffer_id_is_the_callers_and_per_step() -> None:
    """``buffer_id=`` is the id in the log; the same id in two steps is two buffers."""
    wf = Pairs()
    handler = wf.run()
    assert await handler == [[1, 2], [10, 20]]
    records = [r for r in wf.store.records(handler.run_id) if r.kind == "collected"]
    assert {(r.step, r.data()["buf"]) for r in records} == {("parts", "pair"), ("wholes", "pair")}
    # Each step buffered only the events it expects.
    puts = {(r.step, r.data()["put"]["event"]["c"]) for r in records if r.data()["put"]}
    assert puts == {("parts", class_name(Part)), ("wholes", class_name(Whole))}


def test_default_buffer_id_is_a_digest_of_step_and_names() -> None:
    """Without ``buffer_id=`` the id is 16 hex digits of the step and the classes' names."""
    a = _buffers.default_buffer_id("join", ["Left", "Right"])
    assert len(a) == 16
    assert int(a, 16) >= 0
    assert a != _buffers.default_buffer_id("join", ["Right", "Left"])
    assert a != _buffers.default_buffer_id("other", ["Left", "Right"])
    assert _buffers.legacy_buffer_key("join:__main__:Left,__main__:Right") == f"join:{a}"
    assert _buffers.legacy_buffer_key("join:app.flows:Left,app.flows:Right") == f"join:{a}"


class Same(Event):
    n: int


def _other_same() -> type[Event]:
    class Same(Event):  # another class of the same name: the log could not tell them apart
        n: int

    Same.__qualname__ = "Same"
    Same.__module__ = "elsewhere"
    return Same


class Clash(Workflow):
    @step
    async def start(self, ctx: Context[Any], ev: StartEvent) -> StopEvent | None:
        other = _other_same()
        ctx.collect_events(Same(n=1), [Same, other])
        return None


async def test_collect_refuses_two_classes_of_one_name() -> None:
    """Expected classes that share a name are refused with both named."""
    with pytest.raises(WorkflowRuntimeError, match=r"elsewhere:Same.*main_module:Same"):
        await Clash().run()


# ------------------------------------------------------------------ the codec's resolution


def _model(module: str, name: str = "Thing") -> type[BaseModel]:
    """A pydantic model that says it was defined in ``module``."""
    return type(name, (BaseModel,), {"__module__": module, "__annotations__": {"x": int}})


def test_main_name_resolves_to_a_registered_class() -> None:
    """``__main__:X`` resolves to the one registered class named X, of any module."""
    thing = _model("app.flows")
    codec = Codec()
    codec.register(thing)
    text = '{"$t": "model", "c": "__main__:Thing", "v": {"x": 1}}'
    assert type(codec.decode(text)) is thing
    assert codec.resolve("__main__:Thing") is thing


def test_main_name_prefers_the_workflows_module() -> None:
    """Among registered classes of one name, the aliased module's class wins."""
    mine, other = _model("app.flows"), _model("lib.things")
    codec = Codec()
    codec.register(other, mine)
    with pytest.raises(UnknownClassError, match=r"several registered.*app\.flows:Thing"):
        codec.resolve("__main__:Thing")
    codec.alias_main("app.flows")
    assert codec.resolve("__main__:Thing") is mine


def test_main_name_finds_classes_of_the_aliased_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unregistered ``__main__:X`` is looked up in the aliased, imported module."""
    module = ModuleType("app_flows")
    thing = _model("app_flows")
    module.__dict__["Thing"] = thing
    monkeypatch.setitem(sys.modules, "app_flows", module)
    codec = Codec(how_to_register="Workflow(types=[{name}])")
    with pytest.raises(UnknownClassError, match=r"Workflow\(types=\[Thing\]\)"):
        codec.resolve("__main__:Thing")
    codec.alias_main("app_flows")
    assert codec.resolve("__main__:Thing") is thing


def test_other_modules_are_never_aliased() -> None:
    """A registered class of one module does not stand for a same-named class of another."""
    codec = Codec()
    codec.register(_model("app.flows"), _model("__main__"))
    with pytest.raises(UnknownClassError, match=r"lib\.things"):
        codec.resolve("lib.things:Thing")
