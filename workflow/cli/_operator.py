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


def cancel_run(store: EventStore, run_id: str) -> int:
    """Cancels a run from outside whatever executes it; returns the seq of ``run_cancelled``.

    It takes the run over first (a new epoch): an executor running it elsewhere loses it at
    its next commit, which the store refuses, so nothing it does afterwards lands. Then it
    records ``run_cancelled``, under that epoch. ``resume --cancelled`` continues it.

    :raises RunNotFoundError: no such run.
    :raises WorkflowRuntimeError: the run has already ended.
    """
    info = run_info(store, run_id)
    if (info.status or "running") in TERMINAL:
        msg = f"run {run_id!r} has already {_ended(info.status)}; there is nothing to cancel"
        raise WorkflowRuntimeError(msg)
    epoch = store.claim_sync(run_id)
    # It may have ended between the look and the claim; no commit of its executor lands now.
    info = run_info(store, run_id)
    if (info.status or "running") in TERMINAL:
        msg = f"run {run_id!r} {_ended(info.status)} meanwhile; there is nothing to cancel"
        raise WorkflowRuntimeError(msg)
    try:
        done = store.append_sync(
            Commit(run_id, [journal.run_cancelled()], epoch=epoch, status="cancelled")
        )
    except ConcurrencyError as exc:
        msg = f"run {run_id!r} was taken over by another process while cancelling it ({exc})"
        raise WorkflowRuntimeError(msg) from None
    return done.last_seq


def _ended(status: str | None) -> str:
    return "timed out" if status == "timed_out" else str(status)


@cli.command()
@click.argument("db")
@click.argument("run")
@json_option
def cancel(db: str, run: str, as_json: bool) -> None:
    """Cancel RUN: whatever executes it stops at its next commit; `run_cancelled` is recorded.

    Needs no user code. `workflow resume --cancelled` continues the run later.
    """
    open_store(db).close()  # an existing store: cancelling never makes one
    with EventStore(db, payload_codec=cli_codec()) as store:
        seq = cancel_run(store, run)
    if as_json:
        emit_json({"run_id": run, "status": "cancelled", "seq": seq})
        return
    click.echo(f"cancelled run {run} (run_cancelled at seq {seq})")
