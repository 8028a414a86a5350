"""``workflow serve`` over HTTP, a real server in a subprocess: its routes, that it is strictly
read-only unless told otherwise, its live stream, its actions and its answers to bad input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import POSTGRES_URL
from tests.flows import Asker, ReportFlow
from tests.support.ui_server import (
    get,
    post,
    server,
    serving,
    status_of,
    wait_for,
    waiting_asker,
)
from tests.test_cli import invoke, ok, run_to_end
from workflow import HumanResponseEvent, Worker


def fork_of(db: Path, run_id: str, seq_step: str = "process") -> tuple[str, int]:
    """Forks a run at its ``seq_step`` checkpoint and runs the fork to its end."""

    async def go() -> tuple[str, int]:
        wf = ReportFlow(store=db, timeout=None)
        at = next(c.seq for c in wf.checkpoints(run_id) if c.step == seq_step)
        h = wf.run_from((run_id, at), updates={"var": 1})
        await h
        wf.store.close()
        return h.run_id, at

    return asyncio.run(go())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A failed ReportFlow run 'rep' and its finished fork (whose id is returned)."""
    db = tmp_path_factory.mktemp("ui") / "ui.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")
    child, _ = fork_of(db, "rep")
    return db, child


def digest(db: Path) -> list[tuple[str, str]]:
    """The store's files and their contents' hashes (SQLite's shared-memory index aside, and
    the empty write-ahead log a read-only reader of a WAL database makes)."""
    return sorted(
        (p.name, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in db.parent.iterdir()
        if p.name.startswith(db.name)
        and not p.name.endswith("-shm")
        and not (p.name.endswith("-wal") and p.stat().st_size == 0)
    )


def test_routes_read_only(store: tuple[Path, str]) -> None:
    """The run list, a run's page, its data and state; nothing of the store changes, and every
    action is refused with the reason."""
    db, child = store
    before = digest(db)
    with serving(db) as base:
        code, ctype, page = get(base + "/")
        assert code == 200
        assert ctype.startswith("text/html")
        assert "2 runs · read-only · live" in page
        assert 'href="/runs/rep"' in page
        assert f'href="/runs/{child}"' in page
        assert 'class="parent" href="/runs/rep#seq=' in page  # the fork links to its parent
        assert 'href="/?parent=rep">1 fork</a>' in page
        assert re.search(r'data-status="failed">failed 1</a>', page)
        assert re.search(r'data-status="finished">finished 1</a>', page)
        # Filters: by status, workflow, parent, time.
        _, _, failed = get(base + "/?status=failed")
        assert 'data-run="rep"' in failed
        assert f'data-run="{child}"' not in failed
        _, _, forks = get(base + "/runs-table?parent=rep")
        assert f'data-run="{child}"' in forks
        assert 'data-run="rep"' not in forks
        _, _, none = get(base + "/?workflow=Asker")
        assert "no runs match" in none
        _, _, later = get(base + "/?since=2999-01-01")
        assert "no runs match" in later
        # A run's page embeds its timeline and the UI's bar, links runs to run pages, and
        # offers no actions on a read-only server.
        code, _, run_page = get(base + "/runs/rep")
        assert code == 200
        assert '"link":"/runs/{}"' in run_page
        assert 'id="uibar"' in run_page
        assert 'id="actions"' not in run_page
        code, ctype, data = get(base + "/runs/rep/data")
        assert code == 200
        assert ctype == "application/json"
        assert json.loads(data)["run"]["forks"][0][0] == child
        seq = json.loads(data)["commits"]["seq"][3]
        code, _, at = get(f"{base}/runs/rep?seq={seq}")
        assert code == 200
        assert f'"seq":{seq}' in at
        code, _, state = get(f"{base}/runs/rep/state?seq={seq}")
        assert code == 200
        assert json.loads(state)["seq"] == seq
        assert status_of(base, "rep") == "failed"
        for action, body in [
            ("cancel", {}),
            ("resume", {}),
            ("fork", {"seq": 5}),
            ("send", {"event": "workflow:HumanResponseEvent"}),
        ]:
            code, answer = post(f"{base}/runs/rep/{action}", body)
            assert code == 403
            assert "read-only: start `workflow serve` with --allow-actions" in answer["message"]
    assert digest(db) == before


def test_bad_input_is_named(store: tuple[Path, str]) -> None:
    """An unknown run is a 404 page naming it; a bad seq or filter is a 400 saying why."""
    db, _ = store
    with serving(db) as base:
        for url in ("/runs/nope", "/runs/nope/data", "/runs/nope/state", "/runs/nope/events"):
            code, _, body = get(base + url)
            assert code == 404, url
            assert "no run &#x27;nope&#x27; in" in body or "no run 'nope' in" in body
        code, ctype, body = get(base + "/runs/nope")
        assert ctype.startswith("text/html")
        assert '<p class="error" id="message">no run &#x27;nope&#x27; in' in body
        code, _, body = get(base + "/runs/rep?seq=abc")
        assert code == 400
        assert "seq must be a whole number, not &#x27;abc&#x27;" in body
        code, _, body = get(base + "/runs/rep?seq=99999")
        assert code == 400
        assert "past the end of the log" in body
        code, _, body = get(base + "/runs/rep/state?seq=0")
        assert code == 400
        assert "seq 0" in json.loads(body)["message"]
        code, _, body = get(base + "/?status=done")
        assert code == 400
        assert "unknown status done" in body
        code, _, body = get(base + "/?since=soon")
        assert code == 400
        assert "&#x27;soon&#x27; is neither a duration ago" in body


def read_event(stream: object) -> tuple[str, dict[str, object]]:
    """The next named event of a server-sent event stream."""
    name = ""
    for raw in stream:  # type: ignore[attr-defined]
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name:
            return name, json.loads(line[6:])
    raise AssertionError("the stream ended")


def test_live_stream_follows_the_run(tmp_path: Path) -> None:
    """The run's stream sends a commit event when its log grows and its status changes, and
    the store's stream one when anything is written."""
    db = tmp_path / "live.db"
    waiting_asker(db, "ask")
    with serving(db) as base:
        _, _, data = get(base + "/runs/ask/data")
        last = json.loads(data)["commits"]["seq"][-1]
        with (
            urllib.request.urlopen(f"{base}/runs/ask/events?after={last}", timeout=60) as run,
            urllib.request.urlopen(f"{base}/events?head={last}", timeout=60) as store,
        ):

            async def answer() -> None:
                wf = Asker(store=db, timeout=None)
                wf.send("ask", HumanResponseEvent(response="Ada"))
                assert await wf.resume("ask") == "hello Ada"
                wf.store.close()

            asyncio.run(answer())
            seen = [read_event(run)]
            while seen[-1][1]["status"] != "finished":
                seen.append(read_event(run))
            assert {name for name, _ in seen} == {"commit"}
            seqs = [int(str(got["last_seq"])) for _, got in seen]
            assert seqs == sorted(seqs)
            assert seqs[-1] > last
            name, head = read_event(store)
            assert name == "head"
            assert int(str(head["head"])) > last
        # A page whose data is behind gets its first event at once.
        with urllib.request.urlopen(f"{base}/runs/ask/events?after=1", timeout=60) as run:
            name, got = read_event(run)
            assert got["status"] == "finished"


def test_actions_need_a_workflow() -> None:
    """--allow-actions without --workflow, or --execute without --allow-actions, is refused."""
    result = invoke("serve", "x.db", "--allow-actions")
    assert result.exit_code == 2
    assert "--allow-actions needs --workflow MODULE:CLASS" in result.stderr
    result = invoke("serve", "x.db", "--execute")
    assert result.exit_code == 2
    assert "--execute needs --allow-actions" in result.stderr
    result = invoke("serve", "missing.db")
    assert result.exit_code == 1
    assert "missing.db: no such file" in result.stderr


def test_actions_for_workers(tmp_path: Path) -> None:
    """Without --execute a fork is recorded for a worker, which runs it; a cancelled run says
    it needs an executor to resume; bad input is refused and names the problem."""
    db = tmp_path / "w.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")
    with serving(db, "--allow-actions", "--workflow", "tests.flows:ReportFlow") as base:
        _, _, page = get(base + "/runs/rep")
        assert 'id="actions"' in page
        assert "left for workers" in page
        assert "left for workers" in get(base + "/")[2]
        wf = ReportFlow(store=db, timeout=None)
        at = next(c.seq for c in wf.checkpoints("rep") if c.step == "finish")
        code, answer = post(base + "/runs/rep/fork", {"seq": at})
        assert code == 200, answer
        new = answer["run_id"]
        assert answer["href"] == f"/runs/{new}"
        # Recorded for a worker and not yet taken: submitted, not interrupted (nothing died).
        assert status_of(base, new) == "submitted"
        assert json.loads(get(f"{base}/runs/{new}/data")[2])["run"]["status"] == "submitted"
        assert f'data-run="{new}" data-status="submitted"' in get(base + "/")[2]
        assert f'data-run="{new}"' in get(base + "/runs-table?status=submitted")[2]
        assert 'data-run="rep"' not in get(base + "/runs-table?status=submitted")[2]
        code, answer = post(f"{base}/runs/{new}/resume", {})
        assert code == 200, answer
        assert "a worker of its workflow claims it" in answer["message"]
        code, answer = post(base + "/runs/rep/fork", {"seq": at, "updates": '{"var": 1}'})
        assert code == 409
        assert "needs an executor: start the server with --execute" in answer["message"]
        code, answer = post(base + "/runs/rep/resume", {})
        assert code == 409
        assert "has failed: this server executes nothing" in answer["message"]

        async def work() -> None:
            w = Worker(wf, poll_interval=0.05)
            task = asyncio.create_task(w.run())
            ended = lambda: status_of(base, new) in ("failed", "finished")  # noqa: E731
            await asyncio.to_thread(wait_for, ended, "the worker to run the fork")
            w.stop()
            await task

        asyncio.run(work())
        assert status_of(base, new) == "failed"  # the worker ran it: var is still unset
        state = json.loads(get(f"{base}/runs/{new}/state")[2])
        assert state["parent"] == ["rep", at]
        assert state["error"]["message"] == "var is not set"
        wf.store.close()
        for body, message in [
            ({"seq": "x"}, "seq must be a whole number, not 'x'"),
            ({"seq": 99999}, "past the end of the log"),
            ({"seq": at, "updates": "{nope"}, "updates is not JSON"),
            ({"seq": at, "updates": "[1]"}, "updates must be a JSON object, not list"),
        ]:
            code, answer = post(base + "/runs/rep/fork", body)
            assert code == 400, body
            assert message in answer["message"]
        code, answer = post(base + "/runs/rep/fork", b"{", "application/json")
        assert code == 400
        assert "the body is not JSON" in answer["message"]
        code, answer = post(base + "/runs/rep/cancel", {}, "text/plain")
        assert code == 415
        code, answer = post(base + "/runs/nope/cancel", {})
        assert code == 404
        assert "no run 'nope'" in answer["message"]
        code, answer = post(base + "/runs/rep/explode", {})
        assert code == 404
        assert "no action 'explode'" in answer["message"]
        code, answer = post(base + "/runs/rep/cancel", {})
        assert code == 409
        assert "has already failed" in answer["message"]


