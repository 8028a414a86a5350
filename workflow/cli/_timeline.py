"""``workflow timeline``: one self-contained HTML page of a run, and the data it embeds.

The page must stay quick for runs of 10,000 commits, so it embeds no states: it embeds the
log's columns (seq, commit, time, kind, step, a few arguments a record, a short text) and
computes the state at a selected seq in the browser by replaying them, the same fold in a
few lines of JavaScript. Only what the browser cannot compute without the user's code (the
text of each event and of each context value after each commit) is rendered here.

A run longer than a window (:data:`WINDOW` commits) is shown a window at a time: the data
holds the commits of one window and, as its base, the state just before it (folded from
the nearest snapshot), so any window of a run of a million records costs what the window
holds. ``workflow serve`` loads the next window as one moves past an edge; the static page
says how to write another.
"""

from __future__ import annotations

import html
from bisect import bisect_right
from pathlib import Path
from typing import Any, Final

import click
import orjson

from eventstore import EventStore

from .. import _journal as J
from .._fold import Folded, fold
from .._ownership import probe_owners
from .._read import Wrap, check_seq, commits, fold_run, run_info, shown_status, start_state
from ._app import cli
from ._common import emit_json, progress, reader, workflow_option
from ._inspect import Viewer
from ._page import PAGE
from ._resumed import listed_before
from ._timeline_build import TEXT, TRACEBACK, UNSHOWN, Builder, lane_rows, worker_rows

__all__ = [
    "TEXT",
    "TRACEBACK",
    "UNSHOWN",
    "WINDOW",
    "embed_json",
    "render_page",
    "timeline",
    "timeline_data",
    "window_after",
]

# Commits a page holds at most: a window of a longer run (a few hundred KiB of page).
WINDOW: Final = 2_000


def _ends(store: EventStore, rid: int, upto: int, n: int) -> list[int]:
    """The last seqs of the run's last ``n`` commits ending at or before ``upto``, latest
    first (an index walk back from ``upto``: it costs what it returns)."""
    rows = store.query(
        "SELECT seq FROM log WHERE rid = ? AND seq <= ? AND seq = commit_seq"
        " ORDER BY seq DESC LIMIT ?",
        (rid, upto, n),
    )
    return [int(seq) for (seq,) in rows]


