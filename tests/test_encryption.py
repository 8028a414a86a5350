"""Encryption at rest: payloads sealed with AES-GCM, keys that rotate, clear errors.

Real SQLite files throughout; the crash test kills a real process with SIGKILL.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventstore import (
    AesGcmCodec,
    Commit,
    DecryptionError,
    EncryptedPayloadError,
    EventStore,
    NewRun,
    PayloadCodec,
    PayloadCodecError,
    Record,
    add_key,
    load_key_file,
    sealed_key_id,
)
from tests.support.memo_flows import calls
from tests.support.ui_server import get, serving
from tests.test_cli import invoke, ok
from workflow import Context, Event, HumanResponseEvent, StartEvent, StopEvent, Workflow, step

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0
SECRET = "the-secret-llama"


def codec(*kids: str, current: str | None = None) -> AesGcmCodec:
    """A codec over fixed keys, one per id (the same id always gets the same key)."""
    return AesGcmCodec({k: (k * 32).encode()[:32] for k in kids}, current)


def raw_rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """What plain SQLite reads from the file."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def get_json(url: str) -> tuple[int, Any]:
    """(status, decoded JSON) of a GET."""
    code, _, body = get(url)
    return code, orjson.loads(body)


def write_run(store: EventStore, run_id: str = "r") -> None:
    store.append_sync(
        Commit(
            run_id,
            [
                Record("run_started", None, orjson.dumps({"who": SECRET}).decode()),
                Record("enqueued", "a", '{"id": 1}'),
            ],
            create=NewRun(meta={"workflow": "m:W"}),
            snapshot=(2, orjson.dumps({"snap": SECRET}).decode()),
        )
    )
    store.post_sync(run_id, orjson.dumps({"posted": SECRET}).decode(), key="k")


def test_payloads_round_trip_and_only_payloads_are_sealed(tmp_path: Path) -> None:
    """Records, snapshots and inbox entries read back as written; on disk each payload is
    an envelope naming its key id, while seqs, kinds, steps and runs stay plain."""
    db = tmp_path / "enc.db"
    with EventStore(db, payload_codec=codec("k1")) as store:
        write_run(store)
        got = [(r.seq, r.kind, r.step, r.data()) for r in store.records("r")]
        assert got == [(1, "run_started", None, {"who": SECRET}), (2, "enqueued", "a", {"id": 1})]
        snap = store.find_snapshot("r")
        assert snap is not None
        assert orjson.loads(snap.data) == {"snap": SECRET}
        assert [orjson.loads(e.payload) for e in store.inbox("r")] == [{"posted": SECRET}]
    content = db.read_bytes() + (
        Path(str(db) + "-wal").read_bytes() if Path(str(db) + "-wal").exists() else b""
    )
    assert SECRET.encode() not in content
    rows = raw_rows(db, "SELECT seq, run_id, kind, step, payload FROM records ORDER BY seq")
    assert [r[:4] for r in rows] == [(1, "r", "run_started", None), (2, "r", "enqueued", "a")]
    for *_, payload in rows:
        env = orjson.loads(payload)  # still JSON, as the column promises
        assert set(env) == {"enc", "kid", "data"}
        assert (env["enc"], env["kid"]) == ("aes-gcm", "k1")
        assert sealed_key_id(payload) == "k1"
    ((meta,),) = raw_rows(db, "SELECT meta FROM runs")
    assert orjson.loads(meta) == {"workflow": "m:W"}
    ((inbox,),) = raw_rows(db, "SELECT payload FROM inbox")
    ((data,),) = raw_rows(db, "SELECT data FROM snapshots")
    assert sealed_key_id(inbox) == sealed_key_id(data) == "k1"


