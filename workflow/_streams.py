"""Collection streams: a fan-out's events, followed to the steps that take them as a list.

A step that returns ``list[E]`` opens a stream (:mod:`workflow.collect`); the events it
returned, and every event a step returns from one of them, are its members. A member that
reaches a collect step (a ``list[R]`` parameter) is *held* there, never run on its own.
The stream closes when none of its members is queued or running any more (a nested
stream counts as one member of its parent until it closes): each collect step the stream
binds to is then given one :class:`CollectionReleaseEvent` with the events it held, in the
order they arrived (``Take(n)`` releases at the n-th).

What is durable is in the log: members are ``enqueued`` with their ``stream`` (held ones
``held``), the fan-out's ``step_finished`` names the stream it ``opened``, and a release is
the ``enqueued`` release event (``release``: the stream, the ids it took, whether it
closes the stream). The counts are the executor's, made from those at each commit that
takes effect (in commit order, so exactly one sees a stream reach none) and rebuilt from
the fold on a resume, which also releases a stream that closed just before a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import _journal as journal
from ._commit import Flows, Planned
from ._events import Event
from ._gather import CollectionReleaseEvent, Gather

if TYPE_CHECKING:
    from eventstore import Codec, Record

    from ._folded import Folded

__all__ = ["StreamBook", "StreamHost", "bindings_of", "stream_book"]


class StreamHost(Protocol):
    """What the book uses of the executor running the run (``Executor``)."""

    @property
    def codec(self) -> Codec: ...

    @property
    def closing(self) -> bool: ...

    def new_event_id(self) -> int: ...

    def launch(self, work: Any) -> None: ...

    async def append(self, records: list[Record], **kw: Any) -> int: ...


@dataclass(slots=True)
class _Stream:
    source: str
    parent: str | None
    open: int = 0
    held: dict[str, list[tuple[int, Event]]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    closing: bool = False
    ids: list[int] = field(default_factory=list)  # its members' ids, to forget them at close


class StreamBook:
    """The run's open streams: how many of each one's members are live, what its collect
    steps hold, and the releases (see the module's docstring)."""

    def __init__(
        self,
        host: StreamHost,
        deliver: Callable[[str, int, Event], None],
        bindings: Mapping[str, Sequence[str]],
        gathers: Mapping[str, Gather],
    ) -> None:
        self._host = host
        self._deliver = deliver
        self._bindings = bindings  # fan-out step -> the collect steps its streams release to
        self._gathers = gathers  # collect step -> its list parameter
        self._names = frozenset(gathers)
        self._streams: dict[str, _Stream] = {}
        self._member: dict[int, str] = {}  # live member event id -> its stream

    def flows(self, step: str, event_id: int) -> Flows:
        """What the commit of an attempt of ``step`` at input ``event_id`` needs."""
        return Flows(self._member.get(event_id), bool(self._bindings.get(step)), self._names)

    def __bool__(self) -> bool:
        return bool(self._streams)

    def stream_of(self, event_id: int) -> str | None:
        """The stream event ``event_id`` is a member of, if any."""
        return self._member.get(event_id)

    def is_gather(self, step: str) -> bool:
        return step in self._gathers

    # ------------------------------------------------------------------ live

    def took_effect(self, step: str, event_id: int, planned: Planned) -> None:
        """An attempt of ``step`` at input ``event_id`` committed ``planned``: the stream it
        opened (a fan-out's), the member deliveries it made (step, id, event, stream) and
        those held at collect steps; its own input is done."""
        opened = planned.opened
        into = self._member.get(event_id)
        if opened is not None:
            self._streams[opened] = _Stream(step, into)
            if into is not None:
                self._streams[into].open += 1  # the nested stream, until it closes
        for _, ev_id, _, sid in planned.members:
            self._join(ev_id, sid)
        for target, ev_id, ev, sid in planned.held:
            self._hold(sid, target, ev_id, ev)
        if into is not None:
            self.done(event_id, into)
        if opened is not None:
            self._check(opened)  # a fan-out of no events closes at once

    def done(self, event_id: int, sid: str | None = None) -> None:
        """A member's delivery is over (its attempt committed, or its failure was handed
        to a ``@catch_error`` handler)."""
        sid = sid if sid is not None else self._member.get(event_id)
        st = None if sid is None else self._streams.get(sid)
        if st is None or sid is None:
            return
        st.open -= 1
        self._check(sid)

    def _hold(self, sid: str, step: str, ev_id: int, ev: Event) -> None:
        st = self._streams.get(sid)
        if st is None or step in st.released:
            return  # a Take(n) that already released: the later ones are dropped
        members = st.held.setdefault(step, [])
        members.append((ev_id, ev))
        take = self._gathers[step].take
        if take is not None and len(members) >= take:
            self._release(sid, [step], closes=False)

    def _check(self, sid: str) -> None:
        st = self._streams.get(sid)
        if st is None or st.open > 0 or st.closing:
            return
        st.closing = True
        self._release(sid, [c for c in self._bindings.get(st.source, ()) if c not in st.released])

    def _release(self, sid: str, steps: list[str], *, closes: bool = True) -> None:
        """Commits the release of what ``steps`` hold of stream ``sid`` (``closes``: the
        stream closes with it), then delivers it; the stream's parent counts each release
        as a member, and the closed stream no longer."""
        st = self._streams[sid]
        records: list[Record] = []
        deliveries: list[tuple[str, int, Event]] = []
        dump = self._host.codec.dump
        for step in steps:
            st.released.add(step)
            taken = st.held.pop(step, [])
            take = self._gathers[step].take
            if take is not None:
                taken = taken[:take]
            ev = CollectionReleaseEvent(
                events=[e for _, e in taken], stream_id=sid, binding_id=f"{st.source}->{step}"
            )
            rid = self._host.new_event_id()
            ids = [i for i, _ in taken]
            records.append(
                journal.enqueued_release(step, rid, dump(ev), sid, st.parent, ids, closes)
            )
            deliveries.append((step, rid, ev))
        if not records:
            if closes:
                self._closed(sid)
            return

        async def commit() -> None:
            await self._host.append(records)
            if self._host.closing:
                return
            self.delivered(deliveries, st.parent)
            if closes:
                self._closed(sid)

        self._host.launch(commit())

    def delivered(self, deliveries: Iterable[tuple[str, int, Event]], sid: str | None) -> None:
        """Release deliveries made, members of stream ``sid`` (None: of no stream)."""
        for step, rid, ev in deliveries:
            if sid is not None and sid in self._streams:
                self._join(rid, sid)
            self._deliver(step, rid, ev)

    def _join(self, ev_id: int, sid: str) -> None:
        """A delivery of member ``ev_id`` of stream ``sid`` is live."""
        st = self._streams[sid]
        if self._member.get(ev_id) != sid:
            self._member[ev_id] = sid
            st.ids.append(ev_id)
        st.open += 1

    def _closed(self, sid: str) -> None:
        st = self._streams.pop(sid)
        for ev_id in st.ids:
            if self._member.get(ev_id) == sid:
                del self._member[ev_id]
        if st.parent is not None and st.parent in self._streams:
            self._streams[st.parent].open -= 1
            self._check(st.parent)

    # ------------------------------------------------------------------ resume

    def restore(self, folded: Folded, load: Any, steps: Iterable[str]) -> None:
        """The streams a resumed run left open, from its fold; then those that closed just
        before the process stopped are released."""
        if not folded.streams:
            return
        streams = self._streams
        for sid, (parent, source) in folded.streams.items():
            streams[sid] = _Stream(source, parent)
        for st in streams.values():
            if st.parent is not None and st.parent in streams:
                streams[st.parent].open += 1  # a nested stream still open
        for key in folded.released:
            sid, _, step = key.rpartition("|")
            if sid in streams:
                streams[sid].released.add(step)
        known = set(steps)
        live = [eid for step, q in folded.queues.items() if step in known for eid in q]
        live += [eid for step, ps in folded.in_progress.items() if step in known for eid in ps]
        for eid in live:
            member = folded.members.get(eid)
            if member is not None and member in streams:
                self._join(eid, member)
        for step, evs in folded.held.items():
            for eid, ev in evs.items():
                holder = streams.get(folded.members.get(eid, ""))
                if holder is not None and step not in holder.released:
                    holder.held.setdefault(step, []).append((eid, load(ev.dump)))
        for sid in list(streams):
            self._check(sid)


class _Graph(Protocol):
    """What the book reads of the run's step graph (``Graph``)."""

    steps: dict[str, Any]

    def collect_bindings(self) -> dict[str, tuple[str, ...]]: ...


def stream_book(
    host: StreamHost, graph: _Graph, deliver: Callable[[str, int, Event], None]
) -> StreamBook | None:
    """The book of a run of these steps; None when no step takes a list (nothing to count)."""
    gathers = {n: s.gathers for n, s in graph.steps.items() if s.gathers is not None}
    if not gathers:
        return None
    return StreamBook(host, deliver, graph.collect_bindings(), gathers)


def bindings_of(
    steps: Mapping[str, Any], route: Callable[[type[Event]], Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """For each fan-out step, the collect steps its streams release to: those its list's
    events reach through the steps they run. A collect step ends the way (its release is
    an event of the level the stream closes into); another fan-out opens a level of its
    own, whose collect steps' events go on at this one."""
    out: dict[str, tuple[str, ...]] = {}

    def of(name: str, visiting: frozenset[str]) -> tuple[str, ...]:
        if name in out:
            return out[name]
        seen: set[type[Event]] = set()
        frontier = list(steps[name].returns)
        reached: list[str] = []
        while frontier:
            t = frontier.pop()
            if t in seen:
                continue
            seen.add(t)
            for target in route(t):
                spec = steps[target]
                if spec.gathers is not None:
                    if target not in reached:
                        reached.append(target)
                elif spec.fans_out and target != name and target not in visiting:
                    for c in of(target, visiting | {name}):
                        frontier.extend(steps[c].returns)
                elif not spec.fans_out:
                    frontier.extend(spec.returns)
        out[name] = tuple(reached)
        return out[name]

    for name, spec in steps.items():
        if spec.fans_out:
            of(name, frozenset())
    return out
