"""The web UI (``workflow serve``) in a real browser: Debian's chromium driven by Playwright
(its own browser downloads are never used). A user opens the run list, clicks into a run,
steps through its seqs with the keys, jumps between failures, watches a live run advance
without a reload, and acts on a run. The screenshots the README shows are written here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from eventstore import add_key
from tests.flows import Asker, ReportFlow
from tests.support.child import child
from tests.support.ui_server import ROOT, serving, wait_for, waiting_asker
from tests.test_cli import run_to_end
from tests.test_encryption import SECRET, sealed_secretive
from tests.test_timeline import fan
from tests.test_ui_http import fork_of

DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A failed ReportFlow run 'rep', its finished fork, and a waiting Asker run 'ask'."""
    db = tmp_path_factory.mktemp("ui") / "runs.db"
    run_to_end(ReportFlow(store=db, timeout=None), run_id="rep")
    fork_of(db, "rep")
    waiting_asker(db, "ask")
    return db


def off_loop(f: Callable[..., object], *args: object) -> None:
    """Calls ``f`` in another thread: Playwright's sync API keeps an event loop running in
    this one, and the helpers that record runs start their own with ``asyncio.run``."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(f, *args).result()


def seq(page: Page) -> int:
    return int(page.evaluate("document.body.dataset.seq"))


def test_runs_page_click_into_a_run_and_step_with_keys(store: Path, page: Page) -> None:
    """The run list shows every run with its counts; a click opens the run at its last
    commit; the arrow keys, Home and End step through its commits; ] and [ jump between
    failures, where the diff shows the traceback."""
    with serving(store.name, cwd=store.parent) as base:  # the page names it as given
        page.goto(base + "/")
        expect(page.locator("#counts")).to_contain_text("all 3")
        expect(page.locator("#counts")).to_contain_text("failed 1")
        expect(page.locator("#counts")).to_contain_text("waiting 1")
        expect(page.locator('tr[data-run="ask"]')).to_contain_text("waiting for HumanResponseEvent")
        page.screenshot(path=str(DOCS / "ui-runs.png"))
        page.locator('tr[data-run="rep"] a.run').click()
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert page.url.startswith(base + "/runs/rep#seq=")
        expect(page.locator("#run-status")).to_have_text("failed")
        last = int(page.evaluate("document.body.dataset.lastSeq"))
        assert seq(page) == last
        steps = []
        for _ in range(3):
            page.keyboard.press("ArrowLeft")
            steps.append(seq(page))
        assert steps == sorted(steps, reverse=True)
        assert steps[0] < last
        assert len(set(steps)) == 3
        page.keyboard.press("ArrowRight")
        assert seq(page) == steps[1]
        page.keyboard.press("Home")
        first = seq(page)
        expect(page.locator("#state")).to_contain_text(f"State at seq {first}")
        failures = [int(s) for s in page.evaluate("document.body.dataset.failures").split(",")]
        assert failures
        page.keyboard.press("]")
        assert seq(page) == failures[0]
        expect(page.locator("#diff")).to_contain_text("step_failed")
        expect(page.locator("#diff pre.traceback")).to_contain_text("ValueError: var is not set")
        page.screenshot(path=str(DOCS / "ui-run.png"))
        page.keyboard.press("End")
        assert failures[-1] == last  # the run failed in its last commit
        page.keyboard.press("[")
        assert seq(page) == failures[-2]
        page.locator("#nextfail").click()
        assert seq(page) == last
        # The bars say what their event carries, and the time axis is labelled in time.
        assert page.locator("text.blabel").count() > 0
        assert (page.locator("text.tlabel").first.text_content() or "").startswith("+")
        page.locator("#axis").click()
        assert page.evaluate("document.body.dataset.axis") == "commits"
        # A fork link leads to the fork's page, which links back to its parent at the seq.
        page.locator("#forks a").first.click()
        page.wait_for_function("document.body.dataset.ready === '1'")
        expect(page.locator("#run-status")).to_have_text("finished")
        page.locator("#parent a").click()
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert "/runs/rep#seq=" in page.url
        assert seq(page) == int(page.url.rsplit("=", 1)[1])


def test_a_live_run_advances_without_reload(tmp_path: Path, page: Page) -> None:
    """A run executing in another process: each commit it makes reaches the open page through
    server-sent events, the page fetches only what is new, the chart and panels redraw in
    place, the selection follows the end."""
    db = tmp_path / "live.db"
    gate = Path(str(db) + ".gate")
    with child(
        [sys.executable, "-m", "tests.support.live_flow", str(db), "live", "3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    ) as proc:
        wait_for(lambda: proc.poll() is None and db.exists() and "live" in _runs(db), "the run")
        with serving(db) as base:
            page.goto(base + "/runs/live")
            page.wait_for_function("document.body.dataset.ready === '1'")
            page.evaluate("window.__same = 'no reload'")
            expect(page.locator("#run-status")).to_have_text("running")
            seen = [int(page.evaluate("document.body.dataset.lastSeq"))]
            for n in (1, 2):
                gate.write_text(str(n))
                page.wait_for_function(
                    f"Number(document.body.dataset.lastSeq) > {seen[-1]}"
                    " && document.querySelector('#state').textContent.includes('ticks')"
                )
                seen.append(int(page.evaluate("document.body.dataset.lastSeq")))
                assert seq(page) == seen[-1]  # following the last commit
                # Only the new records were fetched, not the whole timeline again.
                fetched = str(page.evaluate("document.body.dataset.fetched"))
                assert fetched.startswith("patch:"), fetched
                assert int(fetched.split(":")[1]) > 0  # the new records, and only those
                expect(page.locator("#state")).to_contain_text(f"{n}")
            page.screenshot(path=str(DOCS / "ui-live.png"))
            gate.write_text("3")
            expect(page.locator("#run-status")).to_have_text("finished", timeout=60_000)
            expect(page.locator("#state")).to_contain_text("ticked 3 times")
            assert page.evaluate("window.__same") == "no reload"
        out, _ = proc.communicate(timeout=60)
        assert "ticked 3 times" in out


def _runs(db: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "workflow", "runs", str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout


def test_actions_from_the_page(tmp_path: Path, page: Page) -> None:
    """With --allow-actions --execute: send the answer a waiting run waits for, resume it and
    watch it finish; fork a run at the selected seq and open the fork."""
    db = tmp_path / "act.db"
    off_loop(waiting_asker, db, "ask")
    wf = Asker(store=db, timeout=None)
    waited = wf.checkpoints("ask")[-1].seq
    wf.store.close()
    args = ("--allow-actions", "--workflow", "tests.flows:Asker", "--execute")
    with serving(db, *args) as base:
        page.goto(base + "/runs/ask")
        page.wait_for_function("document.body.dataset.ready === '1'")
        expect(page.locator("#run-status")).to_have_text("waiting")
        page.fill("#send-event", "workflow:HumanResponseEvent")
        page.fill("#send-data", '{"response": "Ada"}')
        page.click("#act-send")
        expect(page.locator("#act-result")).to_contain_text("sent")
        page.screenshot(path=str(DOCS / "ui-actions.png"))
        page.click("#act-resume")
        expect(page.locator("#act-result")).to_contain_text("resumed run ask")
        expect(page.locator("#run-status")).to_have_text("finished", timeout=60_000)
        expect(page.locator("#state")).to_contain_text("hello Ada")
        # Fork where it waited, and open the fork.
        page.fill("#seq", str(waited))
        page.press("#seq", "Enter")
        assert seq(page) == waited
        page.fill("#fork-updates", '{"note": "from the UI"}')
        page.click("#act-fork")
        expect(page.locator("#act-result")).to_contain_text("forked run ask at seq")
        page.click("#act-link")
        page.wait_for_function("document.body.dataset.ready === '1'")
        expect(page.locator("#parent")).to_contain_text("forked from ask")
        # The fork waits again for an answer; cancel it from its page.
        expect(page.locator("#run-status")).to_have_text("waiting", timeout=60_000)
        page.click("#act-cancel")
        expect(page.locator("#act-result")).to_contain_text("cancelled run")
        expect(page.locator("#run-status")).to_have_text("cancelled", timeout=60_000)


def test_read_only_page_offers_no_actions(store: Path, page: Page) -> None:
    """Without --allow-actions there is no actions panel, and the page says it is live."""
    with serving(store) as base:
        page.goto(base + "/runs/ask")
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert page.locator("#actions").count() == 0
        expect(page.locator("#live")).to_have_class("on")


def test_an_encrypted_run_without_and_with_its_key(
    tmp_path: Path, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served without its key file, an encrypted run's page lists its seqs, kinds and steps
    with each payload "encrypted (k1)" and says which key it needs; served with it, the
    timeline shows the run's values."""
    db, keys = tmp_path / "sealed.db", tmp_path / "keys.json"
    add_key(keys)
    off_loop(sealed_secretive, db, keys)
    monkeypatch.delenv("WORKFLOW_KEY_FILE", raising=False)
    with serving(db.name, cwd=db.parent) as base:  # the page names it as given
        page.goto(base + "/")
        page.locator('tr[data-run="s"] a.run').click()
        page.wait_for_url("**/runs/s")
        expect(page.locator("#sealed")).to_contain_text("encrypted (key id k1)")
        rows = page.locator("#records tr[data-seq]")
        assert rows.count() > 10
        expect(rows.first.locator(".payload")).to_have_text("encrypted (k1)")
        expect(page.locator("#records")).to_contain_text("memoized")
        assert SECRET not in page.content()
        page.screenshot(path=str(DOCS / "ui-encrypted.png"))
    monkeypatch.setenv("WORKFLOW_KEY_FILE", str(keys))
    with serving(db) as base:
        page.goto(base + "/runs/s")
        page.wait_for_function("document.body.dataset.ready === '1'")
        assert page.locator("#sealed").count() == 0
        expect(page.locator("#svg")).to_contain_text(SECRET[:8])


def test_a_lane_per_worker(tmp_path: Path, page: Page) -> None:
    """A step with three workers draws three rows, each named by its worker, and each bar
    says which worker of which session ran it."""
    db = tmp_path / "fan.db"
    off_loop(fan, db)
    with serving(db) as base:
        page.goto(base + "/runs/fan")
        page.wait_for_function("document.body.dataset.ready === '1'")
        labels = page.locator('.worker-label[data-step="work"]')
        expect(labels).to_have_count(3)
        assert labels.all_text_contents() == ["w0", "w1", "w2"]
        bars = page.locator('rect.bar[data-step="work"]')
        assert {bars.nth(i).get_attribute("data-worker") for i in range(bars.count())} == {
            "0",
            "1",
            "2",
        }
        assert "worker 1 of session 1" in (
            page.locator('rect.bar[data-step="work"][data-worker="1"]').first.inner_html()
        )
