"""A module with side effects, for the safety tests: importing it writes a marker file.

Nothing may import it by accident: decoding a log that names ``tests.evil_module:Payload``
must refuse the class, never import this module to find it. The marker goes to the path in
the environment variable ``EVIL_MODULE_MARKER`` (a temporary file by default).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from workflow import Event

MARKER_ENV = "EVIL_MODULE_MARKER"
GETATTR_CALLS: list[str] = []


def marker_path() -> Path:
    """Where an import (or a module ``__getattr__`` call) of this module leaves its mark."""
    default = os.path.join(tempfile.gettempdir(), "durable-workflows-evil-module-imported")
    return Path(os.environ.get(MARKER_ENV, default))


def _mark(what: str) -> None:
    with marker_path().open("a") as fh:
        fh.write(what + "\n")


_mark("imported")


class Payload(Event):
    """An allowed kind of class (a pydantic event): only the import is what must not happen."""

    data: str = ""


def __getattr__(name: str) -> object:
    # A module __getattr__ runs code on attribute lookup; decoding must never trigger it.
    GETATTR_CALLS.append(name)
    _mark(f"getattr {name}")
    raise AttributeError(name)
