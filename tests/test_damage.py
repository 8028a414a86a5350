"""Damage is reported by name and never trusted: real store files, damaged byte by byte.

Each test runs a workflow on a file, closes it (so that everything is in the main file, no
WAL), then overwrites bytes of the file as a disk, a bad copy or a stray editor would: a
cached state (snapshot) that does not decode or does not fit the log, a record that is not
text or not JSON, a flipped byte in the schema on page 1, a damaged index. Readers fold the
log instead of an unfit cache (warned), name the file or the seq of what is damaged, and
``workflow check`` / ``workflow history`` report it line by line.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from eventstore import (
    Commit,
    EventStore,
    EventStoreError,
    LogCorruptedError,
    NewRun,
    NotAStoreError,
    Record,
)
from workflow import Context, Event, SnapshotIgnoredWarning, StartEvent, StopEvent, Workflow, step
from workflow._snapshot import SNAPSHOT_FORMAT
from workflow.cli import cli

RUN = "damaged-run-0001"
MARKER = b"hello-marker"  # in exactly one record: the Line event's `enqueued`
HEAD = b'{"v":%d' % SNAPSHOT_FORMAT  # how a cached state begins


class Line(Event):
    text: str


class Notes(Workflow):
    """Two steps, a context key written by each, and a result."""

    @step
    async def write(self, ctx: Context[Any], ev: StartEvent) -> Line:
        await ctx.store.set("stage", "drafted")
        return Line(text=MARKER.decode())

    @step
    async def publish(self, ctx: Context[Any], ev: Line) -> StopEvent:
        await ctx.store.set("stage", "published")
        return StopEvent(result=ev.text.upper())


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """A store file with one finished Notes run (and its snapshot), closed."""
    path = tmp_path / "notes.db"
    wf = Notes(store=str(path))
    assert await wf.run(run_id=RUN) == "HELLO-MARKER"
    wf.store.close()
    return path


def sql(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """One statement on the file with plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def overwrite(path: Path, old: bytes, new: bytes, *, within: bytes | None = None) -> int:
    """Overwrites the one occurrence of ``old`` in the file (inside ``within``, if given)."""
    assert len(old) == len(new)
    assert not Path(f"{path}-wal").exists()  # everything is in the main file
    data = bytearray(path.read_bytes())
    base = 0
    if within is not None:
        assert data.count(within) == 1
        base = data.index(within)
        data_in = bytes(data[base : base + len(within)])
    else:
        data_in = bytes(data)
    assert data_in.count(old) == 1, f"{old!r} occurs {data_in.count(old)} times"
    at = base + data_in.index(old)
    data[at : at + len(old)] = new
    path.write_bytes(bytes(data))
    return at


def snapshot_text(path: Path) -> bytes:
    """The run's cached state as the file holds it."""
    ((data,),) = sql(path, "SELECT data FROM snapshots")
    return str(data).encode()


def marker_seq(path: Path) -> int:
    """The seq of the one record that carries MARKER."""
    ((seq,),) = sql(path, "SELECT seq FROM log WHERE instr(payload, ?)", (MARKER.decode(),))
    return int(seq)


def expected_state(path: Path, tmp_path: Path) -> dict[str, Any]:
    """The run's state (as JSON) read from an undamaged copy of the file, without its cache."""
    copy = tmp_path / "pristine.db"
    shutil.copyfile(path, copy)
    sql(copy, "DELETE FROM snapshots")
    sql(copy, "VACUUM")
    return Notes(store=str(copy)).state_at(RUN).to_json()


