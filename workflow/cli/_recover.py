"""``workflow recover``: resume every pending run of a workflow, and say how each went."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Iterator
from typing import Any, Final

import click

from .._recover import Recovery
from .._workflow import Workflow
from ._app import cli
from ._common import emit_json, json_option
from ._render import short_class, show_typed
from ._running import build_workflow, outcome_of, timeout_option, workflow_required

__all__ = ["recover"]


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
@workflow_required
@click.option(
    "--check",
    is_flag=True,
    help="Resume only the runs a static verify passes (after a deploy); list the others"
    " as incompatible, with what verify found.",
)
@timeout_option
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
    wf = build_workflow(db, workflow_spec, timeout)

    async def settle(recovery: Recovery) -> tuple[str, Any] | None:
        return None if recovery.handler is None else await outcome_of(recovery.handler, wf.store)

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
        rows = [_recovery_row(wf, one, end) for one, end in zip(found, ends, strict=True)]
    finally:
        wf.store.close()
    if as_json:
        emit_json([row for row, _ in rows])
    elif rows:
        lines = [(row["run_id"], _shown_outcome(row), text) for row, text in rows]
        click.echo(_table(lines))
    counts: dict[str, int] = {}
    for row, _ in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    listed = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    click.echo(f"{len(rows)} pending run(s): {listed}" if rows else "no pending runs", err=True)
    if any(
        row["outcome"] in _NOT_RESUMED or row["status"] in ("failed", "interrupted")
        for row, _ in rows
    ):
        raise click.exceptions.Exit(1)


def _table(lines: list[tuple[str, str, str]]) -> str:
    """The runs as a table whose last column is not padded: a long error (a stranded run's
    every problem) runs on in its own line, and the rule under the headers stays as wide as
    the short columns (``--json`` has the same text as a field)."""
    head = ("run", "outcome", "result or error")
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head[:2])]

    def one(cells: tuple[str, str, str]) -> str:
        first, second, last = cells
        return f"{first:<{widths[0]}}  {second:<{widths[1]}}  {last}".rstrip()

    rule = ("-" * widths[0], "-" * widths[1], "-" * len(head[2]))
    return "\n".join([one(head), one(rule), *(one(line) for line in lines)])


def _shown_outcome(row: dict[str, Any]) -> str:
    """``resumed, finished``: what recover did, and how a resumed run ended."""
    if row["outcome"] == "resumed":
        return f"resumed, {row['status']}"
    return str(row["outcome"])


def _recovery_row(
    wf: Workflow, recovery: Recovery, end: tuple[str, Any] | None
) -> tuple[dict[str, Any], str]:
    """One run's recovery as JSON-native data, and its result or error as text."""
    error = _error_text(recovery.error)
    row: dict[str, Any] = {
        "run_id": recovery.run_id,
        "outcome": recovery.outcome,
        "status": "failed" if recovery.outcome == "recovery_limit" else None,
        "result": None,
        "error": error or None,
        "waiting_for": [],
        "problems": [
            {
                "seq": problem.seq,
                "step": problem.step,
                "kind": problem.kind,
                "message": problem.message,
            }
            for problem in recovery.problems
        ],
    }
    text = error
    if recovery.outcome == "incompatible":
        text = "; ".join(str(problem) for problem in recovery.problems)
    if recovery.outcome == "waiting":
        row["status"] = "waiting"
        row["waiting_for"] = list(recovery.waiting_for)
        text = "for " + ", ".join(short_class(a) for a in recovery.waiting_for)
    if recovery.outcome == "resumed" and end is not None:
        status, value = end
        row["status"] = status
        if status == "finished":
            row["result"] = wf.__workflow_parts__.codec.dump(value)
            text = show_typed(value, 2000)
        elif status in ("failed", "interrupted"):  # interrupted: this code cannot finish it
            row["error"] = text = _error_text(value)
        else:
            waiters = wf.state_at(recovery.run_id).waiters
            row["waiting_for"] = list(dict.fromkeys(w.awaited for w in waiters))
            text = "for " + ", ".join(short_class(a) for a in row["waiting_for"])
    return row, text
