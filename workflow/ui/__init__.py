"""The live web UI (``workflow serve``): the runs of a store, each run's timeline with the
state at any seq, updated while runs execute; actions only when the server allows them.

Needs the ``ui`` extra (Starlette and uvicorn): ``pip install 'durable-workflows[ui]'``.
"""

from __future__ import annotations

from ._actions import ActionError, Actions
from ._app import create_app

__all__ = ["ActionError", "Actions", "create_app"]
