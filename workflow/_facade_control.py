"""The facade's control of runs: start or submit one, resume a run from the end of its
log, fork one at a checkpoint, send a run an event. ``Workflow``'s public methods check
their arguments and call these; the executor does the run's start-up (``_run_start``)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from typing import TYPE_CHECKING, Any

from eventstore import Commit, NewRun

from ._changes import encode_updates
from ._errors import RunCancellingError, RunFinishedError, RunOwnedError, WorkflowRuntimeError
from ._fold import rename_steps, to_run_state
from ._handler import WorkflowHandler
from ._live_runs import live_executor, register
from ._log_refs import as_fork
from ._read import refuse_cut
from ._renames import moves_for
from ._run_ids import new_run_id
from ._state import REFUSES_EVENTS, Checkpoint
from ._state_versions import resume_upcast

if TYPE_CHECKING:
    from eventstore import EventStore

    from ._events import Event, StartEvent
    from ._facade_protocol import Facade

__all__ = [
    "fork_run",
    "require_loop",
    "resume_run",
    "send_event",
    "start_run",
    "submit_run",
    "wake_owner",
]


def require_loop(what: str) -> None:
    """Refuses a call of ``wf.<what>()`` made outside async code (it starts tasks).

    :raises WorkflowRuntimeError: no event loop runs in this thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        msg = f"wf.{what}() must be called inside async code (from a coroutine)"
        raise WorkflowRuntimeError(msg) from None


def resume_run(
    wf: Facade,
    run_id: str,
    updates: dict[str, Any] | None,
    *,
    cancelled: bool = False,
    allow_stranded: bool = False,
    deletes: list[str] | None = None,
) -> WorkflowHandler:
    """``wf.resume(run_id, ...)``: the live handler, the stored result, or an executor
    that goes on from the fold of the run's log (``deletes``: keys an operator removes)."""
    parts = wf.__workflow_parts__
    require_loop("resume")
    updates = encode_updates(parts.codec, updates)  # refused before the run is claimed
    live = live_executor(parts.store, run_id)
    if live is not None:
        if updates:
            live.launch(live.operator_update(updates))
        return WorkflowHandler(wf, run_id, live.done, live)
    info = parts.run_info(run_id)
    refuse_cut(info)
    folded = parts.fold(run_id, None)
    loop = asyncio.get_running_loop()
    if folded.status == "finished":
        if updates:
            raise RunFinishedError(run_id)
        fut = loop.create_future()
        fut.set_result(to_run_state(folded, parts.codec).result)
        return WorkflowHandler(wf, run_id, fut, None, parts.recorded_stream(folded))
    if folded.status == "cancelled" and not cancelled:
        msg = f"run {run_id!r} was cancelled; resume(run_id, cancelled=True) continues it"
        raise WorkflowRuntimeError(msg)
    renamed = moves_for(folded, parts.renames)
    rename_steps(folded, renamed)  # recorded by the resume's run_resumed record
    parts.check_stranded(run_id, folded, allow_stranded)
    upcast = resume_upcast(run_id, folded, parts.codec, parts.state_type)
    try:
        parts.owners.acquire(run_id, info.rid)
    except RunOwnedError as exc:
        if folded.status != "cancelled":
            raise
        # Cancelled from outside: its executor elsewhere lets go within a second (``_takeover``).
        raise RunCancellingError(run_id, exc.detail, exc.lapses_at) from None
    try:
        executor = parts.executor(run_id, folded, info.rid, 0)
    except BaseException:
        parts.owners.release(run_id, info.rid)
        raise
    register(parts.store, run_id, executor)
    recorded = parts.recorded_stream(folded)
    handler = WorkflowHandler(wf, run_id, executor.done, executor, recorded)
    executor.resume(copy.deepcopy(folded), updates, renamed=renamed, deletes=deletes, upcast=upcast)
    return handler


