"""The static check of deprecated patches: which pending inputs a resume would refuse.

``ctx.deprecate_patch("id")`` decides at run time, inside the step, so nothing but running
the step tells that it will refuse an input (``_patches``). A workflow that says which
patches it deprecates, as a class attribute::

    class Checkout(Workflow):
        deprecated_patches = {"itemized-receipt": "pay"}  # patch id -> step(s) calling it

lets ``verify`` (and so ``recover(compatible_only=True)``) tell without running anything:
a resume starts a new session, so every pending input of such a step that has started
(in progress, or waiting for an event), did not record ``patched(id)`` True and was not
begun by a session whose code declared the patch deprecated (the same rule as
``_patches.deprecate_patch``) is one ``deprecate_patch`` would refuse. A set of ids
(``{"itemized-receipt"}``) names no step: every step's started inputs are checked, which
may list inputs of steps that never call it.
Queued inputs have not started and are never refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._errors import WorkflowValidationError
from ._folded import MemoRec, began_deprecated
from ._patches import PATCH_KEY
from ._verify_report import Problem

if TYPE_CHECKING:
    from ._folded import Folded

__all__ = ["declared_patches", "patch_problems", "replay_memos"]


def declared_patches(cls: type) -> dict[str, frozenset[str] | None]:
    """A workflow class's ``deprecated_patches``: patch id -> the steps that call
    ``deprecate_patch`` with it (None: any step).

    :raises WorkflowValidationError: the attribute is not a set of ids or a mapping of ids
        to a step name or names.
    """
    raw: Any = getattr(cls, "deprecated_patches", None)
    if raw is None:
        return {}
    bad = (
        f"{cls.__name__}.deprecated_patches must be a set of patch ids or a dict of patch ids"
        f" to the step name (or names) that call ctx.deprecate_patch, not {raw!r}"
    )
    found: dict[str, frozenset[str] | None] = {}
    if isinstance(raw, Mapping):
        for pid, steps in raw.items():
            names = (steps,) if isinstance(steps, str) else steps
            if not isinstance(pid, str) or not isinstance(names, Iterable):
                raise WorkflowValidationError(bad)
            found[pid] = frozenset(names)
            if not all(isinstance(n, str) for n in found[pid] or ()):
                raise WorkflowValidationError(bad)
    elif isinstance(raw, Iterable) and not isinstance(raw, str):
        for pid in raw:
            if not isinstance(pid, str):
                raise WorkflowValidationError(bad)
            found[pid] = None
    else:
        raise WorkflowValidationError(bad)
    return found


def _started(s: Folded) -> Iterator[tuple[str, int, str]]:
    """The pending inputs that have started: (step as recorded, event id, what it is)."""
    for step, progs in s.in_progress.items():
        for ev_id in progs:
            yield step, ev_id, "in-progress"
    for w in s.waiters.values():
        yield w.step, w.ev.id, "waiting"


def patch_problems(cls: type, run_id: str, s: Folded, renames: Mapping[str, str]) -> list[Problem]:
    """The ``patch`` problems of a run's latest state ``s``: each started pending input that
    ``deprecate_patch`` of a declared patch would refuse at a resume (module docstring)."""
    declared = declared_patches(cls)
    problems: list[Problem] = []
    if not declared:
        return problems
    for recorded_step, ev_id, what in _started(s):
        step = renames.get(recorded_step, recorded_step)
        memos = s.memos.get(recorded_step, {}).get(ev_id, {})
        for pid, steps in declared.items():
            if steps is not None and step not in steps:
                continue
            rec = memos.get(PATCH_KEY.format(pid))
            if rec is not None and rec.result is True:
                continue
            if rec is None and began_deprecated(s, pid, recorded_step, ev_id):
                continue  # begun by code that declared it deprecated: never the old branch
            why = (
                "it recorded the old branch (ctx.patched() returned False)"
                if rec is not None
                else "it started before this code, in a session of code that did not declare"
                " the patch deprecated, and never asked, so it may have run the old code"
                " (ctx.patched() would return False)"
            )
            msg = (
                f"{what} event {ev_id} would be refused by ctx.deprecate_patch({pid!r}): {why};"
                f" finish it with code that keeps `if await ctx.patched({pid!r}):`"
            )
            problems.append(Problem(run_id, s.seq, step, "patch", msg))
    return problems


def replay_memos(s: Folded, step: str) -> dict[int, dict[str, MemoRec]]:
    """The memoized calls ``verify --reexecute`` gives the attempts at ``step``'s inputs in
    the state ``s`` before their commit: the recorded ones, and for an input begun by a
    session whose code declared a patch deprecated (code that asked nothing: it has only
    the new branch), that patch's answer True where none is recorded, as ``patched`` would
    answer at run time."""
    recorded = s.memos.get(step, {})
    ids = set(s.in_progress.get(step, {}))
    if not s.deprecated or not ids:
        return recorded
    out = {i: dict(by_key) for i, by_key in recorded.items()}
    for ev_id in ids:
        for pid in s.deprecated:
            key = PATCH_KEY.format(pid)
            if key not in out.get(ev_id, {}) and began_deprecated(s, pid, step, ev_id):
                out.setdefault(ev_id, {})[key] = MemoRec("-", True, None, 0, s.seq)
    return out
