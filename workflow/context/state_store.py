"""LlamaIndex's ``workflows.context.state_store`` names: the untyped state and the store.

``DictState`` is the state a context has when its steps name no state model
(``Context`` or ``Context[DictState]``): what ``ctx.store.get_state()`` and
``async with ctx.store.edit_state() as state`` give, a dict whose keys are also attributes
(``state["foo"] = 1``, ``state.bar = 2``). ``Context[DictState]`` is the same as ``Context``.

``StateStore`` is the class of ``ctx.store`` (for type hints): here the store of every
context is the run's log, so there is one class, whatever the workflow's store; LlamaIndex's
``InMemoryStateStore`` names it too (``isinstance(ctx.store, InMemoryStateStore)``). Built
from a state, as LlamaIndex builds one (``InMemoryStateStore(MyState())``,
``InMemoryStateStore(DictState())``), it is a store of its own with no run behind it: the
same calls, its values kept in memory as LlamaIndex's store keeps them (any object, handed
out as it is; nothing of it is journaled), ``to_dict(serializer)`` /
``InMemoryStateStore.from_dict(data, serializer)`` in LlamaIndex's ``store_type: "in_memory"``
form.
"""

from __future__ import annotations

from .._context_store import ContextStore
from .._state_dict import StateDict as DictState

__all__ = ["DictState", "InMemoryStateStore", "StateStore"]

StateStore = ContextStore
InMemoryStateStore = ContextStore
