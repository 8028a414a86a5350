"""The errors, where LlamaIndex Workflows puts them (``workflows.errors``).

Each is also a :class:`~workflow.WorkflowError`, so ``except`` clauses written for either
package catch it. See :mod:`workflow._errors` for what each means.
"""

from ._errors import (
    ContextSerdeError,
    ContextStateError,
    WorkflowCancelledByUser,
    WorkflowConfigurationError,
    WorkflowDone,
    WorkflowError,
    WorkflowRuntimeError,
    WorkflowStepDoesNotExistError,
    WorkflowTimeoutError,
    WorkflowValidationError,
)

__all__ = [
    "ContextSerdeError",
    "ContextStateError",
    "WorkflowCancelledByUser",
    "WorkflowConfigurationError",
    "WorkflowDone",
    "WorkflowError",
    "WorkflowRuntimeError",
    "WorkflowStepDoesNotExistError",
    "WorkflowTimeoutError",
    "WorkflowValidationError",
]