def test_plain_store_is_unchanged_and_readable_by_an_encrypting_one(tmp_path: Path) -> None:
    """Without a codec payloads stay plain JSON; a store that turns encryption on later
    reads the old plain payloads as they are and seals only the new ones."""
    db = tmp_path / "mixed.db"
    with EventStore(db) as store:
        write_run(store, "old")
    (old,) = raw_rows(db, "SELECT payload FROM records WHERE kind = 'run_started'")
    assert orjson.loads(old[0]) == {"who": SECRET}
    assert sealed_key_id(old[0]) is None
    with EventStore(db, payload_codec=codec("k1")) as store:
        write_run(store, "new")
        assert next(r.data() for r in store.records("old")) == {"who": SECRET}
        assert next(r.data() for r in store.records("new")) == {"who": SECRET}
    kids = [sealed_key_id(p) for (p,) in raw_rows(db, "SELECT payload FROM records ORDER BY seq")]
    assert kids == [None, None, "k1", "k1"]


def test_keys_rotate(tmp_path: Path) -> None:
    """A codec encrypts with its current key and decrypts with any key it holds, so a
    store written under k1 and then k2 reads whole with both keys."""
    db = tmp_path / "rot.db"
    with EventStore(db, payload_codec=codec("k1")) as store:
        write_run(store, "first")
    with EventStore(db, payload_codec=codec("k1", "k2")) as store:
        assert store.payload_codec is not None
        assert store.payload_codec.key_id == "k2"
        write_run(store, "second")
        for run in ("first", "second"):
            assert next(r.data() for r in store.records(run)) == {"who": SECRET}
    kids = [sealed_key_id(p) for (p,) in raw_rows(db, "SELECT payload FROM records ORDER BY seq")]
    assert kids == ["k1", "k1", "k2", "k2"]
    with (
        EventStore(db, readonly=True, payload_codec=codec("k2")) as store,
        pytest.raises(DecryptionError, match=r"record seq 1 .*key id 'k1'.*holds 'k2'"),
    ):
        list(store.records("first"))


def test_a_wrong_key_is_a_clear_error(tmp_path: Path) -> None:
    """Another key under the same id refuses to decrypt, naming what it read: records,
    snapshots and inbox entries alike, never garbage."""
    db = tmp_path / "wrong.db"
    with EventStore(db, payload_codec=codec("k1")) as store:
        write_run(store)
    wrong = AesGcmCodec({"k1": b"x" * 32})
    with EventStore(db, readonly=True, payload_codec=wrong) as store:
        with pytest.raises(DecryptionError, match=r"record seq 1 \(run_started\) of run 'r'.*k1"):
            list(store.records("r"))
        with pytest.raises(DecryptionError, match="the snapshot of run 'r' at seq 2"):
            store.find_snapshot("r")
        with pytest.raises(DecryptionError, match="inbox entry 1 of run 'r'") as caught:
            store.inbox("r")
        assert caught.value.key_id == "k1"


def test_an_altered_payload_does_not_decrypt(tmp_path: Path) -> None:
    """A ciphertext changed on disk, or moved to a record of another kind, is refused."""
    db = tmp_path / "alter.db"
    with EventStore(db, payload_codec=codec("k1")) as store:
        write_run(store)
    conn = sqlite3.connect(db)
    with conn:  # the first record's payload copied over the second's (another kind)
        conn.execute(
            "UPDATE log SET payload = (SELECT payload FROM log WHERE seq = 1) WHERE seq = 2"
        )
    conn.close()
    with (
        EventStore(db, readonly=True, payload_codec=codec("k1")) as store,
        pytest.raises(DecryptionError, match=r"record seq 2 \(enqueued\)"),
    ):
        list(store.records("r"))


