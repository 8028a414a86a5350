"""The web UI's fork point means what ``workflow fork --at SEQ`` and ``wf.run_from`` mean,
and its answers name the seq the fork's log records (a commit counts whole).

A real ``workflow serve`` process, with and without ``--execute``, and the real command.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path

from tests.flows import ReportFlow
from tests.support.ui_server import get, post, serving, wait_for
from tests.test_cli import invoke, run_to_end


def _mid_commit_seq(db: Path, run_id: str) -> tuple[int, int]:
    """A seq of ``run_id`` inside a commit of several records, and that commit's last seq."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute(
            "SELECT seq, commit_seq FROM records WHERE run_id = ? AND seq < commit_seq"
            " ORDER BY seq",
            (run_id,),
        ).fetchall()
    assert rows, "the run has no commit of several records"
    seq, end = rows[0]
    return int(seq), int(end)


def _parent_seq(db: Path, run_id: str) -> int:
    """The parent seq the fork's row records (its first commit may still be on its way)."""

    def row() -> tuple[int] | None:
        with contextlib.closing(sqlite3.connect(db)) as con:
            query = "SELECT parent_seq FROM runs WHERE run_id = ?"
            found: tuple[int] | None = con.execute(query, (run_id,)).fetchone()
            return found

    (seq,) = wait_for(row, "the fork's first commit")
    return int(seq)


def test_a_fork_inside_a_commit_says_the_seq_its_log_records(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="pad")  # seqs are global
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")
    mid, end = _mid_commit_seq(db, "rep")
    said = f"at seq {end} (the end of the commit holding seq {mid}: a commit counts whole)"
    for args in ([], ["--execute"]):
        flags = ["--allow-actions", "--workflow", "tests.flows:ReportFlow", *args]
        with serving(db, *flags) as base:
            code, answer = post(base + "/runs/rep/fork", {"seq": mid})
            assert code == 200, answer
            assert f"forked run rep {said} as {answer['run_id']}" in answer["message"], answer
            assert _parent_seq(db, answer["run_id"]) == end
            state = json.loads(get(f"{base}/runs/{answer['run_id']}/state")[2])
            assert state["parent"] == ["rep", end]
            # A seq before the run's first record names where its log and first commit are.
            first = min(s for s in range(mid + 1) if _in_run(db, "rep", s))
            code, answer = post(base + "/runs/rep/fork", {"seq": first - 1})
            assert code == 400, answer
            assert f"its log begins at seq {first}" in answer["message"], answer
            assert "its first commit ends" not in answer["message"]
    # The command says the same of the same seq.
    out = invoke("fork", str(db), "rep", "--at", str(mid), "--workflow", "tests.flows:ReportFlow")
    found = re.search(rf"forked run rep {re.escape(said)} as (\w+)", out.output)
    assert found is not None, out.output
    assert _parent_seq(db, found[1]) == end


def _in_run(db: Path, run_id: str, seq: int) -> bool:
    with contextlib.closing(sqlite3.connect(db)) as con:
        row = con.execute(
            "SELECT 1 FROM records WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
    return row is not None


def test_the_state_route_refuses_query_parameters_it_does_not_take(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")
    mid, end = _mid_commit_seq(db, "rep")
    with serving(db) as base:
        code, _, body = get(f"{base}/runs/rep/state?at={mid}")
        assert code == 400, body
        message = json.loads(body)["message"]
        assert "unknown query parameter 'at'" in message, message
        assert "it takes ?seq=" in message, message
        code, _, body = get(f"{base}/runs/rep/state?seq={mid}")
        assert code == 200, body
        assert json.loads(body)["seq"] == end
