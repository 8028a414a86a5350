"""Renamed steps and moved event classes: ``Workflow.renamed``, read by every resume.

A deploy may rename a step or move an event class to another module while runs still hold
work under the old names. ``renamed`` on the workflow class maps each old name to the new:
a step's old name to its new name (a string), an old class name (``"old.module:Cls"``, as
the log records it) to the class that replaces it. A resume moves the run's pending work of
an old step name to the new one and records the move in its ``run_resumed`` record
(``renamed``), so every later fold, in any process and on the command line, sees the work
under the new name; the log's earlier records keep the names they were written with.

A renamed step's collect buffers (``collect_events``) move with it: a buffer's key is
``step:id`` and a default id is a digest of the step's name and the expected classes'
qualified names (``_buffers``), so the move recomputes it under the new name for the
classes whose digest under the old name it is (the classes the step accepts, and those in
the buffer, in every order, and lists naming a class more than once, as ``[A, A]``); an id
given as ``buffer_id=`` is kept as it is. The moves go in the same mapping as the steps' (a
buffer key has a colon, a step name none) and are recorded with them. A fork (``run_from``)
at a seq whose work is under old names records the same moves in its ``run_started``.

A class renamed (not only moved: ``{"old.module:Left": Leftie}``) is renamed inside the
collect buffers too: a buffer keys its events by qualified name and a default id is made
of the expected classes' names, so the buffers holding it (or of a step that accepts it)
move to the id made of the new names, and the events in them go under the new name; the
class moves are recorded beside the buffers' (``run_resumed.classes``, old qualified name
-> new).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from eventstore import Codec, split_version

from ._buffers import buffer_key, class_qualname, default_buffer_id
from ._errors import WorkflowValidationError
from ._fold import Folded
from ._folded import CLASS_MOVE

__all__ = ["CLASS_MOVE", "Renames", "class_aliases", "moves_for", "step_renames"]

# How many classes a buffer's expected list is searched over (every order of every subset):
# 8 classes are about 110,000 digests, a tenth of a second, paid once per resume.
_MAX_CLASSES: Final = 8
# Lists naming a class more than once (``[A, A]``) are searched up to this length and count.
_MAX_LENGTH: Final = 16
_MAX_REPEATED: Final = 100_000


class Renames(dict[str, str]):
    """Step renames, old name -> new, with the qualified names of the classes each step
    accepts (``accepts``), from which a renamed step's buffer keys are found again, and the
    classes renamed (not only moved: ``classes``, old qualified name -> new)."""

    def __init__(
        self,
        renames: Mapping[str, str],
        accepts: Mapping[str, Sequence[str]] | None = None,
        classes: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(renames)
        self.accepts: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in (accepts or {}).items()}
        self.classes: dict[str, str] = dict(classes or {})


def _declared(cls: type) -> Mapping[str, Any]:
    renamed = getattr(cls, "renamed", None) or {}
    if not isinstance(renamed, Mapping):
        msg = f"{cls.__name__}.renamed should be a dict of old name -> new, not {renamed!r}"
        raise WorkflowValidationError(msg)
    return renamed


def step_renames(cls: type, steps: Mapping[str, object]) -> Renames:
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
    accepts = {
        name: [c.__qualname__ for c in getattr(spec, "accepted", ())]
        for name, spec in steps.items()
    }
    return Renames(out, accepts, _renamed_classes(cls))


def _renamed_classes(cls: type) -> dict[str, str]:
    """The classes ``cls.renamed`` gives a new qualified name (old -> new): a collect
    buffer keys its events by qualified name and makes its default id of them."""
    out: dict[str, str] = {}
    for old, new in _declared(cls).items():
        if ":" in old and isinstance(new, type):
            before = class_qualname(split_version(old)[0])
            if before != new.__qualname__:
                out[before] = new.__qualname__
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
    """The renames that concern ``folded``: old step names it still holds work under, the
    keys of collect buffers of renamed steps or holding renamed classes (old key -> new
    key), and those classes (``CLASS_MOVE`` + old qualified name -> new)."""
    classes: Mapping[str, str] = getattr(renames, "classes", {})
    if not renames and not classes:
        return {}
    held = {s for s, q in folded.queues.items() if q}
    held |= {s for s, ps in folded.in_progress.items() if ps}
    held |= {w.step for w in folded.waiters.values()}
    out = {old: new for old, new in renames.items() if old in held}
    accepts: Mapping[str, Sequence[str]] = getattr(renames, "accepts", {})
    back = {new: old for old, new in classes.items()}
    for key, buf in folded.buffers.items():
        old, _, bid = key.partition(":")
        new = renames.get(old, old)
        held_names = [class_qualname(t) for t in buf]
        moved = [n for n in held_names if n in classes]
        # What the step's default id was made of: the classes it accepted then (today's,
        # under their old names) and those in the buffer.
        names = [*(back.get(n, n) for n in accepts.get(new, ())), *held_names]
        if new == old and not any(n in classes for n in names):
            continue
        to = buffer_key(new, _buffer_id(old, new, bid, names, classes))
        if to != key:
            out[key] = to
        out.update({CLASS_MOVE + n: classes[n] for n in moved})
    return out


def _buffer_id(
    old: str, new: str, bid: str, names: Sequence[str], classes: Mapping[str, str]
) -> str:
    """The id under step ``new`` of step ``old``'s buffer ``bid``: a default id (a digest of
    ``old`` and some list of ``names``) made again for ``new`` of the classes' names now
    (``classes``: old -> new), else ``bid``."""
    for order in _expected_lists(list(dict.fromkeys(names))[:_MAX_CLASSES]):
        if default_buffer_id(old, order) == bid:
            return default_buffer_id(new, [classes.get(n, n) for n in order])
    return bid  # not a digest of these classes: a buffer_id= the code gave


def _expected_lists(names: Sequence[str]) -> Iterator[Sequence[str]]:
    """The expected lists a step collecting ``names`` may have given, shortest first: every
    order of every subset, then lists naming a class more than once (``[A, A]``, as
    ``collect_events`` keeps them), up to :data:`_MAX_REPEATED` of those."""
    for n in range(1, len(names) + 1):
        yield from itertools.permutations(names, n)
    budget = _MAX_REPEATED
    for n in range(2, _MAX_LENGTH + 1):
        for order in itertools.product(names, repeat=n):
            if len(set(order)) == n:
                continue  # no class twice: an order of a subset, tried above
            budget -= 1
            if budget < 0:
                return
            yield order
