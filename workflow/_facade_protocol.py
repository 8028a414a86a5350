"""What the engine's modules use of the Workflow facade, as a protocol defined below them.

The facade's run control (``_facade_control``), the context's lifecycle (``_lifecycle``,
``_context_dict``, ``_context_run``), child runs, ``recover`` and ``verify`` take a
``Facade``, never import ``_workflow``: the facade imports them, so an import back would
close a cycle. ``Workflow`` satisfies it structurally; :func:`is_workflow` tells one. What
they need besides its public API they read from its parts (``wf.__workflow_parts__``,
:class:`~workflow._facade_parts.WorkflowParts`), never from its private names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ._context import Context, ContextOwner
from ._handler import HandlerOwner

if TYPE_CHECKING:
    from eventstore import EventStore

    from ._events import Event, StartEvent
    from ._facade_parts import WorkflowParts
    from ._handler import WorkflowHandler
    from ._read import RunSummary

__all__ = ["Facade", "is_workflow"]


def is_workflow(obj: object) -> bool:
    """Whether ``obj`` is a workflow or a workflow class (it carries context services)."""
    return getattr(obj, "__context_services__", None) is not None


class Facade(ContextOwner, HandlerOwner, Protocol):
    """A workflow as the modules below its facade see it: its public API and its parts."""

    @property
    def __workflow_parts__(self) -> WorkflowParts: ...

    @property
    def store(self) -> EventStore: ...

    def run(
        self,
        ctx: Context[Any] | None = None,
        start_event: StartEvent | None = None,
        *,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> WorkflowHandler: ...

    def resume(
        self,
        run_id: str,
        updates: dict[str, Any] | None = None,
        *,
        cancelled: bool = False,
        allow_stranded: bool = False,
    ) -> WorkflowHandler: ...

    def runs(self, *, all_workflows: bool = True) -> list[RunSummary]: ...

    def pending_runs(self) -> list[str]: ...

    def send(self, run_id: str, event: Event, idempotency_key: str | None = None) -> int: ...
