"""The workflow class, where LlamaIndex Workflows puts it (``workflows.workflow``)."""

from ._workflow import Workflow

__all__ = ["Workflow"]
