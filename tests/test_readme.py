"""The README's examples run as written: each Python block on its own, and every block and
command of the README in order in one folder, as a new user follows it."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from tests.support.ui_server import server
from tests.test_cli import invoke

ROOT: Final = Path(__file__).resolve().parent.parent
README: Final = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
# A block the README says to save as a file: "Save this as `writer.py`".
_SAVE: Final = re.compile(r"Save this as `([\w./-]+\.py)`[^\n]*\n*$")
# Commands of the repository itself (a checkout's `make` targets), not of the library.
_REPOSITORY: Final = ("make",)
BOUND: Final = 60.0  # seconds `workflow serve` may take to answer before the test fails


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each python block of the README runs in a fresh directory without error, and again
    in the same directory (a reader runs an example twice: its store is there by then)."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(code, str(README), "exec"), {"__name__": "__main__"})  # as `python x.py`
        out = capsys.readouterr().out
        if "# NOTES ON SQLITE" in code:
            assert "NOTES ON SQLITE" in out
        if "assert_replay_deterministic(Greeter" in code:
            assert "result 'hello ada'" in out


def test_readme_starts_with_the_two_commands() -> None:
    """The README opens with make demo and make test."""
    head = README.read_text()[:600]
    assert "make demo" in head
    assert "make test" in head


@dataclass(frozen=True)
class Step:
    """One thing the README has a reader do: run a Python block (or save it as ``save``),
    or run a command and see ``output``."""

    line: int
    code: str = ""
    save: str | None = None
    command: str = ""
    output: str = ""


def readme_steps(text: str) -> Iterator[Step]:
    """The README's Python blocks and console commands, in the order it gives them."""
    for m in re.finditer(r"```(python|console)\n(.*?)```", text, flags=re.DOTALL):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) == "python":
            saved = _SAVE.search(text, 0, m.start())
            near = saved is not None and saved.end() == m.start()
            yield Step(line, code=m.group(2), save=saved.group(1) if near and saved else None)
            continue
        command, output = "", list[str]()
        for row in m.group(2).splitlines():
            if row.startswith("$ "):
                if command:
                    yield Step(line, command=command, output="\n".join(output))
                command, output = row[2:], []
            else:
                output.append(row)
        if command:
            yield Step(line, command=command, output="\n".join(output))


def _normalised(text: str) -> str:
    """Output without what changes from run to run: times, dates, run ids made up, a page's
    size, and the stored tracebacks' frames (paths and line numbers)."""
    text = re.sub(r"\+\d+\.\d{3}", "+0.000", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "2025-01-01 00:00:00", text)
    text = re.sub(r"\b[0-9a-f]{32}\b", "<run id>", text)
    text = re.sub(r"\d+ KiB", "N KiB", text)
    rows = [row.rstrip() for row in text.splitlines() if not row.startswith("     ")]
    # Table columns are as wide as their widest value: a made-up id widens one.
    return "\n".join(re.sub(r"(?<=\S) {2,}", "  ", row) for row in rows).strip()


def _serves(args: list[str], folder: Path) -> None:
    """``workflow serve DB ...`` as given, but on a port of the system's choosing (another
    test may hold the README's): it lists the store's runs, then stops on SIGTERM."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    with server(args[0], *args[1:], cwd=folder, env=env) as (proc, base):
        page = urllib.request.urlopen(base + "/", timeout=BOUND)
        with page:
            assert page.status == 200
            assert "draft-1" in page.read().decode()
    assert proc.returncode in (0, -signal.SIGTERM)


def test_readme_runs_in_order_in_one_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every Python block and ``workflow`` command of the README, run in the order it gives
    them in one fresh folder (as a new user follows it), runs, and each command prints what
    the README shows (an error where it shows one): no example depends on a store another
    example wrote to first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ran: list[str] = []
    try:
        for step in readme_steps(README.read_text()):
            if step.save is not None:
                (tmp_path / step.save).write_text(step.code)
                continue
            if step.code:
                exec(
                    compile(step.code, f"README.md:{step.line}", "exec"), {"__name__": "__readme__"}
                )
                capsys.readouterr()
                continue
            args = shlex.split(step.command, comments=True)
            if args[0] in _REPOSITORY:
                continue
            assert args[0] == "workflow", f"README.md:{step.line}: {step.command}"
            ran.append(args[1])
            if args[1] == "serve":
                _serves(args[2:], tmp_path)
                continue
            result = invoke(*args[1:])
            shown = _normalised(step.output)
            fails = shown.startswith("error:") or re.match(r"run \S+ failed: ", shown) is not None
            where = f"README.md:{step.line}: $ {step.command}"
            assert (result.exit_code != 0) == fails, (where, result.stdout, result.stderr)
            if shown:
                assert _normalised(result.stdout + result.stderr) == shown, where
    finally:
        sys.modules.pop("writer", None)
    assert {"run", "fork", "diff", "state", "serve", "timeline"} <= set(ran)
