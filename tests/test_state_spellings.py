"""Context state is exact through every update spelling users write (issue 17).

Random sequences of updates (``state_programs`` in tests/strategies.py) run in the steps of
a real workflow on a real store, in memory and in a file. The same user code runs on plain
Python values (:class:`PlainStore`, no engine): that is the live value. After the run the
fold of the log, ``wf.state_at(run_id).context``, must equal it with exact types, compared
by a type-tagged structure rather than ``==`` (``1``, ``1.0`` and ``True`` stay distinct,
``-0.0`` and NaN keep their sign and kind; tuples, sets, frozensets, pydantic models,
dataclasses and attrs classes keep their classes; lists and dicts keep their order).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from tests.conftest import ci_examples
from tests.strategies import SpelledState, StateOp, state_programs
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step

_MISSING: Any = object()


# -- the user code of each spelling, for any store (ctx.store, or PlainStore) ---------------

Spelling = Callable[..., Awaitable[None]]
SPELLINGS: dict[str, Spelling] = {}


def spelling(name: str) -> Callable[[Spelling], Spelling]:
    """Registers the code of one spelling: ``async def f(store, *args)``."""

    def register(fn: Spelling) -> Spelling:
        SPELLINGS[name] = fn
        return fn

    return register


@spelling("init")
async def _init(store: Any, items: Any, d: Any, m: Any, nest: Any, v: Any) -> None:
    for key, value in (("items", items), ("d", d), ("m", m), ("nest", nest), ("v", v)):
        await store.set(key, value)


@spelling("t_init")
async def _t_init(store: Any, state: SpelledState) -> None:
    await store.set_state(state)


@spelling("append")
async def _append(store: Any, x: Any) -> None:
    items = await store.get("items")
    items.append(x)
    await store.set("items", items)


@spelling("plus")
async def _plus(store: Any, x: Any) -> None:
    items = await store.get("items")
    items = items + [x]  # noqa: RUF005 - the spelling under test
    await store.set("items", items)


@spelling("star")
async def _star(store: Any, x: Any) -> None:
    items = await store.get("items")
    await store.set("items", [*items, x])


@spelling("slice_plus")
async def _slice_plus(store: Any, x: Any) -> None:
    items = await store.get("items")
    await store.set("items", items[:] + [x])  # noqa: RUF005 - the spelling under test


@spelling("list_copy_append")
async def _list_copy_append(store: Any, x: Any) -> None:
    items = list(await store.get("items"))
    items.append(x)
    await store.set("items", items)


@spelling("deepcopy_append")
async def _deepcopy_append(store: Any, x: Any) -> None:
    items = copy.deepcopy(await store.get("items"))
    items.append(x)
    await store.set("items", items)


@spelling("list_action")
async def _list_action(store: Any, how: str, action: str, j: int, xs: list[Any]) -> None:
    items = await store.get("items")
    if how == "list_copy":
        items = list(items)
    elif how == "deepcopy":
        items = copy.deepcopy(items)
    n = len(items)
    x = xs[0] if xs else None
    if action == "setitem" and n:
        items[j % n] = x
    elif action == "insert":
        items.insert(j, x)
    elif action == "pop" and n:
        items.pop(j % n)
    elif action == "extend":
        items.extend(xs)
    elif action == "del_slice":
        del items[j % (n + 1) : j % (n + 1) + 2]
    elif action == "sort":
        items.sort(key=repr)
    elif action == "reverse":
        items.reverse()
    elif action == "clear":
        items.clear()
    await store.set("items", items)


@spelling("set_index")
async def _set_index(store: Any, j: int, x: Any) -> None:
    items = await store.get("items")
    if items:
        await store.set(f"items.{j % len(items)}", x)


@spelling("d_setitem")
async def _d_setitem(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    d[k] = v
    await store.set("d", d)


@spelling("d_unpack")
async def _d_unpack(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    await store.set("d", {**d, k: v})


@spelling("d_or")
async def _d_or(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    await store.set("d", d | {k: v})


@spelling("d_call")
async def _d_call(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    await store.set("d", dict(d, **{k: v}))


@spelling("d_or")
async def _d_or_view(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    d = d | {k: v}
    d |= {k + "|": v}
    await store.set("d", d)


@spelling("d_copy_set")
async def _d_copy_set(store: Any, k: str, v: Any) -> None:
    d = (await store.get("d")).copy()
    d[k] = v
    await store.set("d", d)


@spelling("list_radd")
async def _list_radd(store: Any, x: Any) -> None:
    items = await store.get("items")
    await store.set("items", [x] + items)  # noqa: RUF005 - the spelling under test


@spelling("list_mul")
async def _list_mul(store: Any, x: Any) -> None:
    items = await store.get("items")
    await store.set("items", items[:2] * 2 + items * 1 + [x])


@spelling("list_comp")
async def _list_comp(store: Any, x: Any) -> None:
    items = await store.get("items")
    await store.set("items", [y for y in items] + [x])  # noqa: C416


@spelling("nest_plus")
async def _nest_plus(store: Any, x: Any) -> None:
    a = await store.get("nest.a")
    await store.set("nest.a", a + [x])  # noqa: RUF005 - the spelling under test


@spelling("new_path")
async def _new_path(store: Any, k: str, x: Any) -> None:
    await store.set(f"fresh{k}.a.b", x)


@spelling("t_copy_items")
async def _t_copy_items(store: Any, x: Any) -> None:
    state = await store.get_state()
    await store.set_state(state.model_copy(update={"items": [*state.items, x]}))


@spelling("d_update")
async def _d_update(store: Any, k: str, v: Any) -> None:
    d = await store.get("d")
    d.update({k: v})
    await store.set("d", d)


@spelling("d_del")
async def _d_del(store: Any, j: int) -> None:
    d = await store.get("d")
    if d:
        del d[list(d)[j % len(d)]]
        await store.set("d", d)


@spelling("d_drop_copy")
async def _d_drop_copy(store: Any, j: int) -> None:
    d = await store.get("d")
    if d:
        drop = list(d)[j % len(d)]
        await store.set("d", {k: v for k, v in d.items() if k != drop})


@spelling("m_setitem")
async def _m_setitem(store: Any, k: Any, v: Any) -> None:
    m = await store.get("m")
    m[k] = v
    await store.set("m", m)


@spelling("m_unpack")
async def _m_unpack(store: Any, k: Any, v: Any) -> None:
    m = await store.get("m")
    await store.set("m", {**m, k: v})


@spelling("m_del")
async def _m_del(store: Any, j: int) -> None:
    m = await store.get("m")
    if m:
        del m[list(m)[j % len(m)]]
        await store.set("m", m)


@spelling("nest_append")
async def _nest_append(store: Any, x: Any) -> None:
    a = await store.get("nest.a")
    a.append(x)
    await store.set("nest.a", a)


@spelling("nest_set")
async def _nest_set(store: Any, x: Any) -> None:
    await store.set("nest.b", x)


@spelling("nest_new")
async def _nest_new(store: Any, k: str, x: Any) -> None:
    await store.set(f"nest.{k}", x)


@spelling("v_set")
async def _v_set(store: Any, x: Any) -> None:
    await store.set("v", x)


@spelling("v_get_set")
async def _v_get_set(store: Any) -> None:
    await store.set("v", await store.get("v"))


@spelling("state_append")
async def _state_append(store: Any, x: Any) -> None:
    state = await store.get_state()
    state["items"].append(x)
    await store.set_state(state)


@spelling("edit_state_d")
async def _edit_state_d(store: Any, x: Any) -> None:
    async with store.edit_state() as state:
        state["d"]["edited"] = x


@spelling("t_edit_append")
async def _t_edit_append(store: Any, x: Any) -> None:
    async with store.edit_state() as state:
        state.items.append(x)


@spelling("t_getset_append")
async def _t_getset_append(store: Any, x: Any) -> None:
    state = await store.get_state()
    state.items.append(x)
    await store.set_state(state)


@spelling("t_edit_n")
async def _t_edit_n(store: Any, x: Any) -> None:
    async with store.edit_state() as state:
        state.n = x


@spelling("t_getset_n")
async def _t_getset_n(store: Any, x: Any) -> None:
    state = await store.get_state()
    state.n = x
    await store.set_state(state)


@spelling("t_copy_update")
async def _t_copy_update(store: Any, x: Any) -> None:
    state = await store.get_state()
    await store.set_state(state.model_copy(update={"n": x}))


@spelling("t_edit_d")
async def _t_edit_d(store: Any, k: str, x: Any) -> None:
    async with store.edit_state() as state:
        state.d[k] = x


@spelling("t_inner_count")
async def _t_inner_count(store: Any, x: Any) -> None:
    await store.set("inner.count", x)


@spelling("t_inner_tag")
async def _t_inner_tag(store: Any, tag: str) -> None:
    tags = await store.get("inner.tags")
    tags.append(tag)
    await store.set("inner.tags", tags)


async def run_ops(store: Any, ops: list[StateOp]) -> None:
    """Runs one step's updates in order, each on its own copy of the arguments."""
    for op in ops:
        await SPELLINGS[op.name](store, *copy.deepcopy(op.args))


