"""Each registered benchmark runs in quick mode, so the harness never rots (timings unchecked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from benchmarks import _peers
from benchmarks.__main__ import BENCHMARKS, load, run


@pytest.fixture(autouse=True)
def _no_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default suite never installs nor runs the peer systems (slow imports)."""
    monkeypatch.setenv("BENCH_PEERS", "off")


# Benchmarks whose quick mode still starts many fresh processes: make test-long.
LONG: Final = frozenset({"state", "restore", "peers", "backends"})


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.long) if n in LONG else n for n in BENCHMARKS]
)
def test_benchmark_quick_mode_runs(name: str, tmp_path: Path) -> None:
    """A benchmark's quick mode returns its report and writes it as NAME.json."""
    data = load(name)(quick=True, repeat=1, out_dir=tmp_path)
    assert {"benchmark", "quick", "repeat", "machine", "params", "results"} <= data.keys()
    assert data["benchmark"] == name
    assert {"python", "sqlite", "cpu_count"} <= data["machine"].keys()
    assert data["results"]
    assert json.loads((tmp_path / f"{name}.json").read_text()) == data
    if name in ("loop", "chain"):
        _check_flow_report(data)
    if name == "peers":
        _check_peers_report(data, tmp_path)
    if name == "state":
        _check_state_report(data, tmp_path)
    if name == "restore":
        _check_restore_report(data)


def _check_restore_report(data: dict[str, Any]) -> None:
    """Every run was read at its latest and middle seq; the bounded runs kept snapshots."""
    for entry in data["results"]:
        assert entry["latest_s"]["median"] > 0
        assert entry["middle_s"]["median"] > 0
        assert 0 < entry["snapshot_bytes"] < entry["log_bytes"]
    chats = [e for e in data["results"] if e["flow"] == "chat"]
    assert chats
    assert max(e["snapshots"] for e in chats) > 1
    commands = data["cli"]["commands"]
    assert len(commands) == 5
    assert all(t["command_s"]["median"] > 0 for t in commands.values())


def _check_flow_report(data: dict[str, Any]) -> None:
    """Each file-store entry has bytes and fresh-process state_at timings; memory has none."""
    by_store = {r["store"]: r for r in data["results"]}
    assert by_store.keys() == {"memory", "normal", "full"}
    assert by_store["memory"]["bytes"] is None
    assert by_store["memory"]["fresh_latest_s"] is None
    for kind in ("normal", "full"):
        assert by_store[kind]["bytes"]["median"] > 0
        assert by_store[kind]["fresh_latest_s"]["median"] > 0
        assert by_store[kind]["fresh_middle_s"]["median"] > 0


def _check_peers_report(data: dict[str, Any], out: Path) -> None:
    """Without the peers, quick mode still measures ours in every workload, writes peers.md."""
    workloads = {(r["workload"], r.get("system")) for r in data["results"]}
    for workload in ("loop", "restore", "crash_resume"):
        assert (workload, "ours-normal") in workloads
    goals = [r for r in data["results"] if r["workload"] == "goal"]
    assert goals
    assert all(g["met"] is None for g in goals)  # nothing to compare with
    assert "| system |" in (out / "peers.md").read_text()


def _check_state_report(data: dict[str, Any], out: Path) -> None:
    """Without the peers, every state workload ran for ours (or says why not); the floor
    and the goals are there, and state.md has each section."""
    from benchmarks import state

    ours = {(r["workload"], r["size"]): r for r in data["results"] if r.get("system") == "ours"}
    assert ours.keys() == {(c.workload, c.size) for c in state.cases(quick=True)}
    for entry in ours.values():
        assert entry["seconds"] is not None or entry["stopped"], entry
    ran = [e for e in ours.values() if e["seconds"] is not None]
    assert all(e["bytes"]["median"] > 0 and e["payload_bytes"]["median"] > 0 for e in ran)
    fan = [e for e in ran if e["workload"] == "fan_in"]
    assert fan
    assert all(e["collector_attempts"]["median"] >= e["size"] for e in fan)
    (floor,) = [r for r in data["results"] if r["section"] == "floor"]
    assert floor["floor_us"]["median"] > 0
    assert any(r["section"] == "goal" for r in data["results"])
    md = (out / "state.md").read_text()
    for section in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## Goals"):
        assert section in md


def test_state_cap_reports_a_run_as_skipped(tmp_path: Path) -> None:
    """A state run longer than the cap is stopped and reported as skipped, never waited for."""
    from benchmarks import state

    case = state.Case("scale", "append", 2000)
    out = state.run_one(state.OURS, None, case, cap_s=0.05, tmp=tmp_path)
    assert out == "skipped: >0.05 s"
    assert not list(tmp_path.iterdir())  # its store is removed


def test_command_line_runs_a_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks NAME --quick`` prints a table and writes the JSON where told."""
    name = next(iter(BENCHMARKS))
    run([name, "--quick", "--repeat", "1", "--out-dir", str(tmp_path)])
    assert "median" in capsys.readouterr().out
    assert (tmp_path / f"{name}.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _peers.is_ready(), reason="no peers venv (python -m benchmarks._peers)")
def test_peers_quick_mode_runs_every_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the peers venv, each peer script runs in quick mode (``make test-slow``)."""
    monkeypatch.setenv("BENCH_PEERS", "on")
    data = load("peers")(quick=True, repeat=1, out_dir=tmp_path)
    systems = {r["system"] for r in data["results"] if r["workload"] == "loop"}
    assert {"llama-memory", "llama-manual", "langgraph-full", "langgraph-delta", "dbos"} <= systems
    assert all(
        g["met"] is not None
        for g in data["results"]
        if g["workload"] == "goal" and "linear" not in g["goal"]
    )
