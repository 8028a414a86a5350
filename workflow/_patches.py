"""Patches for changed step code: ``ctx.patched("id")`` picks the branch an input keeps.

A deploy that changes what a step does while runs are in flight guards the change::

    if await ctx.patched("send-receipt"):
        ...  # the new code
    else:
        ...  # the code the runs already in flight started with

The answer is decided once per step input and recorded, so every later attempt at that
input (after a crash, a retry, a conflict, a wait, in any process) and ``workflow verify
--reexecute`` take the same branch:

- the first ``patched("id")`` call of an input records the answer as a ``memoized`` record
  (key ``patched:id``, result True or False), durable before the call returns, inside the
  attempt as memoized calls are (``_memo``);
- the answer is True iff the input had no ``step_started`` before the start of the session
  that asks (the ``run_started`` or ``run_resumed`` record of the executor running code
  with the patch): every attempt at it ran this code; or it first started in a session
  whose code declared the patch deprecated (``deprecated_patches``, which each session's
  start record names: ``_folded.began_deprecated``), code with only the new branch. Any
  other input that started before may have run the old code (and done the old code's
  effects), so it gets False — also when it failed, waited or crashed and runs again now;
- a recorded attempt without such a record ran code that did not ask: re-executed by
  ``verify``, it takes the old branch, as it did.

``ctx.deprecate_patch("id")`` is the step after, once no run that could take the old branch
is left: the ``if`` is gone and the new code runs alone; the call records nothing and
refuses (:class:`DeprecatedPatchError`, a :class:`WorkflowRuntimeError`) exactly the
inputs ``patched("id")`` answers False (a recorded False, or an input that never asked and
first started in an earlier session whose code did not declare the patch deprecated: a
deploy straight from code without the patch), which the code that would finish them no
longer has. An input begun by code that declares it (which died in the step, and the same
code resumes it) goes through: that code never had the old branch. Each input goes by its
own session, so inputs begun by a session that dropped the declaration (a rollback) are
refused again later. A refusal does not fail the run: the
executor stops it with nothing recorded, so code that still has the old branch can finish
it (``_attempts``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from . import _journal as J
from ._attempt import attempt_of
from ._errors import DeprecatedPatchError, WorkflowRuntimeError
from ._folded import began_deprecated

if TYPE_CHECKING:
    from ._folded import Folded

__all__ = [
    "PATCH_KEY",
    "Attempt",
    "began_in_session",
    "ctx_deprecate_patch",
    "ctx_patched",
    "deprecate_patch",
    "new_branch",
    "patched",
]

# The memoized key of a patch's answer: a colon is in no function's qualified name, so it
# never meets a memoized call's default key.
PATCH_KEY: Final = "patched:{}"
_NAME: Final = "patched"
_DIGEST: Final = "-"  # a patch has no arguments to compare


class Attempt(Protocol):
    """What a patch needs of the attempt asking (``_attempt.Attempt``): its input and run."""

    step: str
    event_id: int
    attempt: int
    host: Any  # the run's executor, or verify's replay (``_memo.MemoHost``)


def _key(patch_id: str) -> str:
    if not isinstance(patch_id, str) or not patch_id:
        msg = f"a patch id must be a non-empty str, not {patch_id!r}"
        raise WorkflowRuntimeError(msg)
    return PATCH_KEY.format(patch_id)


def began_in_session(folded: Folded, step: str, event_id: int) -> bool:
    """Whether ``step``'s input ``event_id`` first started in the run's latest session.

    An input whose first ``step_started`` is not folded yet started now (a first attempt's
    start may ride with the next commit): only a resume re-delivers older inputs, and it
    makes their starts durable before they run.
    """
    first = folded.started.get(step, {}).get(event_id)
    return first is None or first > folded.session


def new_branch(folded: Folded, patch_id: str, step: str, event_id: int) -> bool:
    """Whether an input that recorded no answer for ``patch_id`` can only have run its new
    code: it started in this session, or in a session whose code declared the patch
    deprecated (``deprecated_patches``, named by the session's start record), code that
    has no old branch."""
    return began_in_session(folded, step, event_id) or began_deprecated(
        folded, patch_id, step, event_id
    )


async def patched(att: Attempt | None, patch_id: str) -> bool:
    """This input's branch of patch ``patch_id``: True for the new code (module docstring).

    :raises WorkflowRuntimeError: called outside a step, or with an id that is not a str.
    """
    key = _key(patch_id)
    if att is None or att.host is None:
        msg = "ctx.patched() works inside a step: the answer is kept per step input"
        raise WorkflowRuntimeError(msg)
    host = att.host
    rec = host.memos_of(att.step, att.event_id).get(key)
    if rec is not None:
        return rec.result is True
    if host.replaying:
        return False  # the recorded attempt ran code that did not ask: the old branch
    answer = new_branch(host.folded_state(), patch_id, att.step, att.event_id)
    text = b"true" if answer else b"false"
    record = J.memoized(
        att.step,
        att.event_id,
        att.attempt,
        key,
        _NAME,
        _DIGEST,
        orjson.Fragment(text),
        None,
        0.0,
        0,
    )
    await host.append([record])
    return answer


def _old_branch(att: Attempt, patch_id: str, key: str) -> bool:
    """Whether ``patched`` answers this input False (the old branch), asking nothing new:
    its recorded answer, else what it would decide now (``verify``'s replay: the recorded
    answer only)."""
    host = att.host
    rec = host.memos_of(att.step, att.event_id).get(key)
    if rec is not None:
        return rec.result is not True
    if host.replaying:
        # A recorded attempt without an answer ran code that did not ask: code without the
        # patch, or code that deprecates it (which records nothing), so it cannot be told.
        return False
    return not new_branch(host.folded_state(), patch_id, att.step, att.event_id)


def deprecate_patch(att: Attempt | None, patch_id: str) -> None:
    """Says the old branch of ``patch_id`` is gone: refuses exactly the inputs for which
    ``patched(patch_id)`` answers False.

    Those are the inputs that recorded False, and the inputs that never asked but started
    before this session (a deploy straight from code without the patch: they may have run
    the old code and done its effects). Nothing is recorded either way.

    :raises DeprecatedPatchError: this input's answer is the old branch, which this code no
        longer has; the executor then stops the run, unfailed and resumable by code that
        keeps ``patched`` (even if the step catches the error).
    :raises WorkflowRuntimeError: called outside a step, or with an id that is not a str.
    """
    key = _key(patch_id)
    if att is None or att.host is None:
        msg = "ctx.deprecate_patch() works inside a step"
        raise WorkflowRuntimeError(msg)
    if not _old_branch(att, patch_id, key):
        return
    rec = att.host.memos_of(att.step, att.event_id).get(key)
    run = getattr(att.host, "run_id", None)
    why = (
        "this input recorded its old branch (ctx.patched() returned False)"
        if rec is not None
        else "this input started before this code ran it, in a session of code that did not"
        " declare the patch in deprecated_patches, and never asked, so it may have run the"
        " old code (ctx.patched() would return False)"
    )
    err = DeprecatedPatchError(
        run if isinstance(run, str) else None, att.step, att.event_id, patch_id, why
    )
    # Kept on the attempt: the executor stops the run even if the step catches the raise.
    if hasattr(att, "refused"):
        att.refused = err
    raise err


# Context's methods (``Context.patched`` is this function): the attempt is the caller's.


def _asking(ctx: Any, what: str) -> Any:
    """The attempt running this call (``ctx.patched`` works inside a step of ctx's run)."""
    att = attempt_of(ctx.__context_link__.host)
    if att is None:
        msg = f"ctx.{what}() works inside a step of this context's run"
        raise WorkflowRuntimeError(msg)
    return att


async def ctx_patched(ctx: Any, patch_id: str) -> bool:
    """Whether this step input runs the new code of patch ``patch_id`` (True) or keeps the
    code it started with (False): decided once per input and recorded, so every attempt at
    it takes the same branch (see :mod:`workflow._patches`)."""
    return await patched(_asking(ctx, "patched"), patch_id)


def ctx_deprecate_patch(ctx: Any, patch_id: str) -> None:
    """Says patch ``patch_id``'s old branch is gone (see :mod:`workflow._patches`)."""
    deprecate_patch(_asking(ctx, "deprecate_patch"), patch_id)
