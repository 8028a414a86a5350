"""A long run's timeline in ``workflow serve``: the run page and its data route give one
window of the run (the last, or the one a query names), each the same data the static page
embeds for that window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore
from tests.support.ui_server import get, serving
from tests.test_timeline import Ticker, settle
from workflow.cli._timeline import timeline_data


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of a few hundred commits: several windows of 100."""
    db = tmp_path_factory.mktemp("windows") / "t.db"
    settle(lambda: Ticker(store=db, timeout=None).run(run_id="tick", count=120))
    return db


def data(base: str, query: str) -> tuple[int, Any]:
    code, _, body = get(f"{base}/runs/tick/data?{query}")
    return code, json.loads(body)


def embedded(page: str) -> Any:
    start = page.index('<script type="application/json" id="data">') + 42
    return json.loads(page[start : page.index("</script>", start)])


def test_the_data_route_gives_the_window_a_query_names(long_run: Path) -> None:
    """``/runs/RUN/data`` takes after, before, around and limit as timeline_data does, and
    the run page around ``?seq=`` embeds that window; a bad limit is a clear 400."""
    with EventStore(long_run, readonly=True) as store:
        want = {
            "": timeline_data(store, "tick", limit=100),
            "after": timeline_data(store, "tick", after=0, limit=100),
        }
        seqs = want["after"]["commits"]["seq"]
        want["before"] = timeline_data(store, "tick", before=seqs[-1], limit=50)
        mid = want[""]["window"]["after"] - 30
        want["around"] = timeline_data(store, "tick", around=mid, limit=100)
    with serving(long_run) as base:
        for key, query in [
            ("", "limit=100"),
            ("after", "after=0&limit=100"),
            ("before", f"before={seqs[-1]}&limit=50"),
            ("around", f"around={mid}&limit=100"),
        ]:
            code, got = data(base, query)
            assert code == 200
            expected = json.loads(json.dumps(want[key]))
            assert got["window"] == expected["window"], key
            assert got["commits"] == expected["commits"], key
            assert got["base"] == expected["base"], key
        code, _, page = get(f"{base}/runs/tick?seq={mid}&limit=100")
        assert code == 200
        shown = embedded(page)
        assert shown["seq"] == mid
        assert shown["window"] == json.loads(json.dumps(want["around"]["window"]))
        code, answer = data(base, "limit=0")
        assert code == 400
        assert answer["message"] == "a window holds at least one commit, not 0"
        code, answer = data(base, "after=soon")
        assert code == 400
        assert "not 'soon'" in answer["message"]
