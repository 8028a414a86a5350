"""``WorkflowTestRunner``: run a workflow end to end and collect what it streamed.

LlamaIndex Workflows' test helper (``workflows.testing``), under the same names::

    result = await WorkflowTestRunner(MyFlow()).run(StartEvent(topic="x"))
    assert result.result == "done"
    assert result.event_types.get(StepStateChanged, 0) == 4
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from .._context import Context
from .._events import Event, EventType, StartEvent
from .._workflow import Workflow

__all__ = ["WorkflowTestResult", "WorkflowTestRunner"]


@dataclass
class WorkflowTestResult:
    """What a test run streamed and returned.

    :ivar collected: the streamed events, in order (minus the excluded classes).
    :ivar event_types: how many of each class ``collected`` holds.
    :ivar result: what awaiting the run returned.
    :ivar ctx: the run's context, to read its final state.
    """

    collected: list[Event]
    event_types: dict[EventType, int]
    result: Any
    ctx: Context[Any]


class WorkflowTestRunner:
    """Runs a workflow to its end, collecting every event it streams."""

    def __init__(self, workflow: Workflow) -> None:
        self._workflow = workflow

    async def run(
        self,
        start_event: StartEvent | None = None,
        ctx: Context[Any] | None = None,
        expose_internal: bool = True,
        exclude_events: list[EventType] | None = None,
    ) -> WorkflowTestResult:
        """Runs the workflow from ``start_event`` (a plain StartEvent if None).

        :param ctx: a context to run with (see ``Workflow.run(ctx=)``).
        :param expose_internal: collect the engine's own events too (``StepStateChanged``).
        :param exclude_events: classes not to collect.
        :raises: whatever awaiting the run raises (a step's error, a timeout, ...).
        """
        kwargs: dict[str, Any] = {"start_event": start_event or StartEvent()}
        if ctx is not None:
            kwargs["ctx"] = ctx
        handler = self._workflow.run(**kwargs)
        collected: list[Event] = []
        excluded = tuple(exclude_events or ())
        async for event in handler.stream_events(expose_internal=expose_internal):
            if type(event) in excluded:
                continue
            collected.append(event)
        result = await handler
        return WorkflowTestResult(
            collected=collected,
            event_types=dict(Counter(type(ev) for ev in collected)),
            result=result,
            ctx=handler.ctx,
        )
