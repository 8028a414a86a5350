"""The timeline page's embedded data: enough to rebuild every state, compact, self-contained."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eventstore import EventStore
from tests.flows import Asker, DiesOnce, ReportFlow
from workflow import Context, Event, HumanResponseEvent, StartEvent, StopEvent, Workflow, step
from workflow._fold import fold
from workflow._read import commits, run_info, start_state
from workflow.cli import cli
from workflow.cli._inspect import Viewer
from workflow.cli._timeline import TEXT, render_page, timeline_data

ROOT = Path(__file__).resolve().parent.parent


class Job(Event):
    n: int


class Done(Event):
    n: int


class Fan(Workflow):
    """Three jobs run in parallel workers, then a collect step gathers their results."""

    @step
    async def start(self, ctx: Context[Any], ev: StartEvent) -> Job | None:
        for n in range(3):
            ctx.send_event(Job(n=n))
        return None

    @step(num_workers=3)
    async def work(self, ctx: Context[Any], ev: Job) -> Done:
        await asyncio.sleep(0.05)
        await ctx.store.set(f"w{ev.n}", ev.n * 10)
        return Done(n=ev.n)

    @step
    async def gather(self, ctx: Context[Any], ev: Done) -> StopEvent | None:
        got = ctx.collect_events(ev, [Done, Done, Done])
        if got is None:
            return None
        return StopEvent(result=sorted(e.n for e in got if isinstance(e, Done)))


class Ticker(Workflow):
    """Loops a step ``ev.count`` times, appending to a list in context each time."""

    @step
    async def tick(self, ctx: Context[Any], ev: StartEvent | Job) -> Job | StopEvent:
        if isinstance(ev, Job):
            n = ev.n
        else:
            n = 0
            await ctx.store.set("count", int(ev["count"]))
        seen = await ctx.store.get("seen", default=[])
        seen.append(n)
        await ctx.store.set("seen", seen)
        await ctx.store.set("last", {"n": n, "note": "</script><b>x</b>"})
        if n + 1 >= await ctx.store.get("count"):
            return StopEvent(result=n)
        return Job(n=n + 1)


def settle(coro: Any) -> None:
    """Runs a coroutine; a run that fails is part of the story here."""

    async def go() -> None:
        with contextlib.suppress(Exception):
            await coro()

    asyncio.run(go())


def report_resumed_and_forked(db: Path) -> tuple[str, str]:
    """ReportFlow failed, resumed with the key it needs, and forked before its failure."""

    async def go() -> tuple[str, str]:
        wf = ReportFlow(store=db, timeout=None)
        with contextlib.suppress(ValueError):
            await wf.run(run_id="rep")
        await wf.resume("rep", updates={"var": "ok"})
        fork = wf.run_from(("rep", 11), updates={"var": "fork"})
        await fork
        wf.store.close()
        return "rep", fork.run_id

    return asyncio.run(go())


# ---------------------------------------------------------------------------- the reference


def fold_digests(store: EventStore, run_id: str) -> list[list[Any]]:
    """The state after each commit of a run, by the Python fold, in the page's digest form."""
    state = start_state(store, run_info(store, run_id))
    out = []
    view = Viewer()
    for commit in commits(store.records(run_id)):
        fold(state, commit)
        out.append(
            [
                state.seq,
                state.status,
                {k: list(q) for k, q in state.queues.items() if q},
                {
                    k: [[p.ev.id, p.attempt, p.failures] for p in ps.values()]
                    for k, ps in state.in_progress.items()
                    if ps
                },
                {k: view.show(v.dump, TEXT) for k, v in state.context.items()},
                sorted(state.waiters),
                list(state.unclaimed),
            ]
        )
    return out


