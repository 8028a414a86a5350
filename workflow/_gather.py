"""What a collect step is given (a ``list[R]`` parameter, LlamaIndex's batch fan-in): the
event that runs it, and how its parameter is read (:mod:`workflow.collect`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from ._events import Event

__all__ = ["CollectionReleaseEvent", "Gather"]


class CollectionReleaseEvent(Event):
    """What runs a collect step: the events of one stream it held, released together.

    A step's ``@catch_error`` handler sees it as ``StepFailedEvent.input_event`` when the
    collect step fails (``events`` is the real batch, ``[]`` for an empty stream).
    """

    events: list[Any] = Field(default_factory=list)
    stream_id: str = ""
    binding_id: str = ""


@dataclass(frozen=True, slots=True)
class Gather:
    """A collect step's list parameter: its name, the member classes, ``Take(n)``'s n."""

    param: str
    types: tuple[type[Event], ...]
    take: int | None = None
