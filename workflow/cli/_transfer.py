"""``workflow export`` and ``workflow import``: a run travels to another store.

An export is a store file of its own holding the run and the ancestors its fork needs, with
the same seqs and times as the original, so that ``state``, ``diff``, ``verify`` and ``fork``
give the same answers on a laptop as in production; ``import`` adds its runs to a store.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from eventstore import EventStore

from .._transfer import Part, copy_runs, export_run
from ._app import cli
from ._inspect import is_url, open_store
from ._keys import cli_codec

__all__ = ["export", "import_runs"]


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "-o", "--output", "out", required=True, metavar="FILE", help="The new store file to write."
)
def export(db: str, run: str, out: str) -> None:
    """Write RUN (with the ancestors its fork needs) into FILE, a new store of its own.

    Seqs, times and snapshots are kept: the export reads exactly as DB does.
    """
    if is_url(out):
        msg = "the export is a store file; give a path"
        raise click.BadParameter(msg, param_hint="'-o'")
    if Path(out).exists():
        msg = f"{out} exists; an export writes a new file"
        raise click.BadParameter(msg, param_hint="'-o'")
    store = open_store(db)
    target = EventStore(out, payload_codec=cli_codec())
    try:
        copied = export_run(store, run, target)
    except BaseException:
        target.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(out + suffix):
                os.remove(out + suffix)
        raise
    target.close()
    click.echo(f"exported {', '.join(copied)} to {out}", err=True)


@cli.command("import")
@click.argument("db")
@click.argument("file")
def import_runs(db: str, file: str) -> None:
    """Add every run of FILE (an export) to the store DB, created when it does not exist.

    Their seqs are kept when they come after DB's last one, else moved past it together.
    """
    if not is_url(file) and not Path(file).exists():
        # Most often the two arguments swapped: the store first, as in every command.
        msg = (
            f"{file}: no such file to import; `workflow import DB FILE` adds the runs of"
            " FILE (an export) to the store DB, which it creates when missing"
        )
        raise FileNotFoundError(msg)
    source = open_store(file)
    target = EventStore(db, payload_codec=cli_codec())
    try:
        parts = [Part(info) for info in source.runs()]
        copied = copy_runs(source, parts, target)
    finally:
        target.close()
    click.echo(f"imported {', '.join(copied)} into {db}", err=True)