def invoke(*args: str | Path) -> Result:
    """Runs the command line in-process."""
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---------------------------------------------------------------- the cache is never the truth


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        pytest.param(HEAD, b"#" + HEAD[1:], "not JSON", id="garbage"),
        pytest.param(b'"queues"', b'"queuez"', "shape of a cached state", id="foreign-shape"),
        pytest.param(b'"context":{', b'"context":[', "not JSON", id="broken-json"),
        pytest.param(b'"next_id":3', b'"next_id":"', "not JSON", id="cut-value"),
        pytest.param(b'"status":"finished"', b'"status":1234567890', "not a str", id="wrong-type"),
        pytest.param(
            f'"run_id":"{RUN}"'.encode(), b'"run_id":"another-run-0001"', "of run", id="run"
        ),
        pytest.param(b'"seq":12,', b'"seq":11,', "says seq 11, its row seq 12", id="seq"),
        pytest.param(b'"first_seq":1,', b'"first_seq":2,', "begins at seq 2", id="first-seq"),
        pytest.param(
            b'"status":"finished"', b'"status":"\xff\xfenished"', "not valid UTF-8", id="not-utf8"
        ),
    ],
)
async def test_unfit_snapshot_is_ignored_with_a_warning(
    db: Path, tmp_path: Path, old: bytes, new: bytes, reason: str
) -> None:
    """A snapshot that does not decode or fit its run is ignored (warned); the log is folded."""
    expected = expected_state(db, tmp_path)
    overwrite(db, old, new, within=snapshot_text(db))
    wf = Notes(store=str(db))
    with pytest.warns(SnapshotIgnoredWarning, match=f"run '{RUN}'.*seq 12.*{reason}"):
        state = wf.state_at(RUN)
    assert state.to_json() == expected
    wf.store.close()


async def test_snapshot_of_an_older_format_is_ignored_silently(db: Path, tmp_path: Path) -> None:
    """A snapshot in format 1 (what earlier versions wrote) is not used, and not warned about."""
    expected = expected_state(db, tmp_path)
    # Format 1 had no seqs in its entries (commit d70ee2a added them); at seq 9 the
    # publish step is in progress.
    d = json.loads(_state_at(db, 9))
    d["v"] = 1
    d["queues"] = {k: [e[:2] for e in q] for k, q in d["queues"].items()}
    d["in_progress"] = {k: [e[:5] for e in v] for k, v in d["in_progress"].items()}
    d["context"] = {k: v[:3] for k, v in d["context"].items()}
    assert [e[0] for e in d["in_progress"]["publish"]] == [2]
    conn = sqlite3.connect(db)
    conn.execute("UPDATE snapshots SET seq = 9, data = ?", (json.dumps(d),))
    conn.commit()
    conn.close()
    wf = Notes(store=str(db))
    assert wf.state_at(RUN).to_json() == expected  # filterwarnings=error: no warning
    wf.store.close()


async def test_snapshot_that_the_log_does_not_fold_onto_is_ignored(
    db: Path, tmp_path: Path
) -> None:
    """A cached state at an earlier seq whose queues do not fit the records after it is ignored."""
    expected = expected_state(db, tmp_path)
    # Move the snapshot back to seq 7 (the commit that enqueued the Line event), but leave
    # its queues empty: the `dequeued` at seq 8 then takes an event the state never had.
    text = snapshot_text(db).decode()
    cut = json.loads(text)
    cut.update(seq=7, status="running", result=None)
    sql_text = json.dumps(cut, separators=(",", ":"))
    conn = sqlite3.connect(db)
    conn.execute("UPDATE snapshots SET seq = 7, data = ?", (sql_text,))
    conn.commit()
    conn.close()
    wf = Notes(store=str(db))
    with pytest.warns(SnapshotIgnoredWarning, match="do not fold onto it"):
        state = wf.state_at(RUN)
    assert state.to_json() == expected
    wf.store.close()


