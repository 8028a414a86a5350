"""Safety: reading a log never imports or runs what it names; no pickles; private files.

The hostile records are planted with plain sqlite3 into a real store, as anyone who can
write the file could: class names of functions and classes that would run a command if
called (``os:system``, ``builtins:eval``, ``subprocess:Popen``), a class in a module with
import-time side effects (``tests/evil_module.py``) and a pickle that would run a command.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pickle
import re
import sqlite3
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventstore import (
    Codec,
    DecodeError,
    EncodeError,
    EventStore,
    EventStoreError,
    LogCorruptedError,
)
from tests.test_bad_input import read_whole
from workflow import Context, Event, StartEvent, StopEvent, Workflow, WorkflowError, step

EVIL = "tests.evil_module"


class Parcel(Event):
    label: str


class Depot(Workflow):
    """A run that stops failed in ``ship``, leaving state to read and work to resume."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Parcel:
        await ctx.store.set("count", 1)
        return Parcel(label="p")

    @step
    async def ship(self, ev: Parcel) -> StopEvent:
        msg = "the truck is late"
        raise RuntimeError(msg)


def failed_run(db: Path) -> str:
    """Runs Depot to its failure in ``ship``; returns the run id."""

    async def go() -> str:
        handler = Depot(store=db).run()
        with pytest.raises(RuntimeError, match="truck"):
            await handler
        return handler.run_id

    return asyncio.run(go())


def resume(wf: Workflow, run_id: str) -> None:
    """Calls ``wf.resume`` (which needs a running loop) and drops the handler."""

    async def go() -> None:
        wf.resume(run_id)

    asyncio.run(go())


def plant(db: Path, run_id: str, kind: str, step: str | None, payload: Any) -> int:
    """Appends one record (a commit of its own) with sqlite3; returns its seq."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            (rid,) = conn.execute("SELECT rid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            seq, ts = conn.execute("SELECT max(seq) + 1, max(ts) + 1 FROM log").fetchone()
            conn.execute(
                "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (seq, rid, kind, step, orjson.dumps(payload).decode(), seq, ts),
            )
    finally:
        conn.close()
    return int(seq)


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The file that a side effect (an import, a command) would create; must stay absent."""
    path = tmp_path / "side-effect-happened"
    monkeypatch.setenv("EVIL_MODULE_MARKER", str(path))
    yield path
    sys.modules.pop(EVIL, None)


def hostile_value(name: str, tag: str, marker: Path) -> dict[str, Any]:
    """A tagged value naming ``name``, whose payload would touch ``marker`` if ever called."""
    command = {
        "os:system": f"touch {marker}",
        "builtins:eval": f"__import__('pathlib').Path({str(marker)!r}).touch()",
        "subprocess:Popen": ["touch", str(marker)],
        f"{EVIL}:Payload": "x",
    }[name]
    if tag == "enum":  # rebuilt as cls(value): one positional argument
        return {"$t": "enum", "c": name, "v": command}
    keyword = {
        "os:system": "command",
        "builtins:eval": "source",
        "subprocess:Popen": "args",
        f"{EVIL}:Payload": "data",
    }[name]
    return {"$t": tag, "c": name, "v": {keyword: command}}  # rebuilt with keywords


NAMES = ["os:system", "builtins:eval", "subprocess:Popen", f"{EVIL}:Payload"]


@pytest.mark.parametrize("tag", ["enum", "dataclass", "model"])
@pytest.mark.parametrize("where", ["enqueued-event", "context-value"])
@pytest.mark.parametrize("name", NAMES)
def test_decoding_never_imports_or_runs_what_the_log_names(
    tmp_path: Path, marker: Path, name: str, where: str, tag: str
) -> None:
    """A log naming dangerous callables or an unimported module fails by name, running nothing."""
    assert EVIL not in sys.modules
    db = tmp_path / "hostile.db"
    run_id = failed_run(db)
    value = hostile_value(name, tag, marker)
    if where == "enqueued-event":
        plant(db, run_id, "enqueued", "ship", {"id": 50, "event": value, "src": "external"})
    else:
        plant(db, run_id, "state_set", None, {"key": "count", "value": value})
    modules = set(sys.modules)
    wf = Depot(store=EventStore(db))
    with pytest.raises(EventStoreError, match=re.escape(repr(name))):
        read_whole(wf.state_at(run_id))
    with pytest.raises((EventStoreError, WorkflowError), match=re.escape(repr(name))):
        resume(wf, run_id)
    assert set(sys.modules) == modules
    assert not marker.exists()
    assert [r.kind for r in wf.store.records(run_id)][-1] in ("enqueued", "state_set")


class _RunsACommand:
    """What a hostile pickle does: unpickling calls os.system."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def test_a_pickle_in_the_log_is_never_unpickled(tmp_path: Path, marker: Path) -> None:
    """A pickle planted as a context value is refused as such; its payload never runs."""
    db = tmp_path / "pickled.db"
    run_id = failed_run(db)
    blob = base64.b64encode(pickle.dumps(_RunsACommand(f"touch {marker}"))).decode()
    plant(db, run_id, "state_set", None, {"key": "count", "value": {"$t": "pickle", "v": blob}})
    state = Depot(store=EventStore(db)).state_at(run_id)  # decodes a value when it is read
    with pytest.raises((DecodeError, LogCorruptedError), match="pickle is disabled"):
        state.context["count"]
    assert not marker.exists()


def test_module_getattr_is_never_called(marker: Path) -> None:
    """A class looked up in an imported module never triggers the module's __getattr__."""
    import tests.evil_module as evil

    assert marker.read_text() == "imported\n"
    codec = Codec()
    text = orjson.dumps({"$t": "model", "c": f"{EVIL}:Lazy", "v": {}}).decode()
    with pytest.raises(EventStoreError, match=r"tests\.evil_module has no 'Lazy'"):
        codec.decode(text)
    assert evil.GETATTR_CALLS == []
    assert marker.read_text() == "imported\n"


class Plain:
    """Neither a dataclass, attrs class, pydantic model nor Enum: the codec refuses it."""

    def __init__(self) -> None:
        self.secret = 42


class Keeper(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("conn", {"handle": Plain()})
        return StopEvent(result="stored")


async def test_context_value_is_refused_not_pickled(tmp_path: Path) -> None:
    """A context value of an unsupported class is refused at set; nothing is pickled."""
    db = tmp_path / "plain.db"
    wf = Keeper(store=db)
    handler = wf.run()
    with pytest.raises(EncodeError, match=r"conn\['handle'\]: <class 'tests\.test_safety\.Plain'>"):
        await handler
    conn = sqlite3.connect(db)
    try:
        logged = conn.execute("SELECT group_concat(payload, ' ') FROM log").fetchone()[0]
        cached = conn.execute("SELECT group_concat(data, ' ') FROM snapshots").fetchone()[0]
    finally:
        conn.close()
    # The step's error message is logged (it mentions pickle as an opt-in), never a pickle.
    assert '"$t":"pickle"' not in logged
    assert '"$t":"pickle"' not in (cached or "")
    assert "secret" not in logged


def test_store_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """The database, its WAL and shared-memory files and the owners sidecar are all 0600."""
    db = tmp_path / "private.db"
    old = os.umask(0)
    try:
        failed_run(db)
        files = sorted(p.name for p in tmp_path.iterdir())
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
        Depot(store=db).store.close()
    assert {"private.db", "private.db-wal", "private.db-shm", "private.db-owners"} <= set(files)
    assert modes == dict.fromkeys(files, 0o600)
