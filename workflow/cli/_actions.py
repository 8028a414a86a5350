"""The commands that change a store: ``run``, ``resume``, ``fork`` and ``send``
(``recover`` is :mod:`._recover`'s).

They import the user's workflow (``--workflow module:Class``), the one place the command
line runs user code, because running it is what the user asked for.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from eventstore import Codec, EventStore, class_name

from .._cancel_wait import CANCELLING_WAIT_S, resume_when_let_go
from .._errors import RunCancellingError, WorkflowRuntimeError
from .._events import Event
from .._read import check_seq, run_info
from .._seqs import fork_said
from .._state import REFUSES_EVENTS
from ._app import cli
from ._common import (
    allow_pickle_option,
    check_store_to_write,
    emit_json,
    import_object,
    json_option,
    load_workflow,
)
from ._inspect import open_store
from ._keys import cli_codec, refuse_plain_write
from ._render import show_dump
from ._running import (
    build_workflow,
    json_object,
    left_unfinished,
    outcome_of,
    parse_sets,
    recorded_by_other,
    report,
    say_asked,
    sets_option,
    timeout_option,
    workflow_required,
)

if TYPE_CHECKING:
    from .._handler import WorkflowHandler

__all__ = ["fork", "parse_sets", "resume", "run", "send"]


@cli.command(name="run")
@click.argument("db")
@workflow_required
@click.option("--data", default="{}", metavar="JSON", help="The start event's fields (object).")
@click.option("--run-id", default=None, help="The new run's id (default: a random one).")
@timeout_option
@json_option
def run(
    db: str,
    workflow_spec: str,
    data: str,
    run_id: str | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Start a run of the workflow in DB (created if missing) and wait for its outcome."""
    fields = json_object(data, "--data")
    check_store_to_write(db)  # refuse a place that cannot hold a store before writing to it
    wf = load_workflow(workflow_spec, db, **({} if timeout is None else {"timeout": timeout}))
    if run_id is not None and wf.store.get_run(run_id) is not None:
        click.echo(
            f"run {run_id} exists already: continuing it (a run starts once; --data is not"
            " used). Fork it with `workflow fork` to start over with other data.",
            err=True,
        )

    async def go() -> tuple[str, Any]:
        handler = wf.run(run_id=run_id, **fields)
        ids.append(handler.run_id)
        return await outcome_of(handler, wf.store, asks=say_asked(wf, db))

    ids: list[str] = []
    try:
        with left_unfinished(db, ids, workflow_spec):
            outcome = asyncio.run(go())
        report(wf, ids[0], outcome, as_json, db, workflow_spec)
    finally:
        wf.store.close()


