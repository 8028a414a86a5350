"""The run page of ``workflow serve --workflow`` shows a run of an older typed state model
version as the command line does: its context upcast to the workflow's state model (the
field renamed, the one added), never under the log's old field names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.browser.conftest import Chromium
from tests.browser.test_pages import body_attrs, element, text
from tests.support.ui_server import get, serving
from tests.test_deploying import MODULE, loaded, notes_server_run
from workflow.cli import cli


def test_an_old_runs_page_shows_its_context_upcast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chromium: Chromium
) -> None:
    db, root = notes_server_run(tmp_path, monkeypatch)
    flow = ["--workflow", f"{MODULE}:Flow"]
    with serving(db, *flow) as base:
        data = json.loads(get(base + "/runs/old/data")[2])
        seqs = data["commits"]["seq"]
        rec, kinds = data["rec"], data["kinds"]
        # The commit that wrote "title" (version 1's name of "name").
        wrote = next(
            ci
            for ci, first in enumerate(data["commits"]["first"])
            if any(
                kinds[rec["k"][i]] == "state_set" and rec["a"][i][0] == "title"
                for i in range(first, data["commits"]["first"][ci + 1])
            )
        )
        dom = chromium.dom(f"{base}/runs/old?seq={seqs[-1]}")
        assert body_attrs(dom)["data-ready"] == "1"
        state = text(element(dom, "section", "state"))
        context = state.partition("Context")[2].partition("Waiters")[0]
        assert "upcast to this workflow's state model" in context, context
        assert "name 'hi'" in context, context
        assert "lang 'en'" in context, context
        assert "items ['a', 'b']" in context, context
        assert "title" not in context, context
        # What `workflow state --workflow` shows at the same seq.
        with loaded(root):
            shown = CliRunner().invoke(cli, ["state", str(db), "old", *flow, "--json"])
        assert json.loads(shown.output)["context"] == {
            "name": "hi",
            "items": ["a", "b"],
            "lang": "en",
        }
        # The commit that wrote "title" adds "name" (and what the upcaster fills in).
        dom = chromium.dom(f"{base}/runs/old?seq={seqs[wrote]}")
        changes = text(element(dom, "ul", "ctx-changes"))
        assert "+ name = 'hi'" in changes, changes
        assert "title" not in changes, changes
        # Before anything was written: nothing to upcast, and no upcaster is called.
        dom = chromium.dom(f"{base}/runs/old?seq={seqs[0]}")
        context = text(element(dom, "section", "state")).partition("Context")[2]
        assert context.partition("Waiters")[0].strip() == "empty", context
    with serving(db) as base:  # without the workflow: the log's keys, as the CLI shows them
        dom = chromium.dom(f"{base}/runs/old?seq={seqs[-1]}")
        context = text(element(dom, "section", "state")).partition("Context")[2]
        assert "title 'hi'" in context.partition("Waiters")[0], context
        assert "upcast" not in context, context
