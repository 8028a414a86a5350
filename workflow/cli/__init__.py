"""The command line: ``python -m workflow`` (and the ``workflow`` script).

Read commands (``runs``, ``history``, ``checkpoints``, ``state``, ``diff``, ``timeline``,
``check``) open a store read-only and need no user code, as ``export`` and ``import`` do;
``run``, ``resume``, ``recover``, ``fork``, ``send`` and ``graph`` import the workflow the
user names with ``--workflow module:Class``, as do ``verify`` and ``worker``.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the group.
from . import _actions as _actions
from . import _check as _check
from . import _graph as _graph
from . import _history as _history
from . import _operator as _operator
from . import _ops as _ops
from . import _prune as _prune
from . import _recover as _recover
from . import _serve as _serve
from . import _timeline as _timeline
from . import _trace as _trace
from . import _transfer as _transfer
from ._app import cli, main

__all__ = ["cli", "main"]
