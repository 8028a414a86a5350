"""An executor whose run another process took over stops on its own, without a commit.

A run that only waits commits nothing until its answer comes: the epoch fence alone would
never tell its executor it lost the run. The watch (``workflow._takeover``) reads the run's
row and ends the executor: cancelled when the taker recorded ``run_cancelled``, lost when it
went on with the run, or claimed it and recorded nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from eventstore import Commit, EventStore
from tests.flows import Asker
from workflow import RunLostError, _takeover
from workflow import _journal as J
from workflow._takeover import CANCEL_GRACE_S
from workflow.errors import WorkflowCancelledByUser
from workflow.handler import WorkflowHandler

BOUND = 60.0  # seconds before a test fails instead of hanging: nothing here is timed


async def waiting_run(location: str) -> tuple[Asker, WorkflowHandler]:
    wf = Asker(store=location, timeout=None)
    h = wf.run(run_id="ask")
    await h.wait_until_waiting(BOUND)
    return wf, h


@pytest.mark.parametrize("then", ["resumed", "nothing"])
async def test_a_waiting_run_taken_over_elsewhere_ends_lost(
    location: str, then: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another executor claims the waiting run and goes on (a record under its epoch), or
    claims it and writes nothing for longer than a cancel takes: the handler raises
    RunLostError, and nothing of this executor lands after the claim."""
    # The watch waits this long for a cancel after a claim (2 s): a shorter wait ends the
    # same way, sooner; nothing here cancels.
    monkeypatch.setattr(_takeover, "CANCEL_GRACE_S", 0.5)
    wf, h = await waiting_run(location)
    with EventStore(location) as other:
        epoch = other.claim_sync("ask")
        if then == "resumed":
            resumed = J.run_resumed(epoch, "running", None)
            other.append_sync(Commit("ask", [resumed], epoch=epoch, status="running"))
        last = other.run("ask").last_seq
        with pytest.raises(RunLostError, match="another executor claimed it"):
            await asyncio.wait_for(h, BOUND + CANCEL_GRACE_S)
        assert other.run("ask").last_seq == last
    wf.store.close()


async def test_a_cancel_elsewhere_wins_over_lost(location: str) -> None:
    """A claim followed by ``run_cancelled`` (what `workflow cancel` does) ends the handler
    cancelled, with the reason, not lost."""
    wf, h = await waiting_run(location)
    with EventStore(location) as other:
        epoch = other.claim_sync("ask")
        await asyncio.sleep(0.3)  # the watch may look between the claim and the record
        cancelled = J.run_cancelled("workflow cancel", "changed my mind")
        other.append_sync(Commit("ask", [cancelled], epoch=epoch, status="cancelled"))
        with pytest.raises(WorkflowCancelledByUser, match="was cancelled: changed my mind"):
            await asyncio.wait_for(h, BOUND)
    wf.store.close()