def replay(data: dict[str, Any]) -> list[list[Any]]:
    """The page's fold, in Python: the state after each commit from the embedded data only."""
    kinds, steps, rec, base = data["kinds"], data["steps"], data["rec"], data["base"]
    status = base["status"]
    q = {k: list(v) for k, v in base["q"].items()}
    prog = {k: {e[0]: [e[1], e[2]] for e in v} for k, v in base["p"].items()}
    ctx = dict(base["ctx"])
    waiters = {w[0] for w in base["w"]}
    unclaimed = list(base["u"])
    firsts = [*data["commits"]["first"], len(rec["seq"])]
    out = []
    for ci, seq in enumerate(data["commits"]["seq"]):
        for i in range(firsts[ci], firsts[ci + 1]):
            k, a = kinds[rec["k"][i]], rec["a"][i]
            s = steps[rec["s"][i]] if rec["s"][i] >= 0 else None
            if k == "run_started":
                status = "running"
            elif k == "enqueued":
                if s is None:
                    unclaimed.append(a[0])
                else:
                    q.setdefault(s, []).append(a[0])
            elif k == "dequeued":
                q[s].remove(a[0])
                prog.setdefault(s, {})[a[0]] = [0, 0]
            elif k == "step_started":
                prog[s][a[0]][0] = a[1]
            elif k == "step_failed":
                prog[s][a[0]][1] += 1
            elif k in ("step_finished", "waiting"):
                del prog[s][a[0]]
                if k == "waiting":
                    waiters.add(a[1])
            elif k == "wait_resolved":
                waiters.discard(a[0])
                if a[1] in unclaimed:
                    unclaimed.remove(a[1])
            elif k in ("state_set", "state_deleted"):
                if a[1] is None:
                    ctx.pop(a[0], None)
                else:
                    ctx[a[0]] = a[1]
            elif k == "run_finished":
                status = "finished"
                prog.clear()
            elif k.startswith("run_"):
                status = {
                    "run_failed": "failed",
                    "run_cancelled": "cancelled",
                    "run_timed_out": "timed_out",
                    "run_resumed": "running",
                    "run_suspended": "waiting",
                }[k]
        out.append(
            [
                seq,
                status,
                {k: list(v) for k, v in q.items() if v},
                {k: [[i, *e] for i, e in v.items()] for k, v in prog.items() if v},
                dict(ctx),
                sorted(waiters),
                list(unclaimed),
            ]
        )
    return out


def asker_answered(db: Path) -> str:
    """Asker suspended while waiting, then answered and resumed: returns the run id."""

    async def go() -> None:
        wf = Asker(store=db, timeout=None)
        handler = wf.run(run_id="ask")
        await handler.wait_until_waiting(10)
        await handler.suspend()
        wf.send("ask", HumanResponseEvent(response="Ada"))
        await wf.resume("ask")
        wf.store.close()

    asyncio.run(go())
    return "ask"


def fan(db: Path) -> str:
    """Fan run to its end: returns the run id."""

    async def go() -> None:
        wf = Fan(store=db, timeout=None)
        await wf.run(run_id="fan")
        wf.store.close()

    asyncio.run(go())
    return "fan"