@cli.command()
@click.argument("db")
@click.argument("run")
@workflow_required
@sets_option
@click.option("--cancelled", is_flag=True, help="Also continue a cancelled run.")
@click.option(
    "--allow-stranded",
    is_flag=True,
    help="Continue even though some of the run's pending work has no step to take it now"
    " (that work is left undone).",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=CANCELLING_WAIT_S,
    show_default=True,
    metavar="SECONDS",
    help="With --cancelled: how long to wait for the executor of a run just cancelled to"
    " let go of it (within a second; a step blocking its event loop, once that step ends).",
)
@timeout_option
@json_option
def resume(
    db: str,
    run: str,
    workflow_spec: str,
    sets: tuple[str, ...],
    cancelled: bool,
    allow_stranded: bool,
    wait_s: float,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Continue RUN from the end of its log: only unfinished work runs again.

    A run cancelled a moment ago may still be held by the executor that was running it
    (it lets go within a second): with --cancelled, resume waits up to --wait seconds
    for that, saying so, then says what holds the run.
    """
    raw = parse_sets(sets)
    wf = build_workflow(db, workflow_spec, timeout)
    updates = {k: wf.__workflow_parts__.codec.load(v) for k, v in raw.items()}

    def attempt() -> WorkflowHandler:
        with recorded_by_other(run, "--allow-stranded"):
            return wf.resume(
                run, updates=updates or None, cancelled=cancelled, allow_stranded=allow_stranded
            )

    def waiting(exc: RunCancellingError) -> None:
        click.echo(
            f"run {run} is still being cancelled ({exc.detail} holds it): waiting up to"
            f" {wait_s:g} s for it to let go",
            err=True,
        )

    async def go() -> tuple[str, Any]:
        handler = await resume_when_let_go(attempt, wait_s=wait_s, on_wait=waiting)
        return await outcome_of(handler, wf.store, asks=say_asked(wf, db))

    try:
        with left_unfinished(db, [run], workflow_spec):
            outcome = asyncio.run(go())
        report(wf, run, outcome, as_json, db, workflow_spec)
    finally:
        wf.store.close()


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option("--at", "at", type=int, required=True, metavar="SEQ", help="The checkpoint seq.")
@workflow_required
@sets_option
@timeout_option
@json_option
def fork(
    db: str,
    run: str,
    at: int,
    workflow_spec: str,
    sets: tuple[str, ...],
    timeout: float | None,
    as_json: bool,
) -> None:
    """Start a new run from RUN's state at seq SEQ (the parent is never changed)."""
    raw = parse_sets(sets)
    with open_store(db) as store:
        check_seq(store, run, at)
    wf = build_workflow(db, workflow_spec, timeout)
    updates = {k: wf.__workflow_parts__.codec.load(v) for k, v in raw.items()}
    new_id: list[str] = []

    async def go() -> tuple[str, Any]:
        with recorded_by_other(run):
            handler = wf.run_from((run, at), updates=updates or None)
        new_id.append(handler.run_id)
        if not as_json:
            recorded = wf.__workflow_parts__.fold(run, at).seq  # what the fork records
            click.echo(fork_said(run, at, recorded, handler.run_id))
        return await outcome_of(handler, wf.store)

    try:
        with left_unfinished(db, new_id, workflow_spec):
            outcome = asyncio.run(go())
        report(wf, new_id[0], outcome, as_json, db, workflow_spec)
    finally:
        wf.store.close()


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "--event", "event_spec", required=True, metavar="MODULE:CLASS", help="The event class."
)
@click.option("--data", default="{}", metavar="JSON", help="The event's fields as a JSON object.")
@click.option("--key", default=None, help="An idempotency key: the event is recorded once.")
@click.option(
    "--workflow",
    "workflow_spec",
    metavar="MODULE:CLASS",
    help="Send through this Workflow class (wf.send) instead of posting the event directly.",
)
@allow_pickle_option
@json_option
def send(
    db: str,
    run: str,
    event_spec: str,
    data: str,
    key: str | None,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """Record an external event for RUN; its executor (or the next resume) takes it in."""
    cls = import_object(event_spec, "--event")
    if not (isinstance(cls, type) and issubclass(cls, Event)):
        msg = f"{event_spec} is not an Event subclass"
        raise click.BadParameter(msg, param_hint="--event")
    fields = json_object(data, "--data")
    try:
        event = cls.model_validate(fields)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        msg = " ".join(str(exc).split())
        raise click.BadParameter(msg, param_hint="--data") from None
    if workflow_spec is not None:
        wf = build_workflow(db, workflow_spec, None)
        try:
            entry = wf.send(run, event, idempotency_key=key)
            status = run_info(wf.store, run).status
        finally:
            wf.store.close()
    else:
        open_store(db).close()
        with EventStore(db, payload_codec=cli_codec()) as store:
            refuse_plain_write(store, run)
            info = run_info(store, run)
            if (info.status or "running") in REFUSES_EVENTS:
                msg = f"run {run!r} has {info.status}; nothing would take the event in"
                raise WorkflowRuntimeError(msg)
            entry = store.post_sync(run, Codec().encode(event), key=key)
            status = info.status
    name = class_name(cls)
    if as_json:
        emit_json({"run_id": run, "inbox_id": entry, "event_type": name})
        return
    shown = show_dump(Codec().dump(event), 200)
    if status == "cancelled":
        then = "the run is cancelled: `workflow resume --cancelled` takes it in"
    elif status == "timed_out":
        then = "the run timed out: `workflow resume` takes it in"
    else:
        then = "a running executor takes it in at once, otherwise `workflow resume` does"
    click.echo(f"sent {shown} to run {run} (inbox entry {entry}); {then}")
