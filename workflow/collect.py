"""How a step's ``list[E]`` parameter is released: LlamaIndex's collect selection.

A step that returns ``list[E]`` (a fan-out) opens a *stream*: each element is an event of
its own, and every event the steps make from them by returning one belongs to the stream
too. A step with a ``list[R]`` parameter (a collect step) takes the stream's ``R`` events
together, once, as one list::

    @step
    async def fan(self, ev: StartEvent) -> list[Item]:
        return [Item(i=i) for i in range(10)]

    @step(num_workers=4)
    async def work(self, ev: Item) -> Done | None: ...

    @step
    async def gather(self, done: list[Done]) -> StopEvent: ...

``gather`` runs once the stream closes (no event of it is queued or running any more),
with every ``Done`` that reached it, in the order they arrived; a stream of no events
(``return []``) gives ``[]``. ``Annotated[list[Done], Collect(Take(n))]`` runs it as soon
as ``n`` have arrived, with those ``n`` (or, if the stream closes first, with what did
arrive); the later ones are dropped. ``Annotated[list[Done], Collect()]`` is the default,
``Collect(All())``.

Events a step sends with ``ctx.send_event`` are not members of a stream; a stream's
events reaching a collect step are held by the run (durably: a resume holds them again)
and never run it one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["All", "Cardinality", "Collect", "Take"]


@dataclass(frozen=True)
class Cardinality:
    """When a collect step's list is released, and with which events: :class:`All` or
    :class:`Take` (this base class is no strategy of its own)."""


@dataclass(frozen=True)
class All(Cardinality):
    """Once the stream closes, with every event that reached the step (the default)."""


@dataclass(frozen=True)
class Take(Cardinality):
    """As soon as ``n`` events have reached the step, with those ``n``; with fewer if the
    stream closes first.

    :raises ValueError: ``n`` is not a whole number of at least 1.
    """

    n: int

    def __post_init__(self) -> None:
        if type(self.n) is not int or self.n < 1:
            msg = f"Take(n) takes a whole number n >= 1, not {self.n!r}"
            raise ValueError(msg)


@dataclass(frozen=True)
class Collect:
    """How a ``list[E]`` parameter is released, given in its annotation:
    ``Annotated[list[E], Collect(Take(1))]``.

    :raises TypeError: ``cardinality`` is not :class:`All` or :class:`Take`.
    """

    cardinality: Cardinality = field(default_factory=All)

    def __post_init__(self) -> None:
        if type(self.cardinality) not in (All, Take):
            msg = f"Collect() takes All() or Take(n), not {self.cardinality!r}"
            raise TypeError(msg)
