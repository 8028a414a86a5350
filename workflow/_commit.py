"""What an attempt's outcome writes: the outcome types, and the records of each, built by
pure functions (no executor, no store: tested on their own in tests/test_commit.py).

An attempt ends in one of three ways (:data:`Outcome`): the step returned (:class:`Returned`),
it waits for an event (:class:`Waited`), or it raised (:class:`Raised`). The executor turns
the outcome into records here, writes them, and only once they are durable applies what
:class:`Planned` says takes effect (durable before visible).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import orjson

from eventstore import EncodeError, Record

from . import _journal as journal
from ._attempt import Attempt, WaitRequest
from ._changes import refused
from ._errors import WorkflowRuntimeError
from ._events import Event, InputRequiredEvent, StopEvent

if TYPE_CHECKING:
    from eventstore import Codec

__all__ = [
    "Outcome",
    "Planned",
    "Raised",
    "Returned",
    "Waited",
    "asked",
    "commit_of",
    "event_json",
    "failure_record",
    "streamed_records",
    "wait_records",
]


@dataclass(frozen=True, slots=True)
class Returned:
    """The step returned ``result`` (None: it returned nothing)."""

    result: Event | None


@dataclass(frozen=True, slots=True)
class Waited:
    """The step called ``wait_for_event`` (or a durable ``sleep``) with no answer yet."""

    request: WaitRequest


@dataclass(frozen=True, slots=True)
class Raised:
    """The step raised ``error`` (or returned what is not an event), with its traceback."""

    error: Exception
    traceback: str


Outcome = Returned | Waited | Raised


class Planned(NamedTuple):
    """The commit of a returned attempt: its records, and what takes effect once durable.

    ``ids`` are the new ids of ``emitted`` (in order); ``deliveries`` the (step, event id,
    event) each routed event reaches; ``unrouted`` the (event id, event) of those no step
    takes (they may answer a wait); ``asked`` the questions no step takes, streamed once
    the commit is durable; ``stop`` the StopEvent that finishes the run (its id and event).
    A named tuple: one is made for every step, and a frozen dataclass costs a call of
    ``object.__setattr__`` a field.
    """

    records: list[Record]
    ids: list[int]
    emitted: list[tuple[Event, str | None]]
    deliveries: list[tuple[str, int, Event]]
    unrouted: list[tuple[int, Event]]
    asked: list[Event]
    stop: tuple[int, StopEvent] | None
    # Collection streams (``_streams``): the stream a fan-out opened, the deliveries of
    # members (step, id, event, stream) and the members held at collect steps.
    opened: str | None = None
    members: list[tuple[str, int, Event, str]] = []  # noqa: RUF012 - never mutated
    held: list[tuple[str, int, Event, str]] = []  # noqa: RUF012 - never mutated


_log = logging.getLogger("workflow")


class Flows(NamedTuple):
    """What an attempt's commit needs of the run's collection streams: the stream its
    input is a member of, whether the streams its step's lists open release to a collect
    step (else its list's events stay in ``into``), and the collect steps."""

    into: str | None
    bound: bool
    gathers: frozenset[str]


def event_json(codec: Codec, ev: Event, how: str) -> orjson.Fragment:
    """An event's JSON for a record, checked: what the log cannot hold is refused ``how``."""
    try:
        return orjson.Fragment(codec.encode(ev, name=type(ev).__name__))
    except EncodeError as exc:
        raise refused(exc, how) from None


def streamed_records(codec: Codec, att: Attempt) -> list[Record]:
    """The ``streamed`` records of what the attempt wrote to the stream (JSON made when it
    was streamed is reused)."""
    records = []
    for e in att.streamed:
        text = None if att.encoded is None else att.encoded.get(id(e))
        if text is None:
            text = event_json(codec, e, "refused by ctx.write_event_to_stream")
        records.append(journal.streamed(att.step, att.event_id, att.attempt, text))
    return records


def _event_dump(codec: Codec, att: Attempt, ev: Event, verb: str) -> Any:
    """An event's dump for a record of the attempt's commit, which it ``verb`` (returned,
    sent, collected); its strings are checked as the record is serialized."""
    try:
        return codec.dump(ev, name=type(ev).__name__)
    except EncodeError as exc:
        raise refused(exc, f"step {att.step!r} {verb} it") from None


@functools.lru_cache(maxsize=1024)
def _role(cls: type[Event]) -> int:
    """What events of ``cls`` do in a commit: 1 a StopEvent, 2 a question
    (InputRequiredEvent), 0 anything else. By class, cached: ``isinstance`` on a pydantic
    model class runs its metaclass's Python-level ``__instancecheck__``, twice an event."""
    if issubclass(cls, StopEvent):
        return 1
    return 2 if issubclass(cls, InputRequiredEvent) else 0


def asked(ev: Event, target: str | None, route: Callable[[type[Event]], Sequence[str]]) -> bool:
    """Whether a commit streams ``ev`` as a question instead of emitting it: an
    InputRequiredEvent sent to no step in particular, which no step takes."""
    return _role(type(ev)) == 2 and target is None and not route(type(ev))


def _verb(ev: Event, result: Event | None) -> str:
    """How an attempt's commit names what it did with ``ev``: returned it, or sent it."""
    return "returned" if ev is result else "sent"


def _refuse_text(
    codec: Codec, att: Attempt, emitted: list[tuple[Event, str | None]], result: Event | None
) -> None:
    """Raises the refusal of the event whose record orjson could not serialize."""
    events = [(put[1], "collected") for _, _, put, _ in att.collects if put is not None]
    events += [(ev, "returned" if ev is result else "sent") for ev, _ in emitted]
    for ev, verb in events:
        try:
            codec.encode(ev, name=type(ev).__name__)
        except EncodeError as exc:
            raise refused(exc, f"step {att.step!r} {verb} it") from None


def commit_of(
    att: Attempt,
    outcome: Returned,
    state_records: list[Record],
    *,
    codec: Codec,
    route: Callable[[type[Event]], Sequence[str]],
    first_id: int,
    flows: Flows | None = None,
) -> Planned:
    """The commit of an attempt that returned: ``step_finished``, its context changes
    (``state_records``), collects, the events it sent and returned (ids from ``first_id``,
    one per event), what it streamed and asked, and ``run_finished`` for a StopEvent.

    :raises EncodeError: an event it emitted or collected cannot be stored.
    """
    step = att.step
    result = outcome.result
    emitted: list[tuple[Event, str | None]] = list(att.sent)
    if result is not None:
        emitted.append((result, None))
    # One id per event, in order: known before any record is made.
    ids = list(range(first_id, first_id + len(emitted)))
    deliveries: list[tuple[str, int, Event]] = []
    unrouted: list[tuple[int, Event]] = []
    stop: tuple[int, StopEvent] | None = None
    stop_dump: Any = None
    # Questions no step takes: streamed once this commit is durable, as it records them.
    asked: list[tuple[Event, orjson.Fragment]] = []
    base = att.collect_base
    for seq in att.reads.values():
        if seq > base:
            base = seq
    dump = codec.dump
    source = [att.event_id, att.attempt]
    opened = None
    if flows is not None and att.spread is not None and flows.bound:
        opened = f"{step}:{att.event_id}"
    members: list[tuple[str, int, Event, str]] = []
    held: list[tuple[str, int, Event, str]] = []
    try:  # events are dumped (checked but for their strings) and serialized once, here
        records = [
            journal.step_finished(
                step, att.event_id, att.attempt, ids, base, att.answers_used, opened
            ),
            *state_records,
        ]
        takes = iter(att.taken)  # each take's entries, in the order of the takes
        for _, buf, put, take in att.collects:
            put_json: journal.EventRef | None = None
            taken_ids: list[int] | None = None
            slot = None
            if put is not None:
                put_json = {"id": put[0], "event": _event_dump(codec, att, put[1], "collected")}
                slot, take = (take[0] if take else None), None  # a put's: the slot it fills
            elif take:
                taken_ids = [ev_id for ev_id, _ in next(takes)[1]]
            records.append(journal.collected(step, buf, put_json, take, taken_ids, slot))
        for ev_id, (ev, target) in zip(ids, emitted, strict=True):
            role = _role(type(ev))
            if role == 1:
                if stop is None:
                    stop = (ev_id, cast("StopEvent", ev))
                    stop_dump = _event_dump(codec, att, ev, _verb(ev, result))
                continue
            if role == 2 and target is None and not route(type(ev)):  # as asked() says
                asked.append((ev, event_json(codec, ev, f"step {step!r} {_verb(ev, result)} it")))
                continue
            try:
                d = dump(ev)
            except EncodeError:
                d = _event_dump(codec, att, ev, _verb(ev, result))  # raises, naming the event
            targets = (target,) if target is not None else route(type(ev))
            if not targets:
                records.append(journal.enqueued(None, ev_id, d, source))
                unrouted.append((ev_id, ev))
                continue
            if flows is not None:
                stream = _stream_of(att, flows, opened, ev_id - first_id, ev is result)
                routed = _Routed(records, deliveries, members, held)
                _flow_targets(att, flows, stream, target, ev_id, ev, d, targets, routed)
                continue
            for t in targets:
                records.append(journal.enqueued(t, ev_id, d, source))
                deliveries.append((t, ev_id, ev))
        if att.streamed:
            records.extend(streamed_records(codec, att))
        if asked:
            # Recorded as streamed by this commit only: a conflicted or failed attempt
            # never asked them.
            records.extend(
                journal.streamed(step, att.event_id, att.attempt, text) for _, text in asked
            )
        if stop is not None:
            records.append(journal.run_finished(stop_dump, stop[0]))
    except orjson.JSONEncodeError:
        _refuse_text(codec, att, emitted, result)
        raise
    questions = [q for q, _ in asked] if asked else []
    return Planned(
        records, ids, emitted, deliveries, unrouted, questions, stop, opened, members, held
    )


class _Routed(NamedTuple):
    """Where :func:`_flow_targets` puts what it makes (``commit_of``'s lists)."""

    records: list[Record]
    deliveries: list[tuple[str, int, Event]]
    members: list[tuple[str, int, Event, str]]
    held: list[tuple[str, int, Event, str]]


def _stream_of(
    att: Attempt, flows: Flows, opened: str | None, index: int, returned: bool
) -> str | None:
    """The stream of the attempt's ``index``-th emitted event: a fan-out list's events are
    members of the stream it opened (of its input's when no collect step takes that
    stream's events), what it returned of its input's, what it sent of none."""
    spread = att.spread
    if spread is not None and not returned and index >= spread:
        return opened if opened is not None else flows.into
    return flows.into if returned else None


def _flow_targets(
    att: Attempt,
    flows: Flows,
    stream: str | None,
    target: str | None,
    ev_id: int,
    ev: Event,
    d: Any,
    targets: Sequence[str],
    out: _Routed,
) -> None:
    """The records of an emitted event in a run with collection streams: enqueued with its
    ``stream``, held at the collect steps it reaches; a collect step takes no event of no
    stream (it is not enqueued there).

    :raises WorkflowRuntimeError: an event of no stream sent to a collect step by name.
    """
    source = [att.event_id, att.attempt]
    for t in targets:
        if t in flows.gathers:
            if stream is None:
                if target is None:
                    _log.warning(
                        "Ignoring %s for collect step %r: sent outside any collection stream (it"
                        " is not a member of a fan-out's stream)",
                        type(ev).__name__,
                        t,
                    )
                else:
                    msg = (
                        f"{type(ev).__name__} was sent to collect step {t!r} by name"
                        " (send_event(step=...)), but a collect step cannot receive targeted"
                        " events: it takes the events of a fan-out's stream as one list"
                    )
                    raise WorkflowRuntimeError(msg)
                continue
            out.records.append(journal.enqueued(t, ev_id, d, source, stream, held=True))
            out.held.append((t, ev_id, ev, stream))
            continue
        out.records.append(journal.enqueued(t, ev_id, d, source, stream))
        out.deliveries.append((t, ev_id, ev))
        if stream is not None:
            out.members.append((t, ev_id, ev, stream))


def failure_record(
    att: Attempt,
    outcome: Raised,
    *,
    delay: float | None,
    retry_at: float | None,
    elapsed: float,
    with_traceback: bool = True,
) -> Record:
    """The ``step_failed`` record of an attempt that raised (``delay`` None: no retry)."""
    return journal.step_failed(
        att.step,
        att.event_id,
        att.attempt,
        outcome.error,
        outcome.traceback if with_traceback else "",
        delay is not None,
        delay,
        retry_at,
        elapsed,
    )


def wait_records(
    codec: Codec, att: Attempt, request: WaitRequest, deadline: float | None
) -> list[Record]:
    """The ``waiting`` record of an attempt that waits (due at ``deadline``), and what it
    streamed (its question first, when it is to be asked)."""
    dump = codec.dump
    question = request.waiter_event
    return [
        journal.waiting(
            att.step,
            att.event_id,
            att.attempt,
            request.waiter_id,
            request.awaited_name,
            dump(request.requirements),
            deadline,
            None if question is None else dump(question),
        ),
        *streamed_records(codec, att),
    ]
