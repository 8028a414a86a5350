"""The id a new run is given: the caller's, once it is one the store can keep, or a new one."""

from __future__ import annotations

import uuid

from ._errors import WorkflowRuntimeError

__all__ = ["new_run_id"]


def new_run_id(run_id: object) -> str:
    """``run_id`` as given (None: a new random one).

    An empty id is refused rather than replaced (each call would start another run, where
    the caller meant one: an unset variable, say), as is one the log cannot hold as text.

    :raises WorkflowRuntimeError: not a string, empty or blank, or not encodable as UTF-8.
    """
    if run_id is None:
        return uuid.uuid4().hex
    if not isinstance(run_id, str):
        msg = f"run_id must be a string, not {type(run_id).__name__}"
        raise WorkflowRuntimeError(msg)
    if not run_id.strip():
        what = "empty" if not run_id else f"blank ({run_id!r})"
        msg = f"run_id is {what}: pass a non-empty id, or none for a new random one"
        raise WorkflowRuntimeError(msg)
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = f"run_id {run_id!r} is not valid text (a lone surrogate at position {exc.start})"
        raise WorkflowRuntimeError(msg) from None
    return run_id