def test_actions_executed_by_the_server(tmp_path: Path) -> None:
    """With --execute: send an answer to a waiting run and resume it; fork with updates; cancel
    a waiting run; each ends as its log says."""
    db = tmp_path / "x.db"
    waiting_asker(db, "ask")
    waiting_asker(db, "other")
    args = ("--allow-actions", "--workflow", "tests.flows:Asker", "--execute")
    with serving(db, *args) as base:
        code, answer = post(
            base + "/runs/ask/send",
            {"event": "workflow:HumanResponseEvent", "data": '{"response": "Ada"}'},
        )
        assert code == 200, answer
        assert "sent" in answer["message"]
        code, answer = post(base + "/runs/ask/resume", {})
        assert code == 200, answer
        wait_for(lambda: status_of(base, "ask") == "finished", "the resumed run to finish")
        result = json.loads(get(base + "/runs/ask/state")[2])["result"]
        assert result["v"] == {"result": "hello Ada"}
        # A fork where the run waited, with an update: the server runs it, and it waits too.
        wf = Asker(store=db, timeout=None)
        at = wf.checkpoints("other")[-1].seq
        wf.store.close()
        code, answer = post(base + "/runs/other/fork", {"seq": at, "updates": {"note": "hi"}})
        assert code == 200, answer
        new = answer["run_id"]
        wait_for(lambda: status_of(base, new) == "waiting", "the fork to wait")
        assert json.loads(get(f"{base}/runs/{new}/state")[2])["context"]["note"] == "hi"
        for run_id in (new, "other"):
            code, answer = post(f"{base}/runs/{run_id}/cancel", {})
            assert code == 200, answer
            wait_for(lambda r=run_id: status_of(base, r) == "cancelled", "the cancel")
        for run_id in (new, "other"):  # its own run through the handler, the other directly
            (rec,) = json.loads(ok("history", db, run_id, "--json", "--kind", "run_cancelled"))
            assert rec["payload"]["via"] == "ui", rec
        code, answer = post(base + "/runs/ask/send", {"event": "workflow:HumanResponseEvent"})
        assert code == 409
        assert "has finished; nothing would take the event in" in answer["message"]
        waiting_asker(db, "third")
        for body, message in [
            ({"event": "tests.flows:Nope"}, "has no attribute 'Nope'"),
            ({"event": "tests.flows:Asker"}, "is not an Event subclass"),
            ({"event": ""}, "name its class as module:Class"),
            ({"event": "workflow:HumanResponseEvent", "data": "3"}, "must be a JSON object"),
        ]:
            code, answer = post(base + "/runs/third/send", body)
            assert code == 400, body
            assert message in answer["message"]
        code, answer = post(base + "/runs/ask/resume", {})
        assert code == 409
        assert "has finished; fork it" in answer["message"]


