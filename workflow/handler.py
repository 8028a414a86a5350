"""The run handler, where LlamaIndex Workflows puts it (``workflows.handler``)."""

from ._handler import WorkflowHandler

__all__ = ["WorkflowHandler"]
