"""The state workloads of issue 17, written once for both engines.

This module runs unchanged on durable-workflows (``workflow``) and on LlamaIndex Workflows
2.26 (``workflows``): ``BENCH_ENGINE`` picks the import, the one line a LlamaIndex user
changes, so both sides run the same step code. It imports nothing else of this project (the
peers venv has LlamaIndex and pydantic only).

Workloads, each a step that loops N times (``run(n=N)``) unless said otherwise:

* list spellings: a 100-byte item added per step to a list, read with ``get`` and written
  back with ``set`` as users write it: in place ``append``, ``items + [x]``, ``[*items, x]``,
  ``items[:] + [x]``, ``list(items)`` then append, ``copy.deepcopy(items)`` then append;
  and a list at the nested path ``a.b`` (``get("a.b")``, append, ``set("a.b", ...)``).
* dict spellings: a new 100-byte entry per step via ``d[k] = v``, ``{**d, k: v}``,
  ``d | {k: v}``, ``dict(d, **{k: v})``.
* agent memory: two chat messages (pydantic, role, content, a dict of extras) a step, in the
  typed state ``Context[AgentState]`` through ``edit_state()`` and through
  ``get_state()``/``set_state()``, and as plain message dicts in a ``ctx.store`` list.
* fan-out/fan-in (``run(k=K)``): one step sends K events, a ``num_workers=4`` step handles
  each, a collector gathers them with ``ctx.collect_events(ev, [Done] * K)``.

Each run returns the length it built (N, or 2N messages, or K), so the caller checks it.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING or os.environ.get("BENCH_ENGINE", "workflow") == "workflow":
    from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
else:
    from workflows import Context, Workflow, step
    from workflows.events import Event, StartEvent, StopEvent

ITEM = "x" * 100
EXTRAS = {"model": "gpt-bench", "tokens": 42, "tool_calls": []}


class Again(Event):
    """Runs the loop step once more: ``i`` steps done so far, ``n`` in all."""

    i: int
    n: int


def _next(ev: StartEvent | Again) -> tuple[int, int]:
    if isinstance(ev, Again):
        return ev.i, ev.n
    return 0, int(ev.n)


def _again(i: int, n: int, length: int) -> Again | StopEvent:
    if i + 1 >= n:
        return StopEvent(result=length)
    return Again(i=i + 1, n=n)


# ---------------------------------------------------------------------------- lists


class Append(Workflow):
    """A step looping N times, ``items.append(x)`` on what ``get`` returned.

    The other spellings subclass it and override :meth:`update` (the step is inherited).
    """

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i, n = _next(ev)
        return _again(i, n, await self.update(ctx, i))

    async def update(self, ctx: Context, i: int) -> int:
        items = await ctx.store.get("items", default=[])
        items.append(ITEM)
        await ctx.store.set("items", items)
        return len(items)


class Plus(Append):
    """``items = items + [x]``."""

    async def update(self, ctx: Context, i: int) -> int:
        items = await ctx.store.get("items", default=[])
        items = items + [ITEM]  # noqa: RUF005 - the spelling under test
        await ctx.store.set("items", items)
        return len(items)


class Star(Append):
    """``items = [*items, x]``."""

    async def update(self, ctx: Context, i: int) -> int:
        items = await ctx.store.get("items", default=[])
        items = [*items, ITEM]
        await ctx.store.set("items", items)
        return len(items)


class SlicePlus(Append):
    """``items = items[:] + [x]``."""

    async def update(self, ctx: Context, i: int) -> int:
        items = await ctx.store.get("items", default=[])
        items = items[:] + [ITEM]  # noqa: RUF005 - the spelling under test
        await ctx.store.set("items", items)
        return len(items)


class ListCopy(Append):
    """``items = list(items)`` then ``append``."""

    async def update(self, ctx: Context, i: int) -> int:
        items = list(await ctx.store.get("items", default=[]))
        items.append(ITEM)
        await ctx.store.set("items", items)
        return len(items)


class DeepCopy(Append):
    """``items = copy.deepcopy(items)`` then ``append``."""

    async def update(self, ctx: Context, i: int) -> int:
        items = copy.deepcopy(await ctx.store.get("items", default=[]))
        items.append(ITEM)
        await ctx.store.set("items", items)
        return len(items)


class Nested(Append):
    """A list at the nested path ``a.b``: ``get("a.b")``, append, ``set("a.b", items)``.

    The first step writes ``a`` whole (``set("a.b")`` under a missing ``a`` would create it,
    in both engines), so every later step is the same nested update.
    """

    async def update(self, ctx: Context, i: int) -> int:
        if i == 0:
            await ctx.store.set("a", {"b": [ITEM], "note": "nested"})
            return 1
        items = await ctx.store.get("a.b")
        items.append(ITEM)
        await ctx.store.set("a.b", items)
        return len(items)


# ---------------------------------------------------------------------------- dicts


class DictSetItem(Append):
    """``d[k] = v`` on what ``get`` returned."""

    async def update(self, ctx: Context, i: int) -> int:
        d = await ctx.store.get("d", default={})
        d[f"k{i}"] = ITEM
        await ctx.store.set("d", d)
        return len(d)


class DictUnpack(Append):
    """``d = {**d, k: v}``."""

    async def update(self, ctx: Context, i: int) -> int:
        d = await ctx.store.get("d", default={})
        d = {**d, f"k{i}": ITEM}
        await ctx.store.set("d", d)
        return len(d)


class DictOr(Append):
    """``d = d | {k: v}``."""

    async def update(self, ctx: Context, i: int) -> int:
        d = await ctx.store.get("d", default={})
        d = d | {f"k{i}": ITEM}
        await ctx.store.set("d", d)
        return len(d)


class DictCall(Append):
    """``d = dict(d, k=v)`` (the key varies, so ``dict(d, **{k: v})``)."""

    async def update(self, ctx: Context, i: int) -> int:
        d = await ctx.store.get("d", default={})
        d = dict(d, **{f"k{i}": ITEM})
        await ctx.store.set("d", d)
        return len(d)


# ---------------------------------------------------------------------------- agent memory


class ChatMessage(BaseModel):
    """A chat message as agents keep them: role, content and a dict of extras."""

    role: str
    content: str
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)


class AgentState(BaseModel):
    """An agent's typed state: its memory of messages, and a turn counter."""

    messages: list[ChatMessage] = Field(default_factory=list)
    turns: int = 0


