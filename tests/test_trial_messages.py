"""Small messages a new user met: the recover table's width, a cancelled run's 409 in the
web UI, and the PostgreSQL URL's ``?schema=`` rule. Real stores, a real server process and
the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from eventstore import EventStore
from tests.support.ui_server import post, serving, waiting_asker
from tests.test_cli import ok
from tests.test_recover import BUSY, left_behind
from workflow.cli import cli


def test_the_recover_table_does_not_pad_its_error_column(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with left_behind(db):
        pass
    result = CliRunner().invoke(
        cli, ["recover", str(db), "--workflow", "tests.test_recover:PipelineChanged"]
    )
    assert result.exit_code == 1
    head, rule, *lines = result.stdout.splitlines()
    assert head.split() == ["run", "outcome", "result", "or", "error"]
    assert rule.split()[-1] == "-" * len("result or error"), rule
    assert len(rule) < 60, rule
    assert [ln.split()[:2] for ln in lines] == [[r, "stranded"] for r in BUSY]
    # Every line holds its full error, unpadded: no line ends in blanks.
    assert all("'second', which no longer exists" in ln for ln in lines), lines
    assert all(ln == ln.rstrip() for ln in lines)


def test_a_cancelled_runs_resume_says_it_is_cancelled_and_names_the_flag(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    waiting_asker(db, "ask")
    ok("cancel", db, "ask")
    with serving(db, "--allow-actions", "--workflow", "tests.flows:Asker") as base:
        code, answer = post(base + "/runs/ask/resume", {})
        assert code == 409, answer
        message = answer["message"]
        assert "run 'ask' is cancelled: this server executes nothing" in message, message
        assert "`workflow resume` with its --workflow --cancelled" in message, message
        # A cancelled run keeps what is sent to it, for the resume that continues it.
        code, answer = post(base + "/runs/ask/send", {"event": "workflow:Event", "data": "{}"})
        assert code == 200, answer
        assert "to run ask (inbox entry" in answer["message"], answer
    with EventStore(str(db)) as store:
        assert len(store.inbox("ask")) == 1


@pytest.mark.parametrize("schema", ["bad-name", "1st", "a b", "x" * 64])
def test_a_schema_that_is_not_a_plain_identifier_names_the_parameter(schema: str) -> None:
    with pytest.raises(ValueError, match=r"\?schema= parameter must be a plain identifier") as err:
        EventStore(f"postgresql://postgres@127.0.0.1/test?schema={schema}")
    assert "a letter or _, then letters, digits or _, at most 63" in str(err.value)