# -- the live value: the same code on plain Python values -----------------------------------


def _into(value: Any, part: str) -> Any:
    if isinstance(value, list):
        return value[int(part)]
    if isinstance(value, dict):
        return value[part]
    return getattr(value, part)


class PlainStore:
    """``ctx.store``'s methods on plain Python values: what the user's code computes."""

    def __init__(self, typed: bool) -> None:
        self.typed = typed
        self.data: dict[str, Any] = {}
        self.state: Any = None

    async def get(self, path: str, default: Any = _MISSING) -> Any:
        head, *rest = path.split(".")
        value = getattr(self.state, head) if self.typed else self.data[head]
        for part in rest:
            value = _into(value, part)
        return value

    async def set(self, path: str, value: Any) -> None:
        *parents, last = path.split(".")
        if not parents:
            if self.typed:
                setattr(self.state, last, value)
            else:
                self.data[last] = value
            return
        if not self.typed and parents[0] not in self.data:
            self.data[parents[0]] = {}  # missing parents are made dicts, as LlamaIndex does
        node = await self.get(parents[0])
        for part in parents[1:]:
            try:
                node = _into(node, part)
            except KeyError:
                node[part] = {}
                node = node[part]
        parent = node
        if isinstance(parent, list):
            parent[int(last)] = value
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            setattr(parent, last, value)

    async def get_state(self) -> Any:
        return self.state if self.typed else dict(self.data)

    async def set_state(self, state: Any) -> None:
        if self.typed:
            self.state = state
        else:
            self.data = dict(state)

    @asynccontextmanager
    async def edit_state(self) -> AsyncIterator[Any]:
        state = await self.get_state()
        yield state
        await self.set_state(state)

    def context(self) -> dict[str, Any]:
        """The values by key, as ``RunState.context`` holds them."""
        if self.typed:
            return {name: getattr(self.state, name) for name in type(self.state).model_fields}
        return self.data


