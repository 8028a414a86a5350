"""The commands that change a store: ``run``, ``resume``, ``recover``, ``fork`` and ``send``.

They import the user's workflow (``--workflow module:Class``), the one place the command
line runs user code, because running it is what the user asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Iterator
from typing import Any, Final

import click
import orjson

from eventstore import Codec, EventStore, class_name

from .._errors import RunSuspendedError, WorkflowChangedError, WorkflowRuntimeError
from .._events import Event
from .._handler import WorkflowHandler
from .._read import check_seq, run_info
from .._recover import Recovery
from .._state import TERMINAL
from .._workflow import Workflow
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
from ._render import short_class, show_dump, show_typed, table

__all__ = ["fork", "parse_sets", "recover", "resume", "run", "send"]


def _workflow_required(f: Any) -> Any:
    return allow_pickle_option(
        click.option(
            "--workflow",
            "workflow_spec",
            required=True,
            metavar="MODULE:CLASS",
            help="The Workflow class to run (imported, then built as Class(store=DB)).",
        )(f)
    )


def _sets_option(f: Any) -> Any:
    return click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=JSON",
        help="Write a context key first (JSON; codec-tagged values allowed). Repeatable.",
    )(f)


def _timeout_option(f: Any) -> Any:
    return click.option(
        "--timeout", type=float, help="The run's timeout in seconds (default: the class's)."
    )(f)


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
            out[key] = orjson.loads(text)
        except orjson.JSONDecodeError:
            msg = (
                f"the value of {key!r} is not JSON: {text!r}"
                " (quote strings, e.g. --set name='\"Ada\"')"
            )
            raise click.BadParameter(msg, param_hint="--set") from None
    return out


def _build(db: str, spec: str, timeout: float | None) -> Workflow:
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


async def _outcome(handler: WorkflowHandler, store: EventStore) -> tuple[str, Any]:
    """Awaits a run until it ends, or leaves it once only waiters remain (``waiting``)."""
    ended = asyncio.ensure_future(_settle(handler))
    idle = asyncio.ensure_future(_idle(handler, store))
    await asyncio.wait({ended, idle}, return_when=asyncio.FIRST_COMPLETED)
    if not ended.done():
        # Nothing can happen until an event is sent: leave the run, resumable later.
        await handler.suspend()
    idle.cancel()
    return await ended


async def _settle(handler: WorkflowHandler) -> tuple[str, Any]:
    try:
        return "finished", await handler
    except RunSuspendedError:
        return "waiting", None
    except Exception as exc:  # the user's step raised: that is the run's outcome, not ours
        return "failed", exc


def _report(wf: Workflow, run_id: str, outcome: tuple[str, Any], as_json: bool, db: str) -> None:
    status, value = outcome
    state = wf.state_at(run_id) if status != "failed" else None
    if as_json:
        data: dict[str, Any] = {"run_id": run_id, "status": status}
        if status == "finished":
            data["result"] = wf._codec.dump(value)
        elif status == "failed":
            data["error"] = f"{type(value).__name__}: {value}"
        elif state is not None:
            data["waiting_for"] = [w.awaited for w in state.waiters]
        emit_json(data)
    elif status == "finished":
        click.echo(f"run {run_id} finished: {show_typed(value, 2000)}")
    elif status == "failed":
        click.echo(f"run {run_id} failed: {type(value).__name__}: {value}")
    else:
        awaited = ", ".join(w.awaited for w in state.waiters) if state else "an event"
        click.echo(
            f"run {run_id} is waiting for {awaited}; send it with"
            f" `workflow send {db} {run_id} --event MODULE:CLASS --data JSON`,"
            f" then resume it"
        )
    if status == "failed":
        raise click.exceptions.Exit(1)


@cli.command(name="run")
@click.argument("db")
@_workflow_required
@click.option("--data", default="{}", metavar="JSON", help="The start event's fields (object).")
@click.option("--run-id", default=None, help="The new run's id (default: a random one).")
@_timeout_option
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
    fields = _json_object(data, "--data")
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
        return await _outcome(handler, wf.store)

    ids: list[str] = []
    try:
        with _left_unfinished(db, ids, workflow_spec):
            outcome = asyncio.run(go())
        _report(wf, ids[0], outcome, as_json, db)
    finally:
        wf.store.close()


@contextlib.contextmanager
def _left_unfinished(db: str, ids: list[str], spec: str) -> Iterator[None]:
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


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        fields = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        msg = f"not JSON: {exc}"
        raise click.BadParameter(msg, param_hint=option) from None
    if not isinstance(fields, dict):
        msg = "must be a JSON object of the event's fields"
        raise click.BadParameter(msg, param_hint=option)
    return fields


@cli.command()
@click.argument("db")
@click.argument("run")
@_workflow_required
@_sets_option
@click.option("--cancelled", is_flag=True, help="Also continue a cancelled run.")
@click.option(
    "--allow-stranded",
    is_flag=True,
    help="Continue even though some of the run's pending work has no step to take it now"
    " (that work is left undone).",
)
@_timeout_option
@json_option
def resume(
    db: str,
    run: str,
    workflow_spec: str,
    sets: tuple[str, ...],
    cancelled: bool,
    allow_stranded: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Continue RUN from the end of its log: only unfinished work runs again."""
    raw = parse_sets(sets)
    wf = _build(db, workflow_spec, timeout)
    updates = {k: wf._codec.load(v) for k, v in raw.items()}

    async def go() -> tuple[str, Any]:
        with _recorded_by_other(run, "--allow-stranded"):
            handler = wf.resume(
                run, updates=updates or None, cancelled=cancelled, allow_stranded=allow_stranded
            )
        return await _outcome(handler, wf.store)

    try:
        with _left_unfinished(db, [run], workflow_spec):
            outcome = asyncio.run(go())
        _report(wf, run, outcome, as_json, db)
    finally:
        wf.store.close()


