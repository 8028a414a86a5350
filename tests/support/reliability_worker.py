"""The subprocess side of the reliability tests:
``python -m tests.support.reliability_worker MODE ...``.

Modes (each prints one line per fact the test checks, flushed at once, so that what a
killed process printed is still readable). DB is an SQLite file or a PostgreSQL URL; on
PostgreSQL every workflow leases its runs for ``$DW_TEST_LEASE_TTL`` seconds (a killed
worker's runs are free again that soon), and a run whose lease a killed worker still holds
is started once the lease lapsed:

``counter DB ITEMS RUN_ID...``
    Runs (or, for ids that exist, resumes: ``run(run_id=...)`` does that) one
    :class:`Counter` run per id, all at once. Prints ``START`` once the handlers exist,
    ``ACK RUN_ID SEQ`` after each commit that changed state is durable (the executor's
    commit hook), ``RESULT RUN_ID JSON`` per run and ``ERROR RUN_ID TYPE: MESSAGE`` for a
    run that raised.
``slow DB RUN_ID``
    Starts :class:`Slow`, whose one step sleeps; prints ``START`` and the result.
``race DB RUN_ID GO``
    Prints ``READY``, waits for the file GO, then resumes RUN_ID: prints ``RESULT ...`` if
    it ran the run, ``OWNED ...`` if another executor had it.
``diskfull DB PAGES RUN_ID FLOW WAIT``
    Runs FLOW (``bulky``: :class:`Bulky` with 40 inputs, or ``blob``: :class:`Blob`) with
    every writing connection of this process under ``PRAGMA max_page_count = PAGES``: the
    database is "full" once it has that many pages (PAGES 0: no limit). Prints ``START``,
    ``ACK`` lines, then ``RESULT``, ``ERROR``, or ``HUNG`` if the handler did not complete
    within WAIT seconds.
``poll DB RUN_ID SECONDS``
    Prints ``POLLING``, then reads the latest state of the :class:`Flaky` run RUN_ID in a
    loop for SECONDS, as a dashboard would; prints ``POLLED N``.
``create-race DIR ROUNDS PROCS``
    ROUNDS times, forks PROCS children that open one new store file at the same instant;
    prints ``CREATED OK`` or ``CREATED ERROR TYPE: MESSAGE`` per child.
``bigfold DB RUN_ID MODULE:CLASS``
    With the workflow class MODULE:CLASS, reads the latest state of a large run and
    iterates its records; prints ``MEM`` with a JSON object: peak RSS before and after
    (KiB), records seen, seconds taken, the state's seq and its queued and running work.
``probe DB``
    Opens DB and reads everything (runs, records, each run's state and checkpoints);
    prints ``OK ...`` or ``ERROR TYPE: MESSAGE`` (``RAW`` instead of ``ERROR`` for an
    exception that is not an :class:`eventstore.EventStoreError` or ``WorkflowError``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import eventstore._sqlite as _sqlite
from eventstore import EventStore, EventStoreError
from workflow import Context, Event, RunOwnedError, StartEvent, StopEvent, Workflow, step
from workflow._errors import WorkflowError

WORK_SLEEP_S = 0.01
SLOW_STEP_S = 1.0
BLOB_BYTES = 8_000


def say(line: str) -> None:
    """Prints one whole line and flushes it (a SIGKILL never leaves half a fact)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def effects_file(db: str | Path) -> Path:
    """Where the side effects of runs on store ``db`` go: ``DB.effects`` beside an SQLite
    file; for a PostgreSQL URL, ``SCHEMA.effects`` in the temporary folder (the tests give
    each store a schema of its own)."""
    text = str(db)
    if not text.startswith("postgresql://"):
        return Path(text + ".effects")
    schema = parse_qs(urlsplit(text).query).get("schema", ["public"])[0]
    return Path(tempfile.gettempdir()) / f"{schema}.effects"


def side_effect(wf: Workflow, line: str) -> None:
    """An external side effect of a step: a line appended to the effects file (one write)."""
    where = os.environ.get("DW_TEST_STORE") or wf.store.path
    if where is None:
        return  # an in-memory store: nowhere beside it to write
    with effects_file(where).open("a") as fh:
        fh.write(line + "\n")


def read_effects(db: str | Path) -> list[str]:
    """The lines :func:`side_effect` wrote for store ``db``."""
    path = effects_file(db)
    return path.read_text().splitlines() if path.exists() else []


def lease_ttl() -> float | None:
    """The lease the tests ask for (``$DW_TEST_LEASE_TTL`` seconds), or the default."""
    ttl = os.environ.get("DW_TEST_LEASE_TTL")
    return float(ttl) if ttl else None


