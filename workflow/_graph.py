"""The step graph: which step takes which event, validation, and its fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from eventstore import class_name

from ._catch_error import StepFailedEvent
from ._errors import WorkflowValidationError
from ._events import Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent
from ._journal import StepShape
from ._step import StepSpec

__all__ = ["Graph"]


class Graph:
    """Routes events to steps and says whether the steps form a runnable workflow."""

    def __init__(self, steps: Mapping[str, StepSpec]) -> None:
        self.steps = dict(steps)
        self._routes: dict[type, tuple[str, ...]] = {}
        # Accepted class -> steps, so routing walks an event's bases, not every step.
        self._takers: dict[type, list[str]] = {}
        for name, spec in self.steps.items():
            for t in spec.accepted:
                self._takers.setdefault(t, []).append(name)

    def route(self, event_type: type) -> tuple[str, ...]:
        """The steps that take events of this class (its own or a base class's annotation)."""
        found = self._routes.get(event_type)
        if found is None:
            names = {n for base in event_type.__mro__ for n in self._takers.get(base, ())}
            found = tuple(n for n in self.steps if n in names)  # in declaration order
            self._routes[event_type] = found
        return found

    def event_types(self) -> set[type[Event]]:
        """Every event class a step takes or emits."""
        out: set[type[Event]] = set()
        for spec in self.steps.values():
            out.update(spec.accepted)
            out.update(spec.returns)
        return out

    def validate(self, workflow: str) -> None:
        """Raises :class:`WorkflowValidationError` naming the first problem found."""
        if not self.steps:
            msg = f"{workflow} has no steps (decorate async methods with @step)"
            raise WorkflowValidationError(msg)
        takers = [
            n for n, s in self.steps.items() if any(issubclass(StartEvent, t) for t in s.accepted)
        ]
        if not takers:
            msg = f"{workflow}: no step takes StartEvent, so a run could never begin"
            raise WorkflowValidationError(msg)
        if not any(issubclass(t, StopEvent) for s in self.steps.values() for t in s.returns):
            msg = f"{workflow}: no step returns a StopEvent, so a run could never finish"
            raise WorkflowValidationError(msg)
        for name, spec in self.steps.items():
            for t in spec.returns:
                if issubclass(t, StopEvent | InputRequiredEvent):
                    continue  # these leave the graph: the result, or a question to a human
                if not self.route(t):
                    msg = f"{workflow}: step {name!r} produces {t.__name__}, which no step consumes"
                    raise WorkflowValidationError(msg)
        # Every class some produced event is an instance of (its bases included).
        produced = {b for s in self.steps.values() for t in s.returns for b in t.__mro__}
        for name, spec in self.steps.items():
            for t in spec.accepted:
                if issubclass(StartEvent, t) or issubclass(
                    t, HumanResponseEvent | StopEvent | StepFailedEvent
                ):
                    # StartEvent comes from run(); a human's response from send(); a
                    # failure from the engine, for a @catch_error handler
                    continue
                if t not in produced:
                    msg = f"{workflow}: step {name!r} consumes {t.__name__}, which no step produces"
                    raise WorkflowValidationError(msg)

    def fingerprint(self) -> str:
        """A short hash of the steps and the event classes between them.

        Classes count by qualified name without module: a script run as ``python app.py``
        (module ``__main__``) and the same code imported as ``app`` have one fingerprint.
        """
        lines = sorted(
            f"{n}:{','.join(sorted(t.__qualname__ for t in s.accepted))}"
            f"->{','.join(sorted(t.__qualname__ for t in s.returns))}"
            for n, s in self.steps.items()
        )
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, StepShape]:
        """The graph as plain data: each step's accepted and returned event classes."""
        return {
            n: {
                "accepts": sorted(map(class_name, s.accepted)),
                "returns": sorted(map(class_name, s.returns)),
            }
            for n, s in self.steps.items()
        }


def names(types_: Iterable[type]) -> list[str]:
    """Qualified names of classes, as the log writes them."""
    return [class_name(t) for t in types_]
