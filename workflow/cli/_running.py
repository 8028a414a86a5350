"""Running a workflow from the command line: what ``run``, ``resume``, ``fork`` and
``recover`` share.

Their options, building the user's workflow on the store, awaiting a run until it ends or
only waits for an event nobody sent yet, and saying how it went (or how to continue it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

import click
import orjson

from eventstore import EventStore, StoreUnavailableError, class_name

from .._errors import (
    DeprecatedPatchError,
    RunSuspendedError,
    WaitTimeoutError,
    WorkflowCancelledByUser,
    WorkflowChangedError,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
)
from .._events import HumanResponseEvent, InputRequiredEvent
from .._handler import WorkflowHandler
from .._workflow import Workflow
from ._common import allow_pickle_option, emit_json, load_workflow, loads_exact
from ._inspect import open_store
from ._render import show_typed

__all__ = [
    "build_workflow",
    "json_object",
    "left_unfinished",
    "outcome_of",
    "parse_sets",
    "public_event_name",
    "recorded_by_other",
    "report",
    "say_asked",
    "sets_option",
    "timeout_option",
    "workflow_required",
]


def workflow_required(command: Any) -> Any:
    return allow_pickle_option(
        click.option(
            "--workflow",
            "workflow_spec",
            required=True,
            metavar="MODULE:CLASS",
            help="The Workflow class to run (imported, then built as Class(store=DB)).",
        )(command)
    )


def sets_option(command: Any) -> Any:
    return click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=JSON",
        help="Write a context key first (JSON; codec-tagged values allowed). Repeatable.",
    )(command)


def timeout_option(command: Any) -> Any:
    return click.option(
        "--timeout", type=float, help="The run's timeout in seconds (default: the class's)."
    )(command)


def parse_sets(sets: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=JSON`` pairs as a dict of JSON values.

    :raises click.BadParameter: a pair without ``=``, or a value that is not JSON.
    """
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            msg = f"{item!r} is not KEY=JSON"
            raise click.BadParameter(msg, param_hint="--set")
        try:
            out[key] = loads_exact(text)
        except ValueError as exc:
            msg = (
                f"the value of {key!r} is not JSON: {text!r} ({exc};"
                " quote strings, e.g. --set name='\"Ada\"')"
            )
            raise click.BadParameter(msg, param_hint="--set") from None
    return out


def build_workflow(db: str, spec: str, timeout: float | None) -> Workflow:
    # Validate the file read-only first: building the workflow on a path that is not a
    # store yet would create an empty store there.
    open_store(db).close()
    return load_workflow(spec, db, **({} if timeout is None else {"timeout": timeout}))


# How often to look whether a run can only wait; and how long it must stay so to count.
_IDLE_POLL: Final = 0.05


async def _idle(handler: WorkflowHandler, store: EventStore) -> None:
    """Returns once the run has nothing left to do but wait for an event nobody sent yet."""
    quiet = 0
    while quiet < 2:
        await handler.wait_until_waiting()
        if handler.is_done():
            return
        # Events already in the inbox may answer a waiter: the executor takes them in first.
        quiet = quiet + 1 if not store.inbox(handler.run_id) else 0
        await asyncio.sleep(_IDLE_POLL)


async def outcome_of(
    handler: WorkflowHandler, store: EventStore, *, asks: Asks | None = None
) -> tuple[str, Any]:
    """Awaits a run until it ends, or leaves it once only waiters remain (``waiting``).

    ``asks`` is told each question (``InputRequiredEvent``) the run streams meanwhile: a
    question a step returned leaves the run idle, not waiting, so nothing else would say
    that it waits for an answer.
    """
    ended = asyncio.ensure_future(_settle(handler))
    idle = asyncio.ensure_future(_idle(handler, store))
    told = None if asks is None else asyncio.ensure_future(_questions(handler, asks))
    await asyncio.wait({ended, idle}, return_when=asyncio.FIRST_COMPLETED)
    if not ended.done():
        # Nothing can happen until an event is sent: leave the run, resumable later.
        await handler.suspend()
    idle.cancel()
    try:
        return await ended
    finally:
        if told is not None:
            told.cancel()


Asks = Callable[[str, InputRequiredEvent], None]


async def _questions(handler: WorkflowHandler, asks: Asks) -> None:
    """Tells ``asks`` the questions the run streams, until its stream ends."""
    with contextlib.suppress(Exception):  # the run's outcome is _settle's to report
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                asks(handler.run_id, ev)


def say_asked(wf: Workflow, db: str) -> Asks:
    """Says on stderr (stdout may be JSON) what a question asks and how to answer it."""
    outside = wf.__workflow_parts__.graph.outside_events()
    answers = [t for t in outside if issubclass(t, HumanResponseEvent)] or outside
    event = public_event_name(class_name(answers[0])) if answers else "MODULE:CLASS"

    def said(run_id: str, ev: InputRequiredEvent) -> None:
        q = shlex.quote
        prefix = getattr(ev, "prefix", "")
        if not answers:
            # A wait's question (no step takes an answer): the run is left waiting, and how
            # it ends says the class it waits for and the command that sends it.
            click.echo(f"run {run_id} asks: {prefix!r}", err=True)
            return
        data = (
            q(orjson.dumps({"response": "..."}).decode())
            if event.endswith(":HumanResponseEvent")
            else "JSON"
        )
        click.echo(
            f"run {run_id} asks: {prefix!r}; answer it with `workflow send {q(db)} {q(run_id)}"
            f" --event {event} --data {data}` (from another shell, before its timeout)",
            err=True,
        )

    return said