def flow(cls: type[Workflow], db: str, **kwargs: Any) -> Workflow:
    """A workflow of ``cls`` on store ``db``, with the lease the tests ask for."""
    os.environ["DW_TEST_STORE"] = db  # where side_effect writes, for a PostgreSQL store
    return cls(store=db, lease_ttl=lease_ttl(), **kwargs)


class Item(Event):
    i: int


class Done(Event):
    i: int
    square: int


class Counter(Workflow):
    """Fans out ``items`` inputs; each bumps its own counter and appends to a shared list.

    Context effects must happen exactly once per input whatever kills the process: key
    ``count-<i>`` ends at 1 and ``seen`` holds each input once (it is read and written by
    four workers at once, so conflicts re-run attempts too).
    """

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        n = int(ev.get("items"))
        await ctx.store.set("n", n)
        for i in range(n):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def work(self, ctx: Context, ev: Item) -> Done:
        side_effect(self, f"work {ctx.run_id} {ev.i}")
        await asyncio.sleep(WORK_SLEEP_S)
        count = await ctx.store.get(f"count-{ev.i}", default=0)
        await ctx.store.set(f"count-{ev.i}", count + 1)
        seen = await ctx.store.get("seen", default=[])
        seen.append(ev.i)
        await ctx.store.set("seen", seen)
        return Done(i=ev.i, square=ev.i * ev.i)

    @step
    async def join(self, ctx: Context, ev: Done) -> StopEvent | None:
        n = await ctx.store.get("n")
        got = ctx.collect_events(ev, [Done] * n)
        if got is None:
            return None
        return StopEvent(result={"n": n, "sum": sum(d.square for d in got if isinstance(d, Done))})


