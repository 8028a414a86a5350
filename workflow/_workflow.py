"""Workflow: run, resume, fork, send, and read any run's state at any seq."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from eventstore import (
    EventStore,
    class_name,
)

from ._checkpoints import checkpoints
from ._context_services import CONTEXT_SERVICES
from ._errors import (
    WorkflowRuntimeError,
    WorkflowValidationError,
)
from ._events import Event, StartEvent
from ._facade_build import RunSlots, owners_for, workflow_codec
from ._facade_control import (
    fork_run,
    require_loop,
    resume_run,
    send_event,
    start_run,
    submit_run,
    wake_owner,
)
from ._facade_parts import WorkflowParts
from ._facade_steps import WorkflowSteps
from ._fold import to_run_state
from ._handler import WorkflowHandler
from ._live_runs import live_executor
from ._patch_check import declared_patches
from ._prune import PruneReport, prune_runs
from ._read import RunSummary, run_summaries, shown_status
from ._recover import Recoveries, is_run_of
from ._recover import recover as recover_runs
from ._renames import class_aliases, step_renames
from ._state import Checkpoint, RunState, listed_by
from ._step import (
    GRAPH_CHECKS,
    graph_checks,
)
from ._stores import open_store
from ._timers import DEFAULT_SLEEP_THRESHOLD
from .resource import ResourceManager

if TYPE_CHECKING:
    from ._context import Context, ContextServices

__all__ = ["RunSummary", "Workflow"]

_log = logging.getLogger("workflow")


class Workflow(WorkflowSteps):
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

    renamed: ClassVar[Mapping[str, str | type]] = {}
    """Old names of renamed steps and moved event classes -> their new ones, so that runs
    recorded before a deploy continue: ``{"old_step": "new_step", "old.mod:Cls": Cls}``.
    A resume moves such a run's pending work to the new step names (and records the move);
    old class names decode as the new class. See ``workflow/_renames.py``."""

    # What its contexts reach their lifecycle through; also what marks an object as a
    # workflow to the modules below this one (they cannot import this class).
    __context_services__: ClassVar[ContextServices] = CONTEXT_SERVICES

    # What it is made of (its name, graph, codec, store, ...), read by the modules below
    # this one under public names: the workflow itself gains no public attribute.
    __workflow_parts__: WorkflowParts

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
        self._num_concurrent_runs = num_concurrent_runs
        self._init_steps(skips, disable_validation, workflow_name)
        codec, state_type = workflow_codec(
            type(self), Workflow, self._graph, types, allow_pickle=allow_pickle
        )
        class_aliases(type(self), codec)
        store_ = open_store(store)
        self.__workflow_parts__ = WorkflowParts(
            instance=self,
            name=class_name(type(self)),
            graph=self._graph,
            codec=codec,
            state_type=state_type,
            store=store_,
            owners=owners_for(store_, lease_ttl),
            renames=step_renames(type(self), self._graph.steps),
            timeout=timeout,
            verbose=verbose,
            max_recovery=max_recovery_attempts,
            catchers=self._catchers,
            # Resources are this object's, never the log's: a resume elsewhere builds its own.
            resources=resource_manager or ResourceManager(),
            slots=RunSlots(num_concurrent_runs),
            start_class=lambda: self._start_event_class,
            # A bad ``deprecated_patches`` is refused here, before any run records it.
            deprecated=tuple(sorted(declared_patches(type(self)))),
        )
        # On PostgreSQL an answer posted on any host wakes the run's owner at once (the
        # owner also polls, which is all SQLite needs).
        store_.on_post(partial(wake_owner, store_))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} store={self.store!r}>"

    # ------------------------------------------------------------------ LlamaIndex's API
    @property
    def store(self) -> EventStore:
        """The event store this workflow journals to."""
        return self.__workflow_parts__.store

    # ------------------------------------------------------------------ starting runs

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
        :raises WorkflowValidationError: the steps do not make a valid graph (checked at
            the first run, as LlamaIndex checks it).
        """
        require_loop("run")
        self.__check_graph__()
        if ctx is not None:
            from ._context_run import run_with_context

            return run_with_context(self, ctx, start_event, kwargs, run_id)
        return start_run(self, self.__workflow_parts__.start_event(start_event, kwargs), run_id)

    def submit(
        self, *, start_event: StartEvent | None = None, run_id: str | None = None, **kwargs: Any
    ) -> str:
        """Records a new run for a worker to execute and returns its id at once.

        Nothing runs here: a :class:`~workflow.Worker` of this workflow (in this process or
        any other that shares the store) claims it. A ``run_id`` that exists is returned
        as it is (a run is submitted once).

        :raises WorkflowValidationError: the steps do not make a valid graph.
        """
        self.__check_graph__()
        return submit_run(self, self.__workflow_parts__.start_event(start_event, kwargs), run_id)

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
        return resume_run(self, run_id, updates, cancelled=cancelled, allow_stranded=allow_stranded)

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
        return fork_run(self, checkpoint, updates)

    # ------------------------------------------------------------------ reading

    def state_at(self, run_id: str, seq: int | None = None) -> RunState:
        """The run's state at ``seq`` (the latest if None): the fold of its log.

        Every commit that begins at or before ``seq`` counts whole.

        :raises RunNotFoundError: no such run.
        :raises CheckpointNotFoundError: ``seq`` is before the run's first record.
        """
        parts = self.__workflow_parts__
        folded = parts.fold(run_id, seq)
        status = shown_status(parts.store, folded, parts.owners, seq)
        return to_run_state(folded, parts.codec, status)

    def checkpoints(
        self, run_id: str, step: str | None = None, event: type | str | None = None
    ) -> list[Checkpoint]:
        """One checkpoint per commit of the run, oldest first, optionally filtered.

        :param step: only commits of this step.
        :param event: only commits that enqueue (or finish with) this event class; a class
            or a name (qualified ``module:Class`` or plain ``Class``).
        """
        codec = self.__workflow_parts__.codec
        found = checkpoints(
            self.store,
            run_id,
            step=step,
            event=event,
            resolve=codec.resolve,
            load=codec.load,
        )
        return [listed_by(cp, self) for cp in found]

    def runs(self, *, all_workflows: bool = True) -> list[RunSummary]:
        """Every run in the store with its status: ``interrupted`` when a run is unfinished
        and no live executor owns it (``submitted`` while no worker took it up yet: no
        process died in it), ``waiting`` (``waiting_for`` the awaited classes) when, so
        unowned or suspended, it has nothing to do but wait. A run a live executor owns is
        ``running`` (a polled listing does not fold busy runs; ``state_at`` tells waiting).

        A store shared by several workflows (a parent and its children) holds the runs of
        each, and all are listed; ``all_workflows=False`` lists only this workflow's (a
        run is this workflow's as :meth:`pending_runs` says).
        """
        every = run_summaries(self.store, self.__workflow_parts__.owners, owned=False)
        return every if all_workflows else [r for r in every if is_run_of(self, r)]

    def pending_runs(self) -> list[str]:
        """Runs of this workflow not finished and owned by no live executor.

        A run is this workflow's when it records this class's module and qualified name,
        or the same qualified name under ``__main__`` (a run of ``python script.py``) with
        a step of this workflow; a same-named class of another module is another workflow.
        """
        return [
            r.run_id
            for r in self.runs(all_workflows=False)
            if r.status in ("interrupted", "submitted", "waiting")
            and r.copied_upto is None  # an exported ancestor: its log ends at its fork
            and live_executor(self.store, r.run_id) is None
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
            ``timed_out``; ``interrupted`` (a crashed run nobody resumed) and ``submitted``
            (one no worker took up) may be named too.
        :param include_waiting: also delete runs waiting for an event (a human's answer),
            which are otherwise always kept.
        :param dry_run: only report what would be deleted.

        A run is deleted whole (records, inbox, snapshots, lease). A fork keeps the runs it
        was forked from; a run an executor took up again meanwhile is kept. Returns a
        :class:`PruneReport`.

        :raises ValueError: a bad duration or status.
        """
        return prune_runs(
            self.store,
            self.__workflow_parts__.owners,
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
        require_loop("recover")
        return recover_runs(self, compatible_only=compatible_only)

    def send(self, run_id: str, event: Event, idempotency_key: str | None = None) -> int:
        """Records an external event for a run, whether or not a process runs it now.

        The run's executor takes it in promptly; a resume takes pending ones first. With
        an ``idempotency_key`` the event is recorded once however often it is sent.
        """
        if not isinstance(event, Event):  # a dict would be parked, never meeting a wait
            msg = f"send takes an Event, not {type(event).__qualname__}"
            raise WorkflowRuntimeError(msg)
        return send_event(self, run_id, event, idempotency_key)
