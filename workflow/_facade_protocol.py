"""What the engine's modules use of the Workflow facade, as a protocol defined below them.

The handler, the facade's control of runs (``_facade_control``) and the context's
lifecycle take a ``Facade``, never import ``_workflow``: the facade imports them, so an
import back would close a cycle. ``Workflow`` satisfies it structurally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from eventstore import Codec, EventStore, Record, RunInfo

    from ._events import Event, StartEvent
    from ._fold import Folded
    from ._graph import Graph
    from ._handler import WorkflowHandler
    from ._ownership import LeaseOwners, Owners
    from ._runner import Executor
    from ._state import RunState

__all__ = ["Facade"]


class Facade(Protocol):
    """A workflow as its handlers, its run control and its contexts see it."""

    _codec: Codec
    _graph: Graph
    _name: str
    _renames: dict[str, str]

    @property
    def _store(self) -> EventStore: ...

    @property
    def _owners(self) -> Owners | LeaseOwners: ...

    @property
    def workflow_name(self) -> str: ...

    def resume(self, run_id: str) -> WorkflowHandler: ...

    def _start_records(self, start_event: StartEvent) -> list[Record]: ...

    def state_at(self, run_id: str, seq: int | None = None) -> RunState: ...

    async def _post(self, run_id: str, event: Event, key: str | None) -> int: ...

    def _executor(
        self, run_id: str, folded: Folded | None, rid: int = 0, epoch: int = 1
    ) -> Executor: ...

    def _run_info(self, run_id: str) -> RunInfo: ...

    def _fold(self, run_id: str, seq: int | None) -> Folded: ...

    def _check_stranded(self, run_id: str, folded: Folded, allow: bool) -> None: ...

    def _recorded_stream(self, folded: Folded) -> list[Event]: ...
