"""``workflow cancel``: cancel a run from outside the process that executes it."""

from __future__ import annotations

import click

from eventstore import Commit, ConcurrencyError, EventStore

from .. import _journal as journal
from .._errors import WorkflowRuntimeError
from .._read import run_info
from .._state import TERMINAL
from ._app import cli
from ._common import emit_json, json_option
from ._inspect import open_store
from ._keys import cli_codec

__all__ = ["cancel_run"]


def cancel_run(
    store: EventStore, run_id: str, *, reason: str | None = None, via: str = "workflow cancel"
) -> int:
    """Cancels a run from outside whatever executes it; returns the seq of ``run_cancelled``.

    It takes the run over first (a new epoch): the store refuses every later commit of an
    executor running it elsewhere, so nothing it does afterwards lands, and that executor
    stops within a fraction of a second (``_takeover``), its caller told
    :class:`WorkflowCancelledByUser` with ``reason``. Then it records ``run_cancelled``,
    under that epoch (with ``via`` and ``reason``). ``resume --cancelled`` continues it.

    :raises RunNotFoundError: no such run.
    :raises WorkflowRuntimeError: the run has already ended.
    """
    info = run_info(store, run_id)
    if (info.status or "running") in TERMINAL:
        msg = f"run {run_id!r} {_ended(info.status, 'already ')}; there is nothing to cancel"
        raise WorkflowRuntimeError(msg)
    epoch = store.claim_sync(run_id)
    # It may have ended between the look and the claim; no commit of its executor lands now.
    info = run_info(store, run_id)
    if (info.status or "running") in TERMINAL:
        msg = f"run {run_id!r} {_ended(info.status)} meanwhile; there is nothing to cancel"
        raise WorkflowRuntimeError(msg)
    try:
        done = store.append_sync(
            Commit(run_id, [journal.run_cancelled(via, reason)], epoch=epoch, status="cancelled")
        )
    except ConcurrencyError as exc:
        msg = f"run {run_id!r} was taken over by another process while cancelling it ({exc})"
        raise WorkflowRuntimeError(msg) from None
    return done.last_seq


def _ended(status: str | None, already: str = "") -> str:
    """How the run ended, as a verb phrase: "has already failed", "was cancelled"."""
    if status == "cancelled":
        return f"was {already}cancelled"
    verb = "timed out" if status == "timed_out" else str(status)
    return f"has {already}{verb}" if already else verb


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option("--reason", help="Why: recorded, shown by history, raised to the run's caller.")
@json_option
def cancel(db: str, run: str, reason: str | None, as_json: bool) -> None:
    """Cancel RUN: whatever executes it stops within a second; `run_cancelled` is recorded.

    Needs no user code. The process awaiting the run gets WorkflowCancelledByUser (with
    the reason). `workflow resume --cancelled` continues the run later.
    """
    open_store(db).close()  # an existing store: cancelling never makes one
    with EventStore(db, payload_codec=cli_codec()) as store:
        seq = cancel_run(store, run, reason=reason)
    if as_json:
        emit_json({"run_id": run, "status": "cancelled", "seq": seq, "reason": reason})
        return
    click.echo(f"cancelled run {run} (run_cancelled at seq {seq})")