@contextlib.contextmanager
def _recorded_by_other(run_id: str, stranded_flag: str | None = None) -> Iterator[None]:
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


# Recoveries that need a person: the run was not resumed, or it ended failed.
_NOT_RESUMED: Final = frozenset({"stranded", "incompatible", "recovery_limit", "failed"})


@contextlib.contextmanager
def _quiet_log() -> Iterator[None]:
    """Keeps the ``workflow`` logger's records off stderr where nobody configured logging:
    the command prints every outcome itself."""
    log = logging.getLogger("workflow")
    null = logging.NullHandler()
    log.addHandler(null)
    try:
        yield
    finally:
        log.removeHandler(null)


def _error_text(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"


@cli.command()
@click.argument("db")
@_workflow_required
@click.option(
    "--check",
    is_flag=True,
    help="Resume only the runs a static verify passes (after a deploy); list the others"
    " as incompatible, with what verify found.",
)
@_timeout_option
@json_option
def recover(db: str, workflow_spec: str, check: bool, timeout: float | None, as_json: bool) -> None:
    """Resume every pending run of the workflow here (wf.recover()) and wait for each.

    Prints a line a run: its id, what recover did (resumed, waiting, owned, stranded,
    incompatible, recovery_limit, failed) with how a resumed run ended, and its result or
    error. A run that only waits for an event nobody sent is left as it is (waiting); one
    left waiting after its resume stays resumable. With --check
    (wf.recover(compatible_only=True)) a run whose recorded values no longer decode or
    whose pending work no longer routes is not resumed, and nothing of it runs
    (incompatible). Exit status 1 when a run is stranded, incompatible, past its recovery
    limit, failed to resume, or failed once resumed.
    """
    wf = _build(db, workflow_spec, timeout)

    async def settle(r: Recovery) -> tuple[str, Any] | None:
        return None if r.handler is None else await _outcome(r.handler, wf.store)

    async def go() -> tuple[list[Recovery], list[tuple[str, Any] | None]]:
        with _quiet_log():
            found = wf.recover(compatible_only=check)
        return found, list(await asyncio.gather(*map(settle, found)))

    try:
        try:
            found, ends = asyncio.run(go())
        except KeyboardInterrupt:
            click.echo(
                f"the runs resumed here were left unfinished; `workflow recover"
                f" {shlex.quote(db)} --workflow {workflow_spec}` continues them",
                err=True,
            )
            raise
        rows = [_recovery_row(wf, r, end) for r, end in zip(found, ends, strict=True)]
    finally:
        wf.store.close()
    if as_json:
        emit_json([row for row, _ in rows])
    elif rows:
        lines = [(row["run_id"], _shown_outcome(row), text) for row, text in rows]
        click.echo(table(lines, ["run", "outcome", "result or error"]))
    counts: dict[str, int] = {}
    for row, _ in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    listed = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    click.echo(f"{len(rows)} pending run(s): {listed}" if rows else "no pending runs", err=True)
    if any(row["outcome"] in _NOT_RESUMED or row["status"] == "failed" for row, _ in rows):
        raise click.exceptions.Exit(1)


def _shown_outcome(row: dict[str, Any]) -> str:
    """``resumed, finished``: what recover did, and how a resumed run ended."""
    if row["outcome"] == "resumed":
        return f"resumed, {row['status']}"
    return str(row["outcome"])


def _recovery_row(
    wf: Workflow, r: Recovery, end: tuple[str, Any] | None
) -> tuple[dict[str, Any], str]:
    """One run's recovery as JSON-native data, and its result or error as text."""
    error = _error_text(r.error)
    row: dict[str, Any] = {
        "run_id": r.run_id,
        "outcome": r.outcome,
        "status": "failed" if r.outcome == "recovery_limit" else None,
        "result": None,
        "error": error or None,
        "waiting_for": [],
        "problems": [
            {"seq": p.seq, "step": p.step, "kind": p.kind, "message": p.message} for p in r.problems
        ],
    }
    text = error
    if r.outcome == "incompatible":
        text = "; ".join(str(p) for p in r.problems)
    if r.outcome == "waiting":
        row["status"] = "waiting"
        row["waiting_for"] = list(r.waiting_for)
        text = "for " + ", ".join(short_class(a) for a in r.waiting_for)
    if r.outcome == "resumed" and end is not None:
        status, value = end
        row["status"] = status
        if status == "finished":
            row["result"] = wf._codec.dump(value)
            text = show_typed(value, 2000)
        elif status == "failed":
            row["error"] = text = _error_text(value)
        else:
            row["waiting_for"] = [w.awaited for w in wf.state_at(r.run_id).waiters]
            text = "for " + ", ".join(short_class(a) for a in row["waiting_for"])
    return row, text


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option("--at", "at", type=int, required=True, metavar="SEQ", help="The checkpoint seq.")
@_workflow_required
@_sets_option
@_timeout_option
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
    wf = _build(db, workflow_spec, timeout)
    updates = {k: wf._codec.load(v) for k, v in raw.items()}
    new_id: list[str] = []

    async def go() -> tuple[str, Any]:
        with _recorded_by_other(run):
            handler = wf.run_from((run, at), updates=updates or None)
        new_id.append(handler.run_id)
        if not as_json:
            click.echo(f"forked run {run} at seq {at} as {handler.run_id}")
        return await _outcome(handler, wf.store)

    try:
        with _left_unfinished(db, new_id, workflow_spec):
            outcome = asyncio.run(go())
        _report(wf, new_id[0], outcome, as_json, db)
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
    fields = _json_object(data, "--data")
    try:
        event = cls.model_validate(fields)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        msg = " ".join(str(exc).split())
        raise click.BadParameter(msg, param_hint="--data") from None
    if workflow_spec is not None:
        wf = _build(db, workflow_spec, None)
        try:
            entry = wf.send(run, event, idempotency_key=key)
        finally:
            wf.store.close()
    else:
        open_store(db).close()
        with EventStore(db) as store:
            info = run_info(store, run)
            if (info.status or "running") in TERMINAL:
                msg = f"run {run!r} has {info.status}; nothing would take the event in"
                raise WorkflowRuntimeError(msg)
            entry = store.post_sync(run, Codec().encode(event), key=key)
    name = class_name(cls)
    if as_json:
        emit_json({"run_id": run, "inbox_id": entry, "event_type": name})
        return
    shown = show_dump(Codec().dump(event), 200)
    click.echo(
        f"sent {shown} to run {run} (inbox entry {entry}); a running executor takes it in"
        f" at once, otherwise `workflow resume` does"
    )
