"""A process that runs a question-asking workflow and holds its run while it waits.

``python -m tests.support.context_proc hold DB FILE``: runs :class:`Ask` on the store DB; when the
question is asked it writes ``handler.ctx.to_dict()`` to FILE and waits for the answer (the
test kills it). ``... dict-memory FILE``: the same on a private in-memory store, then cancels
the run and exits (LlamaIndex's pause-and-resume pattern, first half).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from workflow import (
    Context,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)


class Ask(Workflow):
    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        if await ctx.store.get("asked", default=None) is None:  # code before a wait runs again
            await ctx.store.set("asked", getattr(ev, "who", "you"))
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="name?")
        )
        return StopEvent(result=f"hello {answer.response} from {await ctx.store.get('asked')}")


async def main(mode: str, file: Path, db: str | None) -> None:
    wf = Ask(store=db)
    handler = wf.run(who="proc")
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            file.with_suffix(".tmp").write_text(json.dumps(handler.ctx.to_dict()), "utf-8")
            file.with_suffix(".tmp").rename(file)
            if mode == "hold":
                await asyncio.sleep(3600)
            await handler.cancel_run()
            break


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "hold":
        asyncio.run(main(mode, Path(sys.argv[3]), sys.argv[2]))
    else:
        asyncio.run(main(mode, Path(sys.argv[2]), None))