async def test_a_damaged_record_is_not_blamed_on_the_snapshot(db: Path) -> None:
    """A damaged record after the snapshot raises LogCorruptedError naming it, with no warning."""
    seq = marker_seq(db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE snapshots SET seq = 2, data = ?", (_state_at(db, 2),))
    conn.commit()
    conn.close()
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    wf = Notes(store=str(db))
    with pytest.raises(LogCorruptedError, match=f"record seq {seq} cannot be read back") as info:
        wf.state_at(RUN)
    assert info.value.seq == seq
    wf.store.close()


def _state_at(path: Path, seq: int) -> str:
    """The run's cached-state text at ``seq``, from the pure fold."""
    from workflow._read import fold_run
    from workflow._snapshot import dump_folded

    with EventStore(path, readonly=True) as store:
        return dump_folded(fold_run(store, RUN, seq, cached=False)).decode()


# ---------------------------------------------------------------- damaged records


async def test_record_that_is_not_text_names_its_seq(db: Path) -> None:
    """A record whose payload is not UTF-8 fails reads with LogCorruptedError naming its seq."""
    seq = marker_seq(db)
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    with EventStore(db, readonly=True) as store:
        got: list[int] = []
        with pytest.raises(LogCorruptedError, match=f"record seq {seq} cannot be read") as info:
            got.extend(r.seq for r in store.records(RUN))
        assert info.value.seq == seq
        assert got == list(range(1, seq))  # every record before it was read
        assert [r.seq for r in store.records(RUN, after=seq)] == list(range(seq + 1, 13))
        with pytest.raises(LogCorruptedError, match=f"record seq {seq}"):
            list(store.records())  # all runs at once: the same record is named
    wf = Notes(store=str(db))
    assert wf.state_at(RUN).result == "HELLO-MARKER"  # the cache covers it: nothing to read
    with pytest.raises(LogCorruptedError, match=f"record seq {seq}"):
        wf.state_at(RUN, seq)
    wf.store.close()


# ---------------------------------------------------------------- a flipped byte on page 1


def _schema_positions(path: Path) -> list[int]:
    """Every third byte of page 1 from the first CREATE to the page's end (the schema text)."""
    head = path.read_bytes()[:4096]
    return list(range(head.index(b"CREATE"), 4096, 3))


def test_flipped_byte_in_the_schema_names_the_file(tmp_path: Path) -> None:
    """A flipped byte anywhere in the schema text of page 1 gives an error naming the file."""
    path = tmp_path / "store.db"
    with EventStore(path) as store:
        store.append_sync(Commit("r", [Record("k", None, '{"a":1}')], create=NewRun()))
    clean = path.read_bytes()
    errors: list[tuple[str, EventStoreError]] = []
    for pos in _schema_positions(path):
        damaged = tmp_path / f"flip-{pos}.db"
        data = bytearray(clean)
        data[pos] ^= 0xFF
        damaged.write_bytes(bytes(data))
        for readonly in (True, False):
            try:
                with EventStore(damaged, readonly=readonly) as store:
                    for info in store.runs():
                        list(store.records(info.run_id))
            except EventStoreError as exc:  # anything else fails the test
                errors.append((damaged.name, exc))
        damaged.unlink()
    assert [(name, e) for name, e in errors if name not in str(e)] == []
    assert "NotAStoreError" in {type(e).__name__ for _, e in errors}


def test_schema_text_that_is_not_utf8_is_not_a_unicode_error(tmp_path: Path) -> None:
    """Schema text that is not UTF-8 (SQLite quotes it) gives NotAStoreError, no UnicodeError."""
    path = tmp_path / "store.db"
    EventStore(path).close()
    head = path.read_bytes()[:4096]
    at = head.index(b'CREATE TABLE "leases"') + len(b"CRE")
    data = bytearray(path.read_bytes())
    data[at] = 0xFF
    path.write_bytes(bytes(data))
    for readonly in (True, False):
        with pytest.raises(NotAStoreError, match=r"store\.db.*schema.*damaged"):
            EventStore(path, readonly=readonly)


# ---------------------------------------------------------------- workflow check


def test_check_on_a_whole_store_exits_0(db: Path) -> None:
    """check on an undamaged store prints no problem and exits 0; --json says ok."""
    result = invoke("check", db)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == "checked 1 run(s), 12 records: ok"
    report = json.loads(invoke("check", db, "--json").stdout)
    assert report == {"ok": True, "integrity": ["ok"], "runs": 1, "records": 12, "problems": []}
    assert invoke("check", db, RUN).exit_code == 0


def test_check_names_the_first_bad_seq(db: Path) -> None:
    """check names the run and seq of a record that is not text, and exits 1."""
    seq = marker_seq(db)
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    result = invoke("check", db)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"run {RUN}: seq {seq}: record: LogCorruptedError: record seq {seq} cannot be read back"
        f" (Could not decode to UTF-8 column 'payload' with text"
        + result.stdout.split("with text", 1)[1].rstrip("\n")
    ]
    (problem,) = json.loads(invoke("check", db, "--json").stdout)["problems"]
    assert (problem["what"], problem["run_id"], problem["seq"]) == ("record", RUN, seq)


