"""The read side is one: ``Workflow`` and the command line see the same state and status."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests.test_engine import Linear
from workflow.cli import cli


def cli_status(db: Path, run_id: str, seq: int) -> str:
    """The status ``workflow state --at SEQ --json`` shows."""
    result = CliRunner().invoke(cli, ["state", str(db), run_id, "--at", str(seq), "--json"])
    assert result.exit_code == 0, result.stderr
    status: str = json.loads(result.stdout)["status"]
    return status


def test_state_at_and_the_command_line_agree_at_every_seq(tmp_path: Path) -> None:
    """At each seq of an unowned run, also inside its last commit, both show one status."""
    db = tmp_path / "t.db"
    wf = Linear(store=db)
    run_id = wf.submit(run_id="queued")  # one commit, no executor yet: submitted
    info = wf.store.run(run_id)
    assert info.first_seq is not None
    assert info.last_seq is not None
    assert info.last_seq > info.first_seq  # the commit spans seqs: one is inside it
    for seq in range(info.first_seq, info.last_seq + 1):
        assert wf.state_at(run_id, seq).status == "submitted", seq
        assert cli_status(db, run_id, seq) == "submitted", seq
