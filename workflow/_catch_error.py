"""``@catch_error``: a step that takes over when another step has used up its retries.

When a step's attempt fails and its retry policy (or the lack of one) says no more, the
failure goes to the ``@catch_error`` handler that covers the step, as a
:class:`StepFailedEvent`, instead of failing the run. A handler covers the steps named in
``for_steps``; one handler without ``for_steps`` (the wildcard) covers every other step
but the handlers. Each handler may take over at most ``max_recoveries`` times per lineage:
the count follows the events from a failure onwards (the handler's output, what the steps
make of it, their failures), so a loop of fail, recover, fail again ends.

Durably: the failed attempt's commit holds its ``step_failed`` and the ``enqueued``
:class:`StepFailedEvent` (with the lineage's counts), so a run that dies before or while
the handler runs resumes with the handler's input queued and the recoveries counted.
"""

from __future__ import annotations

import time
import typing
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

from . import _journal as journal
from ._errors import WorkflowValidationError
from ._events import Event
from ._journal._builders import _message as recorded_message
from ._retry import rebuild_error

if TYPE_CHECKING:
    from eventstore import Codec, Record

    from ._attempt import Attempt
    from ._retry import RetryClock
    from ._step import StepSpec

__all__ = ["CATCH_ATTR", "Catcher", "StepFailedEvent", "catch_error", "catchers", "recovery_of"]

F = TypeVar("F", bound=Callable[..., Any])
CATCH_ATTR: Final = "__workflow_catch_error__"

# The live exception of a StepFailedEvent made in this process, by id(event): kept beside
# the event rather than on it, where the codec would try to log it as a field.
_LIVE: dict[int, tuple[weakref.ref[Event], BaseException]] = {}


class StepFailedEvent(Event):
    """What a ``@catch_error`` handler receives when a step has used up its retries.

    :param step_name: the step that failed.
    :param input_event: the event its failed attempts were given.
    :param exception: the exception of the last attempt. In the process where it failed,
        the exception itself (with its traceback); after a resume, rebuilt from the class
        and message the log holds (see ``error_type``), without its traceback.
    :param attempts: how many attempts failed.
    :param elapsed_seconds: seconds from the first attempt to the last failure.
    :param failed_at: when the last attempt failed (timezone-aware, UTC).

    The log holds the exception as ``error_type`` (``module:QualName``) and
    ``error_message``; give ``exception=`` and they are filled in.
    """

    step_name: str
    input_event: Event
    attempts: int
    elapsed_seconds: float
    failed_at: datetime
    error_type: str = ""
    error_message: str = ""

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            step_name: str,
            input_event: Event,
            attempts: int,
            elapsed_seconds: float,
            failed_at: datetime,
            exception: BaseException | None = None,
            error_type: str = "",
            error_message: str = "",
            **data: Any,
        ) -> None: ...

    else:

        def __init__(self, **data: Any) -> None:
            exc = data.pop("exception", None)
            if exc is not None:
                if not isinstance(exc, BaseException):
                    msg = f"StepFailedEvent(exception=...) takes an exception, not {exc!r}"
                    raise TypeError(msg)
                kind = type(exc)
                data.setdefault("error_type", f"{kind.__module__}:{kind.__qualname__}")
                # As step_failed records it: whatever its text holds, even a raising __str__.
                data.setdefault("error_message", recorded_message(exc))
            super().__init__(**data)
            if exc is not None:
                key = id(self)
                _LIVE[key] = (weakref.ref(self, lambda _: _LIVE.pop(key, None)), exc)

    @property
    def exception(self) -> BaseException:
        """The last attempt's exception (rebuilt from the log after a resume)."""
        live = _LIVE.get(id(self))
        if live is not None and live[0]() is self:
            return live[1]
        module, _, name = self.error_type.partition(":")
        return rebuild_error(module, name, self.error_message)


@dataclass(frozen=True, slots=True)
class Catcher:
    """A ``@catch_error`` handler as the decorator marks it."""

    for_steps: tuple[str, ...] | None
    max_recoveries: int


@overload
def catch_error(func: F, /) -> F: ...


@overload
def catch_error(
    *, for_steps: list[str] | None = None, max_recoveries: int = 1
) -> Callable[[F], F]: ...