def test_check_names_a_record_that_is_not_json(db: Path) -> None:
    """check names the seq of a record whose payload is not JSON."""
    seq = marker_seq(db)
    overwrite(db, b'{"id":2,"event"', b'{"id":2,"event!')
    result = invoke("check", db, RUN)
    assert result.exit_code == 1
    assert result.stdout.startswith(f"run {RUN}: seq {seq}: record: LogCorruptedError: ")
    assert "malformed payload" in result.stdout


def test_check_finds_a_snapshot_that_does_not_decode(db: Path) -> None:
    """check reports a cached state that is not JSON, at its seq."""
    overwrite(db, HEAD, b"#" + HEAD[1:], within=snapshot_text(db))
    result = invoke("check", db)
    assert result.exit_code == 1
    assert result.stdout.startswith(f"run {RUN}: seq 12: snapshot: SnapshotError: it is not JSON")


def test_check_finds_a_snapshot_whose_text_is_not_utf8(db: Path) -> None:
    """check reports a cached state whose bytes are not text at all, at its seq, and goes on
    to check the log (which folds)."""
    overwrite(db, b'"status":"finished"', b'"status":"\xff\xfenished"', within=snapshot_text(db))
    result = invoke("check", db)
    assert result.exit_code == 1
    assert result.stdout.startswith(f"run {RUN}: seq 12: snapshot: SnapshotUnreadableError: ")
    assert "not valid UTF-8" in result.stdout
    with pytest.warns(SnapshotIgnoredWarning, match="not valid UTF-8"):
        assert invoke("state", db, RUN).exit_code == 0  # the log is read instead


def test_check_finds_a_snapshot_that_differs_from_the_fold(db: Path) -> None:
    """check reports a cached state that decodes but holds another value than the log."""
    overwrite(db, b'"published"', b'"publishex"', within=snapshot_text(db))
    result = invoke("check", db, "--json")
    assert result.exit_code == 1
    (problem,) = json.loads(result.stdout)["problems"]
    assert (problem["what"], problem["seq"], problem["error"]) == ("snapshot", 12, "SnapshotError")
    assert problem["message"] == "it differs from the fold of the log in context"


