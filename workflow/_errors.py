"""The errors of the workflow engine.

WorkflowError
  + WorkflowValidationError   (also ValueError) the step graph or a step signature is wrong
  + WorkflowTimeoutError      (also TimeoutError) the run used up its timeout
  + WorkflowCancelledError    (also asyncio.CancelledError's sibling: awaited a cancelled run)
  + WorkflowRuntimeError      (also RuntimeError) the engine was used wrongly
  + RunNotFoundError          (also eventstore.RunNotFoundError, LookupError) no such run
  + CheckpointNotFoundError   (also LookupError) no state at that seq for that run
  + RunOwnedError             another live executor owns the run
  |   + RunCancellingError    a run cancelled from outside is still held by its old executor
  + RunSuspendedError         the caller left a waiting run; resume it later
  + RunAbandonedError         this process stopped running the run; another may take it
  + DeprecatedPatchError      (a WorkflowRuntimeError) this code's deprecate_patch refused an
                              input begun by older code: the run stopped, left resumable
  + RunFinishedError          a finished run cannot take updates; fork it instead
  + StateConflictError        an operator's edit read state a step changed before it was written
  + RecoveryLimitError        an input killed the process too many times
  + WorkflowChangedError      stored work no longer fits the workflow's steps
  + MemoizedError             a memoized call raised (recorded with cache_errors=True)

SnapshotIgnoredWarning        (a UserWarning) a run's cached state was unfit; the log was folded

LlamaIndex Workflows' names (``workflow.errors``), each also a WorkflowError:

  WorkflowValidationError, WorkflowTimeoutError, WorkflowRuntimeError   (the classes above)
  WorkflowConfigurationError    (a WorkflowValidationError) no step takes the start event,
                                none returns a stop event, or more than one class of either
  WorkflowCancelledByUser       (a WorkflowCancelledError) awaited a run cancel_run() ended
  WorkflowStepDoesNotExistError (also WorkflowRuntimeError) an event sent to no such step
  WorkflowDone                  a run's workers were told to stop (the run ended)
  ContextSerdeError             (also ValueError) a context could not be (de)serialized
  ContextStateError             (also RuntimeError) a context method called in the wrong state
"""

from __future__ import annotations

import math
import time
from typing import Any

import eventstore

__all__ = [
    "CheckpointNotFoundError",
    "ContextKeyError",
    "ContextSerdeError",
    "ContextStateError",
    "DeprecatedPatchError",
    "MemoizedError",
    "RecoveryLimitError",
    "RunAbandonedError",
    "RunCancellingError",
    "RunFinishedError",
    "RunNotFoundError",
    "RunOwnedError",
    "RunSuspendedError",
    "SnapshotIgnoredWarning",
    "StateConflictError",
    "WorkflowCancelledByUser",
    "WorkflowCancelledError",
    "WorkflowChangedError",
    "WorkflowConfigurationError",
    "WorkflowDone",
    "WorkflowError",
    "WorkflowRuntimeError",
    "WorkflowStepDoesNotExistError",
    "WorkflowTimeoutError",
    "WorkflowValidationError",
]


class WorkflowError(Exception):
    """Base class of every error raised by :mod:`workflow`."""


class ContextKeyError(WorkflowError, KeyError, ValueError):
    """No context value at the path ``ctx.store.get`` was given (and no default): a
    ``KeyError``, and the ``ValueError`` LlamaIndex raises there."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WorkflowValidationError(WorkflowError, ValueError):
    """The workflow's steps do not form a valid graph, or a step's signature is wrong."""


class WorkflowTimeoutError(WorkflowError, TimeoutError):
    """The run was executed for longer than its timeout (summed across resumes)."""


class WaitTimeoutError(WorkflowTimeoutError):
    """``ctx.wait_for_event`` got no matching event within its own ``timeout``: raised in
    the waiting step, where it may be caught; uncaught, it fails the step as any error
    does (the stream ends with ``WorkflowFailedEvent``, as LlamaIndex's ``TimeoutError``
    from the wait does), not the run's timeout."""


class WorkflowCancelledError(WorkflowError):
    """The run was cancelled (``handler.cancel_run()``)."""


class WorkflowRuntimeError(WorkflowError, RuntimeError):
    """The engine was used in a way it does not support; the message says what to do."""