def crashed_then_resumed(db: Path) -> str:
    """DiesOnce killed mid-step in a subprocess, then resumed here: returns the run id."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.flows", "dies_once", str(db), "run", "crash"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 9, proc.stderr

    async def go() -> None:
        wf = DiesOnce(store=db, timeout=None)
        await wf.resume("crash")
        wf.store.close()

    asyncio.run(go())
    return "crash"


def always_dies(db: Path) -> str:
    """AlwaysDies run and resumed twice in subprocesses, dying each time: returns the run id."""
    for mode in (["run", "dies"], ["resume", "dies"], ["resume", "dies"]):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.flows", "always_dies", str(db), *mode],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 9, proc.stdout + proc.stderr
    return "dies"


STORIES = {
    "report": lambda db: report_resumed_and_forked(db)[0],
    "fork": lambda db: report_resumed_and_forked(db)[1],
    "asker": asker_answered,
    "fan": fan,
    "crash": crashed_then_resumed,
    "always-dies": always_dies,
}


@pytest.mark.parametrize("story", list(STORIES))
def test_embedded_data_rebuilds_every_state(story: str, tmp_path: Path) -> None:
    """Replaying the page's data gives the Python fold's state after every commit."""
    db = tmp_path / "t.db"
    run_id = STORIES[story](db)
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, run_id)
        expected = fold_digests(store, run_id)
    assert replay(data) == expected
    assert len(data["commits"]["seq"]) == len(expected)
    n = len(data["rec"]["seq"])
    assert all(len(col) == n for col in data["rec"].values())


def test_attempt_bars_of_a_failed_then_resumed_run(tmp_path: Path) -> None:
    """Each attempt is a bar from its start to its outcome; failures and retries are marked."""
    db = tmp_path / "t.db"
    report_resumed_and_forked(db)
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "rep")
    steps = data["steps"]
    seqs = data["commits"]["seq"]
    bars = [(steps[a[0]], a[1], a[2], seqs[a[3]], seqs[a[4]], a[5], a[6]) for a in data["attempts"]]
    assert bars[:3] == [
        ("start", 1, 1, 4, 6, "ok", "emitted #2"),
        ("process", 2, 1, 8, 10, "ok", "emitted #3"),
        ("finish", 3, 1, 12, 13, "failed", "ValueError: var is not set"),
    ]
    assert bars[3][:3] == ("finish", 3, 2)
    assert bars[3][5:] == ("ok", "emitted #4")
    assert data["run"]["status"] == "finished"
    assert data["run"]["parent"] is None
    [(child, at_seq, at_commit)] = data["run"]["forks"]
    assert at_seq == 11
    assert seqs[at_commit] == 11
    with EventStore(db, readonly=True) as store:
        forked = timeline_data(store, child)
    assert forked["run"]["parent"] == ["rep", 11]
    # The fork begins with the parent's in-progress finish, which it runs again.
    assert forked["base"]["p"] == {"finish": [[3, 0, 0]]}
    assert forked["events"]["3"] == [
        "tests.flows:EventB",
        "tests.flows:EventB(content='second: first')",
    ]


def test_waits_parallel_rows_and_lost_attempts(tmp_path: Path) -> None:
    """Waits are bars of their own; parallel attempts get rows; a dead process's attempt is lost."""
    asker_answered(db := tmp_path / "a.db")
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "ask")
    [wait] = data["waits"]
    assert wait[4] == "HumanResponseEvent"
    assert wait[3] > wait[2]  # resolved
    assert [a[5] for a in data["attempts"]] == ["wait", "ok"]

    fan(db2 := tmp_path / "f.db")
    with EventStore(db2, readonly=True) as store:
        data = timeline_data(store, "fan")
    work = data["steps"].index("work")
    assert data["lanes"][work] == 3
    assert sorted(a[7] for a in data["attempts"] if a[0] == work) == [0, 1, 2]
    always_dies(db3 := tmp_path / "c.db")
    with EventStore(db3, readonly=True) as store:
        data = timeline_data(store, "dies")
    outcomes = [(a[2], a[5], a[4]) for a in data["attempts"]]
    # The attempt a resume finds still open died with its process; the last one is open.
    assert outcomes[-2][1] == "lost"
    assert outcomes[-1][1:] == ("open", -1)
    assert outcomes[-1][0] == outcomes[-2][0] + 1


def test_page_is_self_contained_and_escapes_its_data(tmp_path: Path) -> None:
    """The page loads nothing from the network, and data can never close its script element."""
    db = tmp_path / "t.db"
    settle(lambda: Ticker(store=db, timeout=None).run(run_id="tick", count=5))
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "tick")
    page = render_page(data)
    assert "</script><b>" not in page
    assert page.count("</script>") == 2  # the data's and the code's
    for needle in ("http:", "https:", "src=", "@import", "url(http"):
        assert needle not in page
    start = page.index('<script type="application/json" id="data">') + 42
    embedded = json.loads(page[start : page.index("</script>", start)])
    assert embedded == json.loads(json.dumps(data))
    texts = [a[1] for a in embedded["rec"]["a"] if a and a[0] == "last"]
    assert texts[-1] == "{'n': 4, 'note': '</script><b>x</b>'}"


