"""Listings tell a run submitted for a worker (never taken up) from one whose process died."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import get_args

import pytest

from eventstore import EventStore
from tests.conftest import postgres_location
from tests.test_cli import ok
from tests.test_engine import Linear
from tests.test_timeline import always_dies
from workflow import RunOwnedError, Worker
from workflow._prune import PRUNABLE
from workflow._state import RunStatus
from workflow._trace_spans import run_trace
from workflow.cli._filters import STATUSES, is_submitted
from workflow.cli._timeline import timeline_data


def test_runs_lists_submitted_runs_apart_from_interrupted_ones(tmp_path: Path) -> None:
    """``wf.submit`` leaves a run for a worker: ``workflow runs`` says submitted (and
    ``--status submitted`` finds it), while a run whose process died stays interrupted;
    once a worker has run it, it is finished."""
    db = tmp_path / "sub.db"
    always_dies(db)  # run "dies": its process died in its step, three times
    wf = Linear(store=db)
    wf.submit(run_id="queued", topic="llamas")
    listed = ok("runs", db)
    assert re.search(r"^queued\s+submitted\s", listed, re.M), listed
    assert re.search(r"^dies\s+interrupted\s", listed, re.M), listed
    only = ok("runs", db, "--status", "submitted")
    assert "queued" in only
    assert "dies" not in only
    assert "dies" in ok("runs", db, "--status", "interrupted")
    with EventStore(db, readonly=True) as store:
        assert is_submitted(store, "queued")
        assert not is_submitted(store, "dies")

    async def work() -> None:
        w = Worker(wf, poll_interval=0.05)
        task = asyncio.create_task(w.run())
        while wf.store.run("queued").status not in ("finished", "failed"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        w.stop()
        await task

    asyncio.run(asyncio.wait_for(work(), 60))
    wf.store.close()
    assert re.search(r"^queued\s+finished\s", ok("runs", db), re.M)
    with EventStore(db, readonly=True) as store:
        assert not is_submitted(store, "queued")


def test_runs_says_submitted_and_recover_still_resumes_it(tmp_path: Path) -> None:
    """A run submitted and not yet claimed is ``submitted`` in ``wf.runs()`` (as in
    ``workflow runs``), while a run whose process died stays ``interrupted``; ``pending_runs``
    lists it and ``recover`` resumes it to the end, as before."""
    db = tmp_path / "sub.db"
    always_dies(db)
    wf = Linear(store=db)
    wf.submit(run_id="queued", topic="llamas")
    statuses = {r.run_id: r.status for r in wf.runs()}
    assert statuses == {"dies": "interrupted", "queued": "submitted"}
    assert [r.status for r in wf.runs(all_workflows=False)] == ["submitted"]
    assert wf.state_at("queued").status == "submitted"  # as the listings say
    assert wf.state_at("dies").status == "interrupted"
    assert wf.pending_runs() == ["queued"]

    async def recover() -> list[tuple[str, str]]:
        report = await wf.recover()
        for r in report:
            assert r.handler is not None
            assert await r.handler == "hello llamas!"
        return [(r.run_id, r.outcome) for r in report]

    assert asyncio.run(recover()) == [("queued", "resumed")]
    wf.store.close()
    assert re.search(r"^queued\s+finished\s", ok("runs", db), re.M)


def test_every_reader_agrees_a_submitted_run_is_submitted(tmp_path: Path) -> None:
    """A run submitted and not yet claimed is ``submitted`` wherever its status shows: the
    listings, ``wf.state_at``, ``workflow state`` (text and JSON, raw and typed), the
    timeline's data and the trace; a run whose process died is ``interrupted`` in each."""
    db = tmp_path / "sub.db"
    always_dies(db)
    wf = Linear(store=db)
    wf.submit(run_id="queued", topic="llamas")
    wf.store.close()
    for run, status in (("queued", "submitted"), ("dies", "interrupted")):
        wf = Linear(store=db)
        assert {r.run_id: r.status for r in wf.runs()}[run] == status
        assert wf.state_at(run).status == status
        wf.store.close()
        assert re.search(rf"^{run}\s+{status}\s", ok("runs", db), re.M)
        assert ok("state", db, run).splitlines()[0].endswith(f": {status}")
        assert json.loads(ok("state", db, run, "--json"))["status"] == status
        with EventStore(db, readonly=True) as store:
            assert timeline_data(store, run)["run"]["status"] == status
            spans = run_trace(store, run).spans
            assert spans[0].attributes["workflow.status"] == status
    typed = ok("state", db, "queued", "--json", "--workflow", "tests.test_engine:Linear")
    assert json.loads(typed)["status"] == "submitted"


def test_prune_names_submitted_runs_apart_from_interrupted_ones(tmp_path: Path) -> None:
    """`prune --status` takes ``submitted`` as the listings show it: a run no worker took
    up is pruned only when named so, and ``interrupted`` names only runs whose process died."""
    db = tmp_path / "sub.db"
    always_dies(db)
    wf = Linear(store=db)
    wf.submit(run_id="queued", topic="llamas")
    wf.store.close()
    args = ("prune", db, "--older-than", "0s", "--dry-run", "--json", "--status")
    assert json.loads(ok(*args, "submitted"))["deleted"] == ["queued"]
    assert json.loads(ok(*args, "interrupted"))["deleted"] == ["dies"]


def test_the_status_filters_know_every_run_status() -> None:
    """`--status` (and the web UI's filter) accepts exactly the values of ``RunStatus``."""
    assert sorted(STATUSES) == sorted(get_args(RunStatus))
    assert set(STATUSES) >= PRUNABLE


@pytest.mark.postgres
def test_runs_says_until_when_a_lease_holds_a_run_whose_owner_died() -> None:
    """A run whose owner died while its lease is still live is listed as running, with
    whose lease holds it and until when (UTC), in `workflow runs` (table and JSON) and
    `wf.runs()`: why a resume is refused until then, as the refusal says too."""
    with postgres_location() as url:
        wf = Linear(store=url)
        wf.submit(run_id="held", topic="llamas")
        # What an executor that died leaves behind: its lease, not renewed any more.
        assert wf.store.lease_sync("held", "gone-host:4242:deadbeef", 600)
        lease = wf.store.lease_of("held")
        assert lease is not None
        lapses_at = lease[1] / 1e6
        when = time.strftime("%H:%M:%S", time.gmtime(lapses_at))
        (summary,) = wf.runs()
        assert (summary.status, summary.lease) == (
            "running",
            ("gone-host:4242:deadbeef", lapses_at),
        )

        async def resume() -> None:
            with pytest.raises(RunOwnedError) as refused:
                wf.resume("held")
            assert refused.value.lapses_at == lapses_at

        asyncio.run(resume())
        wf.store.close()
        said = f"running (lease held until {when} UTC by gone-host:4242:deadbeef)"
        assert re.search(rf"^held\s+{re.escape(said)}\s", ok("runs", url), re.M)
        (row,) = json.loads(ok("runs", url, "--json"))
        assert row["status"] == "running"
        assert row["lease"] == {"holder": "gone-host:4242:deadbeef", "lapses_at": lapses_at}
