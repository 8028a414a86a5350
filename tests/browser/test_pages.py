"""The timeline and graph pages in a real (headless) browser: what a user sees, and that the
page's own fold agrees with the Python fold at every commit."""

from __future__ import annotations

import asyncio
import html
import json
import re
import struct
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventstore import EventStore
from tests.browser.conftest import Chromium
from tests.test_timeline import STORIES, Ticker, fold_digests, report_resumed_and_forked
from workflow.cli import cli
from workflow.cli._timeline import render_page, timeline_data


def write_page(db: Path, run_id: str, out: Path) -> Path:
    """Writes a run's timeline page with the command line; returns its path."""
    result = CliRunner().invoke(cli, ["timeline", str(db), run_id, "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def element(dom: str, tag: str, ident: str) -> str:
    """The inner HTML of the element with that id (the page never nests them)."""
    m = re.search(rf'<{tag}[^>]*\bid="{ident}"[^>]*>(.*?)</{tag}>', dom, re.S)
    assert m is not None, f"no <{tag} id={ident}>"
    return m.group(1)


def text(fragment: str) -> str:
    """Visible text of an HTML fragment, cells separated by single spaces."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def body_attrs(dom: str) -> dict[str, str]:
    """The attributes of <body>, where the page says it is ready and what it selected."""
    m = re.search(r"<body([^>]*)>", dom)
    assert m is not None
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A failed, resumed ReportFlow run and a fork of it, with both pages written."""
    where = tmp_path_factory.mktemp("report")
    db = where / "t.db"
    parent, child = report_resumed_and_forked(db)
    write_page(db, parent, where / f"{parent}.html")
    write_page(db, child, where / f"{child}.html")
    return db, parent, child


def test_selecting_a_seq_shows_state_and_diff(
    report: tuple[Path, str, str], chromium: Chromium
) -> None:
    """At the failed attempt's seq the page shows the step in progress, its error, the diff."""
    db, run, _ = report
    page = db.parent / f"{run}.html"
    dom = chromium.dom(page.as_uri() + "#seq=13")
    attrs = body_attrs(dom)
    assert attrs["data-ready"] == "1"
    assert attrs["data-seq"] == "13"
    state = text(element(dom, "section", "state"))
    assert "State at seq 13" in state
    assert "running" in state
    row = "finish #3 EventB 1 1 ValueError: var is not set"
    assert f"{row} tests.flows:EventB(content='second: first')" in state
    assert "Queues empty" in state
    diff = text(element(dom, "section", "diff"))
    assert "What commit seq 13 changed" in diff
    assert "13 step_failed finish #3 attempt 1 ValueError: var is not set (no retry)" in diff
    header = text(element(dom, "header", "head"))
    assert f"Run {run} finished" in header
    # Bars: one per attempt, the failed one marked, the retry marked as such.
    bars = re.findall(
        r'<rect class="bar ([\w ]+)" data-step="(\w+)" data-event="(\d+)" data-attempt="(\d+)"', dom
    )
    assert ("failed", "finish", "3", "1") in bars
    assert ("ok retry", "finish", "3", "2") in bars
    assert {b[1] for b in bars} == {"start", "process", "finish"}


def test_failed_attempt_shows_its_traceback(
    report: tuple[Path, str, str], chromium: Chromium
) -> None:
    """At a failed attempt's seq the page shows its stored traceback; at the seq where the
    run failed, the state shows the failed step's traceback open."""
    db, run, _ = report
    with EventStore(db, readonly=True) as store:
        [failed] = list(store.records(run, kinds=["step_failed"]))
        [ended] = list(store.records(run, kinds=["run_failed"]))
    stored = json.loads(failed.payload)["traceback"]
    assert "raise ValueError(msg)" in stored
    page = (db.parent / f"{run}.html").as_uri()
    diff = element(chromium.dom(f"{page}#seq={failed.seq}"), "section", "diff")
    assert "Traceback of finish #3" in text(diff)
    shown = re.search(r'<pre class="traceback">(.*?)</pre>', diff, re.S)
    assert shown is not None
    assert html.unescape(shown.group(1)) == stored
    state = element(chromium.dom(f"{page}#seq={ended.seq}"), "section", "state")
    assert re.search(r'<details class="traceback" open="[^"]*"><summary>', state)
    assert "traceback of finish #3: ValueError: var is not set" in text(state)
    assert "raise ValueError(msg)" in text(state)


def test_context_changes_old_to_new(tmp_path: Path, chromium: Chromium) -> None:
    """A commit that changes a context key shows its old and new values."""
    db = tmp_path / "t.db"

    async def go() -> None:
        await Ticker(store=db, timeout=None).run(run_id="tick", count=3)

    asyncio.run(go())
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "tick")
    rec = data["rec"]
    kinds = data["kinds"]
    sets = [
        i for i, k in enumerate(rec["k"]) if kinds[k] == "state_set" and rec["a"][i][0] == "last"
    ]
    second = rec["seq"][sets[1]]
    page = tmp_path / "tick.html"
    page.write_text(render_page(data))
    dom = chromium.dom(f"{page.as_uri()}#seq={second}")
    changes = text(element(dom, "ul", "ctx-changes"))
    assert (
        "~ last : {'n': 0, 'note': '</script><b>x</b>'} → {'n': 1, 'note': '</script><b>x</b>'}"
        in changes
    )
    assert "~ seen : [0] → [0, 1]" in changes


@pytest.mark.parametrize("story", list(STORIES))
def test_page_fold_equals_python_fold(story: str, tmp_path: Path, chromium: Chromium) -> None:
    """The state the page computes after every commit is the Python fold's."""
    db = tmp_path / "t.db"
    run_id = STORIES[story](db)
    page = write_page(db, run_id, tmp_path / "p.html")
    dom = chromium.dom(page.as_uri() + "#selftest")
    got = json.loads(html.unescape(element(dom, "pre", "selftest")))
    with EventStore(db, readonly=True) as store:
        expected = json.loads(json.dumps(fold_digests(store, run_id)))
    assert got == expected


def test_fork_links_to_its_parent_and_back(
    report: tuple[Path, str, str], chromium: Chromium
) -> None:
    """A fork's page links to its parent's at the fork seq, and the parent's lists the fork."""
    db, parent, child = report
    child_dom = chromium.dom((db.parent / f"{child}.html").as_uri())
    link = element(child_dom, "p", "parent")
    assert f'href="{parent}.html#seq=11"' in link
    assert (db.parent / f"{parent}.html").exists()
    parent_dom = chromium.dom((db.parent / f"{parent}.html").as_uri() + "#seq=11")
    assert f'href="{child}.html"' in element(parent_dom, "p", "forks")
    assert 'class="forklink"' in parent_dom
    # Following the link lands on the parent at the fork seq.
    assert (
        body_attrs(chromium.dom((db.parent / f"{parent}.html").as_uri() + "#seq=11"))["data-seq"]
        == "11"
    )


# ---------------------------------------------------------------------------- screenshots


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decodes an 8-bit RGB or RGBA PNG (what Chromium writes) into rows of pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8
            assert color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, channels, rows


def count_color(path: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixels of a screenshot have exactly this color."""
    width, channels, rows = png_pixels(path)
    want = bytes(rgb)
    return sum(
        1 for row in rows for x in range(width) if row[x * channels : x * channels + 3] == want
    )


def test_screenshot_shows_failed_and_finished_bars(
    report: tuple[Path, str, str], chromium: Chromium, tmp_path: Path
) -> None:
    """The rendered chart has red (failed) and green (finished) attempt bars."""
    db, run, _ = report
    shot = chromium.screenshot((db.parent / f"{run}.html").as_uri(), tmp_path / "shot.png")
    assert count_color(shot, (0xD9, 0x2D, 0x20)) > 200  # --failed
    assert count_color(shot, (0x3A, 0x9D, 0x5D)) > 200  # --ok


# ---------------------------------------------------------------------------- 10,000 commits


def test_ten_thousand_commits_stay_usable(tmp_path: Path, chromium: Chromium) -> None:
    """A run of 10,000+ commits, asked for whole (--window), gives a page of a few MB that
    loads and selects quickly."""
    db = tmp_path / "big.db"

    async def go() -> None:
        await Ticker(store=db, timeout=None).run(run_id="big", count=3400)

    asyncio.run(go())
    with EventStore(db, readonly=True) as store:
        data = timeline_data(store, "big", limit=20_000)
    n = len(data["commits"]["seq"])
    assert n >= 10_000
    page = tmp_path / "big.html"
    page.write_text(render_page(data))
    assert page.stat().st_size < 8_000_000
    middle = data["commits"]["seq"][n // 2]
    started = time.monotonic()
    dom = chromium.dom(f"{page.as_uri()}#seq={middle}")
    elapsed = time.monotonic() - started
    attrs = body_attrs(dom)
    assert attrs["data-ready"] == "1"
    assert attrs["data-commits"] == str(n)
    assert attrs["data-seq"] == str(middle)
    with EventStore(db, readonly=True) as store:
        expected = fold_digests(store, "big")[n // 2][4]["last"]
    state = text(element(dom, "section", "state"))
    assert f"last {html.unescape(expected)}" in state
    assert elapsed < 60, f"the page took {elapsed:.1f}s to load and render"
    # An append to the long list changes it past the text shown, and the diff still says so.
    changes = text(element(dom, "ul", "ctx-changes"))
    assert "~ seen :" in changes
    assert "(changed past the part shown)" in changes
    shot = chromium.screenshot(f"{page.as_uri()}#seq={middle}", tmp_path / "big.png")
    assert count_color(shot, (0x3A, 0x9D, 0x5D)) > 200


# ---------------------------------------------------------------------------- graph


def test_graph_page_draws_the_steps(tmp_path: Path, chromium: Chromium) -> None:
    """The graph page shows every step and the events between them."""
    out = tmp_path / "flow.html"
    result = CliRunner().invoke(
        cli, ["graph", "--workflow", "tests.flows:ReportFlow", "-o", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    dom = chromium.dom(out.as_uri())
    nodes = re.findall(r'data-node="(\w+)"', dom)
    assert nodes == ["_start", "start", "process", "finish", "_stop"]
    labels = re.findall(r'class="elabel">(\w+)<', dom)
    assert labels == ["StartEvent", "EventA", "EventB", "StopEvent"]
    shot = chromium.screenshot(out.as_uri(), tmp_path / "flow.png", (700, 700))
    assert count_color(shot, (0xEF, 0xF4, 0xFF)) > 1000  # the steps' boxes


def test_static_page_has_time_axis_labels_and_failure_jumps(
    report: tuple[Path, str, str], chromium: Chromium
) -> None:
    """The written page draws a wall-clock axis (or one slot a commit with #axis=commits),
    labels bars with what their event carries, and lists the failures its ] and [ keys jump
    between."""
    db, run, _ = report
    page = (db.parent / f"{run}.html").as_uri()
    dom = chromium.dom(page)
    attrs = body_attrs(dom)
    assert attrs["data-axis"] == "time"
    assert attrs["data-failures"].split(",") == ["13", "14"]
    # Each label is the event id, then its class and fields as far as the bar has room.
    svg = element(dom, "div", "scroll")
    assert re.search(r'<text class="tlabel"[^>]*>\+0\.0+ s</text>', svg)
    labels = re.findall(r'<text class="blabel"[^>]*>([^<]*)</text>', svg)
    assert len(labels) == 4, labels
    assert all(re.match(r"#\d+( \u00d7\d+)?( |…)", label) for label in labels), labels
    assert [label for label in labels if re.match(r"#\d+ [A-Z]", label)], labels
    by_commit = body_attrs(chromium.dom(page + "#axis=commits"))
    assert by_commit["data-axis"] == "commits"
    assert 'class="tlabel"' not in element(chromium.dom(page + "#axis=commits"), "div", "scroll")