class Bulky(Workflow):
    """Like :class:`Counter`, but each input stores a blob under its own key: the file grows."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Item | None:
        n = int(ev.get("items"))
        await ctx.store.set("n", n)
        for i in range(n):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=2)
    async def work(self, ctx: Context, ev: Item) -> Done:
        await ctx.store.set(f"blob-{ev.i}", f"{ev.i:08d}" * (BLOB_BYTES // 8))
        return Done(i=ev.i, square=ev.i * ev.i)

    @step
    async def join(self, ctx: Context, ev: Done) -> StopEvent | None:
        n = await ctx.store.get("n")
        got = ctx.collect_events(ev, [Done] * n)
        if got is None:
            return None
        return StopEvent(result={"n": n, "sum": sum(d.square for d in got if isinstance(d, Done))})


class Blob(Workflow):
    """One step that waits (its start records are flushed alone), then stores a big blob.

    Under a page limit smaller than the blob, its outcome commit is the only one that fails.
    """

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await asyncio.sleep(0.2)
        await ctx.store.set("blob", "x" * 400_000)
        return StopEvent(result={"n": 1, "sum": 0})


class Slow(Workflow):
    """One step that takes a while, so that two executors surely overlap."""

    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        side_effect(self, f"slow {os.getpid()}")
        await asyncio.sleep(SLOW_STEP_S)
        return StopEvent(result="slow done")


class Flaky(Workflow):
    """One step that always fails: each resume re-runs it, fails and releases the run."""

    @step
    async def start(self, ev: StartEvent) -> StopEvent:
        msg = "flaky by design"
        raise RuntimeError(msg)


# ---------------------------------------------------------------------------- modes


async def _start(wf: Workflow, run_id: str, items: int) -> Any:
    """Runs or resumes the run; while a killed worker's lease holds it (PostgreSQL), waits
    for the lease to lapse (at most twice its length) and tries again."""
    ttl = lease_ttl()
    deadline = time.monotonic() + 2 * (ttl or 0)
    while True:
        try:
            return wf.run(run_id=run_id, items=items)
        except RunOwnedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep((ttl or 0) / 20)


async def _runs(wf: Workflow, items: int, run_ids: list[str]) -> int:
    """Runs or resumes each run and reports; the exit status is 1 if any run raised."""
    handlers = [await _start(wf, rid, items) for rid in run_ids]
    say("START")
    results = await asyncio.gather(*handlers, return_exceptions=True)
    status = 0
    for rid, res in zip(run_ids, results, strict=True):
        if isinstance(res, BaseException):
            say(f"ERROR {rid} {type(res).__name__}: {res}")
            status = 1
        else:
            say(f"RESULT {rid} {json.dumps(res, sort_keys=True)}")
    return status


def _ack(x: Any, seq: int) -> None:
    say(f"ACK {x.run_id} {seq}")


async def counter(db: str, items: str, *run_ids: str) -> int:
    wf = flow(Counter, db, timeout=None, max_recovery_attempts=1_000_000)
    wf.__workflow_parts__.commit_hook = _ack
    return await _runs(wf, int(items), list(run_ids))


async def slow(db: str, run_id: str) -> int:
    wf = flow(Slow, db, timeout=None)
    handler = wf.run(run_id=run_id)
    say("START")
    say(f"RESULT {run_id} {json.dumps(await handler)}")
    return 0


def race(db: str, run_id: str, go: str) -> int:
    wf = flow(Slow, db, timeout=None)
    say("READY")
    while not os.path.exists(go):  # a file is the barrier between the racing processes
        time.sleep(0.001)
    return asyncio.run(_resume_slow(wf, run_id))


async def _resume_slow(wf: Workflow, run_id: str) -> int:
    try:
        handler = wf.resume(run_id)
    except RunOwnedError as exc:
        say(f"OWNED {exc}")
        return 0
    say(f"RESULT {run_id} {json.dumps(await handler)}")
    return 0


async def diskfull(db: str, pages: str, run_id: str, flow: str, wait: str) -> int:
    limit = int(pages)
    if limit:
        original = _sqlite.connect

        def limited(target: str, **kw: Any) -> sqlite3.Connection:
            conn = original(target, **kw)
            if not kw["readonly"]:
                conn.execute(f"PRAGMA max_page_count = {limit}")
            return conn

        _sqlite.connect = limited
    wf = (Bulky if flow == "bulky" else Blob)(store=db, timeout=None)
    wf.__workflow_parts__.commit_hook = _ack
    handler = wf.run(run_id=run_id, items=40)
    say("START")
    try:
        result = await asyncio.wait_for(asyncio.shield(handler._future), float(wait))
    except TimeoutError:
        say(f"HUNG {run_id}")  # the handler never completed
        return 2
    except Exception as exc:
        say(f"ERROR {run_id} {type(exc).__name__}: {exc}")
        return 1
    say(f"RESULT {run_id} {json.dumps(result, sort_keys=True)}")
    return 0


def poll(db: str, run_id: str, seconds: str) -> int:
    wf = flow(Flaky, db, timeout=None)
    wf.state_at(run_id)
    say("POLLING")
    polls = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        wf.state_at(run_id)  # the latest state: asks whether a live executor owns the run
        polls += 1
    say(f"POLLED {polls}")
    return 0


def create_race(directory: str, rounds: str, procs: str) -> int:
    for r in range(int(rounds)):
        path = os.path.join(directory, f"race-{r}.db")
        at = time.time() + 0.05
        children = []
        for _ in range(int(procs)):
            pid = os.fork()
            if pid == 0:
                while time.time() < at:
                    pass
                try:
                    EventStore(path).close()
                    line = "CREATED OK"
                except Exception as exc:
                    line = f"CREATED ERROR {type(exc).__name__}: {exc}"
                say(line)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
    return 0


def bigfold(db: str, run_id: str, spec: str) -> int:
    module, _, name = spec.partition(":")
    flow: type[Workflow] = getattr(importlib.import_module(module), name)
    store = EventStore(db, readonly=True)
    wf = flow(store=store, timeout=None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    state = wf.state_at(run_id)
    count = sum(1 for _ in store.records(run_id))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    info = {
        "before_kib": before,
        "after_kib": after,
        "records": count,
        "seconds": round(time.perf_counter() - started, 2),
        "seq": state.seq,
        "queued": sum(len(q) for q in state.queues.values()),
        "in_progress": sum(len(p) for p in state.in_progress.values()),
    }
    say(f"MEM {json.dumps(info)}")
    return 0


def probe(db: str) -> int:
    try:
        store = EventStore(db)
        wf = Counter(store=store, timeout=None)
        runs = store.runs()
        records = sum(1 for _ in store.records())
        for info in runs:
            wf.state_at(info.run_id)
            wf.checkpoints(info.run_id)
    except (EventStoreError, WorkflowError) as exc:
        say(f"ERROR {type(exc).__name__}: {exc}")
        return 1
    except Exception as exc:
        say(f"RAW {type(exc).__module__}.{type(exc).__name__}: {exc}")
        return 1
    say(f"OK {len(runs)} runs, {records} records")
    return 0


def main(argv: list[str]) -> int:
    mode, *args = argv
    if mode == "counter":
        return asyncio.run(counter(*args))
    if mode == "slow":
        return asyncio.run(slow(*args))
    if mode == "race":
        return race(*args)
    if mode == "diskfull":
        return asyncio.run(diskfull(*args))
    if mode == "poll":
        return poll(*args)
    if mode == "create-race":
        return create_race(*args)
    if mode == "bigfold":
        return bigfold(*args)
    if mode == "probe":
        return probe(*args)
    say(f"unknown mode {mode!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