class RunNotFoundError(WorkflowError, eventstore.RunNotFoundError):
    """No run with that id in the store.

    One lineage with :class:`eventstore.RunNotFoundError`: ``except`` either catches it.
    """

    def __init__(self, run_id: str, where: str = "the store") -> None:
        eventstore.RunNotFoundError.__init__(self, run_id, where)


class CheckpointNotFoundError(WorkflowError, LookupError):
    """The run has no state at that seq (before its first commit)."""

    def __init__(
        self, run_id: str, seq: int, first: int | None, first_commit_end: int | None = None
    ) -> None:
        self.run_id = run_id
        self.seq = seq
        self.first = first  # the seq of its first record
        self.first_commit_end = first_commit_end
        where = f"its log begins at seq {first}" if first is not None else "it has no records"
        if first_commit_end is not None and first is not None and first_commit_end != first:
            where += f" (its first commit holds seqs {first} to {first_commit_end})"
        super().__init__(f"run {run_id!r} has no state at seq {seq}: {where}")


class RunOwnedError(WorkflowError):
    """Another live executor (this process or another) is running the run."""

    def __init__(self, run_id: str, detail: str = "", lapses_at: float | None = None) -> None:
        self.run_id = run_id
        self.detail = detail  # who holds it, as far as this process can tell
        self.lapses_at = lapses_at  # a lease's end (epoch seconds): its owner may be dead
        more = f" ({detail})" if detail else ""
        if lapses_at is None:
            super().__init__(
                f"run {run_id!r} is owned by another live executor{more}; wait for it to"
                " finish or stop that process, then resume"
            )
            return
        when = time.strftime("%H:%M:%S", time.gmtime(lapses_at))
        left = max(0, math.ceil(lapses_at - time.time()))
        super().__init__(
            f"run {run_id!r} is owned by another executor{more}, whose lease lapses at"
            f" {when} UTC (in about {left} s) unless it renews it: a dead owner's lease"
            " lapses by itself, so resume after that; a live one renews it: wait for it to"
            " finish or stop that process"
        )


class RunCancellingError(RunOwnedError):
    """A run cancelled from outside (``workflow cancel``) is still held by the executor that
    was running it: that executor notices within a second and lets go, unless a step blocks
    its event loop, when it lets go at its next commit (the store refuses it), once that
    step ends. Resuming works from then; ``workflow resume --cancelled`` waits for it
    (``waited``: how long this resume waited before giving up)."""

    def __init__(
        self, run_id: str, detail: str, lapses_at: float | None = None, waited: float = 0.0
    ) -> None:
        self.run_id = run_id
        self.detail = detail
        self.lapses_at = lapses_at
        self.waited = waited
        until = (
            "within a second, or once the step in flight ends if that step blocks its event loop"
        )
        if lapses_at is not None:
            when = time.strftime("%H:%M:%S", time.gmtime(lapses_at))
            until += f", or when its lease lapses at {when} UTC if it stops renewing it"
        after = f"waited {waited:g} s for it; " if waited else ""
        WorkflowError.__init__(  # its own message, not RunOwnedError's
            self,
            f"run {run_id!r} was cancelled, but the executor that was running it ({detail})"
            f" still holds it: it lets go {until}; {after}resume again then (`workflow resume"
            " --cancelled` waits for it, up to --wait seconds)",
        )


class RunSuspendedError(WorkflowError):
    """Awaited a handler whose run was suspended while waiting; resume the run later."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} was suspended while waiting for an event; send the event with"
            " wf.send() and resume it with wf.resume()"
        )


class RunAbandonedError(WorkflowError):
    """This process stopped running the run (a shutdown); another executor may resume it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} was left unfinished for another executor to resume")


class DeprecatedPatchError(WorkflowRuntimeError):
    """``ctx.deprecate_patch(id)`` refused a step input that takes the patch's old branch.

    The code that would finish the input is gone from this deploy, so the run is not failed
    (as a Temporal non-determinism error blocks the workflow task): the executor stops it
    with nothing recorded, and it stays ``interrupted``, resumable by code that still has
    ``if await ctx.patched(id):`` and its old branch.
    """

    def __init__(self, run_id: str | None, step: str, event_id: int, patch_id: str, why: str):
        self.run_id = run_id
        self.step = step
        self.event_id = event_id
        self.patch_id = patch_id
        where = f"run {run_id!r}, " if run_id is not None else ""
        super().__init__(
            f"{where}step {step!r}, event {event_id}: patch {patch_id!r} is deprecated, but"
            f" {why}; the run was stopped, not failed, and is left resumable: keep"
            f" `if await ctx.patched({patch_id!r}):` and its old branch until such runs are"
            " done, and resume it with that code"
        )


