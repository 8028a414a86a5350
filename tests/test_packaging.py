"""What pyproject.toml declares is what gets installed: the packages, their types, their path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import Distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventstore", "workflow")
_NOT_SOURCES = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "*.db*")


def test_wheel_ships_both_packages_with_py_typed(tmp_path: Path) -> None:
    """The built wheel holds eventstore and workflow with their py.typed markers, nothing else."""
    # Built from a copy: setuptools writes build/ and egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("durable_workflows-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"eventstore/py.typed", "workflow/py.typed", "workflow/cli/__init__.py"} <= set(names)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == set(PACKAGES)


def test_editable_install_is_a_plain_path_entry() -> None:
    """``pip install -e .`` put the root on sys.path with a .pth, not an import hook."""
    # Looked up in site-packages: the root's own durable_workflows.egg-info is on sys.path too.
    site = sysconfig.get_paths()["purelib"]
    (dist,) = Distribution.discover(name="durable-workflows", path=[site])
    assert json.loads(dist.read_text("direct_url.json") or "{}")["dir_info"]["editable"]
    files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
    assert not [f.name for f in files if f.name.endswith("_finder.py")]  # setuptools' hook
    (pth,) = [f for f in files if f.suffix == ".pth"]
    assert pth.read_text(encoding="utf-8").split() == [str(ROOT)]
