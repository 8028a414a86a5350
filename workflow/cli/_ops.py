"""Commands for operating a store: ``verify`` recorded runs, run a ``worker``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from .._verify import verify as verify_runs
from .._worker import Worker
from ._app import cli
from ._common import (
    allow_pickle_option,
    check_store_to_write,
    emit_json,
    json_option,
    load_workflow,
)
from ._inspect import open_store, shown_location

__all__ = ["verify", "worker"]


@cli.command()
@click.argument("db")
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@click.option(
    "--workflow",
    "workflow_spec",
    required=True,
    metavar="MODULE:CLASS",
    help="Today's Workflow class to check the recorded runs against.",
)
@allow_pickle_option
@click.option(
    "--reexecute",
    is_flag=True,
    help="Also run each recorded successful attempt again and compare its outputs.",
)
@json_option
def verify(
    db: str, run_ids: tuple[str, ...], workflow_spec: str, reexecute: bool, as_json: bool
) -> None:
    """Check recorded runs against the current code (exit status 1 when one diverges).

    Without --reexecute nothing runs: recorded events and values must decode, queued and
    in-progress work must still route, outputs must fit the steps' return types, and
    changes to the step graph are listed.
    """
    store = open_store(db)
    wf = load_workflow(workflow_spec, store)
    total = sum((r.last_seq or 0) - (r.first_seq or 0) + 1 for r in store.runs())
    show_bar = sys.stderr.isatty() and total >= 20_000 and not as_json
    with (
        click.progressbar(length=total, label="verifying", file=sys.stderr)
        if show_bar
        else _Null() as bar
    ):
        report = verify_runs(
            wf, run_ids or None, reexecute=reexecute, progress=bar.update if show_bar else None
        )
    if as_json:
        emit_json(
            {
                "ok": report.ok,
                "runs": report.runs,
                "records": report.records,
                "attempts_reexecuted": report.attempts_reexecuted,
                "problems": [
                    {
                        "run_id": p.run_id,
                        "seq": p.seq,
                        "step": p.step,
                        "kind": p.kind,
                        "message": p.message,
                        "expected": p.expected,
                        "actual": p.actual,
                    }
                    for p in report.problems
                ],
            }
        )
    else:
        for p in report.problems:
            click.echo(str(p))
        verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        extra = f", {report.attempts_reexecuted} attempts re-executed" if reexecute else ""
        click.echo(
            f"verified {len(report.runs)} run(s), {report.records} records{extra}: {verdict}"
        )
    if not report.ok:
        raise click.exceptions.Exit(1)


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n_steps: int) -> None:
        return None


@cli.command()
@click.option("--store", "db", required=True, help="The store: an SQLite path or a PostgreSQL URL.")
@click.option(
    "--workflow",
    "workflow_spec",
    required=True,
    metavar="MODULE:CLASS",
    help="The Workflow class whose runs this worker executes.",
)
@allow_pickle_option
@click.option("--concurrency", default=4, show_default=True, help="Runs executed at once.")
@click.option("--poll", default=0.2, show_default=True, help="Seconds between looks for new work.")
def worker(db: str, workflow_spec: str, concurrency: int, poll: float) -> None:
    """Claim and execute runs that need work until SIGTERM or Ctrl-C.

    New runs (wf.submit), runs whose executor died and waiting runs whose answer arrived
    are picked up; on SIGTERM running attempts are left cleanly for another worker.
    """
    check_store_to_write(db)
    wf = load_workflow(workflow_spec, db)

    async def go() -> int:
        w = Worker(wf, concurrency=concurrency, poll_interval=poll)
        where = shown_location(db)  # never print a password
        click.echo(f"worker on {where}: {workflow_spec}, concurrency {concurrency}", err=True)
        return await w.run(handle_signals=True)

    done: Any = asyncio.run(go())
    click.echo(f"worker stopped after {done} run(s)", err=True)