def test_key_files_add_and_rotate(tmp_path: Path) -> None:
    """``add_key`` makes a key file readable by its owner only and each new key current;
    a file that is not a key file is a clear error."""
    keys = tmp_path / "keys.json"
    assert add_key(keys) == "k1"
    assert keys.stat().st_mode & 0o777 == 0o600
    assert add_key(keys, "2026-12") == "2026-12"
    ring = load_key_file(keys)
    assert ring.key_id == "2026-12"
    assert ring.key_ids == ["k1", "2026-12"]
    assert isinstance(ring, PayloadCodec)
    with pytest.raises(PayloadCodecError, match="already holds a key 'k1'"):
        add_key(keys, "k1")
    with pytest.raises(PayloadCodecError, match="must be 1 to 64"):
        add_key(keys, 'bad"id')
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(PayloadCodecError, match=r"bad\.json: not a key file"):
        load_key_file(bad)
    short = tmp_path / "short.json"
    short.write_text(orjson.dumps({"keys": {"a": base64.b64encode(b"x" * 5).decode()}}).decode())
    with pytest.raises(PayloadCodecError, match="'a' is 5 bytes"):
        load_key_file(short)
    with pytest.raises(PayloadCodecError, match="cannot read it"):
        load_key_file(tmp_path / "missing.json")


class Asked(Event):
    secret: str


class Told(HumanResponseEvent):
    response: str


class Secretive(Workflow):
    """Keeps a secret in its context, a memoized call's result and an awaited answer."""

    @step
    async def ask(self, ctx: Context[Any], ev: StartEvent) -> Asked:
        await ctx.store.set("secret", ev.get("secret"))
        echoed = await ctx.memo("echo", _echo, ev.get("secret"))
        answer = await ctx.wait_for_event(Told)
        return Asked(secret=echoed + answer.response)

    @step
    async def done(self, ctx: Context[Any], ev: Asked) -> StopEvent:
        return StopEvent(result=ev.secret)


async def _echo(text: str) -> str:
    return text


def test_a_workflow_on_an_encrypted_store(location: str) -> None:
    """A run journals to an encrypted store, SQLite or PostgreSQL (context, memoized
    result, event sent from outside, snapshots) and reads back whole with the key; without
    it the fold says the payloads are encrypted and which key they need; with another key
    under the same id it says the key is wrong."""

    async def go() -> Any:
        with EventStore(location, payload_codec=codec("k1")) as store:
            wf = Secretive(store=store, timeout=None)
            handler = wf.run(run_id="s", secret=SECRET)
            await handler.wait_until_waiting(BOUND)
            wf.send("s", Told(response="!"))
            result = await asyncio.wait_for(handler, BOUND)
            state = wf.state_at("s")
            return result, state.context.get("secret")

    assert asyncio.run(go()) == (SECRET + "!", SECRET)
    with EventStore(location, readonly=True) as plain:
        stored = [
            str(p)
            for q in ("payload FROM records", "payload FROM inbox", "data FROM snapshots")
            for (p,) in plain.query(f"SELECT {q}")
        ]
        assert len(stored) > 10
        assert all(sealed_key_id(p) == "k1" for p in stored)
        assert not any(SECRET in p for p in stored)
        kinds = {k for (k,) in plain.query("SELECT kind FROM records WHERE run_id = 's'")}
        assert {"memoized", "waiting", "run_finished"} <= kinds
        wf = Secretive(store=plain)
        with pytest.raises(EncryptedPayloadError, match=r"is encrypted \(key id 'k1'\)"):
            wf.state_at("s")
    wrong = AesGcmCodec({"k1": b"w" * 32})
    with (
        EventStore(location, readonly=True, payload_codec=wrong) as store,
        pytest.raises(DecryptionError, match="does not decrypt with key 'k1'"),
    ):
        Secretive(store=store).state_at("s")


