"""What the engine's modules use of the Workflow facade, as a protocol defined below them.

The facade's run control (``_facade_control``), the context's lifecycle (``_lifecycle``,
``_context_dict``, ``_context_run``), child runs, ``recover`` and ``verify`` take a
``Facade``, never import ``_workflow``: the facade imports them, so an import back would
close a cycle. ``Workflow`` satisfies it structurally; :func:`is_workflow` tells one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ._context import Context, ContextOwner
from ._handler import HandlerOwner

if TYPE_CHECKING:
    from eventstore import EventStore, Record, RunInfo

    from ._events import Event, StartEvent
    from ._fold import Folded
    from ._graph import Graph
    from ._handler import WorkflowHandler
    from ._read import RunSummary
    from ._renames import Renames
    from ._run_config import RunConfig
    from ._runner import Executor
    from ._state import Checkpoint
    from .resource import ResourceManager

__all__ = ["Facade", "is_workflow"]


def is_workflow(obj: object) -> bool:
    """Whether ``obj`` is a workflow or a workflow class (it carries context services)."""
    return getattr(obj, "__context_services__", None) is not None


class Facade(ContextOwner, HandlerOwner, Protocol):
    """A workflow as the modules below its facade see it."""

    _graph: Graph
    _renames: Renames
    _timeout: float | None
    _resource_manager: ResourceManager
    _script_runs: dict[str, bool]

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

    def _run_config(self) -> RunConfig: ...

    def _executor(
        self, run_id: str, folded: Folded | None, rid: int = 0, epoch: int = 1
    ) -> Executor: ...

    def _run_info(self, run_id: str) -> RunInfo: ...

    def _fold(self, run_id: str, seq: int | None) -> Folded: ...

    def _check_stranded(self, run_id: str, folded: Folded, allow: bool) -> None: ...

    def _recorded_stream(self, folded: Folded) -> list[Event]: ...

    def _start_event(self, given: StartEvent | None, fields: dict[str, Any]) -> StartEvent: ...

    def _start_records(
        self,
        start_event: StartEvent,
        context: Iterable[Record] = (),
        previous: tuple[str, int] | None = None,
    ) -> list[Record]: ...

    def _run_started(
        self, start_id: int, start: Any, previous: tuple[str, int] | None = None
    ) -> Record: ...

    def _resume(
        self,
        run_id: str,
        updates: dict[str, Any] | None,
        *,
        cancelled: bool = False,
        allow_stranded: bool = False,
        deletes: list[str] | None = None,
    ) -> WorkflowHandler: ...

    def _run_from(
        self,
        checkpoint: Checkpoint | tuple[str, int] | dict[str, Any],
        updates: dict[str, Any] | None,
        deletes: list[str] | None = None,
    ) -> WorkflowHandler: ...