def window_after(
    store: EventStore,
    run_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    around: int | None = None,
    limit: int = WINDOW,
) -> int:
    """The seq a window of ``limit`` commits starts after (0: the run's start).

    ``after`` a seq: the window of the commits after it; ``before``: the last ``limit``
    commits ending at or before it; ``around``: the window holding that seq near its middle;
    none of them: the run's last ``limit`` commits.

    :raises ValueError: ``limit`` is not positive.
    """
    if limit < 1:
        msg = f"a window holds at least one commit, not {limit}"
        raise ValueError(msg)
    info = run_info(store, run_id)
    first = info.first_seq or 0
    if after is not None:
        return 0 if after < first else after
    upto = info.last_seq or 0 if before is None or around is not None else before
    ends = _ends(store, info.rid, upto, limit + 1)
    start = ends[limit] if len(ends) > limit else 0
    if around is not None and around <= start:  # not in the last window: one around it
        half = max(1, limit // 2)
        ends = _ends(store, info.rid, around - 1, half)
        start = ends[-1] if len(ends) == half else 0
    return start


def timeline_data(
    store: EventStore,
    run_id: str,
    view: Viewer | None = None,
    wrap: Wrap | None = None,
    *,
    after: int | None = None,
    before: int | None = None,
    around: int | None = None,
    limit: int = WINDOW,
) -> dict[str, Any]:
    """What the timeline page embeds: the run's log as columns plus per-commit texts, for
    the window of at most ``limit`` commits :func:`window_after` picks (the run's last by
    default).

    ``rec`` holds one entry per record in each column (``seq``, ``c`` its commit's index,
    ``t`` milliseconds since the run began, ``k`` kind and ``s`` step as indexes into
    ``kinds`` and ``steps``, ``a`` the arguments the page's fold needs, ``x`` a short text);
    ``commits`` the last seq and first record of each commit; ``attempts`` one bar per step
    attempt ``[step, event id, attempt, first commit, last commit or -1, outcome, note,
    row]``; ``waits`` ``[step, event id, first commit, last commit or -1, awaited, row]``;
    ``base`` the state a fork starts from; ``events`` each event id's class and text;
    ``tb`` the failed attempts' tracebacks, each once (a ``step_failed`` record's fourth
    argument is its index there, -1 when it has none); ``window`` where the window lies
    (``after``, the seq it starts after, 0 at the run's start; ``more_before`` and
    ``more_after``, whether the run has commits outside it; the run's ``first`` and
    ``last`` seqs; ``limit``). A run only submitted for a worker has the status
    ``submitted`` (:func:`~workflow._read.shown_status`).
    """
    view = view or Viewer()
    info = run_info(store, run_id)
    start = window_after(store, run_id, after=after, before=before, around=around, limit=limit)
    b = Builder(view)
    if start:  # the state just before the window: from the nearest snapshot
        state = fold_run(store, run_id, start)
        base = b.seed(state, windowed=True)
    else:
        state = start_state(store, info, wrap=wrap)
        base = b.seed(state)
    t0 = info.created
    upto = info.last_seq or 0  # as of now: a run that grows meanwhile is read consistently
    records = store.records(run_id, after=start, upto=upto)
    chunks = commits(records if wrap is None or start else wrap(records))
    for ci, commit in enumerate(chunks):
        if ci == limit:
            break  # the rest of the run is other windows
        waits = any(r.kind == J.RUN_RESUMED for r in commit) and state.only_waiters()
        fold(state, commit)
        b.commit_seq.append(commit[-1].seq)
        b.commit_first.append(len(b.text))
        for r in commit:
            p = r.data()
            if r.kind == J.RUN_RESUMED:  # said as `runs` listed the run (and history says)
                p = {**p, "previous": listed_before(info, p, waits)}
            args = b.record(r, p, ci, t0)
            if r.kind == J.STATE_SET or r.kind == J.STATE_DELETED:
                entry = state.context.get(args[0])
                args.append(None if entry is None else view.show(entry.dump, TEXT))
    rows = lane_rows(b.attempts, b.waits, len(b.steps), [w for w, _ in b.who])
    lane_workers = worker_rows(b.attempts, b.who, len(b.steps))
    for a, (worker, session) in zip(b.attempts, b.who, strict=True):
        a.append([worker, session])  # [8]: which worker of which session ran it
    first_seqs = [b.cols["seq"][i] for i in b.commit_first]
    forks = []
    last = b.commit_seq[-1] if b.commit_seq else start
    for other in store.runs():
        if other.parent_run_id == run_id and other.parent_seq is not None:
            at = max(0, bisect_right(first_seqs, other.parent_seq) - 1)
            if not start < other.parent_seq <= last:
                at = -1  # outside the window: named in the header, not drawn
            forks.append([other.run_id, other.parent_seq, at])
    return {
        "v": 1,
        "run": {
            "id": run_id,
            "workflow": state.workflow or str(info.meta.get("workflow", "")),
            "status": _status(store, state, last < upto) if b.commit_seq else state.status,
            "created": info.created,
            "parent": [info.parent_run_id, info.parent_seq] if info.parent_run_id else None,
            "forks": forks,
            "typed": view.typed,
        },
        "steps": list(b.steps),
        "lanes": rows,
        "lane_workers": lane_workers,
        "kinds": list(b.kinds),
        "rec": {**b.cols, "x": b.text},
        "commits": {"seq": b.commit_seq, "first": b.commit_first},
        "attempts": b.attempts,
        "waits": b.waits,
        "base": base,
        "events": {str(k): v for k, v in b.events.items()},
        "tb": b.tracebacks,
        "window": {
            "after": start,
            "more_before": start > 0,
            "more_after": last < upto,
            "first": info.first_seq,
            "last": upto,
            "limit": limit,
        },
    }


def _status(store: EventStore, state: Folded, earlier: bool) -> str:
    """The run's status now; ``state`` is its latest unless the window is an ``earlier`` one."""
    latest = fold_run(store, state.run_id) if earlier else state
    return shown_status(store, latest, probe_owners(store), latest.seq)


def embed_json(data: Any) -> str:
    """JSON to put inside a ``<script>`` element: "<" only occurs inside JSON strings, where
    \u003c means the same, so the data can never close the element."""
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def render_page(data: dict[str, Any], ui_html: str = "", ui_script: str = "") -> str:
    """The self-contained HTML page for timeline data (no network: script and style inline).

    ``ui_html`` (before the data) and ``ui_script`` (after the page's script) are what the
    web UI (``workflow serve``) adds: its live updates and actions; the static page has none.
    """
    title = f"run {data['run']['id']} — timeline"
    return (
        PAGE.replace("__TITLE__", html.escape(title))
        .replace("__UI_HTML__", ui_html)
        .replace("__UI_SCRIPT__", ui_script)
        .replace("__DATA__", embed_json(data))
    )


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the page (default: RUN.html, which is what fork links point to).",
)
@click.option(
    "--at",
    "at",
    type=int,
    metavar="SEQ",
    help="A run longer than a window: the window around this seq (default: the last one).",
)
@click.option(
    "--window",
    "limit",
    type=click.IntRange(min=1),
    default=WINDOW,
    show_default=True,
    metavar="N",
    help="Commits the page holds at most.",
)
@workflow_option
@click.option("--json", "as_json", is_flag=True, help="Print the page's data as JSON instead.")
def timeline(
    db: str,
    run: str,
    output: str | None,
    at: int | None,
    limit: int,
    workflow_spec: str | None,
    as_json: bool,
) -> None:
    """Write RUN's timeline: a lane per step, attempts as bars, the state at any seq.

    A run longer than --window commits gets the page of one window (the last, or the one
    around --at SEQ), which opens at once however long the run; `workflow serve DB` shows
    the same page and loads the other windows as you move through the run.
    """
    store, view, _ = reader(db, workflow_spec)
    if at is not None:
        check_seq(store, run, at)
    wrap = progress(store, run, "reading")
    data = timeline_data(store, run, view, wrap, around=at, limit=limit)
    if as_json:
        emit_json(data)
        return
    path = Path(output or f"{run}.html")
    page = render_page(data)
    path.write_text(page, encoding="utf-8")
    n, w = len(data["commits"]["seq"]), data["window"]
    part = ""
    if w["more_before"] or w["more_after"]:
        seqs = data["commits"]["seq"]
        part = (
            f" of seqs {w['after'] + 1}-{seqs[-1] if seqs else w['after']} of the run's"
            f" {w['first']}-{w['last']}: --at SEQ writes another window,"
            f" `workflow serve {db}` loads them as you move"
        )
    click.echo(f"wrote {path} ({n} commits{part}, {len(page) // 1024} KiB)")
