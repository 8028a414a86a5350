"""What the modules below the facade read of a workflow: its parts, as a protocol.

A ``Workflow`` keeps what it is made of (its name, graph, codec, store, ...) in one object,
``wf.__workflow_parts__`` (:class:`~workflow._facade_parts.WorkflowParts`), with public names
on it. The workflow itself gains no public attribute that could clash with a user's step
or attribute, and no module reads the workflow's private names: a module that needs its
codec reads ``wf.__workflow_parts__.codec``. The context (``_context``) and the handler
(``_handler``) sit below the module that defines the parts, so they read them through
:class:`OwnerParts`; the rest of the engine through the concrete class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from eventstore import Codec, EventStore

    from ._events import Event
    from ._graph import Graph
    from ._ownership import LeaseOwners, Owners

__all__ = ["OwnerParts"]


class OwnerParts(Protocol):
    """The parts of a workflow that its contexts and handlers use."""

    @property
    def name(self) -> str:
        """The workflow's class as the log records it (``module:QualName``)."""
        ...

    @property
    def graph(self) -> Graph: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def state_type(self) -> type | None:
        """The state model its steps' contexts name (None: untyped state)."""
        ...

    @property
    def store(self) -> EventStore: ...

    @property
    def owners(self) -> Owners | LeaseOwners: ...

    async def post(self, run_id: str, event: Event, key: str | None) -> int:
        """Records ``event`` in the inbox of run ``run_id`` (once per ``key``)."""
        ...
