"""An executor that lost its run stops within a fraction of a second, not at its next commit.

``workflow cancel`` (or a resume elsewhere) takes a run over by raising its epoch. The store
refuses the old executor's next commit, but a run that only waits for an event, or whose
step runs for an hour, may not commit again for a long time: it would hold the run, its
caller would wait forever and a ``resume --cancelled`` would wait for it. The watch reads
the run's row every :data:`TAKEOVER_POLL_S` seconds and ends the executor once its epoch is
not the run's: with :class:`WorkflowCancelledByUser` (and the operator's reason) when the run
was cancelled, with :class:`RunLostError` when another executor took it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final, Protocol

from eventstore import ConcurrencyError, EventStore, EventStoreError, RunInfo

from . import _journal as journal
from ._errors import WorkflowCancelledByUser

__all__ = ["TAKEOVER_POLL_S", "TakeoverHost", "cancelled_elsewhere", "cancelled_error", "watch"]

# How often a run's row is read for a takeover, and how long a raised epoch without a
# ``run_cancelled`` yet is given to become one (``workflow cancel`` claims, then records).
TAKEOVER_POLL_S: Final = 0.25
CANCEL_GRACE_S: Final = 2.0


class TakeoverHost(Protocol):
    """What the watch uses of the executor whose hold on its run it watches."""

    run_id: str
    store: EventStore

    @property
    def closing(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    def end_with(self, exc: BaseException) -> None: ...


def cancelled_error(run_id: str, reason: str | None = None) -> WorkflowCancelledByUser:
    """What awaiting a cancelled run raises, saying the reason it was cancelled for."""
    text = f"run {run_id!r} was cancelled"
    err = WorkflowCancelledByUser(f"{text}: {reason}" if reason else text)
    err.reason = reason or None
    return err


def cancelled_elsewhere(
    store: EventStore, run_id: str, info: RunInfo | None = None
) -> WorkflowCancelledByUser | None:
    """The error for a run another process cancelled (its row, ``info`` if read already,
    says so), with the reason its ``run_cancelled`` gives; None when the run was not
    cancelled (or cannot be read now)."""
    try:
        info = info or store.run(run_id)
        if info.status != "cancelled":
            return None
        reason = None
        after = (info.last_seq or 1) - 1
        for rec in store.records(run_id, after=after, kinds=[journal.RUN_CANCELLED]):
            reason = rec.data().get("reason")
    except EventStoreError:
        return None
    return cancelled_error(run_id, reason if isinstance(reason, str) else None)


async def watch(host: TakeoverHost, poll_s: float = TAKEOVER_POLL_S) -> None:
    """Ends ``host`` once another process holds its run (a task of the run's executor)."""
    loop = asyncio.get_running_loop()
    moved: tuple[float, int | None] | None = None  # when the move was seen, the last seq then
    while not host.closing:
        await asyncio.sleep(poll_s)
        info = None
        # Best effort: a row unreadable now (the server away, the store closing) is read
        # again at the next tick; the fence still refuses whatever this executor commits.
        with contextlib.suppress(Exception):
            info = host.store.get_run(host.run_id)
        if info is None or info.epoch == host.epoch:
            moved = None  # not created yet, unreadable now, or still ours
            continue
        if info.status == "cancelled":
            cancelled = cancelled_elsewhere(host.store, host.run_id, info)
            host.end_with(cancelled or cancelled_error(host.run_id))
            return
        if moved is None:
            moved = (loop.time(), info.last_seq)
        elif info.last_seq != moved[1] or loop.time() - moved[0] >= CANCEL_GRACE_S:
            # The new holder committed something other than a cancel, or none came.
            how = f"another executor claimed it: epoch {info.epoch}, this one held {host.epoch}"
            host.end_with(ConcurrencyError(how, run_id=host.run_id))
            return
