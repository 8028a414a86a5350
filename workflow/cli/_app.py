"""The read commands: ``runs``, ``history``, ``checkpoints``, ``state`` and ``diff``.

Each opens the store read-only, so it works beside a process that is writing it, and needs
no user code: values are shown as the log holds them, with their class names. ``--workflow
module:Class`` imports the user's workflow to show typed values instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import click
import orjson

from eventstore import EventStore, LogCorruptedError, StoredRecord

from .. import _journal as J
from .._fold import Folded, to_run_state
from .._read import checkpoints as list_checkpoints
from .._read import run_info, run_summaries
from ._common import (
    CliGroup,
    emit_json,
    json_option,
    progress,
    reader,
    workflow_option,
)
from ._inspect import (
    Change,
    Damaged,
    Viewer,
    describe,
    diff,
    error_json,
    event_types_upto,
    failed_attempts,
    fold_at,
    note_event,
    owners,
    readable_records,
    record_json,
    state_json,
    status_of,
    traceback_lines,
)
from ._render import clip, fmt_time, short_class, table, terminal_width

__all__ = ["cli", "main"]

_HELP = """Inspect, debug and continue durable workflow runs in an event store.

DB is an SQLite file (or a PostgreSQL URL). Read commands open it read-only (safe beside
a running process) and need no user code; add --workflow MODULE:CLASS to see typed
values. run, resume, recover, fork and send run the workflow.
"""


@click.group(cls=CliGroup, help=_HELP, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The ``workflow`` command group."""


def main(argv: list[str] | None = None) -> None:
    """The ``workflow`` console script and ``python -m workflow``."""
    cli.main(args=argv, prog_name="workflow")


def _short(name: str | None) -> str:
    """A class name without its module (``EventA``), for narrow columns."""
    if not name:
        return ""
    return name.rsplit(":", 1)[-1]


def _traceback_option(f: Any) -> Any:
    return click.option(
        "--traceback",
        "show_tb",
        is_flag=True,
        help="Also show the stored traceback of each failed attempt.",
    )(f)


# ---------------------------------------------------------------------------- runs


@cli.command()
@click.argument("db")
@workflow_option
@json_option
def runs(db: str, workflow_spec: str | None, as_json: bool) -> None:
    """List the runs in DB: status, workflow, start time, last seq and parent (for forks)."""
    store, _, wf = reader(db, workflow_spec)
    del wf  # a run's row holds no user values: typed and raw listings are the same
    summaries = run_summaries(store, owners(store))
    if as_json:
        emit_json(
            [
                {
                    "run_id": s.run_id,
                    "status": s.status,
                    "workflow": s.workflow,
                    "started": fmt_time(s.created),
                    "created_us": s.created,
                    "first_seq": s.first_seq,
                    "last_seq": s.last_seq,
                    "parent_run_id": s.parent_run_id,
                    "parent_seq": s.parent_seq,
                }
                for s in summaries
            ]
        )
        return
    if not summaries:
        click.echo("no runs", err=True)
        return
    rows = [
        (
            s.run_id,
            s.status,
            s.workflow,
            fmt_time(s.created),
            s.last_seq if s.last_seq is not None else "",
            f"{s.parent_run_id}@{s.parent_seq}" if s.parent_run_id else "",
        )
        for s in summaries
    ]
    click.echo(table(rows, ["run", "status", "workflow", "started (UTC)", "last seq", "parent"]))


