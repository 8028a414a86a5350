"""The command group, and the read commands ``runs``, ``checkpoints``, ``state`` and ``diff``.

Each opens the store read-only, so it works beside a process that is writing it, and needs
no user code: values are shown as the log holds them, with their class names. ``--workflow
module:Class`` imports the user's workflow to show typed values instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from eventstore import add_key

from .._checkpoints import checkpoints as list_checkpoints
from .._children import parent_of, tree_order
from .._compare import Change, changes_between
from .._fold import Folded, to_run_state
from .._ownership import probe_owners
from .._read import RunSummary, check_seq, fold_run, lease_text, run_summaries, shown_status
from .._state import LLAMA_FIELDS
from .._state_versions import upcast_shown
from .._workflow import Workflow
from ._common import (
    CliGroup,
    emit_json,
    json_option,
    progress,
    reader,
    traceback_option,
    workflow_option,
)
from ._filters import RunFilter, parse_since, parse_statuses
from ._inspect import (
    Viewer,
    error_json,
    failed_attempts,
    open_store,
    state_json,
    traceback_lines,
)
from ._keys import KEY_FILE_ENV, set_key_file
from ._render import bare_class, fmt_time, short_class, table, terminal_width

__all__ = ["cli", "main"]

_HELP = """Inspect, debug and continue durable workflow runs in an event store.