# -- the workflows --------------------------------------------------------------------------


class Next(Event):
    """Runs step ``i`` of the program."""

    i: int


class Untyped(Workflow):
    """Runs ``program[i]`` at step ``i`` through a plain ``Context``."""

    program: list[list[StateOp]] = []  # noqa: RUF012 - set on each instance before it runs

    @step
    async def apply(self, ctx: Context, ev: StartEvent | Next) -> Next | StopEvent:
        i = ev.i if isinstance(ev, Next) else 0
        await run_ops(ctx.store, self.program[i])
        return Next(i=i + 1) if i + 1 < len(self.program) else StopEvent(result=i + 1)


class Typed(Workflow):
    """Runs ``program[i]`` at step ``i`` through ``Context[SpelledState]``."""

    program: list[list[StateOp]] = []  # noqa: RUF012 - set on each instance before it runs

    @step
    async def apply(self, ctx: Context[SpelledState], ev: StartEvent | Next) -> Next | StopEvent:
        i = ev.i if isinstance(ev, Next) else 0
        await run_ops(ctx.store, self.program[i])
        return Next(i=i + 1) if i + 1 < len(self.program) else StopEvent(result=i + 1)


# -- exact comparison -----------------------------------------------------------------------


def shape(x: Any) -> Any:
    """A structure that is equal for two values only if they are equal with exact types.

    ``==`` says ``1 == 1.0 == True``, ``(1,) != [1]`` but ``{1} == frozenset({1})`` and
    ``-0.0 == 0.0``; this tags every node with its class and keeps order where it matters.
    """
    t = type(x)
    name = f"{t.__module__}:{t.__qualname__}"
    if t is float:
        return name, repr(x)  # nan, inf and -0.0 kept apart
    if t in (int, bool, str, bytes, type(None)):
        return name, x
    if t is bytearray:
        return name, bytes(x)
    if t in (list, tuple):
        return name, [shape(v) for v in x]
    if t is dict:
        return name, [(shape(k), shape(v)) for k, v in x.items()]
    if t in (set, frozenset):
        return name, sorted((shape(v) for v in x), key=repr)
    if isinstance(x, BaseModel):
        extra = x.__pydantic_extra__ or {}
        return name, shape(dict(x.__dict__)), shape(dict(extra))
    if dataclasses.is_dataclass(x):
        return name, [(f.name, shape(getattr(x, f.name))) for f in dataclasses.fields(x)]
    if attrs.has(t):
        return name, [(a.name, shape(getattr(x, a.name))) for a in attrs.fields(t)]
    if isinstance(x, dt.datetime | dt.time) and x.tzinfo is not None:
        # A zone by what it does: timezone(d) and timezone(d, its default name) differ
        # only in repr.
        tz = x.tzinfo
        zone = (type(tz).__qualname__, getattr(tz, "key", None), x.utcoffset(), x.tzname())
        return name, repr(x.replace(tzinfo=None)), zone, x.fold
    return name, repr(x)  # enums, dates, decimals, paths, uuids: repr is exact