class RunLostError(WorkflowRuntimeError):
    """This executor lost the run to another one and stopped without writing more.

    Its lease lapsed (the host was cut off, stopped or too slow to renew it) or another
    executor claimed the run; the epoch fence refuses whatever it still tried to commit,
    and the other executor goes on with the run.
    """

    def __init__(self, run_id: str, how: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r}: this executor lost the run to another one ({how})")


class RunFinishedError(WorkflowError):
    """A finished run cannot take updates: fork it with ``run_from`` instead."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} has finished; to continue from it with changes, fork it:"
            f" wf.run_from(({run_id!r}, seq), updates=...)"
        )


class StateConflictError(WorkflowError):
    """A read-modify-write of a run's state was overtaken: a commit changed what it read.

    Raised by ``handler.ctx.store.edit_state()`` outside a step (an operator's edit of a
    live run) when a step's commit changed a key the edit read before the edit was
    written; nothing of the edit is written, so the step's write is never undone. Read
    the state again and redo the edit. ``keys`` are the keys that changed, sorted.

    Inside a step a conflict never reaches your code: the attempt's commit is refused and
    the attempt runs again against the new state (``step_conflicted`` in the log).
    """

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"context keys changed by a concurrent attempt: {keys}")


class RecoveryLimitError(WorkflowError):
    """An input was re-delivered more than ``max_recovery_attempts`` times without ending."""

    def __init__(self, run_id: str, step: str, attempts: int, limit: int) -> None:
        self.run_id = run_id
        self.step = step
        self.attempts = attempts
        super().__init__(
            f"run {run_id!r}: step {step!r} was started {attempts} times without finishing"
            f" (max_recovery_attempts={limit}); its input probably kills the process"
        )


class WorkflowChangedError(WorkflowError):
    """Queued or in-progress work would be stranded by the workflow's current steps."""

    def __init__(
        self, run_id: str, problems: list[str], *, recorded_by: str = "", workflow: str = ""
    ) -> None:
        self.run_id = run_id
        self.problems = problems
        self.recorded_by = recorded_by  # set when another workflow class recorded the run
        listing = "; ".join(problems)
        if recorded_by:
            super().__init__(
                f"run {run_id!r} was recorded by {recorded_by}, not {workflow}, and cannot"
                f" continue with it: {listing}; resume it with {recorded_by}"
            )
            return
        super().__init__(
            f"run {run_id!r} cannot continue with this workflow: {listing}; pass"
            " allow_stranded=True to proceed and leave that work undone"
        )


class MemoizedError(WorkflowError):
    """A memoized call raised (``cache_errors=True``): the recorded error's class name and
    message, the same in the attempt that called and in every re-run that reuses it."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, self.message))


class SnapshotIgnoredWarning(UserWarning):
    """A run's cached state (its snapshot) was damaged or did not match the log it covers.

    The cache is never the truth: it was ignored and the run's log folded instead, so the
    state read is right, only slower to read. ``workflow check DB RUN`` reports the damage.
    """

    def __init__(self, run_id: str, seq: int, reason: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.reason = reason
        super().__init__(
            f"run {run_id!r}: its cached state at seq {seq} was ignored and its log folded"
            f" instead: {reason}"
        )


# ---------------------------------------------------------------- LlamaIndex's names


class WorkflowConfigurationError(WorkflowValidationError):
    """The steps cannot make a workflow: no step takes the start event, none returns a stop
    event, or more than one class of either is used (LlamaIndex's name)."""


class WorkflowCancelledByUser(WorkflowCancelledError):
    """The run was cancelled by ``handler.cancel_run()`` (LlamaIndex's name), or by
    ``workflow cancel`` from another process; ``reason``: the one the cancel gave, if any."""

    reason: str | None = None


class WorkflowStepDoesNotExistError(WorkflowRuntimeError):
    """An event was addressed to a step the workflow does not have."""


class WorkflowDone(WorkflowError):
    """The run ended while its workers were still going (LlamaIndex's control-flow error)."""


class ContextSerdeError(WorkflowError, ValueError):
    """A context could not be serialized or restored."""


class ContextStateError(WorkflowError, RuntimeError):
    """A context method was called in a state that does not allow it (e.g. a run of it is
    live elsewhere)."""
