"""What an executor is given of the workflow whose run it executes: a frozen configuration.

The executor never holds the :class:`~workflow.Workflow`: the workflow builds this when a
run starts (its settings as they are then) and hands it over, as a worker hands a workflow
instance its frozen details. ``instance`` is the object the steps are methods of, passed only
as their ``self``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from eventstore import Codec, EventStore, NewRun

if TYPE_CHECKING:
    from ._graph import Graph
    from ._ownership import LeaseOwners, Owners
    from .resource import ResourceManager

__all__ = ["DEFAULT_FAILURE_GRACE", "RunConfig"]

# Seconds that attempts still running get to commit when another step's failure fails the
# run (``Workflow.failure_grace``).
DEFAULT_FAILURE_GRACE: Final = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """A run's settings, fixed when its executor is made.

    :param name: the workflow's recorded name (``module:QualName``).
    :param slot: waits until the workflow may execute one more run (``num_concurrent_runs``),
        given the future the run's end resolves, which frees the slot.
    :param commit_hook: a test hook called with (executor, seq) after each commit that
        changed state took effect.
    :param deprecated: the patch ids the workflow declares deprecated
        (``deprecated_patches``): its sessions' start records name them (``_patches``).
    """

    name: str
    graph: Graph
    codec: Codec
    store: EventStore
    owners: Owners | LeaseOwners
    timeout: float | None
    verbose: bool
    failure_grace: float
    sleep_threshold: float
    max_recovery: int
    catchers: Mapping[str, tuple[str, int]]
    renames: Mapping[str, str]
    state_type: type | None
    resources: ResourceManager
    instance: Any
    slot: Callable[[asyncio.Future[Any]], Awaitable[None]]
    commit_hook: Callable[[Any, int], None] | None = None
    deprecated: tuple[str, ...] = ()

    def new_run(self) -> NewRun:
        """The runs row a new run of this workflow starts with."""
        return NewRun(meta={"workflow": self.name}, status="running")
