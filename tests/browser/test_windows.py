"""A long run's timeline a window at a time, in a real browser: the static page says how to
see the other windows; in ``workflow serve`` moving past a window's edge (keys, the window
bar's buttons, a seq typed or linked) loads the next window and selects where the move
meant."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from playwright.sync_api import Page, expect

from eventstore import EventStore
from tests.browser.conftest import Chromium
from tests.browser.test_pages import body_attrs, element, text
from tests.support.ui_server import serving
from tests.test_timeline import Ticker, settle
from workflow.cli import cli


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A run of a few hundred commits (several windows of 100), and its commits' last seqs."""
    db = tmp_path_factory.mktemp("windows") / "t.db"
    settle(lambda: Ticker(store=db, timeout=None).run(run_id="tick", count=120))
    with EventStore(db, readonly=True) as store:
        ends = sorted({int(r.commit_seq) for r in store.records("tick")})
    return db, ends


def seq(page: Page) -> int:
    return int(page.evaluate("document.body.dataset.seq"))


def window_of(page: Page) -> tuple[int, int]:
    after, last = page.evaluate("document.body.dataset.window").split(":")
    return int(after), int(last)


def moved(page: Page, before: str) -> None:
    """Waits until the page holds another window than ``before``."""
    page.wait_for_function(f"document.body.dataset.window !== {before!r}")


def test_the_static_page_of_a_long_run_says_how_to_see_the_rest(
    long_run: tuple[Path, list[int]], tmp_path: Path, chromium: Chromium
) -> None:
    """The static page of a window shows where it lies in the run and the two commands that
    show the rest; its selection stays inside it."""
    db, ends = long_run
    out = tmp_path / "tick.html"
    result = CliRunner().invoke(
        cli, ["timeline", str(db), "tick", "--window", "100", "-o", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    dom = chromium.dom(out.as_uri())
    attrs = body_attrs(dom)
    assert attrs["data-ready"] == "1"
    assert attrs["data-commits"] == "100"
    assert attrs["data-seq"] == str(ends[-1])
    bar = text(element(dom, "div", "window"))
    assert f"This page shows 100 commits (seqs {ends[-100 - 1] + 1}\u2013{ends[-1]})" in bar
    assert "workflow timeline DB RUN --at SEQ" in bar
    assert "workflow serve DB" in bar
    dom = chromium.dom(f"{out.as_uri()}#seq={ends[3]}")
    assert body_attrs(dom)["data-seq"] == str(ends[-100])  # its first commit: the nearest


def test_serve_loads_the_windows_as_one_moves(long_run: tuple[Path, list[int]], page: Page) -> None:
    """In ``workflow serve``: Home and End load the run's first and last windows; stepping
    past an edge loads the next window with the selection at the next commit; the bar's
    buttons and a typed seq load the windows they name."""
    db, ends = long_run
    with serving(db) as base:
        page.goto(f"{base}/runs/tick?limit=100")
        page.wait_for_function("document.body.dataset.ready === '1'")
        expect(page.locator("#earlier")).to_be_enabled()
        expect(page.locator("#later")).to_be_disabled()
        assert seq(page) == ends[-1]
        last = page.evaluate("document.body.dataset.window")
        page.keyboard.press("Home")
        moved(page, last)
        assert seq(page) == ends[0]
        assert window_of(page) == (0, ends[99])
        first = page.evaluate("document.body.dataset.window")
        page.keyboard.press("End")
        moved(page, first)
        assert seq(page) == ends[-1]
        page.keyboard.press("Home")  # in the last window: the first window again
        moved(page, last)
        for _ in range(99):
            page.keyboard.press("ArrowRight")
        assert seq(page) == ends[99]
        page.keyboard.press("ArrowRight")  # past the edge: the next window, at its first
        moved(page, first)
        assert seq(page) == ends[100]
        assert window_of(page) == (ends[99], ends[199])
        second = page.evaluate("document.body.dataset.window")
        page.keyboard.press("ArrowLeft")  # back past it: the window before, at its last
        moved(page, second)
        assert seq(page) == ends[99]
        page.locator("#later").click()
        moved(page, first)
        assert seq(page) == ends[100]
        page.locator("#earlier").click()
        moved(page, second)
        assert seq(page) == ends[99]
        middle = ends[len(ends) // 2]
        page.locator("#seq").fill(str(middle))
        page.locator("#seq").press("Enter")
        page.wait_for_function(f"document.body.dataset.seq === '{middle}'")
        after, upto = window_of(page)
        assert after < middle <= upto
        expect(page.locator("#state")).to_contain_text(f"State at seq {middle}")
