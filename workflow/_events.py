"""The events steps receive and emit: pydantic models with LlamaIndex's names and habits."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Event", "HumanResponseEvent", "InputRequiredEvent", "StartEvent", "StopEvent"]


class Event(BaseModel):
    """Base class of every event; accepts extra keyword fields, read as attributes.

    ``Event(content="x").content == "x"`` as in LlamaIndex, also as ``ev["content"]`` and
    ``ev.get("content")``.
    """

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        """The field or extra field ``key``, or ``default``."""
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)


class StartEvent(Event):
    """Starts a run; the keyword arguments of ``Workflow.run(**kwargs)`` are its fields."""


class StopEvent(Event):
    """Ends a run: awaiting the handler returns ``result`` (or the event, for a subclass)."""

    result: Any = None


class InputRequiredEvent(Event):
    """A question to a human, usually streamed while a step waits for the answer."""


class HumanResponseEvent(Event):
    """A human's answer, sent into the run with ``send`` / ``handler.send_event``."""
