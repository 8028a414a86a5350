"""A class only the process that leaves runs behind imports (tests/support/recover_proc.py).

The recover tests' own process never imports this module, so a value of this class in a
run's log is one the recovering program cannot resolve.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Secret:
    """A value the recovering process has never heard of."""

    label: str
