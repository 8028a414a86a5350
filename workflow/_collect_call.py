"""``ctx.collect_events`` inside an attempt: the change to the step's live buffer.

The buffer changes at once, on the event loop (no other attempt sees it half done); it is
not an OCC key, so collectors never conflict. The attempt records each put and take, and
the change is undone if it does not commit.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from eventstore import class_name

from ._attempt import Attempt
from ._buffers import buffer_key, default_buffer_id, join_buffer_id
from ._errors import WorkflowRuntimeError
from ._events import Event
from ._gather import CollectionReleaseEvent

if TYPE_CHECKING:
    from ._step import StepSpec

__all__ = ["CollectHost", "collect", "event_inputs", "join_inputs", "join_slot"]


class CollectHost(Protocol):
    """What collecting uses of the executor running the attempt (``RunHost``)."""

    def live_buffer(self, buf_key: str) -> dict[str, list[tuple[int, Event]]]: ...

    def new_event_id(self) -> int: ...

    def collect_put(self, att: Attempt, buf_key: str, entry: tuple[int, Event]) -> None: ...

    def collect_take(self, att: Attempt, buf_key: str, taken: list[tuple[int, Event]]) -> None: ...


def collect(
    host: CollectHost,
    att: Attempt,
    event: Event,
    expected: list[type[Event]],
    buffer_id: str | None,
    slot: type[Event] | None = None,
) -> list[Event] | None:
    """Buffers ``event`` for ``att``'s step; once one of each ``expected`` class is in,
    takes them and returns them in that order (None until then). ``slot``: the expected
    class it is buffered as (a join taking subclasses), else its own class.

    :raises WorkflowRuntimeError: two expected classes have the same name.
    """
    if not expected:
        return []
    names = [t.__qualname__ for t in expected]
    if len(set(names)) != len(set(expected)):
        clash = sorted(class_name(t) for t in set(expected) if names.count(t.__qualname__) > 1)
        msg = f"collect_events: {', '.join(clash)} have the same name; rename one of them"
        raise WorkflowRuntimeError(msg)
    slot = type(event) if slot is None else slot
    if slot not in expected:
        return None
    # Ids name no module: a run of `python app.py` (classes of __main__) continues in a
    # program that imports app.
    bid = default_buffer_id(att.step, names) if buffer_id is None else buffer_id
    key = buffer_key(att.step, bid)
    buf = host.live_buffer(key)
    ev_id = att.event_id if event is att.event else host.new_event_id()
    entry = (ev_id, event)
    buf.setdefault(slot.__qualname__, []).append(entry)
    att.collects.append((key, bid, entry, None if slot is type(event) else [slot.__qualname__]))
    host.collect_put(att, key, entry)
    need = Counter(names)
    if any(len(buf.get(n, ())) < k for n, k in need.items()):
        return None
    taken = []
    for n in names:
        events = buf[n]
        taken.append(events.pop(0))
        if not events:
            del buf[n]
    att.collects.append((key, bid, None, names))
    host.collect_take(att, key, taken)
    return [ev for _, ev in taken]


def join_slot(
    host: CollectHost, att: Attempt, slots: list[type[Event]], bid: str
) -> type[Event] | None:
    """The slot of a join taking subclasses that ``att``'s input fills: one of its exact
    class, else one of a base of it (in the parameters' order), one not yet filled first,
    as LlamaIndex fills them; None when no slot takes it."""
    event = att.event
    exact = [t for t in slots if type(event) is t]
    based = [t for t in slots if t not in exact and isinstance(event, t)]
    candidates = exact + based
    if not candidates:
        return None
    buf = host.live_buffer(buffer_key(att.step, bid))
    need = Counter(t.__qualname__ for t in slots)
    for t in candidates:
        if len(buf.get(t.__qualname__, ())) < need[t.__qualname__]:
            return t
    return candidates[0]


def join_inputs(
    host: CollectHost,
    att: Attempt,
    joins: tuple[tuple[str, type[Event]], ...],
    subclasses: bool = False,
) -> dict[str, Event] | None:
    """A join's arguments (a step with several event parameters, ``joins``): ``att``'s
    input waits in the step's own buffer until an event of each parameter's class is in;
    then each parameter takes one, by name (None until then)."""
    slots = [t for _, t in joins]
    bid = join_buffer_id(att.step, [t.__qualname__ for t in slots])
    slot = join_slot(host, att, slots, bid) if subclasses else None
    got = collect(host, att, att.event, slots, bid, slot)
    if got is None:
        return None
    return {name: ev for (name, _), ev in zip(joins, got, strict=True)}


def event_inputs(host: CollectHost, att: Attempt, spec: StepSpec) -> dict[str, Any] | None:
    """The event arguments of an attempt of ``spec`` (None: it does not run, and returns
    None): its input; a join's events once each is in; a collect step's released list
    (an event of no stream that reached it from outside is not run)."""
    if spec.joins:
        return join_inputs(host, att, spec.joins, spec.accept_event_subclasses)
    if spec.gathers is not None:
        if not isinstance(att.event, CollectionReleaseEvent):
            return None
        return {spec.gathers.param: list(att.event.events)}
    return {spec.event_param: att.event}
