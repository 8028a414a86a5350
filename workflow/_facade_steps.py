"""The workflow as a set of steps (LlamaIndex's API for it): which steps it has, the
graph they make and its checks, and the event classes they start and stop with.

``Workflow`` is a ``WorkflowSteps``: this base owns every attribute it reads, set by
``_init_steps`` when the workflow is made; the journaling facade (``_workflow``) reads
only its graph and its catchers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from ._catch_error import catchers
from ._errors import WorkflowValidationError
from ._events import Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent
from ._graph import Graph
from ._start_events import start_event_of
from ._step import STEP_ATTR, collect_steps, step_functions
from .resource import check_configs

__all__ = ["WorkflowSteps"]


class WorkflowSteps:
    """The steps of a workflow class and what is known of them before any run."""

    # Free functions added as steps (``add_step``, ``@step(workflow=Cls)``), per class.
    _step_functions: ClassVar[dict[str, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._step_functions = {}

    @classmethod
    def add_step(cls, func: Callable[..., Any]) -> None:
        """Adds a free function decorated with ``@step`` as a step of this class.

        ``@step(workflow=Cls)`` calls this. Instances built afterwards have the step.

        :raises WorkflowValidationError: ``func`` is not decorated with ``@step``, or the
            class already has a step by that name.
        """
        name = getattr(func, "__name__", repr(func))
        if not hasattr(func, STEP_ATTR):
            msg = f"Step function {name} is missing the `@step` decorator."
            raise WorkflowValidationError(msg)
        if name in step_functions(cls):
            msg = f"A step {name} is already part of this workflow, please choose another name."
            raise WorkflowValidationError(msg)
        cls._step_functions[name] = func

    def _get_steps(self) -> dict[str, Callable[..., Any]]:
        """Every step function, methods and added free functions, by name."""
        return step_functions(type(self))

    def _validate(self) -> bool:
        """Checks the step graph (unless built with ``disable_validation=True``).

        Returns whether the workflow asks humans (a step returns an InputRequiredEvent
        or takes a HumanResponseEvent), as LlamaIndex's does.
        """
        if self._disable_validation:
            return False
        steps = collect_steps(type(self), self._get_steps())
        graph = Graph(steps)
        graph.validate(type(self).__name__, self._skip_graph_checks)
        check_configs(
            {n: sp.resources for n, sp in steps.items() if sp.resources}, type(self).__name__
        )
        return any(
            issubclass(t, InputRequiredEvent) for s in steps.values() for t in s.returns
        ) or any(issubclass(t, HumanResponseEvent) for s in steps.values() for t in s.accepted)

    def validate(self) -> bool:
        """Checks the step graph even when built with ``disable_validation=True``."""
        Graph(collect_steps(type(self), self._get_steps())).validate(
            type(self).__name__, self._skip_graph_checks
        )
        return self._validate() if not self._disable_validation else False

    @property
    def workflow_name(self) -> str:
        """The name given as ``workflow_name=``, else ``module.QualName`` of the class."""
        if self._workflow_name is not None:
            return self._workflow_name
        cls = type(self)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def start_event_class(self) -> type[StartEvent]:
        """The StartEvent class the steps take."""
        return self._graph.start_event_class()

    @property
    def _start_event_class(self) -> type[StartEvent]:
        return self._start_override or self._graph.start_event_class()

    @_start_event_class.setter
    def _start_event_class(self, value: type[StartEvent]) -> None:
        self._start_override = value

    _start_override: type[StartEvent] | None = None

    @property
    def stop_event_class(self) -> type[StopEvent]:
        """The StopEvent class the steps return."""
        return self._graph.stop_event_class()

    @property
    def _stop_event_class(self) -> type[StopEvent]:
        return self._graph.stop_event_class()

    @property
    def events(self) -> list[type[Event]]:
        """Every event class the steps take or return."""
        return sorted(self._graph.event_types(), key=lambda t: t.__qualname__)

    def _get_start_event_instance(
        self, start_event: StartEvent | None, **kwargs: Any
    ) -> StartEvent:
        """The start event of a run (LlamaIndex's helper): the one given (keyword arguments
        beside it are ignored, with a warning), or the start class built from them.

        :raises WorkflowRuntimeError: the keyword arguments do not make a start event.
        """
        return start_event_of(self._start_event_class, start_event, kwargs)

    def _init_steps(
        self, skips: Iterable[str], disable_validation: bool, workflow_name: str | None
    ) -> None:
        """Builds the step graph (checked before the first run, unless
        ``disable_validation``)."""
        self._skip_graph_checks = list(skips)
        self._disable_validation = disable_validation
        self._workflow_name = workflow_name
        self._graph = Graph(collect_steps(type(self)))
        # Which @catch_error handler takes over which step once it is out of retries.
        self._catchers = catchers(self._graph.steps, type(self).__name__)
        # As in LlamaIndex: its start and stop events are checked now, the graph when a run
        # is first made (so a workflow with a bad graph can be built, inspected and drawn).
        if not disable_validation:
            self._graph.validate_config(type(self).__name__)
        self._graph_checked = False

    def __check_graph__(self) -> None:
        """:meth:`_validate`, once: before this workflow's first run executes.

        :raises WorkflowValidationError: the steps do not make a valid graph.
        """
        if not self._graph_checked:
            self._validate()
            self._graph_checked = True
