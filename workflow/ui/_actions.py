"""The web UI's actions: resume, fork at a seq with updates, send an event, cancel.

They exist only on a server started with ``--allow-actions --workflow M:C``; each goes
through the user's workflow class, on a store of its own opened for writing (the pages
keep reading through the read-only one). A resumed or forked run is left to the workers
(``workflow worker``), unless the server was started with ``--execute``, when it runs in
the server's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

from eventstore import Commit, NewRun

from .._errors import WorkflowError, WorkflowRuntimeError
from .._events import Event
from .._handler import WorkflowHandler, executor_of
from .._ownership import probe_owners
from .._read import check_seq, run_info
from .._seqs import fork_said
from .._state import REFUSES_EVENTS, TERMINAL
from .._workflow import Workflow
from ..cli._common import import_object, loads_exact
from ..cli._operator import cancel_run
from ..cli._render import show_dump

__all__ = ["ActionError", "Actions"]


class ActionError(Exception):
    """An action refused: ``status`` is the HTTP status that says why (400, 404, 409)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Done:
    """What an action did: a message, and the run it started or continued."""

    message: str
    run_id: str | None = None


def _object(text: Any, what: str) -> dict[str, Any]:
    """A JSON object from a form field (text) or a request body (already an object)."""
    if isinstance(text, dict):
        return text
    if not isinstance(text, str):
        raise ActionError(400, f"{what} must be a JSON object")
    try:
        value = loads_exact(text or "{}")
    except ValueError as exc:
        raise ActionError(400, f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ActionError(400, f"{what} must be a JSON object, not {type(value).__name__}")
    return value


class Actions:
    """Carries out the actions with the user's workflow; keeps the runs it executes."""

    def __init__(self, wf: Workflow, *, execute: bool) -> None:
        self.wf = wf
        self.execute = execute
        self.handlers: dict[str, WorkflowHandler] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    @property
    def who(self) -> str:
        """Who carries out resumes and forks, as the actions panel says."""
        if self.execute:
            return "actions run in the server's process (--execute)"
        return "resumed and forked runs are left for workers (`workflow worker`)"

    def _run(self, run_id: str) -> str:
        try:
            return run_info(self.wf.store, run_id).status or "running"
        except WorkflowError as exc:
            raise ActionError(404, str(exc)) from None

    def _keep(self, handler: WorkflowHandler) -> None:
        """Holds a run this process executes until it ends (its log says how it did)."""
        self.handlers[handler.run_id] = handler

        async def watch() -> None:
            with contextlib.suppress(BaseException):
                await handler
            if self.handlers.get(handler.run_id) is handler:
                del self.handlers[handler.run_id]

        task = asyncio.get_running_loop().create_task(watch())
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def cancel(self, run_id: str) -> Done:
        """Cancels the run: through its handler when this process runs it, else from
        outside (its executor elsewhere stops within a fraction of a second)."""
        self._run(run_id)
        live = self.handlers.get(run_id)
        try:
            if live is not None and not live.is_done():
                await live.cancel_run(via="ui")
                return Done(f"cancelled run {run_id}", run_id)
            seq = cancel_run(self.wf.store, run_id, via="ui")
        except WorkflowRuntimeError as exc:
            raise ActionError(409, str(exc)) from None
        return Done(f"cancelled run {run_id} (run_cancelled at seq {seq})", run_id)

    async def resume(self, run_id: str) -> Done:
        """Continues the run: here with ``--execute``; else a worker claims an unfinished
        one (a failed or cancelled one needs an executor: ``--execute``)."""
        status = self._run(run_id)
        if status == "finished":
            raise ActionError(409, f"run {run_id!r} has finished; fork it to run it again")
        if not self.execute:
            if status in TERMINAL:
                how = " --cancelled" if status == "cancelled" else ""
                msg = (
                    f"run {run_id!r} {_is(status)}: this server executes nothing (start it with"
                    f" --execute, or run `workflow resume` with its --workflow{how})"
                )
                raise ActionError(409, msg)
            info = run_info(self.wf.store, run_id)
            if probe_owners(self.wf.store).is_owned(run_id, info.rid):
                raise ActionError(409, f"run {run_id!r} is running in another process")
            return Done(f"run {run_id} is unfinished: a worker of its workflow claims it", run_id)
        try:
            handler = self.wf.resume(run_id, cancelled=True)
        except WorkflowError as exc:
            raise ActionError(409, str(exc)) from None
        self._keep(handler)
        return Done(f"resumed run {run_id} in the server's process", run_id)

    async def fork(self, run_id: str, seq: Any, updates: Any) -> Done:
        """Starts a new run from the run's state at ``seq``, with context ``updates``."""
        self._run(run_id)
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ActionError(400, f"seq must be a whole number, not {seq!r}")
        try:
            check_seq(self.wf.store, run_id, seq)
        except WorkflowError as exc:
            raise ActionError(400, str(exc)) from None
        raw = _object(updates, "updates")
        try:
            values = {k: self.wf.__workflow_parts__.codec.load(v) for k, v in raw.items()}
        except Exception as exc:  # a dump the codec cannot rebuild: the caller's input
            raise ActionError(400, f"updates: {type(exc).__name__}: {exc}") from None
        if self.execute:
            try:
                handler = self.wf.run_from((run_id, seq), updates=values or None)
            except WorkflowError as exc:
                raise ActionError(409, str(exc)) from None
            self._keep(handler)
            at = self.wf.__workflow_parts__.fold(run_id, seq).seq  # what the fork records
            return Done(fork_said(run_id, seq, at, handler.run_id), handler.run_id)
        if values:
            msg = "a fork with updates needs an executor: start the server with --execute"
            raise ActionError(409, msg)
        new_id, at = self._submit_fork(run_id, seq)
        return Done(f"{fork_said(run_id, seq, at, new_id)}, for a worker", new_id)

    def _submit_fork(self, run_id: str, seq: int) -> tuple[str, int]:
        """Records a fork's first commit and leaves it for a worker, which resumes it as
        any run whose executor went away (``Workflow.run_from`` without running it)."""
        wf = self.wf
        parts = wf.__workflow_parts__
        try:
            folded, renamed, upcast = parts.fork_point(run_id, seq)
        except WorkflowError as exc:
            raise ActionError(409, str(exc)) from None
        new_id = uuid.uuid4().hex
        parent = (run_id, folded.seq)
        started = parts.fork_started(parent, renamed)
        create = NewRun(
            meta={"workflow": parts.name, "submitted": True},
            parent_run_id=parent[0],
            parent_seq=parent[1],
            status="running",
        )
        wf.store.append_sync(Commit(new_id, [started, *upcast], epoch=1, create=create))
        return new_id, parent[1]

    async def send(self, run_id: str, event_spec: Any, data: Any) -> Done:
        """Sends an event of the named class to the run (``wf.send``)."""
        status = self._run(run_id)
        if status in REFUSES_EVENTS:
            msg = f"run {run_id!r} {_is(status)}; nothing would take the event in"
            raise ActionError(409, msg)
        if not isinstance(event_spec, str) or not event_spec.strip():
            raise ActionError(400, "event: name its class as module:Class")
        try:
            cls = import_object(event_spec.strip(), "event")
        except Exception as exc:  # click's BadParameter: the spec is wrong
            raise ActionError(400, str(getattr(exc, "message", exc))) from None
        if not (isinstance(cls, type) and issubclass(cls, Event)):
            raise ActionError(400, f"{event_spec} is not an Event subclass")
        fields = _object(data, "data")
        try:
            event = cls.model_validate(fields)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ActionError(400, " ".join(str(exc).split())) from None
        entry = self.wf.send(run_id, event)
        shown = show_dump(self.wf.__workflow_parts__.codec.dump(event), 120)
        return Done(f"sent {shown} to run {run_id} (inbox entry {entry})", run_id)

    def close(self) -> None:
        """Leaves the runs this process executes, cleanly: a worker or resume continues them."""
        for handler in list(self.handlers.values()):
            executor = executor_of(handler)
            if executor is not None:
                with contextlib.suppress(Exception):
                    executor.abandon()
        self.wf.store.close()


def _is(status: str) -> str:
    """A run's ended status as a phrase: ``has failed``, ``is cancelled``, ``has finished``."""
    return f"is {status}" if status == "cancelled" else f"has {status}"
