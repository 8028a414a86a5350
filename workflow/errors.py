"""The errors, where LlamaIndex Workflows puts them (``workflows.errors``).

Each is also a :class:`~workflow.WorkflowError`, so ``except`` clauses written for either
package catch it. See :mod:`workflow._errors` for what each means. ``WaitTimeoutError`` is
ours (a ``wait_for_event`` past its own timeout; LlamaIndex raises a plain ``TimeoutError``,
which it also is).
"""

from ._errors import (
    ContextSerdeError,
    ContextStateError,
    WaitTimeoutError,
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
    "WaitTimeoutError",
    "WorkflowCancelledByUser",
    "WorkflowConfigurationError",
    "WorkflowDone",
    "WorkflowError",
    "WorkflowRuntimeError",
    "WorkflowStepDoesNotExistError",
    "WorkflowTimeoutError",
    "WorkflowValidationError",
]
