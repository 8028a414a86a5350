"""A workflow's parts: what it is made of, and what the engine's modules do with them.

``Workflow.__init__`` builds one :class:`WorkflowParts` and keeps it as
``wf.__workflow_parts__``: the one place the modules below the facade (its run control, the
context's lifecycle, ``verify``, ``recover``, the CLI, the UI) read the workflow's name,
graph, codec, store and owners, start its runs' first records and make their executors. Its
names are public, so no module reads a private name of the workflow; the workflow gains no
public attribute (a dunder name cannot clash with a user's step or attribute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._fold import rename_steps
from ._read import fold_run, run_info
from ._renames import moves_for
from ._run_config import DEFAULT_FAILURE_GRACE, RunConfig
from ._runner import Executor
from ._start_events import (
    checked_start_event,
    first_records,
    fork_started_record,
    run_started_record,
)
from ._state_versions import resume_upcast, state_tag
from ._stranded import check_stranded
from ._timers import DEFAULT_SLEEP_THRESHOLD

if TYPE_CHECKING:
    from eventstore import Codec, EventStore, Record, RunInfo

    from ._events import Event, StartEvent
    from ._facade_build import RunSlots
    from ._fold import Folded
    from ._graph import Graph
    from ._ownership import LeaseOwners, Owners
    from ._renames import Renames
    from .context.serializers import BaseSerializer
    from .resource import ResourceManager

__all__ = ["WorkflowParts"]


@dataclass(eq=False, kw_only=True)
class WorkflowParts:
    """What a workflow is made of (``wf.__workflow_parts__``), fixed when it is made.

    :param instance: the workflow object itself (its steps' ``self``).
    :param start_class: the start event class its runs take now (a workflow may override
        its graph's, as LlamaIndex's ``_start_event_class``).
    :param script_runs: runs recorded under ``__main__`` with this class's name: whether
        each is this workflow's (``recover`` asks once per run).
    :param commit_hook: a test hook called with (executor, seq) after each commit that
        changed state took effect in memory.
    :param deprecated: the patch ids its class declares deprecated (``deprecated_patches``),
        which each session start it writes names (``_patches``).
    """

    instance: Any
    name: str
    graph: Graph
    codec: Codec
    state_type: type | None
    store: EventStore
    owners: Owners | LeaseOwners
    renames: Renames
    timeout: float | None
    verbose: bool
    max_recovery: int
    catchers: Mapping[str, tuple[str, int]]
    resources: ResourceManager
    slots: RunSlots
    start_class: Callable[[], type[StartEvent]]
    script_runs: dict[str, bool] = field(default_factory=dict)
    commit_hook: Callable[[Executor, int], None] | None = None
    deprecated: tuple[str, ...] = ()

    # ------------------------------------------------------------------ runs it starts

    def run_config(self) -> RunConfig:
        """The workflow's settings as a run started now sees them."""
        wf = self.instance
        return RunConfig(
            name=self.name,
            graph=self.graph,
            codec=self.codec,
            store=self.store,
            owners=self.owners,
            timeout=self.timeout,
            verbose=self.verbose,
            failure_grace=float(getattr(wf, "failure_grace", DEFAULT_FAILURE_GRACE)),
            sleep_threshold=getattr(wf, "sleep_threshold", DEFAULT_SLEEP_THRESHOLD),
            max_recovery=self.max_recovery,
            catchers=self.catchers,
            renames=self.renames,
            state_type=self.state_type,
            resources=self.resources,
            instance=wf,
            slot=self.slots.take,
            commit_hook=self.commit_hook,
            deprecated=self.deprecated,
        )

    def executor(
        self, run_id: str, folded: Folded | None, rid: int = 0, epoch: int = 1
    ) -> Executor:
        """An executor for ``run_id``, to go on from ``folded`` (None: a new run).

        :raises WorkflowValidationError: the workflow's steps do not make a valid graph
            (checked before its first run).
        """
        self.instance.__check_graph__()
        return Executor(self.run_config(), run_id, rid, epoch, folded)

    def start_event(self, given: StartEvent | None, fields: dict[str, Any]) -> StartEvent:
        """The start event: the one given, or the start step's class built from ``fields``."""
        qualname = type(self.instance).__qualname__
        return checked_start_event(self.graph, self.start_class(), qualname, given, fields)

    def start_records(
        self,
        start_event: StartEvent,
        context: Iterable[Record] = (),
        previous: tuple[str, int] | None = None,
    ) -> list[Record]:
        """A new run's first commit (:func:`~workflow._start_events.first_records`)."""
        state = state_tag(self.state_type)
        return first_records(
            self.name,
            self.graph,
            self.codec,
            start_event,
            context,
            previous,
            state,
            self.deprecated,
        )

    def run_started(
        self, start_id: int, start: Any, previous: tuple[str, int] | None = None
    ) -> Record:
        """The ``run_started`` record of a run of this workflow."""
        state = state_tag(self.state_type)
        return run_started_record(
            self.name, self.graph, self.codec, start_id, start, previous, state, self.deprecated
        )

    def fork_point(
        self, parent_id: str, seq: int | None
    ) -> tuple[Folded, dict[str, str], list[Record]]:
        """What a fork of ``parent_id`` at ``seq`` goes on from: the parent's fold with its
        work under steps renamed since moved (the moves, which the fork's first record
        names), checked to fit a step now; and the records of its context's upcast.

        :raises WorkflowChangedError: its queued or in-progress work fits no step now.
        """
        folded = self.fold(parent_id, seq)
        renamed = moves_for(folded, self.renames)
        rename_steps(folded, renamed)
        self.check_stranded(parent_id, folded, False)
        return folded, renamed, resume_upcast(parent_id, folded, self.codec, self.state_type)

    def fork_started(self, parent: tuple[str, int], renamed: dict[str, str]) -> Record:
        """The first record of a fork of run ``parent[0]`` at seq ``parent[1]``."""
        state = state_tag(self.state_type)
        return fork_started_record(
            self.name, self.graph, self.codec, parent, renamed, state, self.deprecated
        )

    def check_stranded(self, run_id: str, folded: Folded, allow: bool) -> None:
        """Refuses to go on with ``folded`` when its work fits no step now (unless ``allow``)."""
        wf_class = type(self.instance)
        check_stranded(run_id, folded, self.graph, self.codec, wf_class, self.name, allow=allow)

    async def post(self, run_id: str, event: Event, key: str | None) -> int:
        """Records ``event`` in the inbox of run ``run_id`` (once per ``key``)."""
        text = self.codec.encode(event, name=type(event).__name__)
        return await self.store.post(run_id, text, key=key)

    # ------------------------------------------------------------------ reading its runs

    def run_info(self, run_id: str) -> RunInfo:
        """The runs row of ``run_id``. :raises RunNotFoundError: no such run."""
        return run_info(self.store, run_id)

    def fold(self, run_id: str, seq: int | None) -> Folded:
        """The fold of the run's log up to ``seq`` (None: all of it)."""
        return fold_run(self.store, run_id, seq)

    def recorded_stream(self, folded: Folded) -> list[Event]:
        """The events the run streamed, as recorded, typed again."""
        return [self.codec.load(e.dump) for e in folded.stream]

    def context_dict_at(
        self, run_id: str, seq: int, serializer: BaseSerializer | None
    ) -> dict[str, Any]:
        """``Context.to_dict()`` of a context at ``seq`` of the run (``Checkpoint.ctx_state``)."""
        from ._context import Context

        ctx: Context[Any] = Context(self.instance)  # idle, pointing at ``seq`` of the run
        ctx.__context_link__.run_id = run_id
        ctx.__context_link__.idle.seq = seq
        return ctx.to_dict(serializer)
