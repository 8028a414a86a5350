"""The event classes, where LlamaIndex Workflows puts them (``workflows.events``)."""

from ._catch_error import StepFailedEvent
from ._events import (
    DictLikeModel,
    Event,
    EventType,
    HumanResponseEvent,
    InputRequiredEvent,
    InternalDispatchEvent,
    StartEvent,
    StepState,
    StepStateChanged,
    StopEvent,
    UnhandledEvent,
    WorkflowCancelledEvent,
    WorkflowFailedEvent,
    WorkflowIdleEvent,
    WorkflowTimedOutEvent,
)
from ._gather import CollectionReleaseEvent

__all__ = [
    "CollectionReleaseEvent",
    "DictLikeModel",
    "Event",
    "EventType",
    "HumanResponseEvent",
    "InputRequiredEvent",
    "InternalDispatchEvent",
    "StartEvent",
    "StepFailedEvent",
    "StepState",
    "StepStateChanged",
    "StopEvent",
    "UnhandledEvent",
    "WorkflowCancelledEvent",
    "WorkflowFailedEvent",
    "WorkflowIdleEvent",
    "WorkflowTimedOutEvent",
]
