"""The step graph: which step takes which event, validation, and its fingerprint."""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Iterable, Mapping

from eventstore import class_name

from ._catch_error import StepFailedEvent
from ._errors import (
    WorkflowConfigurationError,
    WorkflowRuntimeError,
    WorkflowStepDoesNotExistError,
    WorkflowValidationError,
)
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
        self._bindings: dict[str, tuple[str, ...]] | None = None

    def route(self, event_type: type) -> tuple[str, ...]:
        """The steps that take events of this class: those annotated with the class itself,
        and (``accept_event_subclasses=True``) those annotated with one of its bases.

        As in LlamaIndex an event goes by its exact class unless a step opts in.
        """
        found = self._routes.get(event_type)
        if found is None:
            names = set(self._takers.get(event_type, ()))
            for base in event_type.__mro__[1:]:
                names.update(
                    n for n in self._takers.get(base, ()) if self.steps[n].accept_event_subclasses
                )
            found = tuple(n for n in self.steps if n in names)  # in declaration order
            self._routes[event_type] = found
        return found

    def check_target(self, step: str, event: Event) -> None:
        """Refuses an event addressed to ``step`` (``send_event(ev, step=...)``) when no
        step has that name or that step would not take the event: it would run a step
        with an event its signature does not name. LlamaIndex's errors and wording.

        :raises WorkflowStepDoesNotExistError: no step is named ``step``.
        :raises WorkflowRuntimeError: the step does not take events of this class.
        """
        if step not in self.steps:
            msg = f"Step {step} does not exist"
            raise WorkflowStepDoesNotExistError(msg)
        if step not in self.route(type(event)):
            msg = f"Step {step} does not accept event of type {type(event)}"
            raise WorkflowRuntimeError(msg)

    def outside_events(self) -> list[type[Event]]:
        """The event classes steps take that only come from outside the run: a
        :class:`HumanResponseEvent` (an answer), or a class no step returns (besides the
        start event), in the steps' order."""
        returned = {t for spec in self.steps.values() for t in spec.returns}
        out: list[type[Event]] = []
        for spec in self.steps.values():
            for t in spec.accepted:
                if t in out or issubclass(t, StartEvent):
                    continue
                if issubclass(t, HumanResponseEvent) or t not in returned:
                    out.append(t)
        return out

    def event_types(self) -> set[type[Event]]:
        """Every event class a step takes or emits."""
        out: set[type[Event]] = set()
        for spec in self.steps.values():
            out.update(spec.accepted)
            out.update(spec.returns)
        return out

    def start_event_class(self) -> type[StartEvent]:
        """The StartEvent class the steps take (StartEvent itself when none does)."""
        found = self._classes(StartEvent, returned=False)
        return typing.cast("type[StartEvent]", found[0]) if len(found) == 1 else StartEvent

    def stop_event_class(self) -> type[StopEvent]:
        """The StopEvent class the steps return (StopEvent itself when none does)."""
        found = self._classes(StopEvent, returned=True)
        return typing.cast("type[StopEvent]", found[0]) if len(found) == 1 else StopEvent

    def _classes(self, base: type[Event], *, returned: bool) -> list[type[Event]]:
        out: list[type[Event]] = []
        for s in self.steps.values():
            for t in s.returns if returned else s.accepted:
                if issubclass(t, base) and t not in out:
                    out.append(t)
        return out

    def validate(self, workflow: str, skip_checks: Iterable[str] = ()) -> None:
        """Raises naming the first problem found, with LlamaIndex's checks and messages.

        :raises WorkflowConfigurationError: no steps, no step taking a StartEvent or none
            returning a StopEvent, or more than one class of either.
        :raises WorkflowValidationError: a step takes StopEvent, an event is consumed but
            never produced or produced but never consumed, or a graph check fails
            (``reachability``: a step no event from the start can reach; ``dead_end``: a
            step from which no StopEvent can be reached), unless skipped.
        """
        self.validate_config(workflow)
        self._validate_graph(workflow, skip_checks)

    def validate_config(self, workflow: str) -> None:
        """The checks LlamaIndex makes when the workflow is built: steps, and one class
        each of StartEvent taken and StopEvent returned.

        :raises WorkflowConfigurationError: no steps, no step taking a StartEvent or none
            returning a StopEvent, or more than one class of either.
        """
        if not self.steps:
            msg = (
                f"Workflow '{workflow}' has no configured steps. Did you forget to annotate"
                " methods with @step or to register free-function steps via"
                " @step(workflow=...)?"
            )
            raise WorkflowConfigurationError(msg)
        for base, returned, verb in ((StartEvent, False, "accepts"), (StopEvent, True, "returns")):
            found = self._classes(base, returned=returned)
            name = base.__name__
            if not found:
                how = "returned" if returned else "received"
                msg = (
                    f"At least one Event of type {name} must be {how} by any step."
                    f" (Workflow '{workflow}' has no @step that {verb} {name}.)"
                )
                raise WorkflowConfigurationError(msg)
            if len(found) > 1:
                listed = ", ".join(t.__name__ for t in found)
                msg = (
                    f"Only one type of {name} is allowed per workflow, found {len(found)}:"
                    f" {listed} in workflow '{workflow}'."
                )
                raise WorkflowConfigurationError(msg)

    def _validate_graph(self, workflow: str, skip_checks: Iterable[str]) -> None:
        bad = [
            n for n, s in self.steps.items() if any(issubclass(t, StopEvent) for t in s.accepted)
        ]
        if bad:
            names = "', '".join(bad)
            msg = (
                f"Step{'' if len(bad) == 1 else 's'} '{names}' cannot accept"
                " StopEvent. StopEvent signals the end of the workflow. Use a different Event"
                " type instead."
            )
            raise WorkflowValidationError(msg)
        start = self.start_event_class()
        produced = {t for s in self.steps.values() for t in s.returns} | {start}
        # A human's response comes from send(); a failure from the engine, for @catch_error.
        boundary_in = (InputRequiredEvent, HumanResponseEvent, StopEvent, StepFailedEvent)
        orphans: dict[str, str] = {}
        for name, spec in self.steps.items():
            for t in spec.accepted:
                if issubclass(t, boundary_in) or name in self._produced_takers(produced, t):
                    continue
                orphans.setdefault(t.__name__, name)
        if orphans:
            where = "; ".join(f"step {s!r} consumes {t}" for t, s in orphans.items())
            msg = (
                "The following events are consumed but never produced:"
                f" {', '.join(orphans)} ({where}, which no step produces)"
            )
            raise WorkflowValidationError(msg)
        unused: dict[str, str] = {}
        for name, spec in self.steps.items():
            for t in spec.returns:
                if issubclass(t, StopEvent | InputRequiredEvent | HumanResponseEvent):
                    continue  # these leave the graph: the result, or a question to a human
                if not self.route(t):
                    unused.setdefault(t.__name__, name)
        if unused:
            where = "; ".join(f"step {s!r} produces {t}" for t, s in unused.items())
            msg = (
                "The following events are produced but never consumed:"
                f" {', '.join(unused)} ({where}, which no step consumes)"
            )
            raise WorkflowValidationError(msg)
        self._check_collects()
        self._check_graph(start, set(skip_checks))

    def _check_collects(self) -> None:
        """A collect step (a ``list[E]`` parameter) no fan-out's stream reaches would
        never run: refused, naming it (as LlamaIndex refuses it)."""
        bound = {c for cs in self.collect_bindings().values() for c in cs}
        lonely = [n for n, s in self.steps.items() if s.gathers is not None and n not in bound]
        if lonely:
            msg = (
                f"step {lonely[0]!r} takes a list of events, but no step returning a list"
                " (a fan-out, -> list[E]) sends it the events of its stream"
            )
            raise WorkflowValidationError(msg)

    def collect_bindings(self) -> dict[str, tuple[str, ...]]:
        """For each fan-out step, the collect steps its streams release to
        (:func:`workflow._streams.bindings_of`), worked out once per graph."""
        if self._bindings is None:
            from ._streams import bindings_of

            self._bindings = bindings_of(self.steps, self.route)
        return self._bindings

    def _produced_takers(self, produced: set[type[Event]], accepted: type) -> set[str]:
        """The steps taking ``accepted`` that some produced class reaches."""
        return {
            n for p in produced if p is accepted or issubclass(p, accepted) for n in self.route(p)
        }

    def _check_graph(self, start: type[Event], skip: set[str]) -> None:
        takers = {
            t: [n for n in self.steps if n in self.route(t)] for t in self.event_types() | {start}
        }
        # Forward: from the start event, the responses humans send and the failures that
        # @catch_error handlers take.
        seeds = [start] + [t for t in takers if issubclass(t, HumanResponseEvent | StepFailedEvent)]
        reached: set[str] = set()
        todo = [n for t in seeds for n in takers.get(t, ())]
        while todo:
            n = todo.pop()
            if n in reached:
                continue
            reached.add(n)
            for t in self.steps[n].returns:
                todo.extend(self.route(t))
        problems: list[str] = []
        unreachable = [
            n
            for n, s in self.steps.items()
            if n not in reached and "reachability" not in s.skip_graph_checks
        ]
        if unreachable and "reachability" not in skip:
            problems.append(
                f"  - [reachability] Unreachable steps: {', '.join(unreachable)}\n"
                "    No event from the start (or from a human's response) reaches them;"
                " remove them, or skip the check with skip_graph_checks=['reachability']."
            )
        # Backward: a step that can end the run, or leads to one that can.
        ends = StopEvent | InputRequiredEvent
        good = {
            n
            for n, s in self.steps.items()
            if not s.returns or any(issubclass(t, ends) for t in s.returns)
        }
        grew = True
        while grew:
            grew = False
            for n, s in self.steps.items():
                if n not in good and any(m in good for t in s.returns for m in self.route(t)):
                    good.add(n)
                    grew = True
        dead = [
            n
            for n in self.steps
            if n not in good and "dead_end" not in self.steps[n].skip_graph_checks
        ]
        if dead and "dead_end" not in skip:
            problems.append(
                f"  - [dead_end] Dead-end steps: {', '.join(dead)}\n"
                "    No StopEvent can be reached from them; give one a way out, or skip the"
                " check with skip_graph_checks=['dead_end']."
            )
        if problems:
            raise WorkflowValidationError("Graph validation failed:\n" + "\n".join(problems))

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
