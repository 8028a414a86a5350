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

__all__ = ["ANY_SLOT", "CollectHost", "collect", "event_inputs", "join_inputs", "join_subclasses"]


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
) -> list[Event] | None:
    """Buffers ``event`` for ``att``'s step; once one of each ``expected`` class is in,
    takes them and returns them in that order (None until then).

    :raises WorkflowRuntimeError: two expected classes have the same name.
    """
    if not expected:
        return []
    names = [t.__qualname__ for t in expected]
    if len(set(names)) != len(set(expected)):
        clash = sorted(class_name(t) for t in set(expected) if names.count(t.__qualname__) > 1)
        msg = f"collect_events: {', '.join(clash)} have the same name; rename one of them"
        raise WorkflowRuntimeError(msg)
    if type(event) not in expected:
        return None
    # Ids name no module: a run of `python app.py` (classes of __main__) continues in a
    # program that imports app.
    bid = default_buffer_id(att.step, names) if buffer_id is None else buffer_id
    key = buffer_key(att.step, bid)
    buf = host.live_buffer(key)
    ev_id = att.event_id if event is att.event else host.new_event_id()
    entry = (ev_id, event)
    buf.setdefault(type(event).__qualname__, []).append(entry)
    att.collects.append((key, bid, entry, None))
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


# The slot every input of a join taking subclasses waits in, unassigned (no class has this
# name): which parameter each fills is decided when a full set is in.
ANY_SLOT = "*"


def join_subclasses(
    host: CollectHost, att: Attempt, slots: list[type[Event]], bid: str
) -> list[Event] | None:
    """A join taking subclasses: ``att``'s input waits, in arrival order, with the others
    until the parameters (in their order) can each take one, each the first in arrival
    order that leaves the later parameters one (as LlamaIndex 2.26 assigns them); then
    those are taken, in the parameters' order (None until then)."""
    event = att.event
    if not any(isinstance(event, t) for t in slots):
        return None
    key = buffer_key(att.step, bid)
    buf = host.live_buffer(key)
    entry = (att.event_id, event)
    waiting = buf.setdefault(ANY_SLOT, [])
    waiting.append(entry)
    att.collects.append((key, bid, entry, [ANY_SLOT]))
    host.collect_put(att, key, entry)
    chosen = _assign(slots, waiting, [])
    if chosen is None:
        return None
    taken = [waiting[i] for i in chosen]
    buf[ANY_SLOT] = [e for i, e in enumerate(waiting) if i not in chosen]
    if not buf[ANY_SLOT]:
        del buf[ANY_SLOT]
    att.collects.append((key, bid, None, [ANY_SLOT] * len(taken)))
    host.collect_take(att, key, taken)
    return [ev for _, ev in taken]


def _assign(
    slots: list[type[Event]], waiting: list[tuple[int, Event]], chosen: list[int]
) -> list[int] | None:
    """Indexes into ``waiting`` for the slots from ``len(chosen)`` on (a search in the
    parameters' order, each trying the events in arrival order), or None."""
    if len(chosen) == len(slots):
        return chosen
    want = slots[len(chosen)]
    for i, (_, ev) in enumerate(waiting):
        if i not in chosen and isinstance(ev, want):
            found = _assign(slots, waiting, [*chosen, i])
            if found is not None:
                return found
    return None


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
    if subclasses:
        got = join_subclasses(host, att, slots, bid)
    else:
        got = collect(host, att, att.event, slots, bid)
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
