"""The main demo: a run dies in its third step; another process resumes it from the file.

``python examples/demo.py`` runs the whole story in two real processes:

1. process 1 starts the run; ``fetch`` and ``summarize`` do their heavy work and commit;
   ``publish`` kills the process (``os._exit``) on its first attempt;
2. process 2 resumes the run from the SQLite file: only ``publish`` runs again;
3. the run's history is printed (``workflow history``), and the state at a seq in the
   middle.

The store is kept (in a new temporary folder, or ``python examples/demo.py DIR``), and the
demo ends with the ``workflow`` commands that look at the run in it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Fetched(Event):
    pages: list[str]


class Summarized(Event):
    summary: str


class Report(Workflow):
    """Fetch, summarize, publish: the first two steps are the expensive ones."""

    @step
    async def fetch(self, ctx: Context, ev: StartEvent) -> Fetched:
        print(f"  [{os.getpid()}] fetch: downloading pages about {ev.topic!r} (slow)")
        pages = [f"{ev.topic} page {i}" for i in range(3)]
        await ctx.store.set("pages_fetched", len(pages))
        return Fetched(pages=pages)

    @step
    async def summarize(self, ctx: Context, ev: Fetched) -> Summarized:
        print(f"  [{os.getpid()}] summarize: calling the LLM (expensive)")
        await ctx.store.set("tokens_spent", 1234)
        return Summarized(summary=" / ".join(ev.pages))

    @step
    async def publish(self, ctx: Context, ev: Summarized) -> StopEvent:
        marker = Path(f"{self.store.path}.crashed")  # a marker file: demo only
        if not marker.exists():  # noqa: ASYNC240 - a demo marker, not I/O to await
            marker.touch()  # noqa: ASYNC240
            print(f"  [{os.getpid()}] publish: the process dies here (os._exit)")
            os._exit(1)
        print(f"  [{os.getpid()}] publish: posting the summary")
        return StopEvent(result=f"published: {ev.summary}")


async def start(db: str) -> None:
    handler = Report(store=db).run(topic="durable workflows")
    print(f"  run id {handler.run_id}", flush=True)
    await handler


async def resume(db: str, run_id: str) -> None:
    result = await Report(store=db).resume(run_id)
    print(f"  result: {result}")


def show(db: str, run_id: str, env: dict[str, str]) -> None:
    wf = Report(store=db)
    print("\nThe run's history, every record of its log (`workflow history DB RUN`; a")
    print("record's `commit` is the last seq of the commit it became durable with):")
    history = subprocess.run(
        [sys.executable, "-m", "workflow", "history", db, run_id],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "100"},
        check=True,
    )
    for line in history.stdout.splitlines():
        print(f"  {line}")
    cps = wf.checkpoints(run_id, step="summarize")
    middle = next(c for c in cps if c.kind == "step_finished")
    state = wf.state_at(run_id, middle.seq)
    print(f"\nThe state at seq {middle.seq} (summarize had just finished):")
    print(f"  status then: {state.status}")
    print(f"  queues: {state.queues}")
    print(f"  context: {state.context}")


def main(folder: str | None) -> None:
    here = Path(__file__).resolve()
    env = {**os.environ, "PYTHONPATH": str(here.parent.parent)}
    tmp = folder or tempfile.mkdtemp(prefix="durable-demo-")
    Path(tmp).mkdir(parents=True, exist_ok=True)
    db = str(Path(tmp).resolve() / "runs.db")
    for stale in Path(tmp).glob("runs.db*"):  # a demo run again in the same folder
        stale.unlink()
    print(f"Process 1 starts a run on {db}:")
    first = subprocess.run(
        [sys.executable, str(here), "start", db], capture_output=True, text=True, env=env
    )
    print(first.stdout, end="")
    print(f"  (process 1 exited with code {first.returncode})")
    run_id = first.stdout.split("run id ")[1].split()[0]
    print("\nProcess 2 resumes it from the file; fetch and summarize do not run again:")
    second = subprocess.run(
        [sys.executable, str(here), "resume", db, run_id],
        capture_output=True,
        text=True,
        env=env,
    )
    print(second.stdout, end="", file=sys.stdout)
    if second.returncode != 0:
        print(second.stderr, file=sys.stderr)
        raise SystemExit(second.returncode)
    show(db, run_id, env)
    tool = Path(sys.executable).with_name("workflow")
    command = str(tool) if tool.exists() else f"{sys.executable} -m workflow"
    print(f"\nThe store is kept at {db}; look at the run yourself:")
    page = shlex.quote(str(Path(db).with_name("timeline.html")))
    for args in ("runs {db}", "history {db} {run}", "timeline {db} {run} -o {page}"):
        print(f"  {command} {args.format(db=shlex.quote(db), run=run_id, page=page)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "start":
        asyncio.run(start(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "resume":
        asyncio.run(resume(sys.argv[2], sys.argv[3]))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
