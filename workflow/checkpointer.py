"""``WorkflowCheckpointer``, as in llama-index-core 0.12 (``llama_index.core.workflow``).

There, a checkpointer wraps a workflow and keeps, in memory, one ``Checkpoint`` per step that
finished, each holding a serialized context. Here every run is already a log, so the
checkpointer is a view over it: ``checkpoints`` lists, for each run it started, one
checkpoint per finished step attempt (of the steps checkpointing is enabled for), read from
the store whenever it is asked; ``run_from(checkpoint=cp)`` forks the run at ``cp.seq``.
Checkpoints are JSON-native: one that went through ``model_dump`` / ``json`` /
``model_validate`` runs from exactly where it was taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import WorkflowValidationError
from ._events import Event
from ._handler import WorkflowHandler
from ._state import Checkpoint, listed_by
from ._workflow import Workflow
from .context.serializers import BaseSerializer, JsonSerializer

__all__ = ["Checkpoint", "WorkflowCheckpointer"]


class WorkflowCheckpointer:
    """Runs a workflow and lists the checkpoints of the runs it started.

    :param workflow: the workflow to run.
    :param checkpoint_serializer: the serializer of each checkpoint's ``ctx_state``
        (default :class:`~workflow.context.serializers.JsonSerializer`).
    :param disabled_steps: steps whose finished attempts are not listed.
    """

    def __init__(
        self,
        workflow: Workflow,
        checkpoint_serializer: BaseSerializer | None = None,
        disabled_steps: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.workflow = workflow
        self._checkpoint_serializer = checkpoint_serializer or JsonSerializer()
        self.enabled_checkpoints: set[str] = set(workflow.__workflow_parts__.graph.steps)
        self._runs: list[str] = []
        for name in disabled_steps:
            self.disable_checkpoint(name)

    def _known(self, step: str) -> None:
        parts = self.workflow.__workflow_parts__
        if step not in parts.graph.steps:
            names = ", ".join(sorted(parts.graph.steps))
            msg = f"this workflow has no step named {step!r} (its steps: {names})"
            raise WorkflowValidationError(msg)

    def enable_checkpoint(self, step: str) -> None:
        """Lists the finished attempts of ``step`` again."""
        self._known(step)
        self.enabled_checkpoints.add(step)

    def disable_checkpoint(self, step: str) -> None:
        """Stops listing the finished attempts of ``step`` (the log keeps them all)."""
        self._known(step)
        self.enabled_checkpoints.discard(step)

    def run(self, **kwargs: Any) -> WorkflowHandler:
        """Starts a run of the workflow (``Workflow.run``'s arguments) and lists it."""
        handler = self.workflow.run(**kwargs)
        self._runs.append(handler.run_id)
        return handler

    def run_from(
        self, checkpoint: Checkpoint, updates: dict[str, Any] | None = None
    ) -> WorkflowHandler:
        """Starts a new run from ``checkpoint`` (a fork at its seq) and lists it."""
        handler = self.workflow.run_from(checkpoint, updates)
        self._runs.append(handler.run_id)
        return handler

    @property
    def checkpoints(self) -> dict[str, list[Checkpoint]]:
        """Run id -> one checkpoint per finished attempt of an enabled step, oldest first.

        Read from the log each time: runs of a previous process are not listed, since this
        checkpointer did not start them (``Workflow.checkpoints(run_id)`` lists any run's).
        """
        out: dict[str, list[Checkpoint]] = {}
        for run_id in self._runs:
            found = [
                cp
                for cp in self.workflow.checkpoints(run_id)
                if cp.last_completed_step is not None
                and cp.last_completed_step in self.enabled_checkpoints
            ]
            serializer = self._checkpoint_serializer
            out[run_id] = [listed_by(cp, self.workflow, serializer) for cp in found]
        return out

    def filter_checkpoints(
        self,
        run_id: str | None = None,
        last_completed_step: str | None = None,
        input_event_type: type[Event] | Event | None = None,
        output_event_type: type[Event] | Event | None = None,
        *,
        output_event: type[Event] | Event | None = None,
        input_event: type[Event] | Event | None = None,
    ) -> list[Checkpoint]:
        """The checkpoints that match every filter given (at least one).

        ``output_event=`` / ``input_event=`` are the spellings of the checkpointing PR for
        ``output_event_type=`` / ``input_event_type=``. An event class matches its exact
        class, as in LlamaIndex (not its subclasses); an event instance matches the
        checkpoints whose event is equal to it (the same class and the same fields).

        :raises ValueError: no filter was given.
        :raises TypeError: an event filter is neither an event class nor an event.
        """
        input_match = _event_matcher("input_event", input_event_type, input_event)
        output_match = _event_matcher("output_event", output_event_type, output_event)
        if not (run_id or last_completed_step or input_match or output_match):
            msg = "filter_checkpoints needs a filter: run_id, last_completed_step or an event type"
            raise ValueError(msg)
        every = self.checkpoints
        candidates = every.get(run_id, []) if run_id else [c for cs in every.values() for c in cs]
        return [
            cp
            for cp in candidates
            if (not last_completed_step or cp.last_completed_step == last_completed_step)
            and (input_match is None or input_match(cp.input_event))
            and (output_match is None or output_match(cp.output_event))
        ]


def _event_matcher(
    name: str, *given: type[Event] | Event | None
) -> Callable[[Event | None], bool] | None:
    """How an event filter of ``filter_checkpoints`` tests a checkpoint's event, or None."""
    wanted = next((g for g in given if g is not None), None)
    if wanted is None:
        return None
    if isinstance(wanted, Event):
        event = wanted
        return lambda ev: type(ev) is type(event) and ev == event
    if isinstance(wanted, type) and issubclass(wanted, Event):
        cls = wanted
        return lambda ev: type(ev) is cls
    msg = (
        f"filter_checkpoints({name}=...) takes an Event class or an Event instance, not {wanted!r}"
    )
    raise TypeError(msg)
