"""Each registered benchmark runs in quick mode, so the harness never rots (timings unchecked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS, load, run


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_benchmark_quick_mode_runs(name: str, tmp_path: Path) -> None:
    """A benchmark's quick mode returns its report and writes it as NAME.json."""
    data = load(name)(quick=True, repeat=1, out_dir=tmp_path)
    assert {"benchmark", "quick", "repeat", "machine", "params", "results"} <= data.keys()
    assert data["benchmark"] == name
    assert {"python", "sqlite", "cpu_count"} <= data["machine"].keys()
    assert data["results"]
    assert json.loads((tmp_path / f"{name}.json").read_text()) == data


def test_command_line_runs_a_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks NAME --quick`` prints a table and writes the JSON where told."""
    name = next(iter(BENCHMARKS))
    run([name, "--quick", "--repeat", "1", "--out-dir", str(tmp_path)])
    assert "median" in capsys.readouterr().out
    assert (tmp_path / f"{name}.json").exists()
