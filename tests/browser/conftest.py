"""Browser tests: headless Chromium renders the pages; run by `make test-browser` only.

They are collected only when pytest is pointed at this directory (or a file in it), so the
default `make test` never runs them, and they never skip: without Chromium they fail and say
how to get it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, ViewportSize

HERE: Final = Path(__file__).resolve().parent
FLAGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SIZE: Final[ViewportSize] = {"width": 1280, "height": 820}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leaves this directory's tests out unless the command line names it."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    for arg in config.args:
        target = Path(arg.split("::")[0]).resolve()
        if target == HERE or HERE in target.parents:
            return None
    return True


class Chromium:
    """Headless Chromium: the DOM after a page's script ran, and screenshots."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as profile:
            return subprocess.run(
                [self.path, *FLAGS, f"--user-data-dir={profile}", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=True,
            )

    def dom(self, url: str, timeout: float = 120) -> str:
        """The page's DOM once it loaded and its scripts ran."""
        return self._run("--dump-dom", url, timeout=timeout).stdout

    def screenshot(self, url: str, out: Path, size: tuple[int, int] = (1280, 900)) -> Path:
        """A PNG of the page at that window size."""
        self._run(f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", url)
        return out


def chromium_path() -> str:
    """Where Debian's chromium is; its absence fails the test (`make test-browser` installs
    it), as these tests never skip."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run `make test-browser`, which installs it")
    return path


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    """The browser run as a command, for pages that need no driving."""
    return Chromium(chromium_path())


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium driven by Playwright (launched by its path, so Playwright's own
    browser downloads are never used), one per test module: while it is open, Playwright's
    event loop runs in this thread, where a module's fixtures that record runs call
    ``asyncio.run`` before their first page."""
    # Imported here: `make test` loads this file while it collects, and needs no Playwright.
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page (its own browser context, at SIZE) whose script errors fail the test."""
    context = browser.new_context(viewport=SIZE)
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield p
    finally:
        context.close()
    assert errors == []
