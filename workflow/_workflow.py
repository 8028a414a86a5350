"""Workflow: run, resume, fork, send, and read any run's state at any seq."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from eventstore import (
    Codec,
    Commit,
    EventStore,
    NewRun,
    Record,
    RunInfo,
    class_name,
)

from ._catch_error import catchers
from ._changes import encode_updates
from ._checkpoints import checkpoints
from ._context_store import StateDict
from ._diff import register_views
from ._errors import (
    RunFinishedError,
    WorkflowRuntimeError,
    WorkflowValidationError,
)
from ._events import Event, StartEvent, StopEvent
from ._fold import Folded, rename_steps, to_run_state
from ._graph import Graph
from ._handler import WorkflowHandler
from ._live_runs import live_executor, register
from ._ownership import LEASE_TTL_S, LeaseOwners, Owners
from ._prune import PruneReport, prune_runs
from ._read import RunSummary, fold_run, refuse_cut, run_info, run_summaries, shown_status
from ._recover import Recoveries, is_run_of
from ._recover import recover as recover_runs
from ._renames import class_aliases, moves_for, step_renames
from ._run_config import DEFAULT_FAILURE_GRACE, RunConfig
from ._runner import Executor
from ._start_events import (
    checked_start_event,
    first_records,
    run_started_record,
    start_event_of,
)
from ._state import TERMINAL, Checkpoint, RunState
from ._step import (
    GRAPH_CHECKS,
    STEP_ATTR,
    collect_steps,
    graph_checks,
    state_model,
    step_functions,
)
from ._stores import open_store
from ._stranded import check_stranded
from ._timers import DEFAULT_SLEEP_THRESHOLD
from .resource import ResourceManager, check_configs

if TYPE_CHECKING:
    from ._context import Context
    from .context.serializers import BaseSerializer

__all__ = ["RunSummary", "Workflow"]

_log = logging.getLogger("workflow")


class Workflow:
    """A set of steps that pass events; every run is journaled to an event store.

    :param store: a path to an SQLite file, a PostgreSQL URL, an :class:`EventStore`, or
        None: the store named by the ``WORKFLOW_STORE`` environment variable (a path or a
        URL) if it is set, else a private in-memory store (every run is still journaled
        and can be inspected).
    :param timeout: seconds of execution a run may take, summed across resumes (None: no
        limit). Time with nothing to do but wait for an event does not count.
    :param verbose: print each step as it runs and what it produced.
    :param types: more classes the codec may rebuild from the log (dataclasses, attrs
        classes, pydantic models, enums) besides those the steps' annotations name.
    :param max_recovery_attempts: how often an input may be started again by a resume
        without ever ending before the run fails (an input that kills the process).
    :param disable_validation: build without checking the step graph.
    :param workflow_name: the name ``workflow_name`` returns (default: ``module.QualName``).
    :param num_concurrent_runs: at most this many runs of this instance execute at once;
        more wait for one to end (None: no limit).
    :param skip_graph_checks: graph checks to skip (``"reachability"``, ``"terminal_event"``,
        ``"dead_end"``).
    :param allow_pickle: store values of types the codec does not (a plain class) as
        pickles, and read pickles back. Off by default: the log is then no longer plain
        JSON, and reading it runs whatever code it names, so read only logs you trust.
        Every program that reads such a run (resume, fork, ``state_at``) must opt in too.
    :param resource_manager: where the steps' resources are built and cached (a new one
        by default: cached resources are this workflow object's).
    :param lease_ttl: on a PostgreSQL store, the seconds a run's lease lasts unless its
        executor renews it (every third of that): how soon another host takes over the
        runs of a host that died or was cut off, and how long such a host's runs wait.
        None: :data:`~workflow._ownership.LEASE_TTL_S` (10 s). Stores on one machine need
        no lease: the kernel frees a dead process's runs at once.
    """

    # Seconds from which ctx.sleep() is durable (a wait the run is resumed from when due);
    # shorter sleeps just wait. A class attribute: set it on a subclass or an instance.
    sleep_threshold: float = DEFAULT_SLEEP_THRESHOLD
    # Seconds that attempts of other steps still running get to commit when a step's
    # failure fails the run, so that a resume does not pay for them again (0: none).
    failure_grace: float = 2.0

    # Free functions added as steps (``add_step``, ``@step(workflow=Cls)``), per class.
    _step_functions: ClassVar[dict[str, Callable[..., Any]]] = {}

    renamed: ClassVar[Mapping[str, str | type]] = {}
    """Old names of renamed steps and moved event classes -> their new ones, so that runs
    recorded before a deploy continue: ``{"old_step": "new_step", "old.mod:Cls": Cls}``.
    A resume moves such a run's pending work to the new step names (and records the move);
    old class names decode as the new class. See ``workflow/_renames.py``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._step_functions = {}

    # A test hook: called with (executor, seq) after each commit that changed state took
    # effect in memory, to compare the live state with the fold of the log.
    _commit_hook: Callable[[Executor, int], None] | None = None

    def __init__(
        self,
        store: str | os.PathLike[str] | EventStore | None = None,
        timeout: float | None = 45.0,
        verbose: bool = False,
        *,
        types: Iterable[type] = (),
        max_recovery_attempts: int = 10,
        disable_validation: bool = False,
        workflow_name: str | None = None,
        num_concurrent_runs: int | None = None,
        skip_graph_checks: Iterable[str] | None = None,
        allow_pickle: bool = False,
        resource_manager: ResourceManager | None = None,
        lease_ttl: float | None = None,
    ) -> None:
        if lease_ttl is not None and not lease_ttl > 0:
            msg = f"lease_ttl must be a positive number of seconds, not {lease_ttl!r}"
            raise ValueError(msg)
        skips = list(graph_checks(skip_graph_checks, GRAPH_CHECKS))
        if num_concurrent_runs is not None and num_concurrent_runs < 1:
            msg = f"num_concurrent_runs must be at least 1 (or None), not {num_concurrent_runs}"
            raise WorkflowValidationError(msg)
        self._skip_graph_checks = skips
        self._disable_validation = disable_validation
        self._workflow_name = workflow_name
        self._num_concurrent_runs = num_concurrent_runs
        self._run_slots: dict[int, asyncio.Semaphore] = {}
        self._graph = Graph(collect_steps(type(self)))
        # Which @catch_error handler takes over which step once it is out of retries.
        self._catchers = catchers(self._graph.steps, type(self).__name__)
        self._validate()
        # Resources are this object's, never the log's: a resume elsewhere builds its own.
        self._resource_manager = resource_manager or ResourceManager()
        self._store = open_store(store)
        self._timeout = timeout
        self._verbose = verbose
        self._max_recovery = max_recovery_attempts
        self._codec = Codec(
            allow_pickle=allow_pickle,
            how_to_register="Workflow(types=[{name}])",
            how_to_allow_pickle="Workflow(allow_pickle=True)",
        )
        self._codec.register(*self._graph.event_types(), *types)
        # Views handed out by ctx.store.get are written as the value they show.
        register_views(self._codec)
        # The untyped state get_state() gives is a dict whose keys are also attributes.
        self._codec.register_proxy(StateDict, dict)
        self._state_type: type | None = state_model(self._graph.steps, type(self).__name__)
        if self._state_type is not None:
            self._codec.register(self._state_type)
        # A run of `python flows.py` records this module's classes as __main__:X.
        self._codec.alias_main(
            *(
                c.__module__
                for c in type(self).__mro__
                if issubclass(c, Workflow) and c is not Workflow
            )
        )
        self._renames = step_renames(type(self), self._graph.steps)
        class_aliases(type(self), self._codec)
        # Kernel locks need a file (one machine); a shared PostgreSQL store needs leases.
        self._owners: Owners | LeaseOwners
        if self._store.kind == "postgres":
            self._owners = LeaseOwners(self._store, lease_ttl or LEASE_TTL_S)
        else:
            sidecar = self._store.path if self._store.kind == "sqlite" else None
            self._owners = Owners(sidecar, memory_key=str(id(self._store)))
        self._name = class_name(type(self))
        # Runs recorded under __main__ with this class's name: whether each is this one's.
        self._script_runs: dict[str, bool] = {}
        # On PostgreSQL an answer posted on any host wakes the run's owner at once (the
        # owner also polls, which is all SQLite needs).
        self._store.on_post(self._posted)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} store={self._store!r}>"

    # ------------------------------------------------------------------ LlamaIndex's API

    @classmethod
    def add_step(cls, func: Callable[..., Any]) -> None:
        """Adds a free function decorated with ``@step`` as a step of this class.

        ``@step(workflow=Cls)`` calls this. Instances built afterwards have the step.

        :raises WorkflowValidationError: ``func`` is not decorated with ``@step``, or the
            class already has a step by that name.
        """
        name = getattr(func, "__name__", repr(func))
        if not hasattr(func, STEP_ATTR):
            msg = f"Step function {name} is missing the `@step` decorator."
            raise WorkflowValidationError(msg)
        if name in step_functions(cls):
            msg = f"A step {name} is already part of this workflow, please choose another name."
            raise WorkflowValidationError(msg)
        cls._step_functions[name] = func

    def _get_steps(self) -> dict[str, Callable[..., Any]]:
        """Every step function, methods and added free functions, by name."""
        return step_functions(type(self))

    def _validate(self) -> bool:
        """Checks the step graph (unless built with ``disable_validation=True``).

        Returns whether the workflow asks humans (a step returns an InputRequiredEvent
        or takes a HumanResponseEvent), as LlamaIndex's does.
        """
        if self._disable_validation:
            return False
        steps = collect_steps(type(self), self._get_steps())
        graph = Graph(steps)
        graph.validate(type(self).__name__, self._skip_graph_checks)
        check_configs(
            {n: sp.resources for n, sp in steps.items() if sp.resources}, type(self).__name__
        )
        from ._events import HumanResponseEvent, InputRequiredEvent

        return any(
            issubclass(t, InputRequiredEvent) for s in steps.values() for t in s.returns
        ) or any(issubclass(t, HumanResponseEvent) for s in steps.values() for t in s.accepted)

    def validate(self) -> bool:
        """Checks the step graph even when built with ``disable_validation=True``."""
        Graph(collect_steps(type(self), self._get_steps())).validate(
            type(self).__name__, self._skip_graph_checks
        )
        return self._validate() if not self._disable_validation else False

    @property
    def workflow_name(self) -> str:
        """The name given as ``workflow_name=``, else ``module.QualName`` of the class."""
        if self._workflow_name is not None:
            return self._workflow_name
        cls = type(self)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def start_event_class(self) -> type[StartEvent]:
        """The StartEvent class the steps take."""
        return self._graph.start_event_class()

    @property
    def _start_event_class(self) -> type[StartEvent]:
        return self._start_override or self._graph.start_event_class()

    @_start_event_class.setter
    def _start_event_class(self, value: type[StartEvent]) -> None:
        self._start_override = value

    _start_override: type[StartEvent] | None = None

    @property
    def stop_event_class(self) -> type[StopEvent]:
        """The StopEvent class the steps return."""
        return self._graph.stop_event_class()

    @property
    def _stop_event_class(self) -> type[StopEvent]:
        return self._graph.stop_event_class()

    @property
    def events(self) -> list[type[Event]]:
        """Every event class the steps take or return."""
        return sorted(self._graph.event_types(), key=lambda t: t.__qualname__)

    def _get_start_event_instance(
        self, start_event: StartEvent | None, **kwargs: Any
    ) -> StartEvent:
        """The start event of a run (LlamaIndex's helper): the one given (keyword arguments
        beside it are ignored, with a warning), or the start class built from them.

        :raises WorkflowRuntimeError: the keyword arguments do not make a start event.
        """
        return start_event_of(self._start_event_class, start_event, kwargs)

    @property
    def store(self) -> EventStore:
        """The event store this workflow journals to."""
        return self._store

    # ------------------------------------------------------------------ starting runs

    def _start_event(self, given: StartEvent | None, fields: dict[str, Any]) -> StartEvent:
        """The start event: the one given, or the start step's class built from ``fields``."""
        return checked_start_event(
            self._graph, self._start_event_class, type(self).__qualname__, given, fields
        )

    def run(
        self,
        ctx: Context[Any] | None = None,
        start_event: StartEvent | None = None,
        *,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> WorkflowHandler:
        """Starts a run and returns its handler at once; call it inside async code.

        The keyword arguments become the fields of the start event. A ``run_id`` that
        already exists starts nothing: it is resumed (or its stored result returned).

        With ``ctx`` (LlamaIndex's ``run(ctx=ctx)``), the run goes on from that context,
        which is then bound to it: with a start event or keyword fields, a new run starts
        from the context's state (a chat turn); without them, the context's run continues
        unless it finished (then a new run starts with the default start event). Writes
        made on the context while it was idle open the run.

        :raises ContextStateError: the context's run is live (here or in another process).
        """
        _require_loop("run")
        if ctx is not None:
            from ._context_run import run_with_context

            return run_with_context(self, ctx, start_event, kwargs, run_id)
        start_event = self._start_event(start_event, kwargs)
        run_id = run_id or uuid.uuid4().hex
        if self._store.get_run(run_id) is not None:
            return self.resume(run_id)
        records = self._start_records(start_event)  # a start event the log cannot hold: here
        executor = self._executor(run_id, None)
        executor.next_id = 2
        handler = WorkflowHandler(self, run_id, executor.done, executor)
        executor.start(records, start_event)
        return handler

    def submit(
        self, *, start_event: StartEvent | None = None, run_id: str | None = None, **kwargs: Any
    ) -> str:
        """Records a new run for a worker to execute and returns its id at once.

        Nothing runs here: a :class:`~workflow.Worker` of this workflow (in this process or
        any other that shares the store) claims it. A ``run_id`` that exists is returned
        as it is (a run is submitted once).
        """
        start_event = self._start_event(start_event, kwargs)
        run_id = run_id or uuid.uuid4().hex
        if self._store.get_run(run_id) is not None:
            return run_id
        # "submitted" in its row: listings tell it, until a worker claims it, from a run
        # whose process died (its log looks the same).
        create = NewRun(meta={"workflow": self._name, "submitted": True}, status="running")
        self._store.append_sync(
            Commit(run_id, self._start_records(start_event), epoch=1, create=create)
        )
        return run_id

    def _start_records(
        self,
        start_event: StartEvent,
        context: Iterable[Record] = (),
        previous: tuple[str, int] | None = None,
    ) -> list[Record]:
        """A new run's first commit (:func:`~workflow._start_events.first_records`)."""
        return first_records(self._name, self._graph, self._codec, start_event, context, previous)

    def _run_started(
        self, start_id: int, start: Any, previous: tuple[str, int] | None = None
    ) -> Record:
        return run_started_record(self._name, self._graph, self._codec, start_id, start, previous)

    def _new_run(self) -> NewRun:
        return NewRun(meta={"workflow": self._name}, status="running")

    def _run_config(self) -> RunConfig:
        """This workflow's settings as a run started now sees them."""
        return RunConfig(
            name=self._name,
            graph=self._graph,
            codec=self._codec,
            store=self._store,
            owners=self._owners,
            timeout=self._timeout,
            verbose=self._verbose,
            failure_grace=float(getattr(self, "failure_grace", DEFAULT_FAILURE_GRACE)),
            sleep_threshold=getattr(self, "sleep_threshold", DEFAULT_SLEEP_THRESHOLD),
            max_recovery=self._max_recovery,
            catchers=self._catchers,
            renames=self._renames,
            state_type=self._state_type,
            resources=self._resource_manager,
            instance=self,
            slot=self._slot,
            commit_hook=self._commit_hook,
        )

    def _executor(
        self, run_id: str, folded: Folded | None, rid: int = 0, epoch: int = 1
    ) -> Executor:
        """An executor for ``run_id``, to go on from ``folded`` (None: a new run)."""
        return Executor(self._run_config(), run_id, rid, epoch, folded)

    async def _slot(self, done: asyncio.Future[Any]) -> None:
        """Waits until fewer than ``num_concurrent_runs`` runs of this instance execute."""
        if self._num_concurrent_runs is None:
            return
        loop = asyncio.get_running_loop()
        sem = self._run_slots.get(id(loop))
        if sem is None:
            sem = self._run_slots[id(loop)] = asyncio.Semaphore(self._num_concurrent_runs)
        await sem.acquire()
        done.add_done_callback(lambda _: sem.release())

    def _posted(self, run_id: str) -> None:
        live = live_executor(self._store, run_id)
        if live is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                live.done.get_loop().call_soon_threadsafe(live.poke)

    # ------------------------------------------------------------------ resume and fork

    def resume(
        self,
        run_id: str,
        updates: dict[str, Any] | None = None,
        *,
        cancelled: bool = False,
        allow_stranded: bool = False,
    ) -> WorkflowHandler:
        """Continues a run from the end of its log, here or in any other process.

        In-progress events are delivered again first (attempt counts kept), then the
        queues. ``updates`` are recorded as operator writes before work continues.
        Resuming a finished run returns its stored result; a failed run re-runs its
        failed step with a fresh retry budget; a run this process already runs returns
        its live handler; a cancelled run is resumed only with ``cancelled=True``.

        :raises RunNotFoundError: no such run.
        :raises RunOwnedError: another live executor runs it.
        :raises RunFinishedError: ``updates`` for a finished run (fork it instead).
        :raises WorkflowChangedError: its queued or in-progress work fits no step now.
        :raises EncodeError: an update holds a value the log cannot hold.
        """
        return self._resume(run_id, updates, cancelled=cancelled, allow_stranded=allow_stranded)

    def _resume(
        self,
        run_id: str,
        updates: dict[str, Any] | None,
        *,
        cancelled: bool = False,
        allow_stranded: bool = False,
        deletes: list[str] | None = None,
    ) -> WorkflowHandler:
        _require_loop("resume")
        updates = encode_updates(self._codec, updates)  # refused before the run is claimed
        live = live_executor(self._store, run_id)
        if live is not None:
            if updates:
                live.launch(live.operator_update(updates))
            return WorkflowHandler(self, run_id, live.done, live)
        info = self._run_info(run_id)
        refuse_cut(info)
        folded = self._fold(run_id, None)
        loop = asyncio.get_running_loop()
        if folded.status == "finished":
            if updates:
                raise RunFinishedError(run_id)
            fut = loop.create_future()
            fut.set_result(to_run_state(folded, self._codec).result)
            return WorkflowHandler(self, run_id, fut, None, self._recorded_stream(folded))
        if folded.status == "cancelled" and not cancelled:
            msg = f"run {run_id!r} was cancelled; resume(run_id, cancelled=True) continues it"
            raise WorkflowRuntimeError(msg)
        renamed = moves_for(folded, self._renames)
        rename_steps(folded, renamed)  # recorded by the resume's run_resumed record
        self._check_stranded(run_id, folded, allow_stranded)
        self._owners.acquire(run_id, info.rid)
        try:
            executor = self._executor(run_id, folded, info.rid, 0)
        except BaseException:
            self._owners.release(run_id, info.rid)
            raise
        register(self._store, run_id, executor)
        recorded = self._recorded_stream(folded)
        handler = WorkflowHandler(self, run_id, executor.done, executor, recorded)
        executor.resume(copy.deepcopy(folded), updates, renamed=renamed, deletes=deletes)
        return handler

    def run_from(
        self,
        checkpoint: Checkpoint | tuple[str, int] | dict[str, Any],
        updates: dict[str, Any] | None = None,
    ) -> WorkflowHandler:
        """Starts a new run from another run's state at a checkpoint (a fork).

        The fork records its parent and the seq and copies nothing; the parent is never
        changed. Steps in progress at the checkpoint run again.

        :raises EncodeError: an update holds a value the log cannot hold.
        """
        return self._run_from(checkpoint, updates)

    def _run_from(
        self,
        checkpoint: Checkpoint | tuple[str, int] | dict[str, Any],
        updates: dict[str, Any] | None,
        deletes: list[str] | None = None,
    ) -> WorkflowHandler:
        _require_loop("run_from")
        updates = encode_updates(self._codec, updates)  # refused before the fork begins
        if isinstance(checkpoint, dict):
            checkpoint = Checkpoint.model_validate(checkpoint)
        if isinstance(checkpoint, Checkpoint):
            parent_id, seq = checkpoint.run_id, checkpoint.seq
        else:
            parent_id, seq = checkpoint
        folded = self._fold(parent_id, seq)
        self._check_stranded(parent_id, folded, False)
        run_id = uuid.uuid4().hex
        at = folded.seq
        folded.run_id = run_id
        folded.first_seq = None  # the fork's own records start it
        folded.records = 0
        executor = self._executor(run_id, folded)
        handler = WorkflowHandler(self, run_id, executor.done, executor)
        executor.fork(folded, (parent_id, at), updates, deletes)
        return handler

    def _check_stranded(self, run_id: str, folded: Folded, allow: bool) -> None:
        check_stranded(
            run_id, folded, self._graph, self._codec, type(self), self._name, allow=allow
        )

    async def _post(self, run_id: str, event: Event, key: str | None) -> int:
        text = self._codec.encode(event, name=type(event).__name__)
        return await self._store.post(run_id, text, key=key)

    # ------------------------------------------------------------------ reading

    def _run_info(self, run_id: str) -> RunInfo:
        return run_info(self._store, run_id)

    def _fold(self, run_id: str, seq: int | None) -> Folded:
        return fold_run(self._store, run_id, seq)

    def state_at(self, run_id: str, seq: int | None = None) -> RunState:
        """The run's state at ``seq`` (the latest if None): the fold of its log.

        Every commit that begins at or before ``seq`` counts whole.

        :raises RunNotFoundError: no such run.
        :raises CheckpointNotFoundError: ``seq`` is before the run's first record.
        """
        folded = self._fold(run_id, seq)
        status = shown_status(self._store, folded, self._owners, seq)
        return to_run_state(folded, self._codec, status)

    def checkpoints(
        self, run_id: str, step: str | None = None, event: type | str | None = None
    ) -> list[Checkpoint]:
        """One checkpoint per commit of the run, oldest first, optionally filtered.

        :param step: only commits of this step.
        :param event: only commits that enqueue (or finish with) this event class; a class
            or a name (qualified ``module:Class`` or plain ``Class``).
        """
        found = checkpoints(
            self._store,
            run_id,
            step=step,
            event=event,
            resolve=self._codec.resolve,
            load=self._codec.load,
        )
        for cp in found:
            cp._source = (self, None)
        return found

    def runs(self) -> list[RunSummary]:
        """Every run in the store with its status: ``interrupted`` when it is unfinished and
        no live executor owns it, ``waiting`` (``waiting_for`` names the awaited classes)
        when, so unowned or suspended, it has nothing to do but wait for an event.

        A run a live executor owns is ``running`` here (a listing that is polled does not
        fold busy runs); ``state_at`` and ``workflow runs`` tell when it is waiting.
        """
        return run_summaries(self._store, self._owners, owned=False)

    def pending_runs(self) -> list[str]:
        """Runs of this workflow not finished and owned by no live executor.

        A run is this workflow's when it records this class's module and qualified name,
        or the same qualified name under ``__main__`` (a run of ``python script.py``) with
        a step of this workflow; a same-named class of another module is another workflow.
        """
        return [
            r.run_id
            for r in self.runs()
            if is_run_of(self, r)
            and r.status in ("interrupted", "waiting")
            and r.copied_upto is None  # an exported ancestor: its log ends at its fork
            and live_executor(self._store, r.run_id) is None
        ]

    def prune(
        self,
        older_than: str | float | timedelta,
        *,
        statuses: Iterable[str] | None = None,
        include_waiting: bool = False,
        dry_run: bool = False,
    ) -> PruneReport:
        """Deletes this workflow's runs that ended long enough ago, then reclaims the space.

        :param older_than: how long ago a run's last record must be: ``"30d"`` (units s, m,
            h, d, w), seconds, or a :class:`~datetime.timedelta`.
        :param statuses: which runs: by default ``finished``, ``failed``, ``cancelled`` and
            ``timed_out``; ``interrupted`` (a crashed run nobody resumed) may be named too.
        :param include_waiting: also delete runs waiting for an event (a human's answer),
            which are otherwise always kept.
        :param dry_run: only report what would be deleted.

        A run is deleted whole (records, inbox, snapshots, lease). A fork keeps the runs it
        was forked from; a run an executor took up again meanwhile is kept. Returns a
        :class:`PruneReport`.

        :raises ValueError: a bad duration or status.
        """
        return prune_runs(
            self._store,
            self._owners,
            older_than=older_than,
            statuses=statuses,
            include_waiting=include_waiting,
            dry_run=dry_run,
            only=lambda r: is_run_of(self, r),
        )

    def recover(self, *, compatible_only: bool = False) -> Recoveries:
        """Resumes every pending run (what a service does at startup); call it in async code,
        as ``await wf.recover()`` or ``wf.recover()``: the call resumes them, and awaiting its
        report gives it back as it is.

        Returns what happened to each run that :meth:`pending_runs` lists, in that order:
        a :class:`Recovery` whose ``outcome`` is ``resumed`` (await its ``handler``),
        ``waiting`` (it only waits for an event nobody sent yet: left as it is, not run
        again; ``waiting_for`` names the classes), ``owned`` (another live process holds
        it), ``stranded`` (the log no longer fits
        this code), ``recovery_limit`` (its input kept killing the process; the run is now
        failed) or ``failed`` (resuming raised; ``error`` says what). One run's problem
        never stops the others. Each outcome is also logged on the ``workflow`` logger
        (``resumed``, ``waiting`` and ``owned`` at INFO, ``stranded`` at WARNING, the rest
        at ERROR).

        With ``compatible_only=True`` (after a deploy) a run is resumed only if a static
        verify of it passes (nothing is executed): every value it holds decodes with this
        code (upcasters and ``renamed`` included) and its pending work routes to a step.
        The others come back ``incompatible`` with verify's ``problems`` and are left
        untouched, so a deploy never half-runs a run its code cannot finish.
        """
        _require_loop("recover")
        return recover_runs(self, compatible_only=compatible_only)

    def send(self, run_id: str, event: Event, idempotency_key: str | None = None) -> int:
        """Records an external event for a run, whether or not a process runs it now.

        The run's executor takes it in promptly; a resume takes pending ones first. With
        an ``idempotency_key`` the event is recorded once however often it is sent.
        """
        if not isinstance(event, Event):  # a dict would be parked, never meeting a wait
            msg = f"send takes an Event, not {type(event).__qualname__}"
            raise WorkflowRuntimeError(msg)
        info = self._run_info(run_id)
        if (info.status or "running") in TERMINAL:
            msg = f"run {run_id!r} has {info.status}; nothing would take the event in"
            raise WorkflowRuntimeError(msg)
        text = self._codec.encode(event, name=type(event).__name__)
        entry = self._store.post_sync(run_id, text, key=idempotency_key)
        live = live_executor(self._store, run_id)
        if live is not None:
            loop = live.done.get_loop()
            loop.call_soon_threadsafe(live.poke)
        return entry

    def _context_dict_at(
        self, run_id: str, seq: int, serializer: BaseSerializer | None
    ) -> dict[str, Any]:
        """``Context.to_dict()`` of a context at ``seq`` of the run (``Checkpoint.ctx_state``)."""
        from ._context import Context

        return Context._at(self, run_id, seq).to_dict(serializer)

    def _recorded_stream(self, folded: Folded) -> list[Event]:
        return [self._codec.load(e.dump) for e in folded.stream]


def _require_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        msg = f"wf.{what}() must be called inside async code (from a coroutine)"
        raise WorkflowRuntimeError(msg) from None
