"""LlamaIndex's ``workflows.types``: the type of a run's result, for type hints.

``await handler`` gives the stop event's ``result`` (``Any``), or the stop event itself for
a :class:`~workflow.events.StopEvent` subclass (``StopEventT``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from .events import StopEvent

__all__ = ["RunResultT", "StopEventT"]

StopEventT = TypeVar("StopEventT", bound=StopEvent)
# A union with Any is Any to a type checker; at run time it names both, as LlamaIndex's.
RunResultT: Any = StopEventT | Any