def fork_run(
    wf: Facade,
    checkpoint: Checkpoint | tuple[str, int] | dict[str, Any],
    updates: dict[str, Any] | None,
    deletes: list[str] | None = None,
) -> WorkflowHandler:
    """``wf.run_from(checkpoint, ...)``: a new run going on from the parent's fold at the
    checkpoint's seq; the parent is read, never changed."""
    parts = wf.__workflow_parts__
    require_loop("run_from")
    updates = encode_updates(parts.codec, updates)  # refused before the fork begins
    if isinstance(checkpoint, dict):
        checkpoint = Checkpoint.model_validate(checkpoint)
    if isinstance(checkpoint, Checkpoint):
        parent_id, seq = checkpoint.run_id, checkpoint.seq
    else:
        parent_id, seq = checkpoint
    folded, renamed, upcast = parts.fork_point(parent_id, seq)
    run_id = uuid.uuid4().hex
    at = folded.seq
    as_fork(folded, run_id)  # its snapshots refer to its own log only, never the parent's
    executor = parts.executor(run_id, folded)
    handler = WorkflowHandler(wf, run_id, executor.done, executor)
    executor.fork(folded, (parent_id, at), updates, deletes, renamed=renamed, upcast=upcast)
    return handler


def start_run(wf: Facade, start_event: StartEvent, run_id: str | None) -> WorkflowHandler:
    """``wf.run(...)`` without a context: a new run from ``start_event``, or the resume of
    ``run_id`` when that run exists already."""
    parts = wf.__workflow_parts__
    run_id = new_run_id(run_id)
    if parts.store.get_run(run_id) is not None:
        return wf.resume(run_id)
    records = parts.start_records(start_event)  # a start event the log cannot hold: here
    executor = parts.executor(run_id, None)
    executor.next_id = 2
    handler = WorkflowHandler(wf, run_id, executor.done, executor)
    executor.start(records, start_event)
    return handler


def submit_run(wf: Facade, start_event: StartEvent, run_id: str | None) -> str:
    """``wf.submit(...)``: records a new run's first commit for a worker to claim (a run
    that exists is left as it is) and returns its id."""
    parts = wf.__workflow_parts__
    run_id = new_run_id(run_id)
    if parts.store.get_run(run_id) is not None:
        return run_id
    # "submitted" in its row: listings tell it, until a worker claims it, from a run
    # whose process died (its log looks the same).
    create = NewRun(meta={"workflow": parts.name, "submitted": True}, status="running")
    parts.store.append_sync(
        Commit(run_id, parts.start_records(start_event), epoch=1, create=create)
    )
    return run_id


def send_event(wf: Facade, run_id: str, event: Event, key: str | None) -> int:
    """``wf.send(...)``: posts ``event`` to the run's inbox and wakes its live executor.

    A cancelled or timed-out run takes the event in when it is resumed (``resume``,
    ``run(ctx=...)``): a late answer to its question is kept for it.

    :raises WorkflowRuntimeError: the run finished or failed (nothing would take the event in).
    """
    parts = wf.__workflow_parts__
    info = parts.run_info(run_id)
    if (info.status or "running") in REFUSES_EVENTS:
        msg = f"run {run_id!r} has {info.status}; nothing would take the event in"
        raise WorkflowRuntimeError(msg)
    text = parts.codec.encode(event, name=type(event).__name__)
    entry = parts.store.post_sync(run_id, text, key=key)
    live = live_executor(parts.store, run_id)
    if live is not None:
        loop = live.done.get_loop()
        loop.call_soon_threadsafe(live.poke)
    return entry


def wake_owner(store: EventStore, run_id: str) -> None:
    """Wakes this process's executor of ``run_id`` (an answer was posted for it): on
    PostgreSQL an answer posted on any host reaches its owner at once."""
    live = live_executor(store, run_id)
    if live is not None:
        with contextlib.suppress(RuntimeError):  # its loop has closed
            live.done.get_loop().call_soon_threadsafe(live.poke)
