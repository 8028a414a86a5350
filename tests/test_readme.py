"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each python block of the README runs in a fresh directory without error."""
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
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
