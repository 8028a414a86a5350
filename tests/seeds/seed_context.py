import json
import asyncio
from pprint import pprint

from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class EventA(Event):
    content: str


class EventB(Event):
    content: str


class TestWorkflow(Workflow):
    @step
    async def start(self, ev: StartEvent) -> EventA:
        return EventA(content="first")

    @step
    async def process(self, ev: EventA) -> EventB:
        return EventB(content="second: " + ev.content)

    @step
    async def finish(self, ctx: Context, ev: EventB) -> StopEvent:
        if await ctx.get('var'):
            return StopEvent(result="end: " + ev.content)
        else:
            raise ValueError()


async def main():
    w = TestWorkflow(verbose=True)
    ctx = Context(w)

    try:
        pprint(await w.run(ctx=ctx))
    except:
        pass

    ctx = json.dumps(ctx.to_dict(), ensure_ascii=False)
    ctx = Context.from_dict(w, json.loads(ctx))
    await ctx.set('var', '1')

    print('-' * 40)
    pprint(await w.run(ctx=ctx))
    print("OK")

asyncio.run(main())
