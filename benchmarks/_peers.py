"""The virtualenv of the peer systems (LlamaIndex Workflows, LangGraph, DBOS): made on demand.

The peers' dependencies (langchain-core, SQLAlchemy, their own pydantic pins) must never
mix with the project's, so they live in ``benchmarks/.peers-venv`` (gitignored), made with
``python -m venv`` and ``pip install -r benchmarks/peers/requirements.txt`` when missing or
when the requirements changed (a stamp file holds their hash). ``make bench`` thus
installs them on a fresh machine; ``python -m benchmarks._peers`` does only that.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["PEERS_DIR", "REQUIREMENTS", "VENV", "ensure", "script", "venv_python"]

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
REQUIREMENTS = PEERS_DIR / "requirements.txt"
VENV = Path(os.environ.get("BENCH_PEERS_VENV") or HERE / ".peers-venv")
_STAMP = ".requirements-sha256"


def venv_python() -> Path:
    """The peers venv's interpreter (it may not exist yet)."""
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _wanted() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def is_ready() -> bool:
    """Whether the venv exists with the current requirements installed."""
    stamp = VENV / _STAMP
    return venv_python().exists() and stamp.exists() and stamp.read_text().strip() == _wanted()


def ensure(*, install: bool = True) -> Path | None:
    """The peers venv's interpreter, installing it first if missing and ``install``.

    Returns None when it is not ready and ``install`` is False (quick runs never install).
    :raises subprocess.CalledProcessError: ``venv`` or ``pip`` failed.
    """
    if is_ready():
        return venv_python()
    if not install:
        return None
    print(f"installing the peer systems into {VENV} (once; a few minutes)", flush=True)
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    (VENV / _STAMP).write_text(_wanted() + "\n")
    return venv_python()


def script(name: str) -> str:
    """The path of a peer workload script in ``benchmarks/peers/``."""
    return str(PEERS_DIR / name)


if __name__ == "__main__":
    print(ensure())
