"""workflow: LlamaIndex-style event-driven workflows, durable by event sourcing."""

from eventstore import UpcastError, upcaster

from ._catch_error import StepFailedEvent, catch_error
from ._context import Context, ContextStore
from ._errors import (
    CheckpointNotFoundError,
    ContextKeyError,
    ContextSerdeError,
    ContextStateError,
    DeprecatedPatchError,
    MemoizedError,
    RecoveryLimitError,
    RunAbandonedError,
    RunCancellingError,
    RunFinishedError,
    RunLostError,
    RunNotFoundError,
    RunOwnedError,
    RunSuspendedError,
    SnapshotIgnoredWarning,
    StateConflictError,
    WaitTimeoutError,
    WorkflowCancelledByUser,
    WorkflowCancelledError,
    WorkflowChangedError,
    WorkflowError,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
    WorkflowValidationError,
)
from ._events import Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent
from ._handler import WorkflowHandler
from ._memo import memoized
from ._prune import PruneReport
from ._recover import Recoveries, Recovery
from ._state import Checkpoint, InProgress, RunState, Waiter
from ._step import step
from ._worker import Worker
from ._workflow import RunSummary, Workflow
from .checkpointer import WorkflowCheckpointer
from .context.serializers import (
    BaseSerializer,
    JsonPickleSerializer,
    JsonSerializer,
    PickleSerializer,
)
from .retry_policy import ConstantDelayRetryPolicy, ExponentialBackoffRetryPolicy, RetryPolicy

__all__ = [
    "BaseSerializer",
    "Checkpoint",
    "CheckpointNotFoundError",
    "ConstantDelayRetryPolicy",
    "Context",
    "ContextKeyError",
    "ContextSerdeError",
    "ContextStateError",
    "ContextStore",
    "DeprecatedPatchError",
    "Event",
    "ExponentialBackoffRetryPolicy",
    "HumanResponseEvent",
    "InProgress",
    "InputRequiredEvent",
    "JsonPickleSerializer",
    "JsonSerializer",
    "MemoizedError",
    "PickleSerializer",
    "PruneReport",
    "Recoveries",
    "Recovery",
    "RecoveryLimitError",
    "RetryPolicy",
    "RunAbandonedError",
    "RunCancellingError",
    "RunFinishedError",
    "RunLostError",
    "RunNotFoundError",
    "RunOwnedError",
    "RunState",
    "RunSummary",
    "RunSuspendedError",
    "SnapshotIgnoredWarning",
    "StartEvent",
    "StateConflictError",
    "StepFailedEvent",
    "StopEvent",
    "UpcastError",
    "WaitTimeoutError",
    "Waiter",
    "Worker",
    "Workflow",
    "WorkflowCancelledByUser",
    "WorkflowCancelledError",
    "WorkflowChangedError",
    "WorkflowCheckpointer",
    "WorkflowError",
    "WorkflowHandler",
    "WorkflowRuntimeError",
    "WorkflowTimeoutError",
    "WorkflowValidationError",
    "catch_error",
    "memoized",
    "step",
    "upcaster",
]
