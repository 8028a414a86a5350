"""Whether a run's pending work still fits this code: each queued, in-progress or waiting
event must be for a step that exists, decode, and be accepted by that step.

A resume or a fork refuses a run whose work would be stranded (:func:`check_stranded`),
unless told to proceed without it; the refusal names every event that does not fit.
"""

from __future__ import annotations

from pydantic import ValidationError

from eventstore import Codec, CodecError, LogCorruptedError, UnknownClassError

from ._errors import WorkflowChangedError
from ._fold import Folded
from ._folded import not_damage
from ._gather import CollectionReleaseEvent
from ._graph import Graph
from ._names import same_name

__all__ = ["check_stranded", "rename_hint", "stranded_work", "takers_of"]


def stranded_work(
    run_id: str, folded: Folded, graph: Graph, codec: Codec, workflow: type | None = None
) -> list[str]:
    """What of the run's pending work fits no step of ``graph`` now, one line an event.

    Work for a step that no longer exists says how to route it, if the step was renamed:
    the ``renamed`` mapping on ``workflow``'s class, with the steps that accept the event.

    :raises LogCorruptedError: a pending event's record is damaged (not a changed class).
    """
    problems: list[str] = []
    steps = graph.steps
    pending = [(s, e) for s, q in folded.queues.items() for e in q.values()]
    pending += [(s, p.ev) for s, ps in folded.in_progress.items() for p in ps.values()]
    pending += [(w.step, w.ev) for w in folded.waiters.values()]
    for step, ev in pending:
        if step not in steps:
            problems.append(
                f"event {ev.id} ({ev.type}) is for step {step!r}, which no longer exists"
                + rename_hint(step, codec, ev.dump, graph, workflow)
            )
            continue
        try:
            event = codec.load(ev.dump)
            # The codec rebuilds without validation (it trusts what it wrote); a class
            # that changed since must still accept the stored fields.
            type(event).model_validate(event._fields())
        except (UnknownClassError, ValidationError) as exc:
            problems.append(f"event {ev.id} for step {step!r} no longer decodes: {exc}")
            continue
        except CodecError as exc:  # not a changed class: a damaged record
            not_damage(exc, f"record seq {ev.seq} of run {run_id!r}, event {ev.id}")
            msg = f"record seq {ev.seq} of run {run_id!r}: its event {ev.id} is malformed: {exc}"
            raise LogCorruptedError(msg, seq=ev.seq) from exc
        spec = steps[step]
        if spec.gathers is not None and isinstance(event, CollectionReleaseEvent):
            continue  # a collect step's release: it takes it whatever its members' classes
        if not any(isinstance(event, t) for t in spec.accepted):
            problems.append(
                f"event {ev.id} ({type(event).__name__}) is no longer accepted by step {step!r}"
            )
    return problems


def rename_hint(old: str, codec: Codec, dump: object, graph: Graph, workflow: type | None) -> str:
    """How to route stored work (event ``dump``) of a step that no longer exists, if it was
    renamed: the ``renamed`` mapping on the workflow class, to each step that would take it.

    With no such step (the event's class does not resolve either), the new name is left to
    say, and the class's mapping is asked for too.
    """
    takers = takers_of(codec, dump, graph)
    owner = f"{workflow.__name__}.renamed" if workflow is not None else "renamed"
    news = takers or ["<its new name>"]
    maps = " or ".join("{" + f"{old!r}: {new!r}" + "}" for new in news)
    hint = f"; if it was renamed, say so on the workflow class: {owner} = {maps}"
    cls = str(dump.get("c", "")).partition("@")[0] if isinstance(dump, dict) else ""
    if not takers and cls:
        hint += f", and map its event's class too if that moved: {{{cls!r}: NewClass}}"
    return hint


def takers_of(codec: Codec, dump: object, graph: Graph) -> list[str]:
    """The steps that accept the stored event ``dump`` now; if it no longer decodes, those
    that accept a class of the name it records (moved to another module)."""
    try:
        event = codec.load(dump)
    except CodecError:
        cls = str(dump.get("c", "")).partition("@")[0] if isinstance(dump, dict) else ""
        qual = cls.partition(":")[2]
        return sorted(
            name
            for name, spec in graph.steps.items()
            if qual and any(t.__qualname__ == qual for t in spec.accepted)
        )
    return sorted(
        name
        for name, spec in graph.steps.items()
        if any(isinstance(event, t) for t in spec.accepted)
    )


def check_stranded(
    run_id: str,
    folded: Folded,
    graph: Graph,
    codec: Codec,
    workflow: type,
    name: str,
    *,
    allow: bool,
) -> None:
    """Refuses a run whose pending work fits no step of ``workflow`` (named ``name``) now.

    :raises WorkflowChangedError: some of it does not fit, and ``allow`` is False.
    """
    problems = stranded_work(run_id, folded, graph, codec, workflow)
    if problems and not allow:
        if folded.workflow and not same_name(folded.workflow, workflow):
            # Not a changed version of this workflow: another one's run.
            raise WorkflowChangedError(run_id, problems, recorded_by=folded.workflow, workflow=name)
        raise WorkflowChangedError(run_id, problems)
