"""Versions of a typed state model (``Context[MyState]``) while runs are in flight.

A state model stores its fields as context keys, each written as a whole value or as a
patch against the one before (``state_set``), so no payload carries the model's class: the
version is recorded per session instead. Each ``run_started`` and ``run_resumed`` written by
code with a typed state model names it, ``"mod:MyState@2"`` (:func:`state_tag`; version 1
has no suffix, and a log that names none is at version 1), and the context records after it
are in that version.

A model that declares ``__version__ = 2`` registers upcasters as an event class does
(``@upcaster(MyState, from_version=1)``), each getting the stored fields as a dict of
decoded values. Where a newer version first meets an older run, the context is upcast:

- a resume or a fork writes the upcast values in its first commit, beside the
  ``run_resumed`` / ``run_started`` that names the new version (:func:`upcast_state`): only
  changed keys, as whole values, and removed keys as ``state_deleted``. So the fold applies
  every patch in the version it was written in, the log is never rewritten, and the command
  line and the page read the move from the log alone;
- a read of a run no newer code has resumed yet (``state_at``, the command line and the web
  UI with ``--workflow``) upcasts the values as it decodes them (:func:`upcast_values`;
  the text of ``workflow state`` and ``diff`` shows them so, :func:`upcast_shown`).

Upcasters get only the fields recorded: a context with nothing recorded yet (a read at a
seq before the first write, a resume of a run that wrote none) calls none of them.

A version with no chain of upcasters is refused as an event's is: :class:`UpcastError`
naming the upcaster to register (a resume raises ``WorkflowChangedError`` with it).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from eventstore import (
    Codec,
    CodecError,
    Record,
    UnknownClassError,
    class_name,
    class_version,
    split_version,
    upcast,
)

from . import _journal as J
from ._errors import WorkflowChangedError
from ._folded import Folded, KeyLog

__all__ = ["resume_upcast", "state_tag", "upcast_shown", "upcast_state", "upcast_values"]

_RESERVED = "\x00"  # keys the engine keeps in the context for itself, never a model's field


def state_tag(model: type | None) -> str | None:
    """What a session's first record names of the typed state model: ``"mod:Cls@2"``."""
    if model is None:
        return None
    v = class_version(model)
    name = class_name(model)
    return name if v == 1 else f"{name}@{v}"


def upcast_values(folded: Folded, codec: Codec, model: type | None = None) -> dict[str, Any] | None:
    """The run's context values, decoded and brought to the state model's current version;
    None when they are in it already (or no typed state model is known).

    ``model`` is the workflow's state model; without it, the class the log names (if this
    program has it).

    :raises UpcastError: no chain of upcasters from the stored version to the current one.
    :raises CodecError: a value cannot be decoded.
    """
    tag = folded.state
    if tag is None:
        if model is None:
            return None
        name, stored = class_name(model), 1  # written before versions were recorded
    else:
        name, stored = split_version(tag)
    cls = model
    if cls is None:
        try:
            cls = codec.resolve(name)
        except UnknownClassError:
            return None  # a reader without the model's module: the values as stored
    if class_version(cls) == stored:
        return None
    fields = {
        k: codec.load(e.dump) for k, e in folded.context.items() if not k.startswith(_RESERVED)
    }
    if not fields:
        # Nothing recorded (a read at a seq before the first write): no stored payload to
        # upcast, so no upcaster is called (as eventsourcing calls them on stored payloads
        # only), and one written as ``fields.pop("old")`` never meets an empty dict.
        return {}
    return upcast(cls, stored, fields, name=name)


def upcast_shown(folded: Folded, codec: Codec, model: type | None) -> Folded:
    """``folded`` as a reader with the workflow shows it (``workflow state`` and ``diff``
    as text): its context brought to ``model``'s current version, as ``state_at`` and
    ``--json`` give it. A copy when it changes: ``folded`` itself is left as the log has it.

    :raises UpcastError: no chain of upcasters from the stored version to the current one.
    :raises CodecError: a value cannot be decoded, or an upcast one encoded.
    """
    if upcast_values(folded, codec, model) is None:
        return folded
    shown = copy.copy(folded)
    shown.context = dict(folded.context)
    upcast_state(shown, codec, model)
    return shown


def upcast_state(folded: Folded, codec: Codec, model: type | None) -> list[Record]:
    """Brings ``folded``'s context to ``model``'s current version, in place, and returns the
    records that write the change (for the first commit of a resume or a fork).

    :raises UpcastError: no chain of upcasters from the stored version to the current one.
    :raises CodecError: a stored value cannot be decoded, or an upcast one encoded.
    """
    values = upcast_values(folded, codec, model)
    if values is None:
        return []
    records: list[Record] = []
    context = folded.context
    for key in [k for k in context if not k.startswith(_RESERVED) and k not in values]:
        records.append(J.state_deleted(None, key))
        del context[key]
    for key, value in values.items():
        dump = codec.dump(value, name=key)
        entry = context.get(key)
        if entry is not None and orjson.dumps(entry.dump) == orjson.dumps(dump):
            continue
        record = J.state_set_value(None, key, dump)
        records.append(record)
        context[key] = KeyLog(dump, len(record.payload), 0, folded.seq)
    folded.state = state_tag(model)
    return records


def resume_upcast(run_id: str, folded: Folded, codec: Codec, model: type | None) -> list[Record]:
    """:func:`upcast_state` for a resume or a fork of ``run_id``, refused before any work.

    :raises WorkflowChangedError: the context cannot be brought to the current version
        (it names the upcaster to register); nothing of the run is changed.
    """
    try:
        return upcast_state(folded, codec, model)
    except CodecError as exc:
        what = folded.state or (class_name(model) if model is not None else "?")
        exc_ = WorkflowChangedError(run_id, [f"its context (state model {what}): {exc}"])
        # Not stranded work that could be left undone: the whole context is unreadable.
        exc_.args = (str(exc_).partition("; pass allow_stranded")[0],)
        raise exc_ from exc
