"""A user's script, copied by tests/test_main_module.py to ``mainflow.py`` in a temp directory.

Run as ``python mainflow.py DB MODE [RUN]`` its classes are recorded as ``__main__:X``;
imported as ``mainflow`` (by a test, or by ``workflow ... --workflow mainflow:Flow``) they
are ``mainflow:X``. Modes: ``run RUN`` and ``resume RUN`` of :class:`Flow` (a two-round
fan-in through ``collect_events``), ``ask RUN`` and ``answer RUN`` of :class:`AskFlow` (a
durable wait). ``MAINFLOW_CRASH=1`` kills the process (SIGKILL) in the second round;
``MAINFLOW_FAIL=1`` makes that step raise instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from typing import Any

from pydantic import BaseModel

from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)


@dataclasses.dataclass
class Mark:
    """A dataclass kept in the state only under ``Any``: the workflow names it in ``types=``."""

    round: int


class Tally(BaseModel):
    """A model nested in the typed state."""

    total: int = 0


class State(BaseModel):
    """The typed state of :class:`Flow` (``Context[State]``)."""

    tally: Tally = Tally()
    marks: list[Any] = []


class Note(Event):
    """An event nested inside another event, named by no step signature."""

    text: str


class Left(Event):
    round: int


class Right(Event):
    round: int
    value: int
    note: Note


class Ask(Event):
    round: int


class Flow(Workflow):
    """Two rounds of a fan-in: each round joins a Left with the Right it asked for."""

    @step
    async def start(self, ctx: Context[State], ev: StartEvent) -> Left:
        return Left(round=1)

    @step
    async def join(self, ctx: Context[State], ev: Left | Right) -> Ask | Left | StopEvent | None:
        got = ctx.collect_events(ev, [Left, Right])
        if got is None:
            return Ask(round=ev.round) if isinstance(ev, Left) else None
        left, right = got
        assert isinstance(left, Left)
        assert isinstance(right, Right)
        async with ctx.store.edit_state() as state:
            state.tally = Tally(total=state.tally.total + right.value + left.round)
            state.marks = [*state.marks, Mark(left.round)]
        if left.round < 2:
            return Left(round=left.round + 1)
        state = await ctx.store.get_state()
        return StopEvent(
            result={
                "total": state.tally.total,
                "marks": [m.round for m in state.marks if isinstance(m, Mark)],
                "note": right.note.text,
            }
        )

    @step
    async def right(self, ev: Ask) -> Right:
        if ev.round == 2 and os.environ.get("MAINFLOW_CRASH"):
            os.kill(os.getpid(), signal.SIGKILL)
        if ev.round == 2 and os.environ.get("MAINFLOW_FAIL"):
            msg = "the right side failed in round 2"
            raise RuntimeError(msg)
        return Right(round=ev.round, value=ev.round * 100, note=Note(text=f"right {ev.round}"))


class Answer(HumanResponseEvent):
    """A human's answer; only ``wait_for_event`` names it."""

    name: str


class Question(InputRequiredEvent):
    """The question streamed while the run waits; only ``wait_for_event`` names it."""

    prefix: str


class AskFlow(Workflow):
    """Asks a human for a name and greets them."""

    @step
    async def ask(self, ctx: Context[Any], ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(Answer, waiter_event=Question(prefix="name?"))
        return StopEvent(result=f"hello {answer.name}")


def flow(db: str) -> Flow:
    """The fan-in workflow as the script builds it."""
    return Flow(store=db, timeout=20, types=[Mark])


async def _main(db: str, mode: str, run_id: str) -> None:
    if mode == "run":
        result = await flow(db).run(run_id=run_id)
    elif mode == "resume":
        result = await flow(db).resume(run_id)
    elif mode == "ask":
        handler = AskFlow(store=db, timeout=20).run(run_id=run_id)
        await handler.wait_until_waiting(timeout=20)
        os.kill(os.getpid(), signal.SIGKILL)  # a crash while the question is open
    else:
        wf = AskFlow(store=db, timeout=20)
        wf.send(run_id, Answer(name="ada"))
        result = await wf.resume(run_id)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:4]))
