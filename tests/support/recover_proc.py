"""Leaves runs for the recover tests to find: ``python -m tests.support.recover_proc DB MODE...``.

Starts ``run-0``, ``run-1`` and ``run-2`` of ``tests.test_recover:Pipeline``, held in their
second step while ``DB.hold`` exists. Each extra MODE adds a run: ``ask`` one (``ask``)
that waits for an answer and is held by this process (not suspended), ``secret`` one
(``secret``) whose context holds a class only this process imports, ``unlucky`` one
(``unlucky``) whose second step raises once it is let go. Prints ``READY`` once every run
is durably where it should be, then stays until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from tests.test_recover import Pipeline


async def main(db: str, modes: list[str]) -> None:
    wf = Pipeline(store=db, timeout=None)
    starts: dict[str, dict[str, Any]] = {f"run-{i}": {"n": i} for i in range(3)}
    if "ask" in modes:
        starts["ask"] = {"n": 0, "ask": True}
    if "secret" in modes:
        from tests.recover_secret import Secret

        starts["secret"] = {"n": 5, "tag": Secret("only here")}
    if "unlucky" in modes:
        starts["unlucky"] = {"n": 13}
    handlers = [wf.run(run_id=run_id, **fields) for run_id, fields in starts.items()]

    def where(run_id: str) -> bool:
        if wf.store.get_run(run_id) is None:
            return False  # its first commit is not written yet
        state = wf.state_at(run_id)
        if run_id == "ask":
            return state.status == "waiting"
        return any(p.attempt >= 1 for p in state.in_progress.get("second", []))

    # What a test finds after the kill is what was committed: wait until the log says so.
    while not all(where(run_id) for run_id in starts):  # noqa: ASYNC110 - polls the log
        await asyncio.sleep(0.02)
    print("READY", flush=True)  # noqa: T201 - how the test learns the runs are in place
    await asyncio.sleep(3600)
    del handlers


if __name__ == "__main__":
    Path(sys.argv[1] + ".hold").touch()
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
