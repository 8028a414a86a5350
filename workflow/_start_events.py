"""A new run's start event and first commit: the event given or built from start fields,
checked, and the records that create the run (``run_started``, any context, the start event
enqueued for each step that takes it)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic import ValidationError

from eventstore import Codec, Record, class_name

from . import _journal as journal
from ._errors import WorkflowRuntimeError
from ._events import StartEvent
from ._graph import Graph

__all__ = [
    "checked_start_event",
    "first_records",
    "fork_started_record",
    "run_started_record",
    "start_event_of",
]

_log = logging.getLogger("workflow")


def start_event_of(
    start_class: type[StartEvent], start_event: StartEvent | None, kwargs: dict[str, Any]
) -> StartEvent:
    """The start event of a run (LlamaIndex's helper): the one given (keyword arguments
    beside it are ignored, with a warning), or ``start_class`` built from them.

    :raises WorkflowRuntimeError: the keyword arguments do not make a start event.
    """
    if start_event is not None:
        if not isinstance(start_event, StartEvent):
            msg = "The 'start_event' argument must be an instance of 'StartEvent'."
            raise WorkflowRuntimeError(msg)
        if kwargs:
            _log.warning(
                "Keyword arguments are not supported when 'run()' is invoked with the"
                " 'start_event' parameter. These keyword arguments will be ignored: %s",
                kwargs,
            )
        return start_event
    try:
        return start_class(**kwargs)
    except ValidationError as exc:
        msg = (
            f"Failed creating a start event of type '{start_class.__name__}' with the keyword"
            f" arguments: {kwargs}"
        )
        raise WorkflowRuntimeError(msg) from exc


def checked_start_event(
    graph: Graph,
    start_class: type[StartEvent],
    workflow: str,
    given: StartEvent | None,
    fields: dict[str, Any],
) -> StartEvent:
    """The start event: the one given, or ``start_class`` built from ``fields``.

    :raises WorkflowRuntimeError: it is not a StartEvent, or no step of ``workflow`` takes it.
    """
    if given is None:
        return start_event_of(start_class, None, fields)
    if not isinstance(given, StartEvent):
        msg = f"start_event must be a StartEvent, not {type(given).__qualname__}"
        raise WorkflowRuntimeError(msg)
    if not graph.route(type(given)):
        # Nothing would ever run: the run could only idle until its timeout.
        msg = (
            f"no step of {workflow} takes {class_name(type(given))}; its"
            f" start step takes {class_name(start_class)}"
        )
        raise WorkflowRuntimeError(msg)
    return start_event_of(start_class, given, fields)  # fields: ignored, warned


def run_started_record(
    name: str,
    graph: Graph,
    codec: Codec,
    start_id: int,
    start: Any,
    previous: tuple[str, int] | None = None,
    state: str | None = None,
    deprecated: Iterable[str] = (),
) -> Record:
    """The ``run_started`` record of a new run of the workflow ``name`` (``state``: its
    typed state model's tag, ``_state_versions.state_tag``; ``deprecated``: the patch ids
    its class declares deprecated, ``_patch_check.declared_patches``)."""
    return journal.run_started(
        name,
        graph.fingerprint(),
        start_id,
        start,
        None,
        codec,
        graph.describe(),
        previous,
        state=state,
        deprecated=deprecated,
    )


def fork_started_record(
    name: str,
    graph: Graph,
    codec: Codec,
    parent: tuple[str, int],
    renamed: dict[str, str] | None = None,
    state: str | None = None,
    deprecated: Iterable[str] = (),
) -> Record:
    """The ``run_started`` record of a fork of run ``parent[0]`` at seq ``parent[1]``: with
    the moves of work under steps renamed since (``renamed``), the typed state model's tag
    (``state``) and the patch ids the fork's code declares deprecated (``deprecated``), as
    a resume's ``run_resumed`` has them."""
    return journal.run_started(
        name,
        graph.fingerprint(),
        0,
        None,
        parent,
        codec,
        graph.describe(),
        renamed=renamed,
        state=state,
        deprecated=deprecated,
    )


def first_records(
    name: str,
    graph: Graph,
    codec: Codec,
    start_event: StartEvent,
    context: Iterable[Record] = (),
    previous: tuple[str, int] | None = None,
    state: str | None = None,
    deprecated: Iterable[str] = (),
) -> list[Record]:
    """A new run's first commit: run_started (with the ``deprecated`` patch ids), its
    ``context`` records (a run from a context, linked to the ``previous`` run), and the
    start event for its steps.

    :raises EncodeError: the start event holds what the log cannot hold.
    """
    dump = orjson.Fragment(codec.encode(start_event, name=type(start_event).__name__))
    targets = graph.route(type(start_event))
    return [
        run_started_record(name, graph, codec, 1, dump, previous, state, deprecated),
        *context,
        *(journal.enqueued(t, 1, dump, journal.SRC_START) for t in targets),
    ]
