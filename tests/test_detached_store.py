"""``InMemoryStateStore(state)``: a state store of its own, as LlamaIndex builds one outside
any workflow; and reads outside a step that hand out copies, never the committed value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from eventstore import EncodeError
from workflow import (
    Context,
    ContextSerdeError,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow.context.serializers import JsonSerializer, PickleSerializer
from workflow.context.state_store import DictState, InMemoryStateStore


class Profile(BaseModel):
    name: str = ""
    count: int = 0
    tags: list[str] = []
    extra: dict[str, Any] = {}


async def test_a_store_of_a_dict_state_gets_sets_paths_and_clears() -> None:
    store: InMemoryStateStore[DictState] = InMemoryStateStore(DictState())
    await store.set("name", "test")
    assert await store.get("name") == "test"
    await store.set("nested", {"key": "value"})
    await store.set("nested.more.deep", 2)  # missing parents become dicts
    assert await store.get("nested.key") == "value"
    assert await store.get("nested") == {"key": "value", "more": {"deep": 2}}
    assert await store.get("missing", default=None) is None
    await store.clear()
    assert await store.get("name", default=None) is None
    assert await store.get_state() == {}


async def test_a_store_of_a_model_starts_from_it_and_keeps_its_type() -> None:
    store = InMemoryStateStore(Profile(name="ada", tags=["a"]))
    state = await store.get_state()
    assert isinstance(state, Profile)
    assert (state.name, state.count, state.tags) == ("ada", 0, ["a"])
    async with store.edit_state() as edited:
        edited.count += 1
        edited.tags.append("b")
    assert await store.get("count") == 1
    assert await store.get("tags") == ["a", "b"]
    await store.set_state(Profile(name="bob"))
    assert (await store.get_state()).model_dump() == Profile(name="bob").model_dump()
    with pytest.raises(ValueError, match="the state is a Profile"):
        await store.set_state(DictState(name="x"))
    await store.clear()
    assert await store.get("name") == ""  # a typed field goes back to its default


async def test_a_store_of_its_own_shares_its_values_as_llamaindexs_does() -> None:
    """Nothing of a store of its own is journaled, so it keeps values as LlamaIndex's
    in-memory store does: as given, and handed out as they are (a caller mutating what it
    read changes the store's value); a dotted set copies only the containers on its path."""
    store = InMemoryStateStore(Profile())
    await store.set("tags", ["a"])
    (await store.get("tags")).append("b")
    snapshot = await store.get_state()
    snapshot.tags.append("c")
    assert await store.get("tags") == ["a", "b", "c"]
    given = {"k": [1], "sibling": {"keep": 1}}
    await store.set("extra", given)
    assert await store.get("extra") is given
    await store.set("extra.k", [2])
    after = await store.get("extra")
    assert after is not given  # the spine is new ...
    assert after["sibling"] is given["sibling"]  # ... what is off the path is shared
    assert given["k"] == [1]  # and what a reader held before is not changed


class Handle:
    """A live object (a client, a lock's holder) kept in a store of its own."""

    def __init__(self) -> None:
        self.slot = 0


async def test_a_store_of_its_own_keeps_any_object_and_writes_through_it() -> None:
    store = InMemoryStateStore(DictState())
    live = Handle()
    await store.set("live", live)
    await store.set("live.slot", 7)
    assert await store.get("live") is live
    assert live.slot == 7
    await store.set("f", lambda: 1)  # kept, as in LlamaIndex: only to_dict needs it encodable
    with pytest.raises(EncodeError, match="cannot encode"):
        store.to_dict()


@pytest.mark.parametrize("serializer", [None, JsonSerializer(), PickleSerializer()])
async def test_to_dict_and_from_dict_carry_the_state(serializer: JsonSerializer | None) -> None:
    store = InMemoryStateStore(Profile(name="ada", tags=["x"], extra={"n": (1, 2)}))
    data = store.to_dict(serializer)
    assert data["store_type"] == "in_memory"
    assert (data["state_type"], data["state_module"]) == ("Profile", __name__)
    back = InMemoryStateStore.from_dict(data, serializer)
    state = await back.get_state()
    assert isinstance(state, Profile)
    assert state.extra == {"n": (1, 2)}  # a tuple stays a tuple
    assert state.model_dump() == (await store.get_state()).model_dump()
    untyped = InMemoryStateStore(DictState(a=1))
    assert await InMemoryStateStore.from_dict(untyped.to_dict()).get("a") == 1


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"store_type": "sql", "state_data": "{}"}, "store_type 'sql'"),
        ({"store_type": "in_memory"}, "state_data text"),
        ({"store_type": "in_memory", "state_data": "{not json"}, "could not read"),
        ({"store_type": "in_memory", "state_data": "[1, 2]"}, "holds a list"),
        ([1], "not a list"),
    ],
)
def test_from_dict_refuses_what_to_dict_did_not_write(data: Any, match: str) -> None:
    with pytest.raises(ContextSerdeError, match=match):
        InMemoryStateStore.from_dict(data)