def test_check_runs_sqlites_integrity_check(db: Path) -> None:
    """check reports what SQLite's integrity check finds (a damaged index entry) and exits 1."""
    data = db.read_bytes()
    # The run id's entry in the index on runs.run_id: on an index leaf page (type 0x0a).
    name = RUN.encode()
    at = next(
        i
        for i in range(len(data))
        if data.startswith(name, i) and data[(i // 4096) * 4096 + (100 if i < 4096 else 0)] == 10
    )
    raw = bytearray(data)
    raw[at + len(name) - 1] ^= 0x01
    db.write_bytes(bytes(raw))
    result = invoke("check", db, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["integrity"] != ["ok"]
    assert report["integrity"] == ["row 1 missing from index idx_runs_run_id"]
    # The run is then not found through that index: reported too, as the run's problem.
    assert [(p["what"], p["run_id"], p["error"]) for p in report["problems"]] == [
        ("integrity", None, "SQLite"),
        ("run", RUN, "RunNotFoundError"),
    ]
    text = invoke("check", db)
    assert text.stdout.startswith("integrity: SQLite: ")


async def test_check_reports_a_fork_of_a_damaged_run(db: Path) -> None:
    """A fork whose parent's prefix is damaged is reported as such; check RUN checks one run."""
    wf = Notes(store=str(db))
    fork = wf.run_from((RUN, 12))
    await fork
    fork_id = fork.run_id
    wf.store.close()
    seq = marker_seq(db)
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    report = json.loads(invoke("check", db, "--json").stdout)
    assert [(p["what"], p["run_id"], p["seq"]) for p in report["problems"]] == [
        ("record", RUN, seq),
        ("parent", fork_id, seq),
    ]


# ---------------------------------------------------------------- workflow history


def test_history_names_a_record_that_is_not_text(db: Path) -> None:
    """history shows every other record, and for the damaged one its seq and the error class."""
    seq = marker_seq(db)
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    result = invoke("history", db, RUN)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()[2:]
    assert [int(ln.split()[0]) for ln in lines] == list(range(1, 13))
    bad = lines[seq - 1]
    assert bad.split()[:2] == [str(seq), "?"]
    assert "DAMAGED LogCorruptedError: record seq" in bad
    assert f"1 damaged record(s) in run {RUN} (seq {seq})" in result.stderr
    rows = json.loads(invoke("history", db, RUN, "--json").stdout)
    assert [r["seq"] for r in rows] == list(range(1, 13))
    assert rows[seq - 1]["damaged"]["error"] == "LogCorruptedError"


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        pytest.param(b'{"id":2,"event"', b'{"id":2,"event!', "JSONDecodeError", id="not-json"),
        pytest.param(b'{"id":2,"event"', b'{"iX":2,"event"', "KeyError", id="no-id"),
        pytest.param(b'{"id":2,"event"', b'["id",2,"event"', "JSONDecodeError", id="array"),
    ],
)
def test_history_names_a_payload_it_cannot_show(
    db: Path, old: bytes, new: bytes, error: str
) -> None:
    """history shows a payload that is not JSON or not of its kind's shape as damaged, by seq."""
    seq = marker_seq(db)
    overwrite(db, old, new)
    for args in ([], ["--full"]):
        result = invoke("history", db, RUN, *args)
        assert result.exit_code == 1
        (bad,) = [ln for ln in result.stdout.splitlines() if "DAMAGED" in ln]
        assert bad.split()[:2] == [str(seq), str(seq)]
        assert f"DAMAGED {error}" in bad
    rows = json.loads(invoke("history", db, RUN, "--json").stdout)
    assert rows[seq - 1]["damaged"]["error"] == error
    assert (
        rows[seq - 1]["payload_text"]
        == sql(db, "SELECT payload FROM log WHERE seq = ?", (seq,))[0][0]
    )


def test_history_from_after_a_damaged_record(db: Path) -> None:
    """history --from past a damaged record shows the rest without complaint."""
    seq = marker_seq(db)
    overwrite(db, MARKER, b"\xff" + MARKER[1:])
    result = invoke("history", db, RUN, "--from", str(seq + 1))
    assert result.exit_code == 0, result.output
    assert [int(ln.split()[0]) for ln in result.stdout.splitlines()[2:]] == list(range(seq + 1, 13))


async def test_check_finds_nothing_wrong_in_healthy_runs(tmp_path: Path) -> None:
    """check passes healthy runs of every kind: fan-out, conflicts, retries, waits, forks."""
    from tests.test_fold import CASES, run_case

    path = tmp_path / "many.db"
    store = EventStore(path)
    runs = {name: await run_case(name, store) for name in CASES}
    wf, run_id, _ = runs["loop"]  # long enough to have cached states on the way
    fork = wf.run_from(wf.checkpoints(run_id)[300])
    assert await fork == 900
    store.close()
    per_run = sql(path, "SELECT rid, count(*) FROM snapshots GROUP BY rid")
    assert len(per_run) == len(CASES) + 1  # every run's executor left one as it ended
    assert max(n for _, n in per_run) > 1  # and the long ones some on the way
    result = invoke("check", path)
    assert result.exit_code == 0, result.stdout
    assert result.stderr.startswith(f"checked {len(CASES) + 1} run(s), ")