async def _settle(handler: WorkflowHandler) -> tuple[str, Any]:
    try:
        return "finished", await handler
    except RunSuspendedError:
        return "waiting", None
    except DeprecatedPatchError as exc:  # this code cannot finish it: stopped, unfailed
        return "interrupted", exc
    except WorkflowCancelledByUser as exc:  # `workflow cancel` (or a cancel of its own)
        return "cancelled", exc
    except WaitTimeoutError as exc:  # a step's wait past its own deadline failed the step
        return "failed", exc
    except WorkflowTimeoutError as exc:  # resumable, with a fresh timeout
        return "timed_out", exc
    except StoreUnavailableError as exc:  # the store could not be written: nothing is lost
        return "interrupted", exc
    except Exception as exc:  # the user's step raised: that is the run's outcome, not ours
        return "failed", exc


def public_event_name(name: str) -> str:
    """How a user spells the event class stored as ``name`` in ``--event MODULE:CLASS``.

    An engine event lives in a private module (``workflow._events:HumanResponseEvent``),
    which works but is not the name users know: one the public ``workflow`` namespace
    exports is named there (``workflow:HumanResponseEvent``). A user's own class keeps
    its own module. Only modules already imported are looked at: nothing is imported.
    """
    module, sep, qualname = name.partition(":")
    if not sep or not module.startswith("workflow."):
        return name
    public, private = sys.modules.get("workflow"), sys.modules.get(module)
    cls = getattr(private, qualname, None)
    if cls is not None and getattr(public, qualname, None) is cls:
        return f"workflow:{qualname}"
    return name


def report(
    wf: Workflow,
    run_id: str,
    outcome: tuple[str, Any],
    as_json: bool,
    db: str,
    spec: str,
) -> None:
    """Says how the run ended (``spec``: the ``--workflow`` it was run with, for the hints)."""
    status, value = outcome
    ended = ("failed", "interrupted", "cancelled", "timed_out")
    state = wf.state_at(run_id) if status not in ended else None
    if as_json:
        data: dict[str, Any] = {"run_id": run_id, "status": status}
        if status == "finished":
            data["result"] = wf.__workflow_parts__.codec.dump(value)
        elif status in ended:
            data["error"] = f"{type(value).__name__}: {value}"
        elif state is not None:
            data["waiting_for"] = list(dict.fromkeys(w.awaited for w in state.waiters))
        emit_json(data)
    elif status == "finished":
        click.echo(f"run {run_id} finished: {show_typed(value, 2000)}")
    elif status == "failed":
        click.echo(f"run {run_id} failed: {type(value).__name__}: {value}")
    elif status == "timed_out":
        q = shlex.quote
        resume = f"workflow resume {q(db)} {q(run_id)} --workflow {q(spec)}"
        click.echo(
            f"run {run_id} timed out: {value} (`{resume}` continues it, with a fresh timeout;"
            " an answer it waits for can be sent first)"
        )
    elif status == "interrupted":
        why = f"{type(value).__name__}: {value}"
        if wf.store.get_run(run_id) is None:  # its first commit could not be written
            click.echo(f"run {run_id} was not started: {why}")
        else:
            q = shlex.quote
            resume = f"workflow resume {q(db)} {q(run_id)} --workflow {q(spec)}"
            click.echo(f"run {run_id} stopped, still resumable (`{resume}`): {why}")
    elif status == "cancelled":
        q = shlex.quote
        resume = f"workflow resume {q(db)} {q(run_id)} --cancelled --workflow {q(spec)}"
        reason = getattr(value, "reason", None)
        why = f": {reason}" if reason else ""
        click.echo(f"run {run_id} cancelled{why} (`{resume}` continues it)")
    else:
        waiters = state.waiters if state is not None else []
        names = list(dict.fromkeys(public_event_name(w.awaited) for w in waiters))
        awaited = ", ".join(names) or "an event"
        event = names[0] if len(names) == 1 else "MODULE:CLASS"
        click.echo(
            f"run {run_id} is waiting for {awaited}; send it with"
            f" `workflow send {shlex.quote(db)} {shlex.quote(run_id)} --event {event} --data JSON`,"
            f" then resume it"
        )
    if status in ended:
        raise click.exceptions.Exit(1)


@contextlib.contextmanager
def left_unfinished(db: str, ids: list[str], spec: str) -> Iterator[None]:
    """On Ctrl-C, says how to continue the run it left (what it committed is kept)."""
    try:
        yield
    except KeyboardInterrupt:
        if ids:
            click.echo(
                f"run {ids[0]} was left unfinished; `workflow resume {shlex.quote(db)} {ids[0]}"
                f" --workflow {spec}` continues it",
                err=True,
            )
        raise


def json_object(text: str, option: str) -> dict[str, Any]:
    try:
        fields = loads_exact(text)
    except ValueError as exc:
        msg = f"not JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise click.BadParameter(msg, param_hint=option) from None
    if not isinstance(fields, dict):
        msg = "must be a JSON object of the event's fields"
        raise click.BadParameter(msg, param_hint=option)
    return fields


@contextlib.contextmanager
def recorded_by_other(run_id: str, stranded_flag: str | None = None) -> Iterator[None]:
    """Says which ``--workflow`` to pass when the run is another workflow class's."""
    try:
        yield
    except WorkflowChangedError as exc:
        if not exc.recorded_by and stranded_flag is None:
            raise
        if not exc.recorded_by:
            msg = (
                f"run {run_id!r} cannot continue with this workflow:"
                f" {'; '.join(exc.problems)}; pass {stranded_flag} to proceed and leave that"
                " work undone"
            )
            raise WorkflowRuntimeError(msg) from None
        msg = (
            f"run {run_id!r} was recorded by {exc.recorded_by}, and this workflow cannot"
            f" continue it ({'; '.join(exc.problems)}): pass --workflow {exc.recorded_by}"
        )
        raise WorkflowRuntimeError(msg) from None
