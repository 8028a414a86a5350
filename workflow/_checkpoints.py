"""What a run's commits say about its events: one checkpoint per commit, and the class of
each event id.

Read without user code: class names come from the records' dumps (a class this program
lacks is a name, never an import); with a codec's ``resolve`` and ``load``, a checkpoint
matches classes under their other names and carries LlamaIndex's input and output events.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from eventstore import (
    CodecError,
    EventStore,
    LogCorruptedError,
    StoredRecord,
    UnknownClassError,
    class_name,
)

from . import _journal as J
from ._fold import payload_of
from ._read import Damaged, commits, readable_records, run_info
from ._state import Checkpoint

__all__ = ["checkpoints", "event_class", "event_type", "event_types_upto", "note_event"]


def event_type(r: StoredRecord) -> str | None:
    """The qualified class name of the event a record carries, if it carries one."""
    if r.kind not in (J.ENQUEUED, J.RUN_FINISHED, J.RUN_STARTED, J.STREAMED, J.WAITING):
        return None
    d: J.Dump
    if r.kind == J.RUN_FINISHED:
        finished: J.RunFinished = payload_of(r)
        d = finished.get("result")
    elif r.kind == J.RUN_STARTED:
        started: J.RunStarted = payload_of(r)
        start = started.get("start")
        d = start.get("event") if start else None
    else:
        carrying: J.Enqueued | J.Streamed | J.Waiting = payload_of(r)
        d = carrying.get("event")
    c = d.get("c") if isinstance(d, dict) else None
    return c.partition("@")[0] if isinstance(c, str) else c  # no version ("mod:Cls@2")


def checkpoints(
    store: EventStore,
    run_id: str,
    *,
    step: str | None = None,
    event: type | str | None = None,
    resolve: Callable[[str], type] | None = None,
    load: Callable[[Any], Any] | None = None,
) -> list[Checkpoint]:
    """One checkpoint per commit of the run, filtered by step and by event class or name.

    With ``resolve`` (a codec's), a class also matches the names it is recorded under in
    another process (``__main__:X`` for ``app:X``). With ``load`` (a codec's), the commits
    of steps that returned carry LlamaIndex's fields: the step, its input and output events
    (decoded from their records; the state is never read here).
    """
    info = run_info(store, run_id)
    wanted = None if event is None else _event_filter(event, resolve)
    out: list[Checkpoint] = []
    dumps: dict[int, Any] = {}
    decoded: dict[int, Any] = {}
    if load is not None and info.parent_run_id is not None and info.parent_seq is not None:
        dumps = _event_dumps(store, info.parent_run_id, info.parent_seq)
    for commit in commits(store.records(run_id)):
        head = commit[0]
        if load is not None:
            for r in commit:
                # A damaged record names no event; the history shows it where it belongs.
                with contextlib.suppress(LogCorruptedError, KeyError, TypeError):
                    _note_dump(r, dumps)
        if step is not None and head.step != step:
            continue
        types: list[str] = []
        for r in commit:
            if r.kind in (J.ENQUEUED, J.RUN_FINISHED, J.RUN_STARTED):
                t = event_type(r)
                if t and t not in types:
                    types.append(t)
        if wanted is not None and not any(map(wanted, types)):
            continue
        extra: dict[str, Any] = {}
        if load is not None and head.kind == J.STEP_FINISHED:
            finished: J.StepFinished = payload_of(head)  # the step's own commit: read, or raise
            emitted = finished.get("emitted") or []
            # A step's output is the next one's input: each event is decoded once.
            extra = {
                "last_completed_step": head.step,
                "input_event": _loaded(load, decoded, dumps, finished["id"]),
                "output_event": _loaded(load, decoded, dumps, emitted[-1]) if emitted else None,
            }
        out.append(
            Checkpoint(
                run_id=run_id,
                seq=commit[-1].seq,
                kind=head.kind,
                step=head.step,
                event_types=types,
                id_=f"{run_id}:{commit[-1].seq}",
                **extra,
            )
        )
    return out


def _note_dump(r: StoredRecord, dumps: dict[int, Any]) -> None:
    """Remembers the dump of each event a record introduces, by id."""
    if r.kind == J.ENQUEUED:
        enqueued: J.Enqueued = payload_of(r)
        dumps.setdefault(enqueued["id"], enqueued.get("event"))
    elif r.kind == J.RUN_FINISHED:
        finished: J.RunFinished = payload_of(r)
        if "id" in finished:
            dumps[finished["id"]] = finished.get("result")
    elif r.kind == J.RUN_STARTED:
        started: J.RunStarted = payload_of(r)
        start = started.get("start")
        if start:
            dumps[start["id"]] = start.get("event")
    elif r.kind == J.WAIT_RESOLVED:
        resolved: J.WaitResolved = payload_of(r)
        answer = resolved.get("id")
        if answer is not None:
            dumps[answer] = resolved.get("event")


def _event_dumps(store: EventStore, run_id: str, seq: int) -> dict[int, Any]:
    """Event id -> dump for the events a run (and its ancestors) had up to ``seq``."""
    info = run_info(store, run_id)
    dumps: dict[int, Any] = {}
    if info.parent_run_id is not None and info.parent_seq is not None:
        dumps = _event_dumps(store, info.parent_run_id, info.parent_seq)
    kinds = [J.ENQUEUED, J.WAIT_RESOLVED, J.RUN_STARTED, J.RUN_FINISHED]
    for r in store.records(run_id, upto=seq, kinds=kinds):
        _note_dump(r, dumps)
    return dumps


def _loaded(
    load: Callable[[Any], Any], decoded: dict[int, Any], dumps: dict[int, Any], ev_id: int
) -> Any:
    """Event ``ev_id`` decoded (once: ``decoded`` keeps it), or None if the log has none."""
    if ev_id in decoded:
        return decoded[ev_id]
    dump = dumps.get(ev_id)
    if dump is None:
        return None
    try:
        event = load(dump)
    except CodecError:  # a class this program lacks: the checkpoint shows its JSON
        event = dump
    decoded[ev_id] = event
    return event


def _event_filter(
    event: type | str, resolve: Callable[[str], type] | None
) -> Callable[[str], bool]:
    """Whether a recorded class name is ``event``: a name (``module:Class`` or ``Class``), or a
    class, which ``resolve`` also finds under the other names of its module."""
    if isinstance(event, str):
        return lambda t: t == event or t.split(":")[-1] == event
    seen = {class_name(event): True}

    def is_event(t: str) -> bool:
        found = seen.get(t)
        if found is None:
            try:
                found = resolve is not None and resolve(t) is event
            except UnknownClassError:  # a class this program lacks is not the one asked for
                found = False
            seen[t] = found
        return found

    return is_event


def event_class(dump: J.Dump) -> str:
    """The class name an event's dump records (the Python type's name for a bare value)."""
    if isinstance(dump, dict):
        return str(dump.get("c", "")).partition("@")[0]  # without a version ("mod:Cls@2")
    return type(dump).__name__


def note_event(r: StoredRecord, p: Any, types: dict[int, str]) -> None:
    """Remembers the class of each event id a record introduces."""
    if r.kind == J.ENQUEUED:
        enqueued: J.Enqueued = p
        types[enqueued["id"]] = event_class(enqueued.get("event"))
    elif r.kind == J.WAIT_RESOLVED:
        resolved: J.WaitResolved = p
        answer_id = resolved.get("id")
        if answer_id is not None:
            types[answer_id] = event_class(resolved.get("event"))
    elif r.kind == J.RUN_STARTED:
        started: J.RunStarted = p
        start = started.get("start")
        if start:
            types[start["id"]] = event_class(start.get("event"))


def event_types_upto(store: EventStore, run_id: str, seq: int) -> dict[int, str]:
    """Event id -> class name for the events the run (and its ancestors) had up to ``seq``."""
    info = run_info(store, run_id)
    types: dict[int, str] = {}
    if info.parent_run_id is not None and info.parent_seq is not None:
        types = event_types_upto(store, info.parent_run_id, info.parent_seq)
    kinds = [J.ENQUEUED, J.WAIT_RESOLVED, J.RUN_STARTED]
    for r in readable_records(store, run_id, 0, seq, kinds):
        if isinstance(r, Damaged):
            continue  # the history shows it where it belongs
        with contextlib.suppress(Exception):  # a damaged payload names no event
            note_event(r, r.data(), types)
    return types