class Counter(Workflow):
    @step
    async def count(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("seen", {"n": 1})
        return StopEvent(result=await ctx.store.get("seen"))


async def test_an_idle_context_takes_a_dotted_path_and_hands_out_copies(tmp_path: Path) -> None:
    """Outside a step a dotted ``set`` rewrites its key (LlamaIndex accepts it there too), and
    what a read returns can be mutated without changing what the next run starts from."""
    wf = Counter(store=tmp_path / "c.db")
    ctx = Context(wf)
    await wf.run(ctx=ctx)
    await ctx.store.set("seen.by", "operator")
    (await ctx.store.get("seen"))["by"] = "leaked"
    assert await ctx.store.get("seen") == {"n": 1, "by": "operator"}
    handler = wf.run(ctx=ctx, start_event=StartEvent())
    assert await handler == {"n": 1}
    assert wf.state_at(handler.run_id).context["seen"] == {"n": 1}


class Other(BaseModel):
    name: str = ""


class Base(BaseModel):
    name: str = ""


class Derived(Base):
    count: int = 0


async def test_a_typed_state_takes_its_fields_only() -> None:
    """As in LlamaIndex: a key that is no field, or a model that is neither the state's
    nor one of its bases, is refused naming it; nothing changes."""
    store = InMemoryStateStore(Derived(name="a"))
    with pytest.raises(ValueError, match='"Derived" object has no field "nope"'):
        await store.set("nope", 1)
    with pytest.raises(ValueError, match="not Other"):
        await store.set_state(Other(name="x"))
    await store.set_state(Base(name="b"))  # a base: its fields replaced
    state = await store.get_state()
    assert (state.name, state.count) == ("b", 0)


async def test_set_state_of_a_dict_state_replaces_it() -> None:
    store = InMemoryStateStore(DictState(a=1, b=2))
    await store.set_state(DictState(q=1))
    assert await store.get_state() == {"q": 1}


class Replaces(Workflow):
    @step
    async def swap(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("old", 1)
        await ctx.store.set_state(DictState(new=2))
        return StopEvent(result=dict(await ctx.store.get_state()))


async def test_set_state_inside_a_step_replaces_the_untyped_state(tmp_path: Path) -> None:
    wf = Replaces(store=tmp_path / "r.db")
    ctx = Context(wf)
    await ctx.store.set("kept_before", 0)
    handler = wf.run(ctx=ctx)
    assert await handler == {"new": 2}
    assert wf.state_at(handler.run_id).context == {"new": 2}


class Unique:
    """A value that refuses a deep copy (a live handle)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Unique:
        raise TypeError("cannot copy a live handle")


async def test_an_edit_of_a_store_of_its_own_is_its_copy_until_the_block_ends() -> None:
    handle = Unique()
    store = InMemoryStateStore(DictState(nums=[1], handle=handle))
    async with store.edit_state() as state:
        state["nums"].append(2)
        assert await store.get("nums") == [1]  # a read meanwhile: the store's value
        assert state["handle"] is handle  # what cannot be copied is shared
    assert await store.get("nums") == [1, 2]
    assert await store.get("handle") is handle
