"""A step's queue of deliveries, which can hand a delivery to the worker that made it.

``asyncio.Queue`` wakes a waiting worker on every put. When a worker's commit delivers
the next event to its own step and nothing else is queued there, that worker takes the
event itself as soon as it returns to the queue (a queue that is not empty is read
without waiting), so the worker woken by the put only finds the queue empty again: one
more event-loop iteration per step of a loop for nothing. :meth:`StepQueue.put` with
``wake=False`` leaves that waiter asleep; the delivery is then owed to the caller, which
must read the queue before it next waits (the step runner does, with no ``await`` in
between). Which worker takes which delivery is what it was with ``asyncio.Queue``; only
the pointless wake is gone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["StepQueue"]

T = TypeVar("T")


class StepQueue(Generic[T]):
    """An unbounded FIFO for one step's workers (one event loop)."""

    __slots__ = ("_getters", "_items", "wakes")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self.wakes = 0  # waiting workers woken so far (what the hand-off saves shows here)

    def qsize(self) -> int:
        """How many deliveries wait."""
        return len(self._items)

    def empty(self) -> bool:
        """Whether no delivery waits."""
        return not self._items

    def put(self, item: T, *, wake: bool = True) -> None:
        """Queues ``item``; with ``wake`` it wakes one waiting worker for it."""
        self._items.append(item)
        if wake:
            self._wake()

    def _wake(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                self.wakes += 1
                return

    async def get(self) -> T:
        """The oldest item, waiting for one if none is queued."""
        while not self._items:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                if getter in self._getters:
                    self._getters.remove(getter)
                elif self._items:
                    self._wake()  # it was woken for an item it will not take: pass it on
                raise
        return self._items.popleft()