def test_page_stays_small_for_long_runs(tmp_path: Path) -> None:
    """A run of 1,500 commits embeds a few hundred bytes per commit, never whole states."""
    db = tmp_path / "t.db"
    settle(lambda: Ticker(store=db, timeout=None).run(run_id="tick", count=500))
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "tick")
    n = len(data["commits"]["seq"])
    assert n >= 1500
    page = render_page(data)
    assert len(page) / n < 600
    # The growing list is embedded as a short text each time it changes, not in full.
    assert max(len(a[1]) for a in data["rec"]["a"] if len(a) == 2 and isinstance(a[1], str)) <= TEXT


def test_timeline_command_writes_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """timeline writes RUN.html by default (what fork links expect), or -o PATH, or --json."""
    db = tmp_path / "t.db"
    report_resumed_and_forked(db)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["timeline", str(db), "rep"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("wrote rep.html (")
    assert (tmp_path / "rep.html").read_text().startswith("<!doctype html>")
    result = runner.invoke(cli, ["timeline", str(db), "rep", "-o", str(tmp_path / "x.html")])
    assert result.exit_code == 0
    assert (tmp_path / "x.html").exists()
    result = runner.invoke(cli, ["timeline", str(db), "rep", "--json"])
    assert json.loads(result.stdout)["run"]["id"] == "rep"
    typed = runner.invoke(
        cli, ["timeline", str(db), "rep", "--json", "--workflow", "tests.flows:ReportFlow"]
    )
    assert json.loads(typed.stdout)["events"]["3"][1] == "EventB(content='second: first')"


def test_a_long_run_is_shown_a_window_at_a_time(tmp_path: Path) -> None:
    """A run longer than the window is embedded a window at a time, each on the state just
    before it: the page's fold over any window gives the Python fold's states at its
    commits, the windows tile the run, and attempts begun before a window are drawn in it."""
    db = tmp_path / "t.db"
    settle(lambda: Ticker(store=db, timeout=None).run(run_id="tick", count=120))
    with EventStore(db, readonly=True) as store:
        expected = fold_digests(store, "tick")
        n = len(expected)
        whole = timeline_data(store, "tick")
        assert (whole["window"]["more_before"], whole["window"]["more_after"]) == (False, False)
        assert replay(whole) == expected
        last = timeline_data(store, "tick", limit=100)
        assert (last["window"]["more_before"], last["window"]["more_after"]) == (True, False)
        assert replay(last) == expected[-100:]
        seen: list[int] = []
        after = 0
        while True:
            d = timeline_data(store, "tick", after=after, limit=100)
            assert replay(d) == expected[len(seen) : len(seen) + len(d["commits"]["seq"])]
            finished = [i for i, k in enumerate(d["rec"]["k"]) if d["kinds"][k] == "step_finished"]
            assert sum(a[5] == "ok" for a in d["attempts"]) == len(finished)
            seen += d["commits"]["seq"]
            if not d["window"]["more_after"]:
                break
            after = d["commits"]["seq"][-1]
        assert seen == [e[0] for e in expected]
        before = timeline_data(store, "tick", before=last["window"]["after"], limit=100)
        assert before["commits"]["seq"][-1] == last["window"]["after"]
        assert replay(before) == expected[-200:-100]
        mid = expected[n // 2][0]
        around = timeline_data(store, "tick", around=mid, limit=100)
        assert around["commits"]["seq"].index(mid) in range(45, 55)
        near_end = timeline_data(store, "tick", around=expected[-3][0], limit=100)
        assert near_end["window"] == last["window"]  # in the last window: that one
    result = CliRunner().invoke(
        cli, ["timeline", str(db), "tick", "--window", "100", "--at", str(mid), "--json"]
    )
    assert json.loads(result.stdout)["window"] == around["window"]
    result = CliRunner().invoke(
        cli, ["timeline", str(db), "tick", "--window", "100", "-o", str(tmp_path / "w.html")]
    )
    assert result.exit_code == 0, result.stderr
    assert "of the run's" in result.stdout
    assert "--at SEQ writes another window" in result.stdout
