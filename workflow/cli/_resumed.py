"""What ``workflow runs`` called a run just before a ``run_resumed`` record.

The record keeps the status as it was logged (``previous``): a run whose executor died is
logged ``running``, but ``runs`` lists it ``interrupted`` (``submitted`` if no worker had
taken it yet, ``waiting`` if it had nothing to do but wait). ``history`` and ``timeline``
say the listed word, so the two commands and ``runs`` agree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from eventstore import RunInfo

from .._read import live_status, only_submitted

__all__ = ["listed_before"]


def listed_before(info: RunInfo, payload: Any, waits: bool) -> str:
    """The status ``runs`` gave the run just before the resume ``payload`` records;
    ``waits``: whether the run, folded just before it, only waited."""
    previous = str(payload.get("previous"))
    if previous != "running":
        return previous
    # Its first claim moved the epoch from 1 to 2: the row as it was then says if submitted.
    if payload.get("epoch") == 2 and only_submitted(replace(info, epoch=1)):
        return "submitted"
    # A resume takes only a run no live executor owns (the claim fences any other).
    return live_status(previous, waits, owned=False)
