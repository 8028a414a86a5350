"""Which runs a listing shows: ``workflow runs`` filters and the web UI's run list."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from eventstore import EventStore

from .._read import RunSummary, only_submitted

__all__ = [
    "STATUSES",
    "RunFilter",
    "is_submitted",
    "parse_since",
    "parse_statuses",
]

# Every status a listing shows (``run_summaries``, the values of ``RunStatus``): the stored
# ones and the four it derives.
STATUSES: Final = (
    "running",
    "waiting",
    "interrupted",
    "finished",
    "failed",
    "cancelled",
    "timed_out",
    "submitted",
)
_AGO: Final = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_statuses(text: str) -> frozenset[str]:
    """``finished,failed`` as a set; an unknown status is an error naming the known ones.

    :raises ValueError: a name that is no status.
    """
    names = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = sorted(names - set(STATUSES))
    if unknown or not names:
        msg = f"unknown status {', '.join(unknown) or repr(text)}: use {', '.join(STATUSES)}"
        raise ValueError(msg)
    return names


def parse_since(text: str, now: float | None = None) -> int:
    """A point in time as microseconds since the epoch, from ``30m``, ``2h``, ``7d`` (ago)
    or an ISO date or time (``2026-12-01``, ``2026-12-01T10:00``; UTC unless it says).

    :raises ValueError: neither form.
    """
    t = text.strip()
    m = _AGO.match(t)
    if m:
        ago = float(m.group(1)) * _UNIT_S[m.group(2)]
        return int(((time.time() if now is None else now) - ago) * 1e6)
    try:
        when = dt.datetime.fromisoformat(t)
    except ValueError:
        msg = f"{text!r} is neither a duration ago (30m, 2h, 7d) nor an ISO date (2026-12-01)"
        raise ValueError(msg) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1e6)


def _workflow_matches(name: str, wanted: str) -> bool:
    """``tests.flows:ReportFlow`` matches itself; a bare ``ReportFlow`` matches the class."""
    if name == wanted:
        return True
    return ":" not in wanted and name.rpartition(":")[2].rpartition(".")[2] == wanted


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs a listing keeps; every criterion left None keeps all."""

    statuses: frozenset[str] | None = None
    workflow: str | None = None
    since_us: int | None = None  # started at or after
    parent: str | None = None  # forks of this run

    def keeps(self, run: RunSummary) -> bool:
        """Whether the run passes every criterion."""
        if self.statuses is not None and run.status not in self.statuses:
            return False
        if self.workflow and not _workflow_matches(run.workflow, self.workflow):
            return False
        if self.since_us is not None and run.created < self.since_us:
            return False
        return not (self.parent and run.parent_run_id != self.parent)

    def apply(self, runs: Iterable[RunSummary]) -> list[RunSummary]:
        """The runs it keeps, in order."""
        return [run for run in runs if self.keeps(run)]


def is_submitted(store: EventStore, run_id: str) -> bool:
    """Whether a run no executor owns was only ever submitted (:func:`only_submitted`)."""
    info = store.get_run(run_id)
    return info is not None and only_submitted(info)
