"""``wf.run(ctx=ctx)``: what runs next from a context, and ``send_event`` on an idle one.

With a start event or start fields a new run starts from the context's state, *linked* to
the run it came from (``run_started.previous``), whose first commit writes that state: each
chat turn is a run that folds on its own. Without them it continues the run (a resume: the
failed step of a failed run, with a fresh retry budget), or forks it where the context
points if the run went on past that, or, after the run finished, starts a linked run with
the default start event. A dict's state this store has no run of is imported as a new run
(:func:`_import_records`). See ``workflow/_lifecycle.py`` for the context's life.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import orjson

from eventstore import Record

from . import _journal as journal
from ._buffers import class_qualname
from ._context import Context, ContextLink, parts_of
from ._errors import ContextStateError, WorkflowRuntimeError
from ._facade_control import fork_run, resume_run
from ._fold import Folded
from ._handler import WorkflowHandler, executor_of
from ._lifecycle import point_of, run_is_live, same_workflow, state_dumps
from ._run_ids import new_run_id

if TYPE_CHECKING:
    from ._events import Event, StartEvent
    from ._facade_protocol import Facade
    from ._runner import Executor

__all__ = ["run_with_context", "send_idle"]


# ---------------------------------------------------------------------- run(ctx=ctx)


def send_idle(ctx: Context[Any], event: Event) -> None:
    """``ctx.send_event`` on an idle context: recorded for its run, which takes it in when
    it runs again; a context with no run to take it is an error."""
    link = ctx.__context_link__
    if link.run_id is None or link.idle.imported is not None:
        msg = "send_event() called before workflow started: call wf.run(ctx=ctx) first"
        raise ContextStateError(msg)
    link.workflow.send(link.run_id, event)


def run_with_context(
    wf: Facade,
    ctx: Context[Any],
    start_event: StartEvent | None,
    fields: dict[str, Any],
    run_id: str | None,
) -> WorkflowHandler:
    """``wf.run(ctx=ctx, ...)``: what runs next from the context (see the module's text)."""
    if not isinstance(ctx, Context):
        msg = f"run(ctx=...) takes a Context, not {type(ctx).__name__}"
        raise WorkflowRuntimeError(msg)
    link, parts = ctx.__context_link__, wf.__workflow_parts__
    if link.workflow is not wf and not same_workflow(parts_of(ctx).name, wf):
        msg = f"this context belongs to workflow {parts_of(ctx).name!r}, not {parts.name!r}"
        raise WorkflowRuntimeError(msg)
    if run_is_live(ctx):
        msg = (
            f"the run {link.run_id!r} of this context is already running; await its handler"
            " (or cancel it) before starting another run from the context"
        )
        raise ContextStateError(msg)
    starting = start_event is not None or bool(fields)
    idle = link.idle
    updates = dict(idle.pending)
    deletes = sorted(idle.deleted)
    imported, origin = idle.imported, idle.origin
    if imported is None and link.run_id is not None and parts.store.get_run(link.run_id) is None:
        # A context of another instance of this workflow, on another store: its run's
        # state there is imported here, as a dict of it would be.
        imported = copy.deepcopy(point_of(ctx))
        origin = (link.run_id, imported.seq)
    handler: WorkflowHandler
    if imported is not None:
        if starting or imported.status == "finished":
            # As for a finished run of this store: a new run linked to it (a next turn).
            start = parts.start_event(start_event, fields)
            handler = _run_linked(wf, state_dumps(ctx, imported), start, origin, run_id)
        else:
            handler = _run_imported(wf, imported, origin, updates, run_id)
    elif link.run_id is None:
        start = parts.start_event(start_event, fields)
        handler = _run_linked(wf, state_dumps(ctx, Folded("")), start, None, run_id)
    else:
        run = link.run_id
        info = parts.run_info(run)
        end = info.last_seq or 0
        at = end if idle.seq is None else idle.seq
        if starting or (at == end and info.status == "finished"):
            start = parts.start_event(start_event, fields)
            handler = _run_linked(wf, state_dumps(ctx, point_of(ctx)), start, (run, at), run_id)
        else:
            if at < end:
                handler = fork_run(wf, (run, at), updates, deletes)
            else:
                handler = resume_run(wf, run, updates, cancelled=True, deletes=deletes)
    executor = executor_of(handler)
    if executor is None:  # a finished run's stored result (resume of a run that ended meanwhile)
        return handler
    _bind(ctx, executor)
    return handler


def _bind(ctx: Context[Any], executor: Executor) -> None:
    """Binds ``ctx`` to the run ``executor`` runs (a run started from it)."""
    executor.ctx = ctx
    ctx.store.bind(executor)
    ctx.__context_link__ = ContextLink(ctx, executor.config.instance, executor)


def _context_records(dumps: dict[str, Any]) -> list[Record]:
    return [
        journal.state_set_value(None, k, orjson.Fragment(orjson.dumps(d))) for k, d in dumps.items()
    ]


def _new_executor(wf: Facade, run_id: str | None) -> tuple[Executor, WorkflowHandler]:
    run_id = new_run_id(run_id)
    if wf.__workflow_parts__.store.get_run(run_id) is not None:
        msg = f"run {run_id!r} already exists; a run from a context starts a new run"
        raise WorkflowRuntimeError(msg)
    executor = wf.__workflow_parts__.executor(run_id, None)
    return executor, WorkflowHandler(wf, run_id, executor.done, executor)


def _run_linked(
    wf: Facade,
    dumps: dict[str, Any],
    start_event: StartEvent,
    previous: tuple[str, int] | None,
    run_id: str | None,
) -> WorkflowHandler:
    """A new run whose first commit writes ``dumps`` as its context, linked to ``previous``."""
    records = wf.__workflow_parts__.start_records(start_event, _context_records(dumps), previous)
    executor, handler = _new_executor(wf, run_id)
    executor.next_id = 2
    executor.start(records, start_event, with_context=True)
    return handler


def _import_records(wf: Facade, f: Folded, origin: tuple[str, int] | None) -> list[Record]:
    """The first commit of a run whose state is ``f`` (a dict from another store).

    Queued and in-progress events are queued again, waits wait again, collect buffers and
    events no step took are kept; what is left out is the history (the stream, answers to
    waits whose step had not run again yet: that step asks again).
    """
    records = [
        wf.__workflow_parts__.run_started(0, None, origin),
        *_context_records({k: e.dump for k, e in f.context.items()}),
    ]
    op: journal.Source = journal.SRC_OPERATOR
    for step, queue in f.queues.items():
        records.extend(journal.enqueued(step, ev.id, ev.dump, op) for ev in queue.values())
    for step, progs in f.in_progress.items():
        records.extend(journal.enqueued(step, p.ev.id, p.ev.dump, op) for p in progs.values())
    records.extend(journal.enqueued(None, ev.id, ev.dump, op) for ev in f.unclaimed.values())
    for key, by_type in f.buffers.items():
        step, buf = key.split(":", 1)
        for slot, evs in by_type.items():
            records.extend(
                journal.collected(
                    step,
                    buf,
                    {"id": ev.id, "event": ev.dump},
                    None,
                    slot=None if class_qualname(ev.type) == slot else slot,
                )
                for ev in evs
            )
    for w in f.waiters.values():
        records += [
            journal.enqueued(w.step, w.ev.id, w.ev.dump, op),
            journal.dequeued(w.step, w.ev.id, 0),
            journal.waiting(
                w.step,
                w.ev.id,
                0,
                w.waiter_id,
                w.awaited,
                w.requirements,
                w.deadline,
                w.waiter_event,
            ),
        ]
    return records


def _run_imported(
    wf: Facade,
    f: Folded,
    origin: tuple[str, int] | None,
    updates: dict[str, Any],
    run_id: str | None,
) -> WorkflowHandler:
    """A new run that goes on from an imported state: its queued work runs, waits wait."""
    wf.__workflow_parts__.check_stranded(origin[0] if origin else "(imported)", f, False)
    work = any(f.queues.values()) or any(f.in_progress.values()) or f.waiters
    if not work and not wf.__workflow_parts__.graph.outside_events():
        # Nothing would ever run, and nothing from outside could make it: refuse loudly
        # rather than start a run that idles. (A run whose step takes an answer from
        # outside, LlamaIndex's separate-steps human in the loop, goes on idle: its
        # answer, ``handler.ctx.send_event(HumanResponseEvent(...))``, runs that step.)
        msg = (
            f"this context's run (status {f.status!r}) has no work left to continue, and"
            " no step takes an event from outside; pass start fields to run(ctx=...) to"
            " start a new run from its state"
        )
        raise WorkflowRuntimeError(msg)
    records = _import_records(wf, f, origin)
    executor, handler = _new_executor(wf, run_id)
    executor.start_imported(records, updates)
    return handler
