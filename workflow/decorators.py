"""The step decorators, where LlamaIndex Workflows puts them (``workflows.decorators``)."""

from ._catch_error import StepFailedEvent, catch_error
from ._step import StepConfig, StepGraphCheck, WorkflowGraphCheck, step
from .collect import Collect

__all__ = [
    "Collect",
    "StepConfig",
    "StepFailedEvent",
    "StepGraphCheck",
    "WorkflowGraphCheck",
    "catch_error",
    "step",
]
