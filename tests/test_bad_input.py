"""The bad-input matrix: each row fails with a specific error, and nothing committed is lost.

Damaged files are read in a subprocess (``tests/support/reliability_worker.py probe``), so
that a hang or a crash of SQLite would fail the test instead of taking pytest down with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventstore import (
    EncodeError,
    EventStore,
    LogCorruptedError,
    NotAStoreError,
    SchemaVersionError,
)
from eventstore import RunNotFoundError as StoreRunNotFoundError
from workflow import (
    CheckpointNotFoundError,
    Context,
    Event,
    RunNotFoundError,
    RunState,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowChangedError,
    WorkflowRuntimeError,
    step,
)

ROOT = Path(__file__).resolve().parent.parent


class Parcel(Event):
    label: str


class Packed(Event):
    label: str
    weight: int


class Shipping(Workflow):
    """Three steps; ``ship`` fails until context key ``ok`` is set (so a run stops there)."""

    @step
    async def start(self, ev: StartEvent) -> Parcel:
        return Parcel(label="p1")

    @step
    async def pack(self, ev: Parcel) -> Packed:
        return Packed(label=ev.label, weight=3)

    @step
    async def ship(self, ctx: Context, ev: Packed) -> StopEvent:
        if not await ctx.store.get("ok", default=False):
            msg = "not ready to ship"
            raise RuntimeError(msg)
        return StopEvent(result=f"{ev.label}:{ev.weight}")


async def failed_run(db: Path, run_id: str = "r1") -> Shipping:
    """A Shipping run that failed in ``ship`` (its Packed input stays in progress)."""
    wf = Shipping(store=db)
    with pytest.raises(RuntimeError, match="not ready"):
        await wf.run(run_id=run_id)
    return wf


def sql(db: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Runs one statement on the file with plain sqlite3, as a user or an attacker could."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


def plant(db: Path, run_id: str, kind: str, step: str | None, payload: str) -> int:
    """Appends one record (a commit of its own) to a run with sqlite3; returns its seq."""
    ((rid,),) = sql(db, "SELECT rid FROM runs WHERE run_id = ?", (run_id,))
    ((seq, ts),) = sql(db, "SELECT max(seq) + 1, max(ts) + 1 FROM log")
    sql(
        db,
        "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (seq, rid, kind, step, payload, seq, ts),
    )
    return int(seq)


def rewrite(db: Path, seq: int, payload: str) -> None:
    """Replaces a record's payload and drops the cached states (a cache of the old log)."""
    sql(db, "UPDATE log SET payload = ? WHERE seq = ?", (payload, seq))
    sql(db, "DELETE FROM snapshots")


def seq_of(db: Path, kind: str, step: str) -> int:
    """The seq of the first record of that kind and step."""
    return int(sql(db, "SELECT min(seq) FROM log WHERE kind = ? AND step = ?", (kind, step))[0][0])


