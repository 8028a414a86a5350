"""Retention: which runs a prune deletes, shared by ``wf.prune`` and ``workflow prune``.

A prune deletes whole runs that ended (or were left) long enough ago, then gives their
space back. It never deletes a run a kept fork starts from (its state is folded from its
parent's), nor a run waiting for an event (a human's answer, a timer) unless asked, nor a
run a live executor holds; the store re-checks the last two at the moment it deletes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from eventstore import EventStore

from ._ownership import LeaseOwners, Owners
from ._read import RunSummary, run_summaries
from ._state import TERMINAL

__all__ = ["PRUNABLE", "PruneReport", "parse_duration", "prune_runs"]

# The statuses a prune may be asked to delete; "waiting" needs include_waiting, and a
# running run (a live executor's) is never deleted.
PRUNABLE: Final = frozenset({*TERMINAL, "interrupted", "submitted"})
DEFAULT_STATUSES: Final = ("finished", "failed", "cancelled", "timed_out")

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``.

    :raises ValueError: not a number followed by one of the units s, m, h, d, w.
    """
    match = _DURATION.match(text)
    if match is None:
        msg = (
            f"bad duration {text!r}: write a number and a unit, one of s, m, h, d, w"
            " (for example 30d, 12h or 90m)"
        )
        raise ValueError(msg)
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune deleted (or, with ``dry_run``, would delete) and what it kept, and why."""

    deleted: list[str]
    kept_for_forks: list[str] = field(default_factory=list)  # old enough, but a fork is kept
    kept_waiting: list[str] = field(default_factory=list)  # old enough, but waiting for an event
    kept_changed: list[str] = field(default_factory=list)  # taken up again while pruning
    dry_run: bool = False
    bytes_before: int | None = None  # the SQLite file (with its WAL); None elsewhere
    bytes_after: int | None = None


def _seconds(older_than: str | float | timedelta) -> float:
    if isinstance(older_than, timedelta):
        seconds = older_than.total_seconds()
    elif isinstance(older_than, str):
        seconds = parse_duration(older_than)
    elif isinstance(older_than, int | float) and not isinstance(older_than, bool):
        seconds = float(older_than)
    else:
        msg = f"older_than takes a duration ('30d'), seconds or a timedelta, not {older_than!r}"
        raise TypeError(msg)
    if seconds < 0:
        msg = f"older_than must not be negative, got {older_than!r}"
        raise ValueError(msg)
    return seconds


def _statuses(statuses: Iterable[str] | None, include_waiting: bool) -> set[str]:
    wanted = set(DEFAULT_STATUSES if statuses is None else statuses)
    if not wanted:
        msg = "no status to prune was given"
        raise ValueError(msg)
    if "waiting" in wanted and not include_waiting:
        msg = (
            "runs waiting for an event (a human's answer) are pruned only when asked:"
            " pass include_waiting=True (--include-waiting)"
        )
        raise ValueError(msg)
    wanted.discard("waiting")
    unknown = sorted(wanted - PRUNABLE)
    if unknown:
        allowed = ", ".join(sorted(PRUNABLE | {"waiting"}))
        msg = f"cannot prune runs by status {', '.join(unknown)}: the statuses are {allowed}"
        raise ValueError(msg)
    if include_waiting:
        wanted.add("waiting")
    return wanted


def _size(store: EventStore) -> int | None:
    if store.kind != "sqlite" or store.path is None:
        return None
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(OSError):  # no WAL file: nothing to add
            total += os.path.getsize(store.path + suffix)
    return total


def prune_runs(
    store: EventStore,
    owners: Owners | LeaseOwners,
    *,
    older_than: str | float | timedelta,
    statuses: Iterable[str] | None = None,
    include_waiting: bool = False,
    dry_run: bool = False,
    now_us: int | None = None,
    only: Callable[[RunSummary], bool] | None = None,
) -> PruneReport:
    """Deletes the runs with one of ``statuses`` whose last record is older than
    ``older_than``, then reclaims the store's space (see :meth:`Workflow.prune`); with
    ``only``, of the runs it accepts (every run of the store still counts as a fork)."""
    age_us = int(_seconds(older_than) * 1e6)
    wanted = _statuses(statuses, include_waiting)
    cutoff = (time.time_ns() // 1000 if now_us is None else now_us) - age_us
    infos = {i.run_id: i for i in store.runs()}
    summaries: dict[str, RunSummary] = {s.run_id: s for s in run_summaries(store, owners)}
    old = {
        run_id
        for run_id, info in infos.items()
        if info.updated <= cutoff
        and run_id in summaries
        and (only is None or only(summaries[run_id]))
    }
    waiting = sorted(r for r in old if summaries[r].status == "waiting" and not include_waiting)
    chosen = {r for r in old if summaries[r].status in wanted}
    # A fork's ancestors stay while the fork does: drop a parent from the set while any
    # run outside it names it (and so on up the chain).
    protected: set[str] = set()
    changed = True
    while changed:
        changed = False
        for run_id, info in infos.items():
            parent = info.parent_run_id
            if parent in chosen and run_id not in chosen:
                chosen.discard(parent)
                protected.add(parent)
                changed = True
    order = [r for r in infos if r in chosen]
    before = _size(store)
    if dry_run:
        return PruneReport(order, sorted(protected), waiting, [], True, before, before)
    seen = {r: infos[r].last_seq for r in order}
    gone = store.delete_runs({r: None if s is None else int(s) for r, s in seen.items()})
    kept = sorted(set(order) - set(gone))
    if gone:
        store.reclaim()
    return PruneReport(gone, sorted(protected), waiting, kept, False, before, _size(store))
