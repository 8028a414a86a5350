"""The events steps receive and emit: pydantic models with LlamaIndex's names and habits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Event", "HumanResponseEvent", "InputRequiredEvent", "StartEvent", "StopEvent"]


class Event(BaseModel):
    """Base class of every event; accepts extra keyword fields, read as attributes.

    ``Event(content="x").content == "x"`` as in LlamaIndex, also as ``ev["content"]`` and
    ``ev.get("content")``.
    """

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    if TYPE_CHECKING:
        # What type checkers see of the extra fields: pydantic declares its own __init__
        # and __getattr__ only at run time, so without these ``StartEvent(topic=...)`` and
        # ``ev.topic`` would be errors under mypy and pyright. At run time pydantic's own
        # __getattr__ still raises AttributeError for a name that is neither field nor extra.
        def __init__(self, **data: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

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

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...


class StopEvent(Event):
    """Ends a run: awaiting the handler returns ``result`` (or the event, for a subclass)."""

    result: Any = None

    if TYPE_CHECKING:

        def __init__(self, result: Any = None, **data: Any) -> None: ...


class InputRequiredEvent(Event):
    """A question to a human, usually streamed while a step waits for the answer."""

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...


class HumanResponseEvent(Event):
    """A human's answer, sent into the run with ``send`` / ``handler.send_event``."""

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...
