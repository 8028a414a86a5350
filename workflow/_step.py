"""``@step`` and what a step's signature says: the events it takes and emits, its workers."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from ._errors import WorkflowValidationError
from ._events import Event
from .resource import ResourceDefinition, resource_of
from .retry_policy import RetryPolicy, _SeedlessRetryPolicy

__all__ = [
    "StepSpec",
    "step",
]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
STEP_ATTR = "__workflow_step__"


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What the decorator and the signature say about one step."""

    name: str
    func: Callable[..., Awaitable[Any]]
    accepted: tuple[type[Event], ...]
    returns: tuple[type[Event], ...]
    event_param: str
    ctx_param: str | None
    num_workers: int
    retry_policy: RetryPolicy | _SeedlessRetryPolicy | None
    # Parameters annotated Annotated[T, Resource(...)]: given to it, never events.
    resources: tuple[ResourceDefinition, ...] = ()


@dataclass(frozen=True, slots=True)
class _StepOptions:
    num_workers: int
    retry_policy: RetryPolicy | _SeedlessRetryPolicy | None


@overload
def step(func: F, /) -> F: ...


@overload
def step(
    *, num_workers: int = 4, retry_policy: RetryPolicy | _SeedlessRetryPolicy | None = None
) -> Callable[[F], F]: ...


def step(
    func: F | None = None,
    /,
    *,
    num_workers: int = 4,
    retry_policy: RetryPolicy | _SeedlessRetryPolicy | None = None,
) -> F | Callable[[F], F]:
    """Marks an async method of a :class:`Workflow` as a step.

    The step receives the events its event parameter's annotation names (a class or a
    union) and emits what its return annotation names (``None`` allowed). A parameter
    annotated :class:`Context` receives the context. ``num_workers`` attempts of the step
    may run at once (4, as in LlamaIndex); ``retry_policy`` retries failed attempts.
    """
    if num_workers < 1:
        msg = f"num_workers must be at least 1, not {num_workers}"
        raise WorkflowValidationError(msg)
    if retry_policy is not None and (
        isinstance(retry_policy, type) or not callable(getattr(retry_policy, "next", None))
    ):
        # Any object with the protocol's next() will do; the usual slip is passing a part
        # (wait_fixed(1)) or an uncalled factory where the built policy belongs.
        msg = (
            "retry_policy must have a next(elapsed_time, attempts, error) method, such as"
            f" retry_policy(wait=wait_fixed(1), stop=stop_after_attempt(3)): {retry_policy!r}"
        )
        raise WorkflowValidationError(msg)

    def decorate(f: F) -> F:
        if not inspect.iscoroutinefunction(f):
            msg = f"step {f.__qualname__} must be an async function (async def)"
            raise WorkflowValidationError(msg)
        setattr(f, STEP_ATTR, _StepOptions(num_workers, retry_policy))
        return f  # type: ignore[return-value]  # narrowed by iscoroutinefunction

    return decorate(func) if func is not None else decorate


def _event_types(annotation: Any, where: str) -> tuple[type[Event], ...]:
    if annotation is None or annotation is type(None):
        return ()
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        out: list[type[Event]] = []
        for arg in typing.get_args(annotation):
            out.extend(_event_types(arg, where))
        return tuple(out)
    if origin is typing.Annotated:
        return _event_types(typing.get_args(annotation)[0], where)
    if isinstance(annotation, type) and issubclass(annotation, Event):
        return (annotation,)
    msg = f"{where}: {annotation!r} is not an Event class"
    raise WorkflowValidationError(msg)


def _is_context(annotation: Any) -> bool:
    from ._context import Context  # the context module imports this one

    target = typing.get_origin(annotation) or annotation
    return isinstance(target, type) and issubclass(target, Context)


def inspect_step(name: str, func: Callable[..., Awaitable[Any]]) -> StepSpec:
    """Reads a step's signature: its event and context parameters and what it emits."""
    options: _StepOptions = getattr(func, STEP_ATTR)
    where = f"step {name!r}"
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:
        msg = f"{where}: cannot resolve its annotations ({exc})"
        raise WorkflowValidationError(msg) from exc
    params = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    event_param: str | None = None
    ctx_param: str | None = None
    accepted: tuple[type[Event], ...] = ()
    resources: list[ResourceDefinition] = []
    for p in params:
        ann = hints.get(p.name)
        if ann is None:
            msg = f"{where}: parameter {p.name!r} needs a type annotation"
            raise WorkflowValidationError(msg)
        if _is_context(ann):
            ctx_param = p.name
            continue
        found = resource_of(ann)
        if found is not None:
            resources.append(
                ResourceDefinition(name=p.name, resource=found[0], type_annotation=found[1])
            )
            continue
        if event_param is not None:
            msg = f"{where}: takes more than one event parameter ({event_param!r}, {p.name!r})"
            raise WorkflowValidationError(msg)
        event_param = p.name
        accepted = _event_types(ann, f"{where}, parameter {p.name!r}")
    if event_param is None or not accepted:
        msg = f"{where} has no event parameter (annotate one with an Event class)"
        raise WorkflowValidationError(msg)
    if "return" not in hints:
        msg = f"{where}: annotate what it returns (an Event class, a union, or None)"
        raise WorkflowValidationError(msg)
    returns = _event_types(hints["return"], f"{where}, return annotation")
    return StepSpec(
        name=name,
        func=func,
        accepted=accepted,
        returns=returns,
        event_param=event_param,
        ctx_param=ctx_param,
        num_workers=options.num_workers,
        retry_policy=options.retry_policy,
        resources=tuple(resources),
    )


def collect_steps(cls: type) -> dict[str, StepSpec]:
    """Every step of a workflow class (and its bases), by name."""
    found: dict[str, StepSpec] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            if callable(attr) and hasattr(attr, STEP_ATTR):
                found[name] = inspect_step(name, attr)
    return found
