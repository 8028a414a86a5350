"""Browser tests: headless Chromium renders the pages; run by `make test-browser` only.

They are collected only when pytest is pointed at this directory (or a file in it), so the
default `make test` never runs them, and they never skip: without Chromium they fail and say
how to get it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

import pytest

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


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    """The browser; its absence fails the test (`make test-browser` installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: run `make test-browser`, which installs it")
    return Chromium(path)
