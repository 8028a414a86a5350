"""``workflow check``: is the store whole? (the checks are ``workflow._check``'s)."""

from __future__ import annotations

import click

from .._check import check_store
from ._app import cli
from ._common import emit_json, json_option
from ._inspect import open_store
from ._keys import KEY_FILE_ENV

__all__ = ["check"]


@cli.command()
@click.argument("db")
@click.argument("run", required=False)
@json_option
def check(db: str, run: str | None, as_json: bool) -> None:
    """Check DB (or only RUN): SQLite's integrity check and a full fold of every run.

    Each run is folded from its first record, without its cached state, which must then
    equal the fold at its seq (a PostgreSQL store gets the folds only). Prints a line per
    problem, naming the run and the first bad seq; the exit status is 1 when there is one,
    0 when the store is whole. Without --key-file, a run whose payloads are encrypted gets
    only the checks that need no values (seqs, kinds, envelopes), and is named with the key
    id that would check the rest.
    """
    store = open_store(db)
    report = check_store(store, run)
    if as_json:
        unchecked = [{"run_id": r, "key_id": kid} for r, kid in report.unchecked.items()]
        emit_json(
            {
                "ok": report.ok,
                "integrity": report.integrity or None,
                "runs": report.runs,
                "records": report.records,
                "problems": [
                    {
                        "what": p.what,
                        "run_id": p.run_id,
                        "seq": p.seq,
                        "error": p.error,
                        "message": p.message,
                    }
                    for p in report.problems
                ],
            }
            # runs checked without their payloads' key: listed only when there are some
            | ({"unchecked": unchecked} if unchecked else {})
        )
    else:
        for p in report.problems:
            click.echo(str(p))
        for r, kid in report.unchecked.items():
            click.echo(
                f"run {r}: payloads not checked: encrypted with key id {kid!r}"
                f" (pass --key-file or set {KEY_FILE_ENV} to check them)",
                err=True,
            )
        verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        if report.unchecked:
            verdict += f" ({len(report.unchecked)} run(s) checked without their payloads)"
        click.echo(f"checked {report.runs} run(s), {report.records} records: {verdict}", err=True)
    if not report.ok:
        raise click.exceptions.Exit(1)
