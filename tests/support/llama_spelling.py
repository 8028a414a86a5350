"""A user's module in LlamaIndex Workflows' documented spelling, checked by ``mypy --strict``.

``tests/test_typing.py`` type-checks this file against the installed package (so an editable
install must be visible to type checkers) and runs the flows, so every pattern here is both
accepted by the type checker and real at runtime. Nothing here is written to suit us: bare
``ctx: Context``, extra fields on ``StartEvent`` / ``InputRequiredEvent`` /
``HumanResponseEvent``, ``StopEvent(result=...)``, and values from ``ctx.store.get`` used
as what the user knows they are.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    JsonSerializer,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.retry_policy import (
    retry_if_exception_message,
    retry_if_exception_type,
    retry_policy,
    stop_after_attempt,
    stop_after_delay,
    wait_fixed,
    wait_random,
)


class JokeEvent(Event):
    joke: str


class JokeFlow(Workflow):
    """The first example of LlamaIndex's docs: a start event with a free-form field."""

    @step
    async def generate_joke(self, ev: StartEvent) -> JokeEvent:
        topic: str = ev.topic
        return JokeEvent(joke=f"a joke about {topic}")

    @step
    async def critique_joke(self, ev: JokeEvent) -> StopEvent:
        return StopEvent(result=f"critique of {ev.joke!r}")


class CounterFlow(Workflow):
    """Context store reads and writes with a bare ``Context``; also the old ``ctx.get``."""

    @step
    async def count(self, ctx: Context, ev: StartEvent) -> StopEvent:
        n = await ctx.store.get("count", default=0)
        await ctx.store.set("count", n + ev.get("by", 1))
        total: int = await ctx.store.get("count")
        await ctx.set("legacy", total)
        return StopEvent(result=total + await ctx.get("legacy", default=0))


class CounterState(BaseModel):
    count: int = 0
    log: list[str] = []


class TypedStateFlow(Workflow):
    """Typed state: ``Context[MyState]`` with ``edit_state`` and ``get_state``."""

    @step
    async def bump(self, ctx: Context[CounterState], ev: StartEvent) -> StopEvent:
        async with ctx.store.edit_state() as state:
            state.count += 1
            state.log.append("bumped")
        final = await ctx.store.get_state()
        return StopEvent(result=final.count)


class ProcessEvent(Event):
    item: str


class ResultEvent(Event):
    value: int


class ProgressEvent(Event):
    msg: str


class FanOutFlow(Workflow):
    """Fan out with ``send_event``, concurrent workers, fan in with ``collect_events``."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> ProcessEvent | None:
        items: list[str] = ev.items
        await ctx.store.set("n", len(items))
        for item in items:
            ctx.send_event(ProcessEvent(item=item))
        return None

    @step(num_workers=4)
    async def process(self, ctx: Context, ev: ProcessEvent) -> ResultEvent:
        ctx.write_event_to_stream(ProgressEvent(msg=f"processing {ev.item}"))
        return ResultEvent(value=len(ev.item))

    @step
    async def combine(self, ctx: Context, ev: ResultEvent) -> StopEvent | None:
        n = await ctx.store.get("n")
        events = ctx.collect_events(ev, [ResultEvent] * n)
        if events is None:
            return None
        return StopEvent(result=sum(e.value for e in events))


class AskFlow(Workflow):
    """Human in the loop as two steps: the question is streamed, the answer routed."""

    @step
    async def ask(self, ev: StartEvent) -> InputRequiredEvent:
        return InputRequiredEvent(prefix="What is your name? ", user_id=ev.user_id)

    @step
    async def answer(self, ev: HumanResponseEvent) -> StopEvent:
        return StopEvent(result=f"hello {ev.response}")


class WaitFlow(Workflow):
    """Human in the loop inside one step: ``ctx.wait_for_event`` with a waiter event."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        response = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix="What is your name? ", user_id=ev.user_id),
            requirements={"user_id": ev.user_id},
        )
        return StopEvent(result=f"hello {response.response}")


class Answer(StopEvent):
    text: str


class FlakyFlow(Workflow):
    """A composed retry policy on a step, and a ``StopEvent`` subclass as the result."""

    failures = 0

    @step(
        retry_policy=retry_policy(
            retry=retry_if_exception_type(RuntimeError) | retry_if_exception_message(match="again"),
            wait=wait_fixed(0.01) + wait_random(0, 0.01),
            stop=stop_after_attempt(3) | stop_after_delay(30),
        )
    )
    async def flaky(self, ev: StartEvent) -> Answer:
        if type(self).failures < 1:
            type(self).failures += 1
            raise RuntimeError("try again")
        return Answer(text="done", result="ok")


async def main() -> list[object]:
    """Runs each flow the way LlamaIndex's docs do and returns their results."""
    results: list[object] = []
    result = await JokeFlow(timeout=60, verbose=False).run(topic="pirates")
    results.append(result)
    results.append(await CounterFlow().run(by=2))
    results.append(await TypedStateFlow().run())

    handler = FanOutFlow(timeout=30).run(items=["a", "bb", "ccc"])
    progress = [ev.msg async for ev in handler.stream_events() if isinstance(ev, ProgressEvent)]
    results.append(await handler)
    results.append(len(progress))

    handler = AskFlow().run(user_id="u1")
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            await handler.send_event(HumanResponseEvent(response="ada", user_id=ev.user_id))
    results.append(await handler)

    answer: Answer = await FlakyFlow().run()
    results.append(answer.text)
    return results


async def answer_waiting_run() -> object:
    """LlamaIndex's documented loop: answer each question with ``handler.ctx.send_event``."""
    handler = WaitFlow(timeout=30).run(user_id="u1")
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            handler.ctx.send_event(HumanResponseEvent(response="ada", user_id=ev.user_id))
    return await handler


async def carry_context() -> list[object]:
    """LlamaIndex's Context lifecycle: one context over runs, carried through a dict, and
    the pause-and-resume pattern of its human-in-the-loop docs."""
    wf = CounterFlow()
    ctx = Context(wf)
    first = await wf.run(ctx=ctx, by=2)
    second = await wf.run(ctx=ctx, by=3)
    ctx_dict = ctx.to_dict(serializer=JsonSerializer())
    restored = Context.from_dict(wf, json.loads(json.dumps(ctx_dict)), serializer=JsonSerializer())
    third = await wf.run(ctx=restored, by=1)

    asking = WaitFlow(timeout=30)
    handler = asking.run(user_id="u2")
    saved: dict[str, Any] = {}
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            saved = handler.ctx.to_dict()
            await handler.cancel_run()
            break
    handler = asking.run(ctx=Context.from_dict(asking, saved))
    handler.ctx.send_event(HumanResponseEvent(response="bo", user_id="u2"))
    return [first, second, third, await handler]