def _turn(i: int) -> tuple[ChatMessage, ChatMessage]:
    user = ChatMessage(role="user", content=f"question {i}: " + "q" * 80, additional_kwargs={})
    extras = {**EXTRAS, "turn": i}
    reply = ChatMessage(role="assistant", content="a" * 150, additional_kwargs=extras)
    return user, reply


class AgentEditState(Workflow):
    """Typed state, two messages a step through ``async with ctx.store.edit_state()``."""

    @step
    async def loop(self, ctx: Context[AgentState], ev: StartEvent | Again) -> Again | StopEvent:
        i, n = _next(ev)
        user, reply = _turn(i)
        async with ctx.store.edit_state() as state:
            state.messages.append(user)
            state.messages.append(reply)
            state.turns += 1
            length = len(state.messages)
        return _again(i, n, length)


class AgentGetSetState(Workflow):
    """Typed state, two messages a step through ``get_state()`` and ``set_state()``."""

    @step
    async def loop(self, ctx: Context[AgentState], ev: StartEvent | Again) -> Again | StopEvent:
        i, n = _next(ev)
        user, reply = _turn(i)
        state = await ctx.store.get_state()
        state.messages.append(user)
        state.messages.append(reply)
        state.turns += 1
        await ctx.store.set_state(state)
        return _again(i, n, len(state.messages))


class AgentDicts(Workflow):
    """Untyped ``ctx.store``: a list of message dicts, two appended a step."""

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i, n = _next(ev)
        user, reply = _turn(i)
        messages = await ctx.store.get("messages", default=[])
        messages.append(user.model_dump())
        messages.append(reply.model_dump())
        await ctx.store.set("messages", messages)
        return _again(i, n, len(messages))


# ---------------------------------------------------------------------------- fan-out/fan-in


class Item(Event):
    """One piece of work of the fan-out."""

    i: int


class Done(Event):
    """One piece of work done."""

    i: int


class FanInFlow(Workflow):
    """Sends K events, handles them on 4 workers, collects the K results in one step."""

    @step
    async def fan(self, ctx: Context, ev: StartEvent) -> Item | None:
        k = int(ev.k)
        await ctx.store.set("k", k)
        for i in range(k):
            ctx.send_event(Item(i=i))
        return None

    @step(num_workers=4)
    async def work(self, ev: Item) -> Done:
        return Done(i=ev.i)

    @step
    async def gather(self, ctx: Context, ev: Done) -> StopEvent | None:
        k = await ctx.store.get("k")
        got = ctx.collect_events(ev, [Done] * k)
        if got is None:
            return None
        return StopEvent(result=len({d.i for d in got}))


# What `python state_run.py ENGINE WORKLOAD ...` runs: name -> (flow, "n" or "k", length per N).
WORKLOADS: dict[str, tuple[type[Workflow], str, int]] = {
    "append": (Append, "n", 1),
    "plus": (Plus, "n", 1),
    "star": (Star, "n", 1),
    "slice_plus": (SlicePlus, "n", 1),
    "list_copy": (ListCopy, "n", 1),
    "deepcopy": (DeepCopy, "n", 1),
    "nested": (Nested, "n", 1),
    "dict_setitem": (DictSetItem, "n", 1),
    "dict_unpack": (DictUnpack, "n", 1),
    "dict_or": (DictOr, "n", 1),
    "dict_call": (DictCall, "n", 1),
    "agent_edit_state": (AgentEditState, "n", 2),
    "agent_get_set_state": (AgentGetSetState, "n", 2),
    "agent_dicts": (AgentDicts, "n", 2),
    "fan_in": (FanInFlow, "k", 1),
}
