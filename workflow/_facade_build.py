"""What a Workflow builds once, when it is made: its codec, who may own its runs, and
the slots that bound how many execute at once.

``Workflow.__init__`` checks its arguments and its steps, then calls these; the facade
keeps what they return and hands it to every run as its
:class:`~workflow._run_config.RunConfig`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from eventstore import Codec, EventStore

from ._diff import register_views
from ._graph import Graph
from ._ownership import LEASE_TTL_S, LeaseOwners, Owners
from ._state_dict import StateDict
from ._step import state_model

__all__ = ["RunSlots", "owners_for", "workflow_codec"]


def workflow_codec(
    cls: type, base: type, graph: Graph, types: Iterable[type], *, allow_pickle: bool
) -> tuple[Codec, type | None]:
    """The codec of workflow class ``cls`` (a subclass of ``base``, ``Workflow``) and the
    state model its steps' contexts name (None: untyped state).

    It knows the steps' event classes, ``types``, the state model, the views
    ``ctx.store.get`` hands out, and this module's
    classes under ``__main__`` (a run of ``python flows.py`` records them so); the
    facade adds the moved classes its ``renamed`` names (``_renames.class_aliases``).
    """
    codec = Codec(
        allow_pickle=allow_pickle,
        how_to_register=(
            "Workflow(types=[{name}]), or if it was renamed or moved since, map its recorded"
            " name to the new class in the workflow's renamed = {{'module:{name}': NewClass}}"
        ),
        how_to_allow_pickle="Workflow(allow_pickle=True)",
    )
    codec.register(*graph.event_types(), *types)
    # Views handed out by ctx.store.get are written as the value they show.
    register_views(codec)
    # The untyped state get_state() gives is a dict whose keys are also attributes.
    codec.register_proxy(StateDict, dict)
    state_type: type | None = state_model(graph.steps, cls.__name__)
    if state_type is not None:
        codec.register(state_type)
    # A run of `python flows.py` records this module's classes as __main__:X.
    codec.alias_main(*(c.__module__ for c in cls.__mro__ if issubclass(c, base) and c is not base))
    return codec, state_type


def owners_for(store: EventStore, lease_ttl: float | None) -> Owners | LeaseOwners:
    """Who owns which run of ``store``: kernel locks need a file (one machine); a shared
    PostgreSQL store needs leases (``lease_ttl`` seconds; None: the default)."""
    if store.kind == "postgres":
        return LeaseOwners(store, lease_ttl or LEASE_TTL_S)
    sidecar = store.path if store.kind == "sqlite" else None
    return Owners(sidecar, memory_key=str(id(store)))


class RunSlots:
    """At most ``limit`` runs of one workflow instance execute at once, per event loop
    (``num_concurrent_runs``; None: no limit); more wait for one to end."""

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._by_loop: dict[int, asyncio.Semaphore] = {}

    async def take(self, done: asyncio.Future[Any]) -> None:
        """Waits until fewer than ``limit`` runs execute; ``done`` resolving frees the slot."""
        if self._limit is None:
            return
        loop = asyncio.get_running_loop()
        sem = self._by_loop.get(id(loop))
        if sem is None:
            sem = self._by_loop[id(loop)] = asyncio.Semaphore(self._limit)
        await sem.acquire()
        done.add_done_callback(lambda _: sem.release())
