"""The shapes of step signatures beyond one event in, events out: joins (several event
parameters, LlamaIndex's heterogeneous fan-in) and fan-outs (``-> list[E]``)."""

from __future__ import annotations

import types
import typing
from typing import Any, Protocol

from ._errors import WorkflowRuntimeError, WorkflowValidationError
from ._events import Event
from .collect import Collect, Take

__all__ = ["bare_returns", "fans_out", "gather_of", "joins_of", "returned_events"]


class _Returning(Protocol):
    """What :func:`returned_events` reads of a step's spec (``_step.StepSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def fans_out(self) -> bool: ...

    @property
    def bare(self) -> tuple[type[Event], ...]: ...


def joins_of(
    where: str, params: list[tuple[str, tuple[type[Event], ...]]], subclasses: bool
) -> tuple[tuple[str, type[Event]], ...]:
    """The parameters of a join (several event parameters), or () for one event parameter.

    With ``subclasses`` (``accept_event_subclasses=True``) a slot also takes events of a
    subclass of its class (:func:`workflow._collect_call.join_slot` picks which slot).

    :raises WorkflowValidationError: a parameter of a join names no single event class.
    """
    if len(params) < 2:
        return ()
    for name, types_ in params:
        if len(types_) != 1:
            shown = " | ".join(t.__name__ for t in types_) or "None"
            msg = (
                f"{where}: parameter {name!r} of a step with several event parameters must"
                f" name a single event type, not {shown}"
            )
            raise WorkflowValidationError(msg)
    names = [types_[0].__qualname__ for _, types_ in params]
    clash = sorted(
        {
            n
            for n in names
            if names.count(n) > 1 and len({t for _, (t,) in params if t.__qualname__ == n}) > 1
        }
    )
    if clash:
        msg = (
            f"{where}: the event classes of a step with several event parameters need"
            f" distinct names; {', '.join(clash)} names classes of several modules"
        )
        raise WorkflowValidationError(msg)
    return tuple((name, types_[0]) for name, types_ in params)


def gather_of(annotation: Any, where: str) -> tuple[tuple[type[Event], ...], int | None] | None:
    """A collect step's parameter (``list[R]``, ``Annotated[list[R], Collect(...)]``): its
    member classes and ``Take(n)``'s n; None for any other annotation.

    :raises WorkflowValidationError: the list's element names no event class, or the
        annotation carries something other than one ``Collect``.
    """
    marks: list[Any] = []
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *marks = typing.get_args(annotation)
    if typing.get_origin(annotation) is not list:
        if any(isinstance(m, Collect) for m in marks):
            msg = f"{where}: a Collect(...) marker goes on a list[E] parameter, not {annotation!r}"
            raise WorkflowValidationError(msg)
        return None
    collects = [m for m in marks if isinstance(m, Collect)]
    if len(collects) > 1:
        msg = f"{where}: give a list[E] parameter one Collect(...), not {len(collects)}"
        raise WorkflowValidationError(msg)
    (element,) = typing.get_args(annotation) or (Any,)
    members = _members(element, where)
    card = collects[0].cardinality if collects else None
    return members, card.n if isinstance(card, Take) else None


def _members(element: Any, where: str) -> tuple[type[Event], ...]:
    origin = typing.get_origin(element)
    if origin is typing.Union or origin is types.UnionType:
        out: list[type[Event]] = []
        for arg in typing.get_args(element):
            out.extend(_members(arg, where))
        return tuple(out)
    if isinstance(element, type) and issubclass(element, Event):
        return (element,)
    msg = f"{where}: list[{getattr(element, '__name__', element)}] names no Event class"
    raise WorkflowValidationError(msg)


def bare_returns(annotation: Any) -> tuple[type[Event], ...]:
    """The event classes a return annotation names outside any ``list[...]``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(t for a in typing.get_args(annotation) for t in bare_returns(a))
    if origin is typing.Annotated:
        return bare_returns(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, Event):
        return (annotation,)
    return ()


def fans_out(annotation: Any) -> bool:
    """Whether a return annotation holds a ``list[E]`` (the step may return a list)."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return True
    if origin is typing.Union or origin is types.UnionType or origin is typing.Annotated:
        args = typing.get_args(annotation)
        return any(fans_out(a) for a in (args[:1] if origin is typing.Annotated else args))
    return False


def returned_events(spec: _Returning, result: Any) -> tuple[Event | None, list[Event]]:
    """What a step's return emits: the event it returned, or the elements of the list a
    fan-out step (``-> list[E]``) returned, each an event of its own (``[]``: none).

    :raises WorkflowRuntimeError: a list from a step not annotated to return one, or an
        element of it that is not an event.
    """
    if type(result) is not list:
        if spec.fans_out and isinstance(result, Event) and not isinstance(result, spec.bare):
            msg = (
                f"Step function {spec.name} returned a bare {type(result).__name__}, which its"
                " return annotation declares only inside a list: return a one-element list to"
                f" fan it out, or add {type(result).__name__} to the annotation"
            )
            raise WorkflowRuntimeError(msg)
        return result, []
    if not spec.fans_out:
        msg = (
            f"Step function {spec.name} returned a list; annotate it -> list[...] to emit"
            " each element as an event"
        )
        raise WorkflowRuntimeError(msg)
    bad = sorted({type(e).__name__ for e in result if not isinstance(e, Event)})
    if bad:
        msg = f"Step function {spec.name} returned a list holding {', '.join(bad)}, not events"
        raise WorkflowRuntimeError(msg)
    return None, list(result)