# ---------------------------------------------------------------------------- history


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "--kind", "kinds", multiple=True, type=click.Choice(sorted(J.KINDS)), help="Only this kind."
)
@click.option("--step", "step_name", metavar="STEP", help="Only records of this step.")
@click.option("--from", "from_seq", type=int, metavar="SEQ", help="From this seq on.")
@click.option("--to", "to_seq", type=int, metavar="SEQ", help="Up to this seq.")
@click.option("--full", is_flag=True, help="Do not cut lines to the terminal's width.")
@_traceback_option
@workflow_option
@json_option
def history(
    db: str,
    run: str,
    kinds: tuple[str, ...],
    step_name: str | None,
    from_seq: int | None,
    to_seq: int | None,
    full: bool,
    show_tb: bool,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """Print the log of RUN, a line a record: seq, commit, time, kind, step, event, payload.

    With --traceback each failed attempt's stored traceback follows its line (--json
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
    bar = progress(store, run, "reading")
    if bar is not None:
        records = bar(records)  # type: ignore[arg-type]  # it only counts what passes
    wanted = set(kinds)
    damaged: list[int] = []

    def selected() -> Iterator[tuple[StoredRecord | Damaged, Any, str]]:
        types = event_types_upto(store, run, after)
        for r in records:
            if not isinstance(r, Damaged):
                try:
                    p = r.data()
                    if not isinstance(p, dict):
                        msg = f"record seq {r.seq}: its payload is not a JSON object"
                        raise LogCorruptedError(msg, seq=r.seq)
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

    if as_json:
        _history_json(selected())
    else:
        _history_text(store, run, info.created, upto, selected(), view, full, damaged, show_tb)
    if damaged:
        listed = ", ".join(map(str, damaged[:5])) + (", ..." if len(damaged) > 5 else "")
        click.echo(
            f"error: {len(damaged)} damaged record(s) in run {run} (seq {listed});"
            f" 'workflow check {db} {run}' checks the whole run",
            err=True,
        )
        raise click.exceptions.Exit(1)


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
    run: str,
    base_ts: int,
    upto: int,
    items: Iterator[tuple[StoredRecord | Damaged, Any, str]],
    view: Viewer,
    full: bool,
    damaged: list[int],
    show_tb: bool = False,
) -> None:
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
                clip(_short(t), widths[5]),
                clip(text, payload_w),
            ]
        click.echo(_line(cells, widths))
        if show_tb and not isinstance(r, Damaged) and r.kind == J.STEP_FAILED:
            # Under the line it belongs to, whole: its last lines say where it failed.
            click.echo("\n".join(traceback_lines(p, " " * (num_w + 2))))
    if empty:
        click.echo("no records match", err=True)


def _line(cells: list[str], widths: list[int]) -> str:
    parts = [c.ljust(w) for c, w in zip(cells, widths, strict=False)]
    parts.extend(cells[len(widths) :])
    return "  ".join(parts).rstrip()


# ---------------------------------------------------------------------------- checkpoints


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option("--step", "step_name", metavar="STEP", help="Only commits of this step.")
@click.option(
    "--event", "event_name", metavar="TYPE", help="Only commits that enqueue this event class."
)
@workflow_option
@json_option
def checkpoints(
    db: str,
    run: str,
    step_name: str | None,
    event_name: str | None,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """List RUN's checkpoints, one per commit: the seq to pass to state --at or fork --at."""
    store, _, wf = reader(db, workflow_spec)
    if wf is not None:
        found = wf.checkpoints(run, step=step_name, event=event_name)
    else:
        found = list_checkpoints(store, run, step=step_name, event=event_name)
    if as_json:
        emit_json([c.model_dump() for c in found])
        return
    if not found:
        click.echo("no checkpoints match", err=True)
        return
    rows = [
        (c.seq, c.kind, c.step or "", ", ".join(short_class(t) for t in c.event_types))
        for c in found
    ]
    click.echo(table(rows, ["seq", "kind", "step", "events"]))


# ---------------------------------------------------------------------------- state


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option("--at", "at", type=int, metavar="SEQ", help="The seq to look at (default: now).")
@_traceback_option
@workflow_option
@json_option
def state(
    db: str, run: str, at: int | None, show_tb: bool, workflow_spec: str | None, as_json: bool
) -> None:
    """Show RUN's state at a seq: status, queues, steps in progress, context and waiters.

    With --traceback, also the last failed attempt of each step in progress, with its
    stored traceback (--json always has them, as "failed_attempts" and "error").
    """
    store, view, wf = reader(db, workflow_spec)
    s = fold_at(store, run, at, progress(store, run, "folding"))
    status = status_of(store, s)
    failed = failed_attempts(store, s) if as_json or show_tb else []
    if wf is not None and as_json:
        # What wf.state_at(run, at) gives, decoded by the user's classes (which fails
        # loudly if the log no longer fits them), without its ownership probe's lock file;
        # and beside it the failed attempts' tracebacks, which a RunState does not hold.
        data = to_run_state(s, wf._codec, status).to_json()
        data["error"] = error_json(s, failed)
        data["failed_attempts"] = failed
        emit_json(data)
        return
    inbox = len(store.inbox(run))
    if as_json:
        emit_json(state_json(s, status, inbox, failed))
        return
    click.echo(state_text(s, status, inbox, view))
    if show_tb:
        click.echo("\n" + failures_text(failed))


def _section(title: str, rows: list[tuple[Any, ...]], headers: list[str], none: str) -> str:
    if not rows:
        return f"{title}: {none}"
    body = table(rows, headers)
    return f"{title}:\n" + "\n".join("  " + ln for ln in body.splitlines())


def state_text(s: Folded, status: str, inbox: int, view: Viewer) -> str:
    """The state as sections of small tables."""
    width = terminal_width()
    val_w = max(30, width - 40)
    head = f"run {s.run_id} ({s.workflow}) at seq {s.seq}: {status}"
    lines = [head]
    if s.parent:
        lines.append(f"forked from {s.parent[0]} at seq {s.parent[1]}")
    if s.error:
        where = f" in step {s.error.get('step')}" if s.error.get("step") else ""
        lines.append(f"error{where}: {s.error.get('error')}: {s.error.get('message')}")
    if s.result is not None:
        lines.append(f"result: {view.show(s.result, val_w)}")
    queued = [
        (step, f"#{i}", _short(e.type), view.show(e.dump, val_w))
        for step, q in s.queues.items()
        for i, e in q.items()
    ]
    queued += [
        ("(no step)", f"#{i}", _short(e.type), view.show(e.dump, val_w))
        for i, e in s.unclaimed.items()
    ]
    running = [
        (step, f"#{i}", _short(p.ev.type), p.attempt, p.failures, view.show(p.ev.dump, val_w))
        for step, ps in s.in_progress.items()
        for i, p in ps.items()
    ]
    context = [(k, view.show(v.dump, max(30, width - 20))) for k, v in s.context.items()]
    waiters = [
        (w.waiter_id, w.step, f"#{w.ev.id}", _short(w.awaited), w.deadline or "")
        for w in s.waiters.values()
    ]
    buffers = [(buf, _short(t), len(es)) for buf, d in s.buffers.items() for t, es in d.items()]
    lines += [
        "",
        _section("queues", queued, ["step", "event", "type", "value"], "empty"),
        "",
        _section(
            "in progress",
            running,
            ["step", "event", "type", "attempts", "failures", "value"],
            "nothing",
        ),
        "",
        _section("context", context, ["key", "value"], "empty"),
        "",
        _section("waiters", waiters, ["waiter", "step", "event", "awaits", "deadline"], "none"),
    ]
    if buffers:
        lines += ["", _section("collect buffers", buffers, ["buffer", "type", "events"], "")]
    if s.stream:
        lines += ["", f"stream: {len(s.stream)} events"]
    if inbox:
        lines += ["", f"inbox: {inbox} external event(s) not yet taken in (resume takes them)"]
    return "\n".join(lines)


def failures_text(failed: list[dict[str, Any]]) -> str:
    """The failed attempts of the steps in progress, each with its traceback."""
    if not failed:
        return "failed attempts: none"
    lines = ["failed attempts:"]
    for f in failed:
        retry = " (will retry)" if f["retry"] else ""
        lines.append(
            f"  {f['step']} #{f['event_id']} attempt {f['attempt']} at seq {f['seq']}:"
            f" {f['error']}: {f['message']}{retry}"
        )
        lines += traceback_lines(f, "    ")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- diff


@cli.command(name="diff")
@click.argument("db")
@click.argument("run")
@click.argument("a", type=int)
@click.argument("b", type=int)
@workflow_option
@json_option
def diff_cmd(db: str, run: str, a: int, b: int, workflow_spec: str | None, as_json: bool) -> None:
    """Show what changed in RUN from seq A to seq B: events, steps and context keys."""
    store, view, _ = reader(db, workflow_spec)
    change = diff(store, run, a, b, progress(store, run, "folding"))
    if as_json:
        emit_json(change.to_json())
        return
    click.echo(diff_text(change, view))


def diff_text(c: Change, view: Viewer) -> str:
    """The change as sections: status, events, step attempts, context keys."""
    val_w = max(30, terminal_width() - 40)
    lines = [f"run {c.run_id}: seq {c.start} → seq {c.end}"]
    if c.status[0] != c.status[1]:
        lines.append(f"status: {c.status[0]} → {c.status[1]}")
    else:
        lines.append(f"status: {c.status[0]} (unchanged)")
    if c.start == c.end:
        lines.append("no commits between them")
    enq = [
        (e["seq"], e["step"] or "(no step)", f"#{e['event_id']}", view.show(e["event"], val_w))
        for e in c.enqueued
    ]
    con = [
        (
            e["seq"],
            e["step"],
            f"#{e['event_id']}",
            "" if e["event"] is None else view.show(e["event"], val_w),
        )
        for e in c.consumed
    ]
    steps = [(e["seq"], e["step"], f"#{e['event_id']}", e["attempt"], _outcome(e)) for e in c.steps]
    lines += [
        "",
        _section("events enqueued", enq, ["seq", "step", "event", "value"], "none"),
        "",
        _section("events consumed", con, ["seq", "step", "event", "value"], "none"),
        "",
        _section("step attempts", steps, ["seq", "step", "event", "attempt", "outcome"], "none"),
        "",
    ]
    ctx = [f"  + {k} = {view.show(v, val_w)}" for k, v in c.added.items()]
    ctx += [
        f"  ~ {k}: {view.show(o, val_w // 2)} → {view.show(n, val_w // 2)}"
        for k, (o, n) in c.changed.items()
    ]
    ctx += [f"  - {k} (was {view.show(v, val_w)})" for k, v in c.removed.items()]
    lines.append("context: unchanged" if not ctx else "context:\n" + "\n".join(ctx))
    if c.result is not None:
        lines += ["", f"result: {view.show(c.result, val_w)}"]
    return "\n".join(lines)


def _outcome(e: dict[str, Any]) -> str:
    o = e["outcome"]
    if o == "finished":
        emitted = ", ".join(f"#{i}" for i in e.get("emitted", []))
        return f"finished, emitted {emitted or 'nothing'}"
    if o == "failed":
        return f"failed: {e.get('error')}" + (" (will retry)" if e.get("retry") else "")
    if o == "conflicted":
        return f"conflicted on {e.get('keys')}"
    if o == "waiting":
        return f"waiting for {_short(e.get('awaited'))}"
    return str(o)