def test_crash_and_resume_with_encryption(tmp_path: Path) -> None:
    """A process with WORKFLOW_KEY_FILE set dies with SIGKILL between two memoized calls;
    resumed with the same key file, the first call's sealed result is reused."""
    db, counters, keys = tmp_path / "runs.db", tmp_path / "counters", tmp_path / "keys.json"
    counters.mkdir()
    add_key(keys)
    env = {**os.environ, "WORKFLOW_KEY_FILE": str(keys), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.memo_proc",
            str(db),
            "crash",
            str(counters),
            "between",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    memo = raw_rows(db, "SELECT payload FROM records WHERE kind = 'memoized'")
    assert len(memo) == 1
    assert sealed_key_id(memo[0][0]) == "k1"
    assert "llamas" not in memo[0][0]
    from tests.support.memo_flows import FLOWS

    async def resume() -> Any:
        with EventStore(db, payload_codec=load_key_file(keys)) as store:
            wf = FLOWS["crash"](store=store, timeout=None, counters=counters)
            return await asyncio.wait_for(wf.resume("agent"), BOUND)

    assert asyncio.run(resume()) == ["first(llamas)", "second(first(llamas))"]
    assert calls(counters, "first") == 1
    assert calls(counters, "second") == 1


def sealed_secretive(db: Path, keys: Path) -> None:
    """Runs Secretive run 's' to its end on a store encrypted with the key file ``keys``."""

    async def go() -> None:
        with EventStore(db, payload_codec=load_key_file(keys)) as store:
            wf = Secretive(store=store, timeout=None)
            handler = wf.run(run_id="s", secret=SECRET)
            await handler.wait_until_waiting(BOUND)
            wf.send("s", Told(response="!"))
            await asyncio.wait_for(handler, BOUND)

    asyncio.run(go())


@pytest.fixture
def sealed_run(tmp_path: Path) -> tuple[Path, Path]:
    """An encrypted store (and its key file) holding Secretive run 's', finished."""
    db, keys = tmp_path / "sealed.db", tmp_path / "keys.json"
    add_key(keys)
    sealed_secretive(db, keys)
    return db, keys


def test_cli_with_and_without_the_key_file(sealed_run: tuple[Path, Path], tmp_path: Path) -> None:
    """Without --key-file the log still lists seqs, kinds and steps, each payload shown as
    "encrypted (key id)", and what needs values says which key; with it, values show; a
    wrong key is a one-line error; nothing is written in the clear to an encrypted run."""
    db, keys = sealed_run
    plain = invoke("history", db, "s")
    assert plain.exit_code == 0, plain.output
    lines = [ln for ln in plain.stdout.splitlines()[2:] if ln.strip()]
    assert lines
    assert all(ln.rstrip().endswith("encrypted (k1)") for ln in lines), plain.stdout
    assert any(" memoized " in ln and " ask " in ln for ln in lines)
    assert SECRET not in plain.stdout
    state = invoke("state", db, "s")
    assert state.exit_code == 1
    assert "is encrypted (key id 'k1')" in state.stderr
    assert "--key-file" in state.stderr
    listed = invoke("runs", db)
    assert listed.exit_code == 0
    assert "finished" in listed.stdout
    keyed = ok("--key-file", keys, "history", db, "s")
    assert SECRET in keyed
    assert "encrypted" not in keyed
    assert SECRET in ok("--key-file", keys, "state", db, "s")
    wrong = tmp_path / "wrong.json"
    add_key(wrong)  # another random key under the same id, k1
    bad = invoke("--key-file", wrong, "state", db, "s")
    assert bad.exit_code == 1
    assert "does not decrypt with key 'k1'" in bad.stderr
    assert SECRET not in bad.output
    refused = invoke(
        "send", db, "s", "--event", "tests.test_encryption:Told", "--data", '{"response": "x"}'
    )
    assert refused.exit_code == 1
    assert "run 's' is encrypted (key id 'k1'): pass --key-file" in refused.stderr


def test_keygen_rotates(tmp_path: Path) -> None:
    """``workflow keygen`` makes a key file and adds a current key at each call."""
    keys = tmp_path / "keys.json"
    assert "added key 'k1'" in invoke("keygen", keys).stderr
    assert "added key 'next'" in invoke("keygen", keys, "--id", "next").stderr
    assert load_key_file(keys).key_ids == ["k1", "next"]
    assert load_key_file(keys).key_id == "next"


def test_ui_without_and_with_the_key(
    sealed_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``workflow serve`` without the key shows the run's seqs and kinds with payloads
    "encrypted (k1)", and its data route says which key it needs; with WORKFLOW_KEY_FILE
    the timeline and its values are served."""
    db, keys = sealed_run
    monkeypatch.delenv("WORKFLOW_KEY_FILE", raising=False)
    with serving(db) as base:
        code, _, listing = get(base + "/")
        assert code == 200
        assert 'data-run="s"' in listing
        code, _, page = get(base + "/runs/s")
        assert code == 200
        assert 'data-key-id="k1"' in page
        assert "Its payloads are encrypted (key id k1)" in page
        assert page.count("encrypted (k1)") >= 10
        assert "<code>memoized</code>" in page
        assert SECRET not in page
        code, data = get_json(base + "/runs/s/data")
        assert code == 409
        assert data["key_id"] == "k1"
    with serving(db, env={**os.environ, "WORKFLOW_KEY_FILE": str(keys)}) as base:
        code, _, page = get(base + "/runs/s")
        assert code == 200
        assert "data-key-id" not in page
        code, data = get_json(base + "/runs/s/data")
        assert code == 200
        assert SECRET in orjson.dumps(data).decode()


def test_trace_without_the_key_names_it(sealed_run: tuple[Path, Path], tmp_path: Path) -> None:
    """``workflow trace`` of an encrypted run without the key says which key id it needs
    (exit 1, no file written); with the key it writes the spans."""
    db, keys = sealed_run
    out = tmp_path / "t.json"
    plain = invoke("trace", db, "s", "-o", out)
    assert plain.exit_code == 1, plain.output
    assert "is encrypted (key id 'k1')" in plain.stderr
    assert "--key-file" in plain.stderr
    assert "KeyError" not in plain.output
    assert not out.exists()
    ok("--key-file", keys, "trace", db, "s", "-o", out)
    assert orjson.loads(out.read_text())["resourceSpans"]


def test_check_without_the_key_checks_the_structure(
    sealed_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """``workflow check`` without the key checks what needs no values and names the key id
    the payloads need (exit 0 on an intact store); a bad kind is still found without it; with
    the key it checks the payloads too (an altered one is a problem)."""
    db, keys = sealed_run
    plain = invoke("check", db)
    assert plain.exit_code == 0, plain.output
    assert "run s: payloads not checked: encrypted with key id 'k1'" in plain.stderr
    assert "--key-file" in plain.stderr
    assert ": ok" in plain.stderr
    report = orjson.loads(ok("check", "--json", db))
    assert report["ok"] is True
    assert report["records"] > 2
    assert report["unchecked"] == [{"run_id": "s", "key_id": "k1"}]
    keyed = invoke("--key-file", keys, "check", db)
    assert keyed.exit_code == 0, keyed.output
    assert "not checked" not in keyed.stderr
    assert "unchecked" not in orjson.loads(ok("--key-file", keys, "check", "--json", db))
    altered, bad_kind = tmp_path / "altered.db", tmp_path / "kind.db"
    for copy, sql in (
        (altered, "UPDATE log SET payload = (SELECT payload FROM log WHERE seq = 1) WHERE seq = 2"),
        (bad_kind, "UPDATE log SET kind = 'no_such_kind' WHERE seq = 2"),
    ):
        copy.write_bytes(db.read_bytes())
        conn = sqlite3.connect(copy)
        with conn:
            conn.execute(sql)
        conn.close()
    broken = invoke("check", bad_kind)
    assert broken.exit_code == 1, broken.output
    assert "unknown kind 'no_such_kind'" in broken.stdout
    assert invoke("check", altered).exit_code == 0  # no key: the ciphertext is not opened
    damaged = invoke("--key-file", keys, "check", altered)
    assert damaged.exit_code == 1, damaged.output
    assert "seq 2" in damaged.stdout