DB is an SQLite file (or a PostgreSQL URL). Read commands open it read-only (safe beside
a running process) and need no user code; add --workflow MODULE:CLASS to see typed
values. run, resume, recover, fork and send run the workflow.
"""


@click.group(cls=CliGroup, help=_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="durable-workflows", prog_name="workflow")
@click.option(
    "--key-file",
    metavar="KEYS",
    envvar=KEY_FILE_ENV,
    help="Decrypt (and encrypt) payloads with this key file (workflow keygen); also"
    f" ${KEY_FILE_ENV}. Without it an encrypted payload shows as 'encrypted (key id)'.",
)
@click.pass_context
def cli(ctx: click.Context, key_file: str | None) -> None:
    """The ``workflow`` command group."""
    set_key_file(ctx, key_file)


def main(argv: list[str] | None = None) -> None:
    """The ``workflow`` console script and ``python -m workflow``."""
    cli.main(args=argv, prog_name="workflow")


# ---------------------------------------------------------------------------- keygen


@cli.command()
@click.argument("key_file", metavar="KEYS")
@click.option("--id", "key_id", metavar="ID", help="The new key's id (default: k1, k2, ...).")
def keygen(key_file: str, key_id: str | None) -> None:
    """Add a new random AES-256 key to the key file KEYS (made, readable by you only, if
    missing) and make it the current one: stores opened with it encrypt with the new key
    and still decrypt what the older keys encrypted (rotation). Keep the file safe: what
    it encrypted cannot be read without it.
    """
    kid = add_key(key_file, key_id)
    click.echo(f"added key {kid!r} to {key_file}; it is the current key", err=True)


# ---------------------------------------------------------------------------- runs


@cli.command()
@click.argument("db")
@click.option(
    "--status",
    "status_text",
    metavar="S[,S...]",
    help="Only runs of these statuses: running, submitted (for a worker, not yet taken),"
    " waiting, interrupted, finished, failed, cancelled, timed_out.",
)
@click.option(
    "--workflow",
    "workflow_name",
    metavar="NAME",
    help="Only runs of this workflow (module:Class as recorded, or just the class name).",
)
@click.option(
    "--since",
    "since_text",
    metavar="WHEN",
    help="Only runs started since then: a duration ago (30m, 2h, 7d) or an ISO date or time"
    " (UTC unless it says).",
)
@click.option("--parent", metavar="RUN", help="Only the forks of this run.")
@json_option
def runs(
    db: str,
    status_text: str | None,
    workflow_name: str | None,
    since_text: str | None,
    parent: str | None,
    as_json: bool,
) -> None:
    """List the runs in DB: status, workflow, start time, last seq and parent (for forks).

    Child runs (started by a step with ``ctx.run_workflow``) follow their parent, indented.
    """
    try:
        keep = RunFilter(
            statuses=None if status_text is None else parse_statuses(status_text),
            workflow=workflow_name,
            since_us=None if since_text is None else parse_since(since_text),
            parent=parent,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    store = open_store(db)
    summaries = keep.apply(run_summaries(store, probe_owners(store)))
    # Child runs (ctx.run_workflow) right after the run that started them, indented.
    tree = tree_order([s.run_id for s in summaries])
    by_id = {s.run_id: s for s in summaries}
    summaries = [by_id[r] for r, _ in tree]
    depth = dict(tree)
    known = set(by_id)
    if as_json:
        items: list[dict[str, Any]] = []
        for s in summaries:
            row: dict[str, Any] = {
                "run_id": s.run_id,
                "status": s.status,
                "workflow": s.workflow,
                "started": fmt_time(s.created),
                "created_us": s.created,
                "first_seq": s.first_seq,
                "last_seq": s.last_seq,
                "parent_run_id": s.parent_run_id,
                "parent_seq": s.parent_seq,
                "waiting_for": list(s.waiting_for),
            }
            child_of = parent_of(s.run_id, known)
            if child_of is not None:  # only child runs have it
                row["child_of"] = child_of
            if s.copied_upto is not None:  # only exported ancestors have it
                row["copied_upto"] = s.copied_upto
            if s.lease is not None:  # only runs a lease holds (PostgreSQL) have it
                row["lease"] = {"holder": s.lease[0], "lapses_at": s.lease[1]}
            items.append(row)
        emit_json(items)
        return
    if not summaries:
        click.echo("no runs" if keep == RunFilter() else "no runs match", err=True)
        return
    rows = [
        (
            "  " * (depth[s.run_id] - 1) + "└ " + s.run_id if depth[s.run_id] else s.run_id,
            _status_text(s),
            s.workflow,
            fmt_time(s.created),
            s.last_seq if s.last_seq is not None else "",
            f"{s.parent_run_id}@{s.parent_seq}" if s.parent_run_id else "",
        )
        for s in summaries
    ]
    click.echo(table(rows, ["run", "status", "workflow", "started (UTC)", "last seq", "parent"]))


def _status_text(s: RunSummary) -> str:
    """A run's status as the table shows it: a waiting run says what it waits for; an
    exported ancestor (which never runs) that it is one."""
    if s.copied_upto is not None:
        return f"ancestor (exported up to seq {s.copied_upto})"
    if s.status == "waiting" and s.waiting_for:
        return "waiting for " + ", ".join(bare_class(t) for t in s.waiting_for)
    if s.lease is not None:  # its holder may be dead: resumable once the lease lapses
        return f"{s.status} ({lease_text(s.lease)})"
    return s.status


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
        # The log's own fields: LlamaIndex's (events of user classes) are for Python callers.
        emit_json([c.model_dump(exclude=set(LLAMA_FIELDS)) for c in found])
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
@traceback_option
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
    check_seq(store, run, at)
    s = fold_run(store, run, at, wrap=progress(store, run, "folding"))
    status = shown_status(store, s, probe_owners(store), at)
    failed = failed_attempts(store, s) if as_json or show_tb else []
    if wf is not None and as_json:
        # What wf.state_at(run, at) gives, decoded by the user's classes (which fails
        # loudly if the log no longer fits them), without its ownership probe's lock file;
        # and beside it the failed attempts' tracebacks, which a RunState does not hold.
        codec = wf.__workflow_parts__.codec
        data = to_run_state(s, codec, status).to_json(codec)
        data["error"] = error_json(s, failed)
        data["failed_attempts"] = failed
        emit_json(data)
        return
    inbox = len(store.inbox(run))
    if as_json:
        emit_json(state_json(s, status, inbox, failed))
        return
    if wf is not None:  # the context as --json and wf.state_at give it: upcast
        s = _upcast_for(wf)(s)
    click.echo(state_text(s, status, inbox, view))
    if show_tb:
        click.echo("\n" + failures_text(failed))


def _upcast_for(wf: Workflow) -> Callable[[Folded], Folded]:
    """A state as ``wf`` shows it: its context upcast to the state model's version."""
    parts = wf.__workflow_parts__
    return lambda s: upcast_shown(s, parts.codec, parts.state_type)


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
        (step, f"#{i}", bare_class(e.type), view.show(e.dump, val_w))
        for step, q in s.queues.items()
        for i, e in q.items()
    ]
    queued += [
        ("(no step)", f"#{i}", bare_class(e.type), view.show(e.dump, val_w))
        for i, e in s.unclaimed.items()
    ]
    running = [
        (step, f"#{i}", bare_class(p.ev.type), p.attempt, p.failures, view.show(p.ev.dump, val_w))
        for step, ps in s.in_progress.items()
        for i, p in ps.items()
    ]
    context = [(k, view.show(v.dump, max(30, width - 20))) for k, v in s.context.items()]
    waiters = [
        (w.waiter_id, w.step, f"#{w.ev.id}", bare_class(w.awaited), w.deadline or "")
        for w in s.waiters.values()
    ]
    buffers = [(buf, bare_class(t), len(es)) for buf, d in s.buffers.items() for t, es in d.items()]
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
    store, view, wf = reader(db, workflow_spec)
    shown = None if wf is None else _upcast_for(wf)
    change = changes_between(store, run, a, b, progress(store, run, "folding"), shown)
    if as_json:
        emit_json(change.to_json())
        return
    click.echo(change_text(change, view))


def change_text(c: Change, view: Viewer) -> str:
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
        return f"waiting for {bare_class(e.get('awaited'))}"
    return str(o)
