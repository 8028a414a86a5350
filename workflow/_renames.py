"""Renamed steps and moved event classes: ``Workflow.renamed``, read by every resume.

A deploy may rename a step or move an event class to another module while runs still hold
work under the old names. ``renamed`` on the workflow class maps each old name to the new:
a step's old name to its new name (a string), an old class name (``"old.module:Cls"``, as
the log records it) to the class that replaces it. A resume moves the run's pending work of
an old step name to the new one and records the move in its ``run_resumed`` record
(``renamed``), so every later fold, in any process and on the command line, sees the work
under the new name; the log's earlier records keep the names they were written with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventstore import Codec

from ._errors import WorkflowValidationError
from ._fold import Folded

__all__ = ["class_aliases", "moves_for", "step_renames"]


def _declared(cls: type) -> Mapping[str, Any]:
    renamed = getattr(cls, "renamed", None) or {}
    if not isinstance(renamed, Mapping):
        msg = f"{cls.__name__}.renamed should be a dict of old name -> new, not {renamed!r}"
        raise WorkflowValidationError(msg)
    return renamed


def step_renames(cls: type, steps: Mapping[str, object]) -> dict[str, str]:
    """The step renames ``cls.renamed`` declares, each old name resolved to a step of now.

    Chains (``a`` -> ``b`` -> ``c``, over several deploys) resolve to their last name.

    :raises WorkflowValidationError: a new name is no step of the workflow, or an old name
        is still a step (it would be ambiguous which one takes the work).
    """
    declared = {k: v for k, v in _declared(cls).items() if ":" not in k}
    out: dict[str, str] = {}
    for old, new in declared.items():
        if not isinstance(new, str):
            msg = f"{cls.__name__}.renamed[{old!r}] should name a step (a str), not {new!r}"
            raise WorkflowValidationError(msg)
        if old in steps:
            msg = f"{cls.__name__}.renamed[{old!r}]: {old!r} is still a step of the workflow"
            raise WorkflowValidationError(msg)
        seen = {old}
        while new in declared and new not in steps:
            if new in seen:
                msg = f"{cls.__name__}.renamed has a cycle through {new!r}"
                raise WorkflowValidationError(msg)
            seen.add(new)
            new = declared[new]
        if new not in steps:
            msg = (
                f"{cls.__name__}.renamed[{old!r}] = {new!r}, which is no step of the workflow"
                f" (steps: {', '.join(sorted(steps))})"
            )
            raise WorkflowValidationError(msg)
        out[old] = new
    return out


def class_aliases(cls: type, codec: Codec) -> None:
    """Makes ``codec`` read each old class name ``cls.renamed`` declares as its new class.

    :raises WorkflowValidationError: an old class name maps to something other than a class
        the codec can rebuild.
    """
    for old, new in _declared(cls).items():
        if ":" not in old:
            continue
        try:
            codec.alias(old, new)
        except (TypeError, ValueError) as exc:
            msg = f"{cls.__name__}.renamed[{old!r}]: {exc}"
            raise WorkflowValidationError(msg) from exc


def moves_for(folded: Folded, renames: Mapping[str, str]) -> dict[str, str]:
    """The renames that concern ``folded``: old step names it still holds work under."""
    if not renames:
        return {}
    held = {s for s, q in folded.queues.items() if q}
    held |= {s for s, ps in folded.in_progress.items() if ps}
    held |= {w.step for w in folded.waiters.values()}
    return {old: new for old, new in renames.items() if old in held}
