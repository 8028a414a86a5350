"""``workflow prune``: retention, deleting whole runs that ended long enough ago."""

from __future__ import annotations

from pathlib import Path

import click

from eventstore import EventStore, NotAStoreError

from .._ownership import probe_owners
from .._prune import DEFAULT_STATUSES, PruneReport, parse_duration, prune_runs
from ._app import cli
from ._common import emit_json, json_option
from ._inspect import is_url, open_store

__all__ = ["prune"]


def _writable_store(db: str) -> EventStore:
    """An existing store opened for writing (never created: a typo must not make one)."""
    if not is_url(db) and Path(db).is_file() and Path(db).stat().st_size == 0:
        raise NotAStoreError(db, "an empty file, not a store")
    return open_store(db, readonly=False)


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


@cli.command()
@click.argument("db")
@click.option(
    "--older-than",
    required=True,
    callback=_duration,
    metavar="DURATION",
    help="Delete runs whose last record is older than this: 30d, 12h, 90m, 45s, 2w.",
)
@click.option(
    "--status",
    "statuses",
    default=",".join(DEFAULT_STATUSES),
    show_default=True,
    metavar="S,S...",
    help="Which runs, by status (interrupted: crashed runs nobody resumed; submitted: runs"
    " no worker took up).",
)
@click.option(
    "--include-waiting",
    is_flag=True,
    help="Also delete runs waiting for an event (a human's answer); kept otherwise.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@json_option
def prune(
    db: str,
    older_than: str,
    statuses: str,
    include_waiting: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete whole runs that ended long enough ago, then give their space back.

    A run goes with everything of it (records, inbox, snapshots, lease). The runs a kept
    fork was forked from stay, as do runs waiting for an event (unless --include-waiting)
    and runs a live executor holds.
    """
    wanted = [s.strip() for s in statuses.split(",") if s.strip()]
    store = _writable_store(db)
    try:
        report = prune_runs(
            store,
            probe_owners(store),
            older_than=older_than,
            statuses=wanted,
            include_waiting=include_waiting,
            dry_run=dry_run,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        emit_json(_as_dict(report))
        return
    verb = "would delete" if dry_run else "deleted"
    for run_id in report.deleted:
        click.echo(f"{verb} {run_id}")
    for run_id in report.kept_for_forks:
        click.echo(f"kept {run_id}: a fork of it is kept")
    for run_id in report.kept_waiting:
        click.echo(f"kept {run_id}: waiting for an event (--include-waiting deletes it)")
    for run_id in report.kept_changed:
        click.echo(f"kept {run_id}: it changed while pruning")
    line = f"{verb} {len(report.deleted)} run(s)"
    if not dry_run and report.bytes_before is not None and report.bytes_after is not None:
        line += f"; the store went from {report.bytes_before:,} to {report.bytes_after:,} bytes"
    click.echo(line)


def _as_dict(report: PruneReport) -> dict[str, object]:
    return {
        "dry_run": report.dry_run,
        "deleted": report.deleted,
        "kept_for_forks": report.kept_for_forks,
        "kept_waiting": report.kept_waiting,
        "kept_changed": report.kept_changed,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
    }
