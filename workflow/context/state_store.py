"""LlamaIndex's ``workflows.context.state_store`` names: the untyped state and the store.

``DictState`` is the state a context has when its steps name no state model
(``Context`` or ``Context[DictState]``): what ``ctx.store.get_state()`` and
``async with ctx.store.edit_state() as state`` give, a dict whose keys are also attributes
(``state["foo"] = 1``, ``state.bar = 2``). ``Context[DictState]`` is the same as ``Context``.

``StateStore`` is the class of ``ctx.store`` (for type hints): here the store of every
context is the run's log, so there is one class, whatever the workflow's store; LlamaIndex's
``InMemoryStateStore`` names it too (``isinstance(ctx.store, InMemoryStateStore)``), but is
not built from a state (``InMemoryStateStore(MyState())`` says so).
"""

from __future__ import annotations

from .._context_store import ContextStore
from .._context_store import StateDict as DictState

__all__ = ["DictState", "InMemoryStateStore", "StateStore"]

StateStore = ContextStore
InMemoryStateStore = ContextStore
