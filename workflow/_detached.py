"""``InMemoryStateStore(MyState())``: a state store of its own, with no run behind it.

LlamaIndex builds its in-memory store from a state (tests, helpers, a store handed around
outside a workflow). Here every context's store is its run's log, so such a store stands
on :class:`Detached`, a host that keeps the values in memory as LlamaIndex's store does:
nothing is journaled, so a value is kept as given (any object) and handed out as it is
(a caller that mutates what it read changes the store's value), and a dotted ``set``
copies only the containers on its path. ``to_dict`` / ``from_dict`` carry it as
LlamaIndex's ``store_type: "in_memory"`` dict (a value the serializer cannot write fails
there, as in LlamaIndex).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from eventstore import Codec

from ._errors import ContextSerdeError
from ._values import register_views

if TYPE_CHECKING:
    from .context.serializers import BaseSerializer

__all__ = [
    "Detached",
    "copy_for_edit",
    "detached_codec",
    "initial_values",
    "state_dict",
    "state_from_dict",
]


def detached_codec(state_type: type | None, proxy: type[dict[str, Any]]) -> Codec:
    """A codec for a store of its own: the state model, the store's views, and ``proxy``
    (the untyped state's dict class) written as a dict."""
    codec = Codec()
    if state_type is not None:
        codec.register(state_type)
    register_views(codec)
    codec.register_proxy(proxy, dict)
    return codec


def copy_for_edit(state: Any) -> Any:
    """The state an ``edit_state()`` block of a store of its own edits: each value a deep
    copy (what the block changes reaches the store only at its end, as in LlamaIndex), a
    value that cannot be copied (a live handle) shared."""
    if isinstance(state, BaseModel):
        values = {name: _copy_or_share(getattr(state, name)) for name in type(state).model_fields}
        return type(state).model_construct(**values)
    out = type(state)()
    for k, v in state.items():
        out[k] = _copy_or_share(v)
    return out


def _copy_or_share(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


def initial_values(state: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """The keys and values a store built from ``state`` starts with: a model's fields (all
    of them, defaults included), or a dict's items."""
    if isinstance(state, BaseModel):
        return {name: getattr(state, name) for name in type(state).model_fields}
    return dict(state)


class Detached:
    """What a store of its own reads and writes: values in memory, kept as given.

    It stands where the executor stands for a run's store (``ContextStore.host``): every
    read and write is outside an attempt, so only ``codec``, ``committed``, ``versions`` and
    ``operator_update`` are used; ``state_lock`` serialises its ``edit_state`` blocks.
    """

    def __init__(self, codec: Codec, values: Mapping[str, Any]) -> None:
        self._codec = codec
        self._committed: dict[str, Any] = {}
        self._versions: dict[str, int] = {}
        self._writes = 0
        self._lock = asyncio.Lock()
        self._apply(values, [])

    @property
    def codec(self) -> Codec:
        return self._codec

    @property
    def committed(self) -> dict[str, Any]:
        return self._committed

    @property
    def versions(self) -> dict[str, int]:
        return self._versions

    @property
    def keylog(self) -> dict[str, list[int]]:
        return {}

    @property
    def state_lock(self) -> asyncio.Lock:
        return self._lock

    def pin(self, key: str) -> None:
        """Nothing to pin: no attempt reads a store of its own."""

    async def operator_update(
        self,
        updates: Mapping[str, Any],
        deletes: list[str] | None = None,
        *,
        read: Mapping[str, int] | None = None,
    ) -> int:
        """Writes ``updates`` and removes ``deletes``; ``read`` is not checked (this store is
        written only by its own calls, each applied whole before the next)."""
        return self._apply(updates, deletes or [])

    def _apply(self, updates: Mapping[str, Any], deletes: list[str]) -> int:
        self._writes += 1
        for k, v in updates.items():
            self._committed[k] = v
            self._versions[k] = self._writes
        for k in deletes:
            self._committed.pop(k, None)
            self._versions[k] = self._writes
        return self._writes


def state_dict(
    values: Mapping[str, Any], state_type: type | None, serializer: BaseSerializer | None
) -> dict[str, Any]:
    """LlamaIndex's dict of an in-memory store: the state serialized whole, with its type."""
    from .context.serializers import JsonSerializer

    if state_type is not None:
        state: Any = state_type.model_construct(**values)  # type: ignore[attr-defined]
        name, module = state_type.__qualname__, state_type.__module__
    else:
        state, name, module = dict(values), "DictState", "workflow.context.state_store"
    text = (serializer or JsonSerializer()).serialize(state)
    return {
        "store_type": "in_memory",
        "state_type": name,
        "state_module": module,
        "state_data": text,
    }


def state_from_dict(data: Any, serializer: BaseSerializer | None) -> Any:
    """The state :func:`state_dict` wrote (a model, or a dict of the untyped state).

    :raises ContextSerdeError: ``data`` is not such a dict, or its state cannot be read.
    """
    from .context.serializers import JsonSerializer

    store_type = data.get("store_type", "in_memory") if isinstance(data, dict) else None
    if isinstance(store_type, str) and store_type != "in_memory":
        msg = (
            f"Cannot parse store_type {store_type!r} as an in-memory state:"
            " InMemoryStateStore.from_dict takes the dict its to_dict() wrote"
            " (store_type 'in_memory')"
        )
        raise ContextSerdeError(msg)
    if store_type != "in_memory" or not isinstance(data.get("state_data"), str):
        msg = (
            "InMemoryStateStore.from_dict takes the dict its to_dict() wrote"
            f" (store_type 'in_memory', state_data text), not {_show(data)}"
        )
        raise ContextSerdeError(msg)
    try:
        state = (serializer or JsonSerializer()).deserialize(data["state_data"])
    except Exception as exc:
        msg = f"InMemoryStateStore.from_dict could not read its state_data: {exc}"
        raise ContextSerdeError(msg) from exc
    if not isinstance(state, BaseModel | Mapping):
        msg = (
            f"InMemoryStateStore.from_dict: state_data holds a {type(state).__name__}, not a state"
        )
        raise ContextSerdeError(msg)
    return state


def _show(data: Any) -> str:
    if isinstance(data, dict):
        return f"a dict with store_type {data.get('store_type')!r}"
    return f"a {type(data).__name__}"