@pytest.mark.postgres
def test_serves_a_postgresql_store() -> None:
    """A PostgreSQL URL is served as a file is: the run list and a run's page."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = f"{POSTGRES_URL}?schema={schema}"
    try:
        run_to_end(ReportFlow(store=url, timeout=None), run_id="rep")
        with serving(url) as base:
            code, _, page = get(base + "/")
            assert code == 200
            assert 'data-run="rep"' in page
            code, _, data = get(base + "/runs/rep/data")
            assert code == 200
            assert json.loads(data)["run"]["status"] == "failed"
            assert status_of(base, "rep") == "failed"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_sigterm_ends_open_streams(tmp_path: Path) -> None:
    """SIGTERM stops the server cleanly while browsers hold live streams open: each stream
    ends (the client reads its end) and the server exits without cancelling them."""
    db = tmp_path / "term.db"
    waiting_asker(db, "ask")
    with server(db) as (proc, base):
        with (
            urllib.request.urlopen(f"{base}/runs/ask/events?after=1", timeout=60) as run,
            urllib.request.urlopen(f"{base}/events?head=0", timeout=60) as store,
        ):
            assert read_event(run)[0] == "commit"
            assert read_event(store)[0] == "head"
            proc.send_signal(signal.SIGTERM)
            assert run.read().strip() == b""  # read to the end: the server closed it
            assert store.read().strip() == b""
        # uvicorn raises the signal again once it has shut down: the exit says SIGTERM.
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert proc.stderr is not None
        rest = proc.stderr.read()
        assert "graceful shutdown exceeded" not in rest, rest


def held_query(d: dict[str, Any]) -> str:
    """What a live page holding ``d`` says it holds (as the page's script does)."""

    def first_open(xs: list[list[Any]], end: int) -> int:
        return next((i for i, a in enumerate(xs) if a[end] < 0), len(xs))

    ids = [int(k) for k in d["events"]]
    seqs = d["rec"]["seq"]
    held = {
        "nrec": len(seqs),
        "ncommits": len(d["commits"]["seq"]),
        "attempts_from": first_open(d["attempts"], 4),
        "waits_from": first_open(d["waits"], 3),
        "ntb": len(d["tb"]),
        "next_event": max(ids) + 1 if ids else 0,
        "seq": seqs[-1] if seqs else 0,
    }
    return "&".join(f"{k}={v}" for k, v in held.items())


def merged(d: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """A page's data with a patch applied (as the page's script applies it)."""
    out: dict[str, Any] = json.loads(json.dumps(d))
    for k, v in p["rec"].items():
        out["rec"][k] += v
    for k, v in p["commits"].items():
        out["commits"][k] += v
    out["attempts"] = out["attempts"][: p["attempts_from"]] + p["attempts"]
    for i, row in enumerate(p["rows"]):
        out["attempts"][i][7] = row
    out["waits"] = out["waits"][: p["waits_from"]] + p["waits"]
    for i, row in enumerate(p["wait_rows"]):
        out["waits"][i][5] = row
    out["tb"] = out["tb"][: p["tb_from"]] + p["tb"]
    out["events"].update(p["events"])
    for k in ("run", "steps", "kinds", "lanes", "lane_workers", "window"):
        if k in p:
            out[k] = p[k]
    return out


def test_live_refresh_fetches_only_what_is_new(tmp_path: Path) -> None:
    """A page that says what it holds gets only the records after it (and the attempts from
    the first open one), and that patch applied to its data is the run's whole data now;
    a page whose data does not fit gets the whole data; bad counts are refused."""
    db = tmp_path / "patch.db"
    waiting_asker(db, "ask")
    with serving(db) as base:
        before = json.loads(get(base + "/runs/ask/data")[2])
        code, _, body = get(f"{base}/runs/ask/data?{held_query(before)}")
        assert code == 200
        nothing = json.loads(body)
        assert nothing["patch"] is True
        assert nothing["rec"]["seq"] == []

        async def answer() -> None:
            wf = Asker(store=db, timeout=None)
            wf.send("ask", HumanResponseEvent(response="Ada"))
            assert await wf.resume("ask") == "hello Ada"
            wf.store.close()

        asyncio.run(answer())
        now = json.loads(get(base + "/runs/ask/data")[2])
        code, _, body = get(f"{base}/runs/ask/data?{held_query(before)}")
        patch = json.loads(body)
        assert patch["patch"] is True
        assert patch["rec"]["seq"] == now["rec"]["seq"][len(before["rec"]["seq"]) :]
        assert patch["rec"]["seq"]
        assert patch["rec"]["seq"][0] > before["rec"]["seq"][-1]
        assert len(body) < len(json.dumps(now))
        assert merged(before, patch) == now
        stale = held_query(before).replace("seq=", "seq=9")
        assert json.loads(get(f"{base}/runs/ask/data?{stale}")[2])["patch"] is False
        code, _, body = get(f"{base}/runs/ask/data?nrec=x")
        assert code == 400
        assert "nrec must be a whole number, not 'x'" in body