def probe(db: Path) -> tuple[int, str]:
    """Opens and reads the whole store in a subprocess; returns its status and its report."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.reliability_worker", "probe", str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return proc.returncode, proc.stdout.strip() + proc.stderr.strip()


# ---------------------------------------------------------------------------- files


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"name,age\nada,36\n" * 50)


def _foreign_sqlite(path: Path) -> None:
    sql(path, "CREATE TABLE people (name TEXT)")


def _newer_schema(path: Path) -> None:
    EventStore(path).close()
    sql(path, "UPDATE meta SET value = '999' WHERE key = 'schema_version'")


@pytest.mark.parametrize(
    ("make", "error", "pattern"),
    [
        pytest.param(
            _not_sqlite, NotAStoreError, r"data\.db: not an event store: .*not an SQLite", id="csv"
        ),
        pytest.param(
            _foreign_sqlite,
            NotAStoreError,
            r"data\.db: not an event store: an SQLite database without the event store's",
            id="foreign-sqlite",
        ),
        pytest.param(
            _newer_schema,
            SchemaVersionError,
            r"data\.db: schema version 999 is newer than the \d+ .*upgrade the library",
            id="newer-schema",
        ),
    ],
)
def test_workflow_refuses_a_file_it_cannot_use(
    tmp_path: Path, make: Callable[[Path], None], error: type[Exception], pattern: str
) -> None:
    """Pointing a Workflow at a file that is not a usable store names it and changes nothing."""
    path = tmp_path / "data.db"
    make(path)
    before = path.read_bytes()
    listing = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=pattern):
        Shipping(store=path)
    with pytest.raises(error, match=pattern):
        EventStore(path, readonly=True)
    assert path.read_bytes() == before
    # Only SQLite's own -wal/-shm may appear (a read-only look at a WAL file needs them).
    added = {p.name for p in tmp_path.iterdir()} - set(listing)
    assert added <= {"data.db-wal", "data.db-shm"}


async def _store_with_runs(db: Path, runs: int) -> None:
    wf = Shipping(store=db)
    for k in range(runs):
        with pytest.raises(RuntimeError):
            await wf.run(run_id=f"run-{k}")
    wf.store.close()


def test_truncated_store_is_refused_by_name(tmp_path: Path) -> None:
    """A store cut to half its size is refused at open, naming the file, without hanging."""
    db = tmp_path / "cut.db"
    asyncio.run(_store_with_runs(db, 150))
    size = db.stat().st_size
    with db.open("r+b") as fh:
        fh.truncate(size // 2)
    code, report = probe(db)
    assert code == 1
    assert report.startswith(f"ERROR NotAStoreError: {db}: "), report
    assert "malformed" in report


def test_store_damaged_in_the_middle_fails_reads_by_name(tmp_path: Path) -> None:
    """Pages overwritten in the middle of a store fail reads with an eventstore error naming it."""
    db = tmp_path / "damaged.db"
    asyncio.run(_store_with_runs(db, 150))
    data = bytearray(db.read_bytes())
    page = 4096
    pages = len(data) // page
    for p in range(int(pages * 0.4), int(pages * 0.6)):
        data[p * page : (p + 1) * page] = b"\xa5" * page
    db.write_bytes(bytes(data))
    code, report = probe(db)
    assert code == 1
    assert report.startswith("ERROR "), report
    assert str(db) in report


# ---------------------------------------------------------------------------- records


def read_whole(state: RunState) -> None:
    """Reads every part of a state (each is decoded as it is read)."""
    for part in (state.queues, state.in_progress, state.context, state.collected):
        dict(part.items())
    list(state.waiters)
    list(state.stream)


@pytest.mark.parametrize(
    ("kind", "step", "payload", "pattern"),
    [
        pytest.param("enqueued", "pack", '{"id": 9, "event', "malformed payload", id="not-json"),
        pytest.param("enqueued", "pack", "[1, 2]", "malformed", id="not-an-object"),
        pytest.param("enqueued", "pack", '{"event": {}}', "malformed", id="missing-field"),
        pytest.param("teleported", "pack", "{}", "unknown kind 'teleported'", id="unknown-kind"),
        pytest.param(
            "dequeued", "pack", '{"id": 99, "worker": 0}', "not queued", id="contradiction"
        ),
        pytest.param(
            "state_set",
            None,
            '{"key": "nope", "patch": [["replace", ["a"], 1]]}',
            "has no value",
            id="patch-of-nothing",
        ),
        pytest.param(
            "enqueued",
            "pack",
            '{"id": 9, "event": {"$t": "model", "c": "tests.test_bad_input:Parcel", "v": 5},'
            ' "src": "external"}',
            "fields",
            id="bad-event-fields",
        ),
        pytest.param(
            "state_set",
            None,
            '{"key": "k", "value": {"$t": "no-such-tag"}}',
            "no-such-tag",
            id="bad-value-tag",
        ),
    ],
)
async def test_malformed_record_names_its_seq(
    tmp_path: Path, kind: str, step: str | None, payload: str, pattern: str
) -> None:
    """A planted bad record fails state_at (or, for a value that does not decode, reading it)
    and resume with LogCorruptedError naming its seq."""
    db = tmp_path / "bad.db"
    wf = await failed_run(db)
    before = wf.state_at("r1")
    seq = plant(db, "r1", kind, step, payload)
    fresh = Shipping(store=EventStore(db))
    with pytest.raises(LogCorruptedError, match=rf"seq {seq}\b.*{pattern}") as info:
        read_whole(fresh.state_at("r1"))
    assert info.value.seq == seq
    with pytest.raises(LogCorruptedError, match=rf"seq {seq}\b"):
        fresh.resume("r1")
    # Nothing committed is lost: every earlier state still reads as it was.
    assert fresh.state_at("r1", seq - 1) == before


async def test_record_damaged_in_the_middle_fails_later_states(tmp_path: Path) -> None:
    """A damaged record in the middle fails every state after it; the fold never skips it."""
    db = tmp_path / "mid.db"
    wf = await failed_run(db)
    seq = seq_of(db, "enqueued", "ship")
    rewrite(db, seq, '{"id": 3, "event": ')
    fresh = Shipping(store=EventStore(db))
    for at in (seq, seq + 1, None):
        with pytest.raises(LogCorruptedError, match=rf"record seq {seq} \(enqueued\) of run 'r1'"):
            fresh.state_at("r1", at)
    # seq - 1 ends the same commit: the last state before the damage is at seq - 2.
    assert list(fresh.state_at("r1", seq - 2).in_progress) == ["pack"]
    assert wf.checkpoints("r1", step="start")[0].seq < seq


async def test_checkpoints_of_a_malformed_record_name_its_seq(tmp_path: Path) -> None:
    """Listing checkpoints over a malformed record raises LogCorruptedError naming its seq."""
    db = tmp_path / "cp.db"
    await failed_run(db)
    seq = plant(db, "r1", "enqueued", "pack", '{"id": 9, "event')
    with pytest.raises(LogCorruptedError, match=rf"seq {seq}\b"):
        Shipping(store=EventStore(db)).checkpoints("r1")


# ---------------------------------------------------------------------------- changed code


async def test_resume_lists_an_event_class_that_no_longer_exists(tmp_path: Path) -> None:
    """Work whose event class is gone from the code is listed by resume, which runs nothing."""
    db = tmp_path / "gone.db"
    await failed_run(db)
    seq = seq_of(db, "enqueued", "ship")
    ((payload,),) = sql(db, "SELECT payload FROM log WHERE seq = ?", (seq,))
    rewrite(db, seq, payload.replace("test_bad_input:Packed", "test_bad_input:Crate"))
    head = sql(db, "SELECT max(seq) FROM log")
    wf = Shipping(store=EventStore(db))
    with pytest.raises(
        WorkflowChangedError,
        match=r"event 3 for step 'ship'.*tests\.test_bad_input:Crate",
    ) as info:
        wf.resume("r1")
    assert len(info.value.problems) == 1
    assert sql(db, "SELECT max(seq) FROM log") == head


async def test_resume_lists_an_event_whose_payload_no_longer_validates(tmp_path: Path) -> None:
    """Work whose stored payload the event class no longer accepts is listed by resume."""
    db = tmp_path / "invalid.db"
    await failed_run(db)
    seq = seq_of(db, "enqueued", "ship")
    payload = orjson.loads(sql(db, "SELECT payload FROM log WHERE seq = ?", (seq,))[0][0])
    payload["event"]["v"] = {"label": "p1", "weight": "three"}  # weight: int now refuses it
    rewrite(db, seq, json.dumps(payload))
    head = sql(db, "SELECT max(seq) FROM log")
    with pytest.raises(WorkflowChangedError, match=r"(?s)event 3 for step 'ship'.*weight"):
        Shipping(store=EventStore(db)).resume("r1")
    assert sql(db, "SELECT max(seq) FROM log") == head


# ---------------------------------------------------------------------------- values


class Report(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("fine", [1, 2])
        await ctx.store.set("cfg", {"retries": 3, "hooks": [print, object()]})
        return StopEvent(result="unreachable")


async def test_unencodable_context_value_is_refused_at_set(tmp_path: Path) -> None:
    """ctx.store.set of a value the codec cannot store names key, path and type; nothing lands."""
    db = tmp_path / "enc.db"
    wf = Report(store=db)
    handler = wf.run()
    with pytest.raises(
        EncodeError, match=r"cfg\['hooks'\]\[0\]: <class 'builtin_function_or_method'>"
    ):
        await handler
    state = wf.state_at(handler.run_id)
    assert state.status == "failed"
    assert state.context == {}  # the attempt's earlier write went with it
    kinds = [r.kind for r in wf.store.records(handler.run_id)]
    assert "state_set" not in kinds
    assert kinds[-2:] == ["step_failed", "run_failed"]


class Carrier(Event):
    payload: Any


class Emitter(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Carrier:
        await ctx.store.set("before", 1)
        return Carrier(payload={"rows": [1, object()]})

    @step
    async def end(self, ev: Carrier) -> StopEvent:
        return StopEvent(result="unreachable")


async def test_unencodable_emitted_event_fails_the_step_in_the_log(tmp_path: Path) -> None:
    """An emitted event the codec cannot store fails the step, recorded as a failure."""
    db = tmp_path / "emit.db"
    wf = Emitter(store=db)
    handler = wf.run()
    with pytest.raises(EncodeError, match=r"\['rows'\]\[1\]: <class 'object'>"):
        await asyncio.wait_for(handler, 10)
    state = wf.state_at(handler.run_id)
    assert state.context == {}
    assert state.status == "failed"


class Big(Event):
    blob: str


class Hauler(Workflow):
    @step
    async def start(self, ev: StartEvent) -> Big:
        return Big(blob="0123456789" * 1_000_000)

    @step
    async def weigh(self, ev: Big) -> StopEvent:
        return StopEvent(result=len(ev.blob))


async def test_ten_megabyte_event(tmp_path: Path) -> None:
    """A 10 MB event field goes through a run, and state_at returns it whole."""
    db = tmp_path / "big.db"
    wf = Hauler(store=db)
    handler = wf.run()
    assert await handler == 10_000_000
    cp = wf.checkpoints(handler.run_id, event=Big)[0]
    fresh = Hauler(store=EventStore(db, readonly=True))
    (queued,) = fresh.state_at(handler.run_id, cp.seq).queues["weigh"]
    assert type(queued) is Big
    assert queued.blob == "0123456789" * 1_000_000


# ---------------------------------------------------------------------------- big logs


def _grow(db: Path, run_id: str, records: int) -> int:
    """Appends ``records`` valid records (enqueue, take, start, finish cycles) with sqlite3."""
    ((rid,),) = sql(db, "SELECT rid FROM runs WHERE run_id = ?", (run_id,))
    ((first, ts),) = sql(db, "SELECT max(seq) + 1, max(ts) + 1 FROM log")
    event = {"$t": "model", "c": "tests.test_bad_input:Parcel", "v": {"label": "tick"}}

    def rows() -> Any:
        for k in range(records):
            seq = first + k
            ev_id = 1_000 + k // 4
            kind, body = [
                ("enqueued", {"id": ev_id, "event": event, "src": "external"}),
                ("dequeued", {"id": ev_id, "worker": 0}),
                ("step_started", {"id": ev_id, "attempt": 1}),
                ("step_finished", {"id": ev_id, "attempt": 1, "emitted": [], "base": 0}),
            ][k % 4]
            yield (seq, rid, kind, "pack", orjson.dumps(body).decode(), seq, ts + k)

    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.executemany(
                "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows(),
            )
    finally:
        conn.close()
    return int(first + records - 1)


def _big_log(tmp_path: Path, records: int) -> None:
    db = tmp_path / "huge.db"
    asyncio.run(_store_with_runs(db, 1))
    with EventStore(db, readonly=True) as store:
        original = sum(1 for _ in store.records("run-0"))
    last = _grow(db, "run-0", records)
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.reliability_worker",
            "bigfold",
            str(db),
            "run-0",
            f"{__name__}:Shipping",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.split("MEM ", 1)[1])
    assert info["records"] == original + records
    assert info["seq"] == last
    assert info["queued"] == 0
    assert info["in_progress"] == 1  # the failed ship step, still there to be re-run
    growth_mib = (info["after_kib"] - info["before_kib"]) / 1024
    assert growth_mib < 32, info  # measured: about 1 MiB for 1,000,000 records
    assert time.perf_counter() - started < 300


def test_hundred_thousand_records(tmp_path: Path) -> None:
    """A run of 100,000 records folds and iterates with bounded memory."""
    _big_log(tmp_path, 100_000)


@pytest.mark.slow
def test_million_records(tmp_path: Path) -> None:
    """A run of 1,000,000 records folds and iterates with peak RSS growth under 32 MiB."""
    _big_log(tmp_path, 1_000_000)


# ---------------------------------------------------------------------------- ids and seqs


def _resume(wf: Workflow, run_id: str) -> object:
    async def go() -> object:
        return wf.resume(run_id)

    return asyncio.run(go())


def _fork(wf: Workflow, run_id: str, seq: int) -> object:
    async def go() -> object:
        return wf.run_from((run_id, seq))

    return asyncio.run(go())


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda wf: wf.state_at("ghost"), id="state_at"),
        pytest.param(lambda wf: wf.state_at("ghost", 1), id="state_at-seq"),
        pytest.param(lambda wf: wf.checkpoints("ghost"), id="checkpoints"),
        pytest.param(lambda wf: wf.send("ghost", Parcel(label="x")), id="send"),
        pytest.param(lambda wf: _resume(wf, "ghost"), id="resume"),
        pytest.param(lambda wf: _fork(wf, "ghost", 1), id="run_from"),
    ],
)
def test_unknown_run_id(tmp_path: Path, call: Callable[[Workflow], object]) -> None:
    """Every API given a run id that does not exist raises RunNotFoundError naming it."""
    db = tmp_path / "ids.db"
    asyncio.run(_store_with_runs(db, 1))
    wf = Shipping(store=EventStore(db))
    with pytest.raises(RunNotFoundError, match=rf"no run 'ghost' in {re.escape(str(db))}") as info:
        call(wf)
    assert isinstance(info.value, LookupError)
    assert info.value.run_id == "ghost"
    with pytest.raises(StoreRunNotFoundError, match="no run 'ghost'"):
        list(wf.store.records("ghost"))


@pytest.mark.parametrize("offset", [1, 2, 10**9], ids=["just-before", "two-before", "far"])
def test_seq_before_the_first_commit(tmp_path: Path, offset: int) -> None:
    """A seq before a run's first record is CheckpointNotFoundError for reads and forks."""
    db = tmp_path / "seq.db"
    asyncio.run(_store_with_runs(db, 2))
    wf = Shipping(store=EventStore(db))
    first = wf.store.run("run-1").first_seq
    assert first is not None
    seq = first - offset
    message = rf"run 'run-1' has no state at seq {seq}: its log begins at seq {first}\b"
    with pytest.raises(CheckpointNotFoundError, match=message) as info:
        wf.state_at("run-1", seq)
    assert (info.value.seq, info.value.first) == (seq, first)
    with pytest.raises(CheckpointNotFoundError, match=message):
        _fork(wf, "run-1", seq)
    assert wf.state_at("run-1", first).seq >= first


class Once(Workflow):
    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="done")


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("", "run_id is empty"),
        ("  ", "run_id is blank ('  ')"),
        ("job-\ud800", "is not valid text (a lone surrogate at position 4)"),
        (42, "run_id must be a string, not int"),
    ],
)
async def test_a_run_id_the_store_cannot_keep_is_refused_by_every_way_in(
    run_id: Any, says: str, tmp_path: Path
) -> None:
    """An empty id started a new random run each call (an unset variable, say, meant to
    name one run); a lone surrogate failed deep in the store with a bare UnicodeEncodeError.
    Both are refused at the call, with nothing written."""
    wf = Once(store=tmp_path / "ids.db")
    with pytest.raises(WorkflowRuntimeError, match=re.escape(says)):
        wf.run(run_id=run_id)
    with pytest.raises(WorkflowRuntimeError, match=re.escape(says)):
        wf.submit(run_id=run_id)
    assert wf.store.runs() == []
    assert await wf.run(run_id="fine") == "done"
    wf.store.close()
