"""A typed state's field that holds no value reads as the model's default through
``ctx.store.get`` (and a dotted path into it), as LlamaIndex 2.26 returns it and as
``get_state`` shows it; reading it writes nothing, and is a read of that key."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from workflow import Context, ContextKeyError, Event, StartEvent, StopEvent, Workflow, step


class Inner(BaseModel):
    x: int = 1
    d: dict[str, int] = {"a": 2}


class State(BaseModel):
    items: list[str] = []
    currency: str = "EUR"
    inner: Inner = Inner()
    table: dict[str, int] = {"k": 3}
    count: int = 0


class Reads(Workflow):
    """Reads every defaulted field (plain and dotted) on a fresh run, writing nothing."""

    @step
    async def read(self, ctx: Context[State], ev: StartEvent) -> StopEvent:
        items = await ctx.store.get("items")
        items.append("not kept")  # a default read is a copy: changes nothing until set
        return StopEvent(
            result={
                "currency": await ctx.store.get("currency"),
                "items": await ctx.store.get("items"),
                "inner.x": await ctx.store.get("inner.x"),
                "inner.d.a": await ctx.store.get("inner.d.a"),
                "table.k": await ctx.store.get("table.k"),
                "state": await ctx.store.get_state(),
                "other": await ctx.store.get("other", default="dflt"),
                "missing_in_field": await ctx.store.get("inner.nope", default=None),
            }
        )


async def test_a_fresh_run_reads_each_field_s_default_and_logs_nothing(tmp_path: Path) -> None:
    wf = Reads(store=tmp_path / "s.db")
    handler = wf.run()
    got = await handler
    assert got["currency"] == "EUR"
    assert got["items"] == []
    assert got["inner.x"] == 1
    assert got["inner.d.a"] == 2
    assert got["table.k"] == 3
    assert got["state"] == State()
    assert got["other"] == "dflt"  # not a field: get(key, default=) as before
    assert got["missing_in_field"] is None
    assert wf.state_at(handler.run_id).context == {}  # reading wrote nothing
    kinds = {r.kind for r in wf.store.records(handler.run_id)}
    assert "state_set" not in kinds


async def test_a_key_that_is_not_a_field_still_raises(tmp_path: Path) -> None:
    class Strict(Workflow):
        @step
        async def read(self, ctx: Context[State], ev: StartEvent) -> StopEvent:
            with pytest.raises(ContextKeyError, match="'nope'"):
                await ctx.store.get("nope")
            with pytest.raises(ContextKeyError, match=r"'inner\.nope'"):
                await ctx.store.get("inner.nope")
            return StopEvent(result="ok")

    assert await Strict(store=tmp_path / "s.db").run() == "ok"


class Required(BaseModel):
    name: str
    n: int = 4


async def test_a_required_field_without_a_value_has_no_default(tmp_path: Path) -> None:
    class Req(Workflow):
        @step
        async def read(self, ctx: Context[Required], ev: StartEvent) -> StopEvent:
            with pytest.raises(ContextKeyError, match="'name'"):
                await ctx.store.get("name")
            return StopEvent(result=(await ctx.store.get("n"), await ctx.store.get("name", "x")))

    assert await Req(store=tmp_path / "s.db").run() == (4, "x")


class Writes(Workflow):
    """Sets a field, a dotted path into a defaulted model field, and reads them back."""

    @step
    async def write(self, ctx: Context[State], ev: StartEvent) -> StopEvent:
        await ctx.store.set("currency", "USD")
        await ctx.store.set("inner.x", 7)  # starts from the default Inner, as LlamaIndex
        return StopEvent(
            result=(
                await ctx.store.get("currency"),
                await ctx.store.get("inner"),
                await ctx.store.get("inner.d.a"),
            )
        )


async def test_a_set_field_reads_its_value_and_the_fold_holds_only_writes(tmp_path: Path) -> None:
    wf = Writes(store=tmp_path / "s.db")
    handler = wf.run()
    assert await handler == ("USD", Inner(x=7), 2)
    context = wf.state_at(handler.run_id).context
    assert context == {"currency": "USD", "inner": Inner(x=7)}
    assert "items" not in context  # never written: not in the fold


class Go(Event):
    pass


class Halts(Workflow):
    """Sets ``items``, then fails in its second step until ``ok`` is set on resume."""

    @step
    async def first(self, ctx: Context[State], ev: StartEvent) -> Go:
        await ctx.store.set("items", ["a"])
        return Go()

    @step
    async def second(self, ctx: Context[State], ev: Go) -> StopEvent:
        if not await ctx.store.get("ok", default=False):
            msg = "halt"
            raise ValueError(msg)
        return StopEvent(
            result=(
                await ctx.store.get("items"),
                await ctx.store.get("currency"),
                await ctx.store.get("inner.d.a"),
            )
        )


async def test_a_resumed_run_reads_written_values_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    wf = Halts(store=path)
    handler = wf.run()
    with pytest.raises(ValueError, match="halt"):
        await handler
    again = Halts(store=path)  # a second workflow over the same file
    assert await again.resume(handler.run_id, updates={"ok": True}) == (["a"], "EUR", 2)
    assert again.state_at(handler.run_id).context == {"items": ["a"], "ok": True}


class Fan(Event):
    pass


class Bumps(Workflow):
    """Two steps run at once, each reading the defaulted ``count`` and writing it + 1: the
    read of the default is a read of ``count``, so the later commit conflicts and reruns."""

    @step
    async def start(self, ctx: Context[State], ev: StartEvent) -> Fan | None:
        ctx.send_event(Fan())
        ctx.send_event(Fan())
        return None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.reads = 0
        self.both_read = asyncio.Event()

    @step(num_workers=2)
    async def bump(self, ctx: Context[State], ev: Fan) -> StopEvent | None:
        n = await ctx.store.get("count")
        self.reads += 1
        if self.reads >= 2:
            self.both_read.set()
        await self.both_read.wait()  # both attempts read before either commits
        await ctx.store.set("count", n + 1)
        collected = ctx.collect_events(ev, [Fan, Fan])
        return None if collected is None else StopEvent(result="done")


async def test_a_read_of_a_default_field_conflicts_with_a_write_of_it(tmp_path: Path) -> None:
    wf = Bumps(store=tmp_path / "s.db")
    handler = wf.run()
    await asyncio.wait_for(handler, 10.0)
    assert wf.state_at(handler.run_id).context == {"count": 2}
    kinds = [r.kind for r in wf.store.records(handler.run_id) if r.step == "bump"]
    assert kinds.count("step_conflicted") == 1
