"""The live collect buffers of a run (``ctx.collect_events``), owned by its executor.

A put or a take changes the live buffer at once, atomically on the event loop, so collectors
never conflict (collect buffers are not OCC keys: DESIGN.md, "No lost updates"); the change is
undone if its attempt does not commit. An attempt that took what another put commits after
it, or not at all if that one does not commit.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ._events import Event

if TYPE_CHECKING:
    from ._attempt import Attempt

__all__ = ["COLLECT_PREFIX", "CollectBuffers"]

# The version key of a collect buffer among the context's versions.
COLLECT_PREFIX = "\x00collect:"


class CollectBuffers:
    """The buffers, with the puts not committed yet and the puts undone while taken.

    ``versions`` is the live context's (each buffer's version is kept there, under
    ``COLLECT_PREFIX`` + its key).
    """

    def __init__(self, versions: dict[str, int]) -> None:
        self.buffers: dict[str, dict[str, list[tuple[int, Event]]]] = {}
        self._versions = versions
        # Puts into live buffers not committed yet, by event id, and the puts undone while
        # another attempt held them taken (by id of the entry, which that attempt holds).
        self._put_owner: dict[int, Attempt] = {}
        self._dead_puts: set[int] = set()

    def live_buffer(self, buf_key: str) -> dict[str, list[tuple[int, Event]]]:
        """The live collect buffer ``buf_key``, which collect_events changes in place."""
        buf = self.buffers.get(buf_key)
        if buf is None:
            buf = self.buffers[buf_key] = {}
        return buf

    def put(self, att: Attempt, buf_key: str, entry: tuple[int, Event]) -> None:
        """An attempt put ``entry`` in a live buffer; it is pending until the attempt commits."""
        att.collect_base = max(att.collect_base, self._versions.get(COLLECT_PREFIX + buf_key, 0))
        if att.outcome is None:
            att.outcome = asyncio.get_running_loop().create_future()
        self._put_owner[entry[0]] = att

    def take(self, att: Attempt, buf_key: str, taken: list[tuple[int, Event]]) -> None:
        """An attempt took ``taken`` out of a live buffer: its commit must follow the commits
        of the attempts that put them, and it cannot commit if one of those is undone."""
        att.taken.append((buf_key, taken))
        for ev_id, _ in taken:
            owner = self._put_owner.get(ev_id)
            if owner is None or owner is att or owner.outcome is None:
                continue
            # Two attempts that each took what the other put (two buffers, two calls each)
            # would wait for each other: that rare order is committed as it comes.
            if att in owner.deps:
                continue
            att.deps.append(owner)

    def settle(self, att: Attempt, *, committed: bool, seq: int = 0) -> None:
        """Settles an attempt's collects: kept when it committed (at ``seq``), else undone
        in reverse."""
        for key, _, put, _ in att.collects:
            if put is not None and self._put_owner.get(put[0]) is att:
                del self._put_owner[put[0]]
            if committed:
                self._versions[COLLECT_PREFIX + key] = seq
        if not committed:
            # Each take's slot names, in the order of the takes (att.taken holds their entries).
            names = [n for _, _, put, n in att.collects if put is None and n]
            for (key, entries), slots in reversed(list(zip(att.taken, names, strict=True))):
                buf = self.live_buffer(key)
                for entry, slot in reversed(list(zip(entries, slots, strict=True))):
                    if id(entry) in self._dead_puts:  # its put was undone: it is gone
                        self._dead_puts.discard(id(entry))
                        continue
                    buf.setdefault(slot, []).insert(0, entry)
            for key, _, put, filled in reversed(att.collects):
                if put is None:
                    continue
                name = filled[0] if filled else type(put[1]).__qualname__
                events = self.live_buffer(key).get(name)
                i = next((i for i, e in enumerate(events or ()) if e is put), None)
                if events is not None and i is not None:
                    del events[i]
                    if not events:
                        del self.buffers[key][name]
                else:  # taken by an attempt not yet committed, which must not commit now
                    self._dead_puts.add(id(put))
        att.collects.clear()
        att.taken.clear()
        att.deps.clear()
        if att.outcome is not None and not att.outcome.done():
            att.outcome.set_result(committed)
        att.outcome = None
