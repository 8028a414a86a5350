"""``workflow history``: a run's log, a line a record (or JSON), damaged records named.

It opens the store read-only and needs no user code: values show with their class names
(``--workflow module:Class`` shows them typed).
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import click
import orjson

from eventstore import EventStore, LogCorruptedError, RunInfo, StoredRecord

from .. import _journal as J
from .._checkpoints import event_class, event_types_upto, note_event
from .._errors import SnapshotIgnoredWarning
from .._read import (
    Damaged,
    fold_run,
    readable_records,
    run_info,
    start_state,
)
from ._app import cli
from ._common import json_option, progress, reader, traceback_option, workflow_option
from ._inspect import Viewer, describe, record_json, traceback_lines
from ._keys import encrypted_text
from ._render import bare_class, clip, terminal_width
from ._resumed import listed_before

__all__ = ["history"]


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="K[,K...]",
    callback=lambda _ctx, _param, values: _kinds(values),
    help="Only records of these kinds (repeat it, or separate them by commas).",
)
@click.option("--step", "step_name", metavar="STEP", help="Only records of this step.")
@click.option("--from", "from_seq", type=int, metavar="SEQ", help="From this seq on.")
@click.option("--to", "to_seq", type=int, metavar="SEQ", help="Up to this seq.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help="At most N lines; the next page's --from is then said on stderr.",
)
@click.option("--full", is_flag=True, help="Do not cut lines to the terminal's width.")
@traceback_option
@workflow_option
@json_option
def history(
    db: str,
    run: str,
    kinds: tuple[str, ...],
    step_name: str | None,
    from_seq: int | None,
    to_seq: int | None,
    limit: int | None,
    full: bool,
    show_tb: bool,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """Print the log of RUN, a line a record: seq, commit, time, kind, step, event, payload.

    --from, --to and --limit page through a long run: a page costs what it shows, wherever
    it starts. With --traceback each failed attempt's stored traceback follows its line (--json
    always has it, in the payload). A damaged record gets a line naming its seq and the
    error; the exit status is then 1.
    """
    store, view, _ = reader(db, workflow_spec)
    info = run_info(store, run)
    if from_seq is not None and to_seq is not None and from_seq > to_seq:
        msg = f"--from {from_seq} is after --to {to_seq}"
        raise click.BadParameter(msg)
    # Stop at the run's last seq as of now, so a run that grows meanwhile reads consistently.
    last = info.last_seq or 0
    upto = last if to_seq is None else min(to_seq, last)
    after = max(0, (from_seq or 0) - 1)
    records = readable_records(store, run, after, upto)
    bar = progress(store, run, "reading") if limit is None else None
    if bar is not None:
        records = bar(records)  # type: ignore[arg-type]  # it only counts what passes
    wanted = set(kinds)
    damaged: list[int] = []

    def selected() -> Iterator[tuple[StoredRecord | Damaged, Any, str]]:
        types = _event_types(store, run, after)
        for r in records:
            if not isinstance(r, Damaged):
                try:
                    p = r.data()
                    if not isinstance(p, dict):
                        msg = f"record seq {r.seq}: its payload is not a JSON object"
                        raise LogCorruptedError(msg, seq=r.seq)
                    if encrypted_text(r.payload) is None:  # a sealed one names no event
                        note_event(r, p, types)
                except Exception as exc:  # whatever a damaged payload makes fail
                    r = Damaged(r.seq, exc, r)
            row = r.record if isinstance(r, Damaged) else r
            if row is not None:  # a row that could not be read is shown whatever the filters
                if wanted and row.kind not in wanted:
                    continue
                if step_name is not None and row.step != step_name:
                    continue
            if isinstance(r, Damaged):
                damaged.append(r.seq)
                yield r, None, ""
                continue
            ev_id = p.get("id")
            yield r, p, types.get(ev_id, "") if isinstance(ev_id, int) else ""

    items: Iterator[tuple[StoredRecord | Damaged, Any, str]] | list[Any] = selected()
    more: int | None = None
    if limit is not None:
        page = list(itertools.islice(items, limit + 1))
        if len(page) > limit:
            more = page[limit][0].seq
        items = page[:limit]
    if as_json:
        _history_json(iter(items))
    else:
        steps = None if isinstance(items, Iterator) else [_step(r) for r, _, _ in items]
        _history_text(store, info, upto, iter(items), view, full, damaged, show_tb, steps)
    if more is not None:
        click.echo(f"more: --from {more}", err=True)
    if damaged:
        listed = ", ".join(map(str, damaged[:5])) + (", ..." if len(damaged) > 5 else "")
        click.echo(
            f"error: {len(damaged)} damaged record(s) in run {run} (seq {listed});"
            f" 'workflow check {db} {run}' checks the whole run",
            err=True,
        )
        raise click.exceptions.Exit(1)


def _event_types(store: EventStore, run: str, after: int) -> dict[int, str]:
    """Event id -> class name of the events the records after ``after`` may name.

    Those are the events of the run's state at ``after`` (queued, in progress, waiting,
    buffered) and the ones the records after it introduce: the state is read from the
    nearest snapshot, so a page deep in a long run costs what the page does. If that state
    cannot be read (a damaged log), the log up to ``after`` is read instead.
    """
    try:
        info = run_info(store, run)
        if info.first_seq is None or after < info.first_seq:
            s = start_state(store, info)  # a fork's parent's state, or nothing yet
        else:
            s = fold_run(store, run, after)
    except Exception:  # whatever the damage: the slow way reads past it
        return event_types_upto(store, run, after)
    return {e.id: event_class(e.dump) for e in s.events(stream=False)}


def _step(r: StoredRecord | Damaged) -> str:
    row = r.record if isinstance(r, Damaged) else r
    return (row.step if row is not None else None) or ""


def _history_json(items: Iterator[tuple[StoredRecord | Damaged, Any, str]]) -> None:
    # Streamed item by item: a log of a million records never sits in memory as one list.
    click.echo("[", nl=False)
    for i, (r, _, t) in enumerate(items):
        if isinstance(r, Damaged):
            row = _damaged_json(r)
        else:
            row = record_json(r)
            row["event_type"] = row["event_type"] or t or None
        click.echo(("," if i else "") + "\n  " + orjson.dumps(row).decode(), nl=False)
    click.echo("\n]")


def _damaged_json(d: Damaged) -> dict[str, Any]:
    r = d.record
    return {
        "seq": d.seq,
        "commit_seq": None if r is None else r.commit_seq,
        "ts": None if r is None else r.ts,
        "kind": None if r is None else r.kind,
        "step": None if r is None else r.step,
        "event_type": None,
        "payload": None,
        "payload_text": None if r is None else r.payload,
        "damaged": {"error": type(d.error).__name__, "message": str(d.error)},
    }


def _history_text(
    store: EventStore,
    info: RunInfo,
    upto: int,
    items: Iterator[tuple[StoredRecord | Damaged, Any, str]],
    view: Viewer,
    full: bool,
    damaged: list[int],
    show_tb: bool = False,
    steps: list[str] | None = None,
) -> None:
    run, base_ts = info.run_id, info.created
    if steps is None:  # every line is shown: the step column fits the run's steps
        steps = [
            row[0]
            for row in store.query("SELECT DISTINCT step FROM records WHERE run_id = ?", (run,))
            if row[0]
        ]
    num_w = max(len("seq"), len(str(upto)))
    step_w = min(20, max([len("step"), *map(len, steps)]))
    widths = [num_w, max(len("commit"), num_w), 8, 15, step_w, 18]
    fixed = sum(widths) + 2 * len(widths)
    # On a terminal a record is a line of its width; piped (grep, less, files) or with --full
    # nothing is cut, and only long values are shortened (unless --full).
    on_tty = sys.stdout.isatty()
    payload_w = max(30, terminal_width() - fixed) if on_tty and not full else 0
    value_w = 10_000 if full else payload_w or 200
    heads = ["seq", "commit", "time", "kind", "step", "event", "payload"]
    click.echo(_line(heads, widths))
    click.echo(_line(["-" * w for w in widths] + ["-" * 40], widths))
    empty = True
    for r, p, t in items:
        empty = False
        if not isinstance(r, Damaged):
            try:
                if r.kind == J.RUN_RESUMED:
                    p = {**p, "previous": _listed_before(store, info, r, p)}
                text = " ".join(describe(r, p, view, value_w).split("\n"))
            except Exception as exc:  # a payload of the wrong shape
                damaged.append(r.seq)
                r = Damaged(r.seq, exc, r)
        if isinstance(r, Damaged):
            rec = r.record
            cells = [
                str(r.seq),
                "?" if rec is None else str(rec.commit_seq),
                "" if rec is None else f"+{max(0, rec.ts - base_ts) / 1e6:.3f}",
                "?" if rec is None else rec.kind,
                "" if rec is None else clip(rec.step or "", step_w),
                "",
                f"DAMAGED {r.error_text()}",
            ]
        else:
            cells = [
                str(r.seq),
                str(r.commit_seq),
                f"+{max(0, r.ts - base_ts) / 1e6:.3f}",
                r.kind,
                clip(r.step or "", step_w),
                clip(bare_class(t), widths[5]),
                clip(text, payload_w),
            ]
        click.echo(_line(cells, widths))
        if show_tb and not isinstance(r, Damaged) and r.kind == J.STEP_FAILED:
            # Under the line it belongs to, whole: its last lines say where it failed.
            click.echo("\n".join(traceback_lines(p, " " * (num_w + 2))))
    if empty:
        click.echo("no records match", err=True)


def _kinds(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--kind`` values, each one kind or several separated by commas, as one tuple; an
    unknown kind is refused naming it and the known ones (as ``runs --status`` does)."""
    kinds = tuple(k.strip() for v in values for k in v.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(J.KINDS))
    if unknown or (values and not kinds):
        known = ", ".join(sorted(J.KINDS))
        msg = f"unknown kind {', '.join(unknown) or repr(','.join(values))}: use {known}"
        raise click.BadParameter(msg, param_hint="'--kind'")
    return kinds


def _listed_before(store: EventStore, info: RunInfo, record: StoredRecord, payload: Any) -> str:
    """The status ``workflow runs`` gave the run just before this ``run_resumed``."""
    if payload.get("previous") != "running":
        return str(payload.get("previous"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SnapshotIgnoredWarning)  # the fold is right anyway
            waits = fold_run(store, info.run_id, record.seq - 1).only_waiters()
    except Exception:  # a damaged record before it is reported where it is read
        waits = False
    return listed_before(info, payload, waits)


def _line(cells: list[str], widths: list[int]) -> str:
    parts = [c.ljust(w) for c, w in zip(cells, widths, strict=False)]
    parts.extend(cells[len(widths) :])
    return "  ".join(parts).rstrip()
