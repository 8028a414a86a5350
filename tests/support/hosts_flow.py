"""Workflows the cross-host tests run with ``workflow worker`` in each host's namespace.

Each step leaves an effect line (run, step, host, time) in a file of its host's own,
``$DW_EFFECTS/<host>.jsonl``, written after the step's work and before it returns (where a
real step would send its e-mail): the test reads the lines back to tell which host did what
and how often. ``DW_HOST`` names the host, ``DW_LEASE_TTL`` shortens the lease so a cut-off
host's runs lapse within seconds (no public setting exists for it yet).

``python -m tests.support.hosts_flow answer STORE RUN_ID...`` is the other host's human: for each
run in turn it waits until the run waits, sends the answer, prints ``{"run", "sent"}``
and waits until the run has finished before the next.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step

STEP_S = 0.3  # each step's "work": long enough for a cut to find steps in flight


def effect(ctx: Context, step: str, **extra: Any) -> None:
    """Appends one effect line to this host's file (one write: lines never tear)."""
    host = os.environ.get("DW_HOST", "local")
    line = {"run": ctx.run_id, "step": step, "host": host, "pid": os.getpid()}
    line.update(extra, t=time.time())
    path = Path(os.environ.get("DW_EFFECTS", ".")) / f"{host}.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def read_effects(folder: Path) -> list[dict[str, Any]]:
    """Every effect line of every host."""
    return [
        json.loads(ln) for f in sorted(folder.glob("*.jsonl")) for ln in f.read_text().splitlines()
    ]


class _Leased(Workflow):
    def __init__(self, **kwargs: Any) -> None:
        ttl = os.environ.get("DW_LEASE_TTL")
        super().__init__(**kwargs, lease_ttl=float(ttl) if ttl else None)


class Fetched(Event):
    n: int


class Worked(Event):
    n: int


class Chores(_Leased):
    """Three steps; the result needs the state the first step wrote (``3n + 1``)."""

    @step
    async def fetch(self, ctx: Context, ev: StartEvent) -> Fetched:
        await asyncio.sleep(STEP_S)
        await ctx.store.set("fetched", ev.n * 3)
        effect(ctx, "fetch")
        return Fetched(n=ev.n)

    @step
    async def work(self, ctx: Context, ev: Fetched) -> Worked:
        await asyncio.sleep(STEP_S)
        total = await ctx.store.get("fetched") + 1
        await ctx.store.set("total", total)
        effect(ctx, "work")
        return Worked(n=total)

    @step
    async def finish(self, ctx: Context, ev: Worked) -> StopEvent:
        await asyncio.sleep(STEP_S)
        effect(ctx, "finish")
        return StopEvent(result=ev.n)


class Question(Event):
    text: str


class Answer(Event):
    text: str


class Ask(_Leased):
    """Waits durably for an answer from elsewhere, then notes when it woke."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(Answer, waiter_event=Question(text="name?"))
        effect(ctx, "ask", answer=answer.text)
        return StopEvent(result=f"hello {answer.text}")


def answer_all(store: str, run_ids: list[str], timeout: float = 60) -> None:
    """Answers each run once it waits, one run at a time (each send is timed alone)."""
    wf = Ask(store=store, timeout=None)
    try:
        for run_id in run_ids:
            deadline = time.monotonic() + timeout
            while wf.state_at(run_id).status != "waiting":
                if time.monotonic() > deadline:
                    sys.exit(f"run {run_id} never waited")
                time.sleep(0.005)
            sent = time.time()
            wf.send(run_id, Answer(text=run_id[:6]))
            sys.stdout.write(json.dumps({"run": run_id, "sent": sent}) + "\n")
            sys.stdout.flush()
            while wf.state_at(run_id).status != "finished":
                if time.monotonic() > deadline:
                    sys.exit(f"run {run_id} did not finish after its answer")
                time.sleep(0.005)
    finally:
        wf.store.close()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "answer":
        sys.exit("usage: python -m tests.support.hosts_flow answer STORE RUN_ID...")
    answer_all(sys.argv[2], sys.argv[3:])