def expected_context(program: list[list[StateOp]], typed: bool) -> dict[str, Any]:
    """The live values after the program, computed on plain Python values."""
    plain = PlainStore(typed)

    async def body() -> None:
        for ops in program:
            await run_ops(plain, ops)

    asyncio.run(body())
    return plain.context()


def folded_context(program: list[list[StateOp]], typed: bool, store: Path | None) -> Any:
    """Runs the program as a workflow on the store; the fold's context, checked twice.

    On a file store, a second Workflow object on the same file (nothing cached in
    memory) must fold to the same context.
    """
    wf = (Typed if typed else Untyped)(store=store, timeout=10)
    wf.program = program

    async def body() -> str:
        handler = wf.run()
        assert await handler == len(program)
        await wf.store.flush()
        return handler.run_id

    try:
        run_id = asyncio.run(body())
        context = wf.state_at(run_id).context
    finally:
        wf.store.close()
    if store is not None:
        again = (Typed if typed else Untyped)(store=store, timeout=10)
        try:
            assert shape(dict(again.state_at(run_id).context)) == shape(dict(context))
        finally:
            again.store.close()
    return context


@pytest.mark.parametrize("kind", ["memory", "file"])
@ci_examples(20)
@given(data=st.data())
def test_fold_equals_the_live_value_through_every_spelling(kind: str, data: st.DataObject) -> None:
    """Random updates in every spelling fold to exactly the values plain Python computes."""
    typed = data.draw(st.booleans(), label="typed")
    program = data.draw(state_programs(typed), label="program")
    expected = expected_context(program, typed)
    with tempfile.TemporaryDirectory(prefix="spellings-") as tmp:
        store = None if kind == "memory" else Path(tmp) / "log.db"
        context = folded_context(program, typed, store)
    assert sorted(context) == sorted(expected)
    for key, value in expected.items():
        assert shape(context[key]) == shape(value), key


# Enough items that views compare them by memory, remember atom-only lists and diffs
# compare by encoding (not item by item); with or without a few mutable ones among them
# (so views wrap them, and the memo of atom-only lists says no).
_PAD = 70


def _pad_list(items: list[Any], mutable: bool) -> list[Any]:
    return [[i] if mutable and i % 13 == 5 else f"pad{i}" for i in range(_PAD)] + items


def _pad_dict(d: dict[Any, Any], mutable: bool) -> dict[Any, Any]:
    return {f"pad{i}": {"i": i} if mutable and i % 13 == 5 else i for i in range(_PAD)} | d


def padded(program: list[list[StateOp]], mutable: bool) -> list[list[StateOp]]:
    """The program with its first values grown by ``_PAD`` items in front (lists, dicts)."""
    (first, *ops), *rest = program
    if first.name == "t_init":
        (state,) = first.args
        update = {"items": _pad_list(state.items, mutable), "d": _pad_dict(state.d, mutable)}
        first = StateOp("t_init", (state.model_copy(update=update),))
    else:
        items, d, m, nest, v = first.args
        nest = {**nest, "a": _pad_list(nest["a"], mutable)}
        lists = (_pad_list(items, mutable), _pad_dict(d, mutable), _pad_dict(m, mutable))
        first = StateOp("init", (*lists, nest, v))
    return [[first, *ops], *rest]


@ci_examples(20)
@given(data=st.data())
def test_large_values_fold_to_the_live_value_through_every_spelling(data: st.DataObject) -> None:
    """The same property on values large enough for the identity and encoding shortcuts."""
    typed = data.draw(st.booleans(), label="typed")
    mutable = data.draw(st.booleans(), label="mutable pads")
    program = padded(data.draw(state_programs(typed), label="program"), mutable)
    expected = expected_context(program, typed)
    with tempfile.TemporaryDirectory(prefix="spellings-") as tmp:
        context = folded_context(program, typed, Path(tmp) / "log.db")
    assert sorted(context) == sorted(expected)
    for key, value in expected.items():
        assert shape(context[key]) == shape(value), key