def catch_error(
    func: F | None = None,
    /,
    *,
    for_steps: list[str] | None = None,
    max_recoveries: int = 1,
) -> F | Callable[[F], F]:
    """Marks an async method as the handler of steps that used up their retries.

    The method is a step (one worker, no retry policy) whose event parameter takes
    :class:`StepFailedEvent`; it may return any event (a ``StopEvent`` ends the run with a
    result), and when it raises, the run fails with its exception.

    :param for_steps: the steps it covers; None (the default) makes it the wildcard, which
        covers every step no other handler names (one wildcard per workflow).
    :param max_recoveries: how often it may take over along one lineage of events before
        the run fails instead (at least 1).
    :raises WorkflowValidationError: a bad ``for_steps`` or ``max_recoveries``, or a method
        that does not take :class:`StepFailedEvent`.
    """
    if not isinstance(max_recoveries, int) or isinstance(max_recoveries, bool):
        msg = f"@catch_error max_recoveries must be an integer >= 1, not {max_recoveries!r}"
        raise WorkflowValidationError(msg)
    if max_recoveries < 1:
        msg = f"@catch_error max_recoveries must be an integer >= 1, not {max_recoveries}"
        raise WorkflowValidationError(msg)
    if for_steps is not None and (
        not isinstance(for_steps, list | tuple) or not all(isinstance(s, str) for s in for_steps)
    ):
        msg = f"@catch_error for_steps must be None or a list of step names, not {for_steps!r}"
        raise WorkflowValidationError(msg)
    marker = Catcher(None if for_steps is None else tuple(for_steps), max_recoveries)

    def decorate(f: F) -> F:
        from ._step import inspect_step, step

        stepped = step(num_workers=1)(f)
        setattr(stepped, CATCH_ATTR, marker)
        try:
            typing.get_type_hints(f)
        except Exception:  # names defined later: checked when the workflow is built
            return stepped
        _check_handler(inspect_step(f.__name__, stepped))
        return stepped

    return decorate(func) if func is not None else decorate


def _check_handler(spec: StepSpec) -> None:
    if spec.accepted != (StepFailedEvent,):
        msg = (
            f"@catch_error handler {spec.name!r} must accept StepFailedEvent as its event parameter"
        )
        raise WorkflowValidationError(msg)


def catchers(steps: Mapping[str, StepSpec], workflow: str) -> dict[str, tuple[str, int]]:
    """Which handler covers which step: step name -> (handler name, max_recoveries).

    :raises WorkflowValidationError: two wildcards, a handler naming a step that does not
        exist or another handler, or a step claimed by two handlers.
    """
    handlers: dict[str, Catcher] = {}
    for name, spec in steps.items():
        marker = getattr(spec.func, CATCH_ATTR, None)
        if marker is not None:
            _check_handler(spec)
            handlers[name] = marker
    problems: list[str] = []
    wildcards = sorted(n for n, c in handlers.items() if c.for_steps is None)
    if len(wildcards) > 1:
        problems.append(
            f"only one @catch_error handler without for_steps is allowed, found {len(wildcards)}:"
            f" {', '.join(wildcards)}"
        )
    routes: dict[str, tuple[str, int]] = {}
    for name, c in handlers.items():
        for target in c.for_steps or ():
            if target not in steps:
                problems.append(f"@catch_error handler {name!r} names unknown step {target!r}")
            elif target in handlers:
                problems.append(f"@catch_error handler {name!r} cannot cover handler {target!r}")
            elif target in routes:
                problems.append(
                    f"step {target!r} is claimed by two @catch_error handlers:"
                    f" {routes[target][0]!r} and {name!r}"
                )
            else:
                routes[target] = (name, c.max_recoveries)
    if problems:
        raise WorkflowValidationError(f"{workflow}: " + "; ".join(problems))
    if wildcards:
        wild = wildcards[0]
        for name in steps:
            if name not in handlers and name not in routes:
                routes[name] = (wild, handlers[wild].max_recoveries)
    return routes


def recovery_of(
    att: Attempt,
    exc: Exception,
    clock: RetryClock,
    elapsed: float,
    *,
    route: tuple[str, int] | None,
    counts: Mapping[str, int],
    new_id: Callable[[], int],
    codec: Codec,
) -> tuple[str, int, StepFailedEvent, Record] | None:
    """The ``@catch_error`` handler (``route``: its name and ``max_recoveries``) that takes
    over a step out of retries: its name, the id of its StepFailedEvent, the event, and its
    ``enqueued`` record (``counts``: the recoveries along the input's lineage so far).

    None when no handler covers the step, or its ``max_recoveries`` along this event's
    lineage are used up (the run fails then).
    """
    if route is None:
        return None
    handler, limit = route
    n = counts.get(handler, 0) + 1
    if n > limit:
        return None
    failed_at = clock.last_failed_at if clock.last_failed_at is not None else time.time()
    ev = StepFailedEvent(
        step_name=att.step,
        input_event=att.event,
        exception=exc,
        attempts=clock.failures,
        elapsed_seconds=elapsed,
        failed_at=datetime.fromtimestamp(failed_at, tz=UTC),
    )
    ev_id = new_id()
    record = journal.enqueued_recovery(
        handler, ev_id, codec.dump(ev), [att.event_id, att.attempt], {**counts, handler: n}
    )
    return handler, ev_id, ev, record
