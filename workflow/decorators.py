"""The step decorator, where LlamaIndex Workflows puts it (``workflows.decorators``)."""

from ._step import StepConfig, StepGraphCheck, WorkflowGraphCheck, step

__all__ = ["StepConfig", "StepGraphCheck", "WorkflowGraphCheck", "step"]