def test_types_that_equal_each_other_stay_apart(tmp_path: Path) -> None:
    """1, 1.0 and True replacing each other in a list, a dict and a field all stay exact."""
    program = [
        [StateOp("init", ([1, 0.0], {"a": 1}, {1: 1}, {"a": [True], "b": 1}, 1))],
        [StateOp("list_action", ("inplace", "setitem", 0, [1.0])), StateOp("v_set", (True,))],
        [StateOp("d_setitem", ("a", True)), StateOp("nest_set", (1.0,))],
        [StateOp("set_index", (1, -0.0)), StateOp("m_setitem", (True, 1.0))],
        [StateOp("deepcopy_append", ((1, frozenset({1.0}), {True}),))],
    ]
    expected = expected_context(program, typed=False)
    assert expected["items"] == [1.0, -0.0, (1, frozenset({1.0}), {True})]
    context = folded_context(program, typed=False, store=tmp_path / "log.db")
    for key, value in expected.items():
        assert shape(context[key]) == shape(value), key


def test_dict_union_spelling_updates_state(tmp_path: Path) -> None:
    """``d = d | {k: v}`` and ``d |= ...`` on what ``get`` returned update the state as on a
    plain dict (a view is a real dict: ``|`` works on it)."""
    program = [
        [StateOp("init", ([], {"a": 1}, {}, {"a": [], "b": 0}, 0))],
        [StateOp("d_or", ("b", 2.0))],
    ]
    context = folded_context(program, typed=False, store=tmp_path / "log.db")
    assert shape(context["d"]) == shape({"a": 1, "b": 2.0, "b|": 2.0})


def test_setting_a_path_under_missing_parents_creates_them(tmp_path: Path) -> None:
    """``set("a.b.c", v)`` with no ``a`` (or no ``b``) creates dicts, as LlamaIndex does."""

    class Paths(Workflow):
        @step
        async def go(self, ctx: Context, ev: StartEvent) -> StopEvent:
            await ctx.store.set("a.b.c", 1)
            await ctx.store.set("a.x.y", [2])
            await ctx.store.set("e", {"f": 0})
            await ctx.store.set("e.g.h", 3.0)
            return StopEvent(result=await ctx.store.get("a.b.c"))

    wf = Paths(store=tmp_path / "log.db", timeout=10)

    async def body() -> str:
        handler = wf.run()
        assert await handler == 1
        return handler.run_id

    try:
        context = wf.state_at(asyncio.run(body())).context
    finally:
        wf.store.close()
    want = {"a": {"b": {"c": 1}, "x": {"y": [2]}}, "e": {"f": 0, "g": {"h": 3.0}}}
    assert shape({k: context[k] for k in context}) == shape(want)


class KeptViews(Workflow):
    """Keeps what ``get`` returned in one step and sets values made from it in later ones."""

    kept: dict[str, Any] = {}  # noqa: RUF012 - the views kept between steps

    @step
    async def go(self, ctx: Context, ev: StartEvent | Next) -> Next | StopEvent:
        i = ev.i if isinstance(ev, Next) else 0
        if i == 0:
            await ctx.store.set("items", ["a"])
            await ctx.store.set("d", {"a": 1})
        elif i == 1:
            self.kept = {"items": await ctx.store.get("items"), "d": await ctx.store.get("d")}
            items = await ctx.store.get("items")  # the same view as the kept one
            items.append("b")
            await ctx.store.set("items", items)
            d = await ctx.store.get("d")
            d["b"] = 2
            await ctx.store.set("d", d)
        elif i == 2:
            await ctx.store.set("items", self.kept["items"] + ["c"])
            await ctx.store.set("d", {**self.kept["d"], "c": 3.0})
        else:
            await ctx.store.set("items", self.kept["items"])
            return StopEvent(result=[await ctx.store.get("items"), await ctx.store.get("d")])
        return Next(i=i + 1)


def test_a_view_kept_from_an_earlier_step_is_a_plain_value_later(tmp_path: Path) -> None:
    """A view kept across steps shows the value as it was when read: what is set from it
    later folds to exactly that (not to its patch replayed onto what changed since)."""
    wf = KeptViews(store=tmp_path / "log.db", timeout=10)

    async def body() -> tuple[Any, str]:
        handler = wf.run()
        result = await handler
        await wf.store.flush()
        return result, handler.run_id

    try:
        result, run_id = asyncio.run(body())
        context = wf.state_at(run_id).context
    finally:
        wf.store.close()
    want_items, want_d = ["a", "b"], {"a": 1, "b": 2, "c": 3.0}
    assert shape([list(result[0]), dict(result[1])]) == shape([want_items, want_d])
    assert shape(context["items"]) == shape(want_items)
    assert shape(context["d"]) == shape(want_d)
