"""The events steps receive and emit: pydantic models with LlamaIndex's names and habits."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, ValuesView
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

__all__ = [
    "DictLikeModel",
    "Event",
    "EventType",
    "HumanResponseEvent",
    "InputRequiredEvent",
    "InternalDispatchEvent",
    "StartEvent",
    "StepState",
    "StepStateChanged",
    "StopEvent",
    "UnhandledEvent",
    "WorkflowCancelledEvent",
    "WorkflowFailedEvent",
    "WorkflowIdleEvent",
    "WorkflowTimedOutEvent",
]


class _field_first:
    """A mapping method that yields to an extra field of the same name.

    ``ev.items`` is the field of ``Event(items=[...])`` (as it was before events were
    mappings), and the method ``items()`` of an event without such a field.
    """

    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self._method
        extra = obj.__pydantic_extra__
        if extra and self._name in extra:
            return extra[self._name]
        return self._method.__get__(obj, owner)


class Event(BaseModel):
    """Base class of every event; accepts extra keyword fields, read as attributes.

    ``Event(content="x").content == "x"`` as in LlamaIndex. The extra fields are also a
    mapping, as LlamaIndex's ``DictLikeModel``: ``ev["content"]``, ``ev.get("content")``,
    ``ev["new"] = 1``, ``keys()``, ``values()``, ``items()``, ``len(ev)``, ``iter(ev)`` and
    ``to_dict()`` see the extra fields (``_data``); ``ev[k]``, ``get`` and ``in`` also find a
    declared field. An event is always truthy.
    """

    model_config = ConfigDict(
        extra="allow", arbitrary_types_allowed=True, ignored_types=(_field_first,)
    )

    if TYPE_CHECKING:
        # What type checkers see of the extra fields: pydantic declares its own __init__
        # and __getattr__ only at run time, so without these ``StartEvent(topic=...)`` and
        # ``ev.topic`` would be errors under mypy and pyright. At run time pydantic's own
        # __getattr__ still raises AttributeError for a name that is neither field nor extra.
        def __init__(self, **data: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def model_post_init(self, context: Any, /) -> None:
        """Private attributes given as keyword arguments are set, as LlamaIndex does
        (pydantic would keep them as extra fields)."""
        extra = self.__pydantic_extra__
        private = self.__private_attributes__
        if extra and private:
            for k in [k for k in extra if k in private]:
                setattr(self, k, extra.pop(k))

    @property
    def _data(self) -> dict[str, Any]:
        """The extra fields (LlamaIndex's name for them), live: writes show on the event."""
        extra = self.__pydantic_extra__
        if extra is None:
            extra = {}
            object.__setattr__(self, "__pydantic_extra__", extra)
        return extra

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        """The field or extra field ``key``, or ``default``."""
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)

    @_field_first
    def keys(self) -> KeysView[str]:
        """The names of the extra fields."""
        return self._data.keys()

    @_field_first
    def values(self) -> ValuesView[Any]:
        """The values of the extra fields."""
        return self._data.values()

    @_field_first
    def items(self) -> ItemsView[str, Any]:
        """The extra fields, as (name, value) pairs."""
        return self._data.items()

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  # LlamaIndex's: the keys
        return iter(self._data)

    def __bool__(self) -> bool:
        return True

    def to_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The extra fields, as a dict (LlamaIndex's ``DictLikeModel.to_dict``)."""
        return self._data

    def _fields(self) -> dict[str, Any]:
        """Every declared and extra field, by name (what ``model_validate`` takes back)."""
        return {**self.__dict__, **self._data}


# LlamaIndex's base of Event, by its name.
DictLikeModel = Event


class StartEvent(Event):
    """Starts a run; the keyword arguments of ``Workflow.run(**kwargs)`` are its fields."""

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...


class StopEvent(Event):
    """Ends a run: awaiting the handler returns ``result`` (or the event, for a subclass).

    As in LlamaIndex, its dump and repr leave ``result`` out while it is None, and its
    ``str()`` is the result's.
    """

    result: Any = None

    if TYPE_CHECKING:

        def __init__(self, result: Any = None, **data: Any) -> None: ...

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.result is None:
            data.pop("result", None)
        return data

    def __repr__(self) -> str:
        shown = {**self._data, **self.model_dump()}
        parts = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"{type(self).__name__}({parts})"

    def __str__(self) -> str:
        return str(self.result)


class InputRequiredEvent(Event):
    """A question to a human, usually streamed while a step waits for the answer."""

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...


class HumanResponseEvent(Event):
    """A human's answer, sent into the run with ``send`` / ``handler.send_event``."""

    if TYPE_CHECKING:  # its fields are all extra: type checkers would synthesize no parameters

        def __init__(self, **data: Any) -> None: ...


# ---------------------------------------------------------------- how a run's stream ends
# Not journaled: each is derived from the record that ended the run, and is the last event
# of the stream (a StopEvent, so ``async for`` loops that stop at a StopEvent stop there).


class WorkflowTimedOutEvent(StopEvent):
    """The stream's last event when the run timed out (awaiting it raises the timeout)."""

    timeout: float
    active_steps: list[str]


class WorkflowCancelledEvent(StopEvent):
    """The stream's last event when the run was cancelled (``handler.cancel_run()``)."""


class WorkflowFailedEvent(StopEvent):
    """The stream's last event when a step failed for good (its retries spent).

    ``exception`` is the step's exception; ``attempts`` and ``elapsed_seconds`` say how
    many attempts it made and how long from the first to the last (None when the run failed
    for a reason other than a step's attempts).
    """

    step_name: str
    exception: Any
    attempts: int | None = None
    elapsed_seconds: float | None = None

    @property
    def exception_type(self) -> str:
        """The qualified name of the exception's class (what older LlamaIndex docs read)."""
        t = type(self.exception)
        return f"{t.__module__}.{t.__qualname__}"

    @property
    def exception_message(self) -> str:
        """The exception's message."""
        return str(self.exception)


# ---------------------------------------------------------------- internal events
# ``handler.stream_events(expose_internal=True)`` yields these too; they are never journaled.


class InternalDispatchEvent(Event):
    """Base of the events that show the engine's own work, streamed only when asked for."""


class StepState(Enum):
    """Where an attempt of a step is: waiting for a worker, running, or done."""

    PREPARING = "preparing"
    RUNNING = "running"
    NOT_RUNNING = "not_running"


class StepStateChanged(InternalDispatchEvent):
    """A step's attempt started (``RUNNING``) or ended (``NOT_RUNNING``) on a worker."""

    name: str = Field(description="Name of the step")
    step_state: StepState = Field(description="The step's state")
    worker_id: str = Field(description="The worker the attempt runs on")
    input_event_name: str = Field(description="The class name of the attempt's input")
    output_event_name: str | None = Field(
        default=None, description="The class name of what the attempt returned"
    )


class WorkflowIdleEvent(InternalDispatchEvent):
    """The run has nothing to do but wait for an event."""


class UnhandledEvent(InternalDispatchEvent):
    """An event came in that no step and no wait takes."""

    event_type: str
    qualified_name: str
    step_name: str | None = None
    idle: bool


EventType = type[Event]
