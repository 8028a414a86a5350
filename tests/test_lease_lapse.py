"""On PostgreSQL a dead executor's lease holds its run until it lapses: a resume meanwhile
says when it lapses and that it lapses by itself, not only "stop that process".

The lease is taken by a real process that then exits without releasing it (as a crash
leaves it), on the local PostgreSQL service.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import postgres_location
from tests.flows import ReportFlow
from tests.test_cli import run_to_end
from workflow import RunOwnedError

pytestmark = pytest.mark.postgres

DIES_HOLDING = """
import os
import sys

from eventstore import EventStore

store = EventStore(sys.argv[1])
assert store.lease_sync(sys.argv[2], "vm:21821:deadbeef", 60.0)
os._exit(3)  # no release: the lease stays until it lapses
"""


def test_a_dead_owners_lease_says_when_it_lapses() -> None:
    with postgres_location() as url:
        run_to_end(ReportFlow(store=url, timeout=None), run_id="rep")  # failed: resumable
        proc = subprocess.run(
            [sys.executable, "-c", DIES_HOLDING, url, "rep"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 3, proc.stderr
        before = time.time()

        async def resume() -> None:
            wf = ReportFlow(store=url, timeout=None)
            try:
                wf.resume("rep", cancelled=True)
            finally:
                wf.store.close()

        with pytest.raises(RunOwnedError) as err:
            asyncio.run(resume())
        text = str(err.value)
        assert "its lease is held by vm:21821:deadbeef" in text, text
        assert "a dead owner's lease lapses by itself" in text, text
        assert "live executor" not in text, text
        found = re.search(r"lapses at (\d\d:\d\d:\d\d) UTC \(in about (\d+) s\)", text)
        assert found is not None, text
        assert err.value.lapses_at is not None
        assert err.value.lapses_at > before
        assert int(found[2]) <= 60
        assert found[1] == time.strftime("%H:%M:%S", time.gmtime(err.value.lapses_at))
