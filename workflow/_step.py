"""``@step`` and what a step's signature says: the events it takes and emits, its workers."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar, overload

from ._errors import WorkflowValidationError
from ._events import Event
from ._gather import Gather
from ._step_shapes import bare_returns, fans_out, gather_of, joins_of
from .resource import ResourceDefinition, resource_of
from .retry_policy import RetryPolicy, _SeedlessRetryPolicy

__all__ = [
    "StepConfig",
    "StepGraphCheck",
    "StepSpec",
    "WorkflowGraphCheck",
    "state_model",
    "step",
]

F = TypeVar("F", bound=Callable[..., Any])


class StepOwner(Protocol):
    """What ``@step(workflow=Cls)`` adds a free function to: a ``Workflow`` class."""

    @classmethod
    def add_step(cls, func: Callable[..., Any]) -> None: ...


STEP_ATTR = "__workflow_step__"

# LlamaIndex's names of the graph checks a workflow (or one step) may skip.
WorkflowGraphCheck = Literal["reachability", "terminal_event", "dead_end"]
StepGraphCheck = Literal["reachability", "dead_end"]
GRAPH_CHECKS: frozenset[str] = frozenset(typing.get_args(WorkflowGraphCheck))
STEP_GRAPH_CHECKS: frozenset[str] = frozenset(typing.get_args(StepGraphCheck))

Policy = RetryPolicy | _SeedlessRetryPolicy


@dataclass
class StepConfig:
    """What ``@step`` read from a step (LlamaIndex's ``_step_config``, same field names)."""

    accepted_events: list[Any]
    event_name: str
    return_types: list[Any]
    context_parameter: str | None
    num_workers: int
    retry_policy: Policy | None
    resources: list[Any] = dataclasses.field(default_factory=list)
    context_state_type: type | None = None
    skip_graph_checks: list[str] = dataclasses.field(default_factory=list)
    accept_event_subclasses: bool = False


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What the decorator and the signature say about one step."""

    name: str
    func: Callable[..., Any]
    accepted: tuple[type[Event], ...]
    returns: tuple[type[Event], ...]
    event_param: str
    ctx_param: str | None
    num_workers: int
    retry_policy: Policy | None
    # Parameters annotated Annotated[T, Resource(...)]: given to it, never events.
    resources: tuple[ResourceDefinition, ...] = ()
    # A method gets the workflow as its first argument; a free function (add_step) not.
    bound: bool = True
    # A plain ``def`` runs in a worker thread, off the event loop.
    is_async: bool = True
    skip_graph_checks: tuple[str, ...] = ()
    accept_event_subclasses: bool = False
    state_type: type | None = None
    # A join (LlamaIndex's heterogeneous fan-in): a step with several event parameters,
    # each one event class, run once an event of each is in. Empty for any other step.
    joins: tuple[tuple[str, type[Event]], ...] = ()
    # Annotated ``-> list[E]`` (LlamaIndex's fan-out): a list it returns is its events.
    fans_out: bool = False
    # A ``list[E]`` parameter (LlamaIndex's batch fan-in): the step takes a fan-out's
    # stream as one list (``workflow.collect``). None for any other step.
    gathers: Gather | None = None
    # The event classes its return annotation names outside a list (a fan-out's bare ones).
    bare: tuple[type[Event], ...] = ()

    def config(self) -> StepConfig:
        """The spec as LlamaIndex's ``StepConfig``."""
        return StepConfig(
            accepted_events=list(self.accepted),
            event_name=self.event_param,
            return_types=list(self.returns) if self.returns else [type(None)],
            context_parameter=self.ctx_param,
            num_workers=self.num_workers,
            retry_policy=self.retry_policy,
            resources=list(self.resources),
            context_state_type=self.state_type,
            skip_graph_checks=list(self.skip_graph_checks),
            accept_event_subclasses=self.accept_event_subclasses,
        )


@dataclass(frozen=True, slots=True)
class _StepOptions:
    num_workers: int
    retry_policy: Policy | None
    skip_graph_checks: tuple[str, ...] = ()
    accept_event_subclasses: bool = False
    # The names visible where @step was applied (a class inside a function): annotations
    # under ``from __future__ import annotations`` are strings naming them.
    localns: dict[str, Any] | None = None


@overload
def step(func: F, /) -> F: ...


@overload
def step(
    *,
    workflow: type[StepOwner] | None = None,
    num_workers: int = 4,
    retry_policy: Policy | None = None,
    skip_graph_checks: list[StepGraphCheck] | None = None,
    accept_event_subclasses: bool = False,
) -> Callable[[F], F]: ...


def step(
    func: F | None = None,
    /,
    *,
    workflow: type[StepOwner] | None = None,
    num_workers: int = 4,
    retry_policy: Policy | None = None,
    skip_graph_checks: list[StepGraphCheck] | None = None,
    accept_event_subclasses: bool = False,
) -> F | Callable[[F], F]:
    """Marks a method of a :class:`Workflow` (or, with ``workflow=``, a function) as a step.

    The step receives the events its event parameter's annotation names (a class or a
    union) and emits what its return annotation names (``None`` allowed). A parameter
    annotated :class:`Context` receives the context. ``num_workers`` attempts of the step
    may run at once (4, as in LlamaIndex); ``retry_policy`` retries failed attempts.

    A plain ``def`` step runs in a worker thread, off the event loop. Events go to the
    steps whose annotation names their exact class; ``accept_event_subclasses=True`` lets
    this step take subclasses too. ``skip_graph_checks`` lists graph checks
    (``"reachability"``, ``"dead_end"``) this step is exempt from. ``workflow=Cls`` adds a
    free function to ``Cls`` (as ``Cls.add_step(f)``).
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
        msg = f"num_workers must be an integer greater than 0, not {num_workers!r}"
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
    skips = graph_checks(skip_graph_checks, STEP_GRAPH_CHECKS)

    def decorate(f: F, localns: dict[str, Any]) -> F:
        if not callable(f):
            msg = f"@step decorates a function, not {f!r}"
            raise WorkflowValidationError(msg)
        options = _StepOptions(
            num_workers, retry_policy, skips, accept_event_subclasses, localns or None
        )
        setattr(f, STEP_ATTR, options)
        bound = _takes_self(f)
        spec = _try_inspect(f.__name__, f, bound=bound)
        if spec is not None:
            f._step_config = spec.config()  # type: ignore[attr-defined]
        if workflow is not None:
            workflow.add_step(f)
        elif not bound:
            msg = f"To decorate {f.__name__} please pass a workflow class to the @step decorator."
            raise WorkflowValidationError(msg)
        return f

    if func is not None:
        return decorate(func, _caller_locals(1))

    def decorator(f: F) -> F:
        return decorate(f, _caller_locals(1))

    return decorator


def graph_checks(names: Iterable[str] | None, valid: frozenset[str]) -> tuple[str, ...]:
    """The graph checks named to be skipped; :raises WorkflowValidationError: an unknown one."""
    skips = tuple(names or ())
    unknown = sorted(set(skips) - valid)
    if unknown:
        msg = (
            f"Unknown graph check names: {', '.join(unknown)}."
            f" Valid names are: {', '.join(sorted(valid))}"
        )
        raise WorkflowValidationError(msg)
    return skips


def _caller_locals(up: int, depth: int = 3) -> dict[str, Any]:
    """The local names of the frames around the caller of ``step`` (innermost wins)."""
    frame = inspect.currentframe()
    try:
        f = frame.f_back if frame is not None else None
        for _ in range(up):
            f = f.f_back if f is not None else None
        frames: list[types.FrameType] = []
        while f is not None and len(frames) < depth:
            if f.f_globals is not f.f_locals:  # a module's names are its globals already
                frames.append(f)
            f = f.f_back
        out: dict[str, Any] = {}
        for fr in reversed(frames):
            out.update(fr.f_locals)
        return out
    finally:
        del frame


def _takes_self(f: Callable[..., Any]) -> bool:
    """Whether ``f`` is called with the workflow first: a method (by its qualified name),
    or a function whose first parameter is named ``self`` (one set on a class later)."""
    if not _is_free_function(f.__qualname__):
        return True
    params = list(inspect.signature(f).parameters)
    return bool(params) and params[0] == "self"


def _is_free_function(qualname: str) -> bool:
    """A module-level or nested function, not a method (by its qualified name)."""
    parts = qualname.split(".")
    if len(parts) == 1:
        return True
    if "<locals>" not in parts:
        return False
    return parts[-2] == "<locals>"


def _event_types(annotation: Any, where: str, *, lists: bool = False) -> tuple[type[Event], ...]:
    """The event classes an annotation names; with ``lists`` (a return annotation) those
    of a ``list[E]`` in it too (a fan-out: each element is emitted)."""
    if annotation is None or annotation is type(None):
        return ()
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        out: list[type[Event]] = []
        for arg in typing.get_args(annotation):
            out.extend(_event_types(arg, where, lists=lists))
        return tuple(out)
    if origin is typing.Annotated:
        return _event_types(typing.get_args(annotation)[0], where, lists=lists)
    if origin is list:
        (element,) = typing.get_args(annotation) or (Any,)
        if lists and typing.get_origin(element) is not list:
            return _event_types(element, where)
        if not lists:
            msg = (
                f"{where}: {annotation!r} in a union: a list[E] parameter (a collect step's)"
                " is the parameter's whole annotation"
            )
            raise WorkflowValidationError(msg)
    if isinstance(annotation, type) and issubclass(annotation, Event):
        return (annotation,)
    msg = f"{where}: {annotation!r} is not an Event class"
    raise WorkflowValidationError(msg)


# Set (True) on ``Context``: a step's context parameter is found by it, without this module
# importing the context's, which sits above it.
CONTEXT_MARK: Final = "__workflow_context__"


def _is_context(annotation: Any) -> bool:
    target = typing.get_origin(annotation) or annotation
    return isinstance(target, type) and getattr(target, CONTEXT_MARK, False) is True


def _state_type(annotation: Any) -> type | None:
    """The state model of ``Context[MyState]``, or None."""
    from pydantic import BaseModel

    args = typing.get_args(annotation)
    if (
        typing.get_origin(annotation) is not None
        and args
        and isinstance(args[0], type)
        and issubclass(args[0], BaseModel)
    ):
        return args[0]
    return None


def _hints(name: str, func: Callable[..., Any]) -> dict[str, Any]:
    options: _StepOptions = getattr(func, STEP_ATTR)
    try:
        return typing.get_type_hints(func, localns=options.localns, include_extras=True)
    except NameError as exc:
        missing = f" Missing name: {exc.name}." if getattr(exc, "name", None) else ""
        msg = (
            f"Failed to resolve type annotations for {func.__qualname__} (step {name!r}).{missing}"
            " If you are using 'from __future__ import annotations' or string annotations,"
            " ensure referenced names are available in module scope or in the scope where"
            " the @step decorator is applied."
        )
        raise WorkflowValidationError(msg) from exc
    except Exception as exc:
        msg = f"step {name!r}: cannot resolve its annotations ({exc})"
        raise WorkflowValidationError(msg) from exc


def _try_inspect(name: str, func: Callable[..., Any], *, bound: bool) -> StepSpec | None:
    """The spec at decoration time, or None when an annotation names something not yet
    defined (a class later in the module): the workflow reads it again when built."""
    try:
        typing.get_type_hints(func, localns=getattr(func, STEP_ATTR).localns, include_extras=True)
    except NameError:
        return None
    except Exception:
        pass
    return inspect_step(name, func, bound=bound)


def inspect_step(name: str, func: Callable[..., Any], *, bound: bool = True) -> StepSpec:
    """Reads a step's signature: its event and context parameters and what it emits."""
    options: _StepOptions = getattr(func, STEP_ATTR)
    where = f"step {name!r}"
    hints = _hints(name, func)
    params = list(inspect.signature(func).parameters.values())
    if params and bound:
        params = params[1:]  # self
    event_params: list[tuple[str, tuple[type[Event], ...]]] = []
    ctx_param: str | None = None
    state_type: type | None = None
    resources: list[ResourceDefinition] = []
    gathers: list[Gather] = []
    for p in params:
        ann = hints.get(p.name)
        if ann is None:
            msg = f"{where}: parameter {p.name!r} needs a type annotation"
            raise WorkflowValidationError(msg)
        if _is_context(ann):
            ctx_param = p.name
            state_type = _state_type(ann)
            continue
        found = resource_of(ann)
        if found is not None:
            resources.append(
                ResourceDefinition(name=p.name, resource=found[0], type_annotation=found[1])
            )
            continue
        listed = gather_of(ann, f"{where}, parameter {p.name!r}")
        if listed is not None:
            gathers.append(Gather(p.name, *listed))
            event_params.append((p.name, listed[0]))
            continue
        event_params.append((p.name, _event_types(ann, f"{where}, parameter {p.name!r}")))
    if gathers and len(event_params) > 1:
        msg = (
            f"{where}: a step with a list[E] parameter (a collect step) takes no other event"
            " parameter"
        )
        raise WorkflowValidationError(msg)
    joins = joins_of(where, event_params, options.accept_event_subclasses)
    event_param = event_params[0][0] if event_params else None
    accepted = tuple(dict.fromkeys(t for _, ts in event_params for t in ts))
    if event_param is None or not accepted:
        msg = (
            f"{where}: step signature must have at least one parameter annotated as type"
            " Event (it has no event parameter)"
        )
        raise WorkflowValidationError(msg)
    if "return" not in hints:
        msg = f"{where}: annotate what it returns (an Event class, a union, or None)"
        raise WorkflowValidationError(msg)
    returns = _event_types(hints["return"], f"{where}, return annotation", lists=True)
    return StepSpec(
        name=name,
        func=func,
        accepted=accepted,
        returns=returns,
        event_param=event_param,
        ctx_param=ctx_param,
        num_workers=options.num_workers,
        retry_policy=options.retry_policy,
        bound=bound,
        is_async=inspect.iscoroutinefunction(func),
        skip_graph_checks=options.skip_graph_checks,
        accept_event_subclasses=options.accept_event_subclasses,
        state_type=state_type,
        resources=tuple(resources),
        joins=joins,
        fans_out=fans_out(hints["return"]),
        gathers=gathers[0] if gathers else None,
        bare=bare_returns(hints["return"]),
    )


def step_functions(cls: type) -> dict[str, Callable[..., Any]]:
    """Every step function of a workflow class: its methods (and its bases'), then the
    free functions added with ``add_step`` / ``@step(workflow=...)``, by name."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        found.update(
            {n: a for n, a in vars(klass).items() if callable(a) and hasattr(a, STEP_ATTR)}
        )
        found.update(vars(klass).get("_step_functions", {}))
    return found


def collect_steps(
    cls: type, funcs: dict[str, Callable[..., Any]] | None = None
) -> dict[str, StepSpec]:
    """The specs of a workflow class's steps (or of ``funcs``, as :func:`step_functions`
    lists them), by name. A method gets the workflow as its first argument; so does a
    function added with ``add_step`` whose first parameter is ``self``, but no other."""
    added = {n for klass in cls.__mro__ for n in vars(klass).get("_step_functions", {})}
    return {
        name: inspect_step(name, f, bound=name not in added or _takes_self(f))
        for name, f in (step_functions(cls) if funcs is None else funcs).items()
    }


def state_model(steps: Mapping[str, StepSpec], workflow: str) -> type | None:
    """The state model the steps' ``Context[MyState]`` annotations name: the most derived
    one, when some steps name a base class of another's model (None: no step names one).

    :raises WorkflowValidationError: the models are not in one inheritance chain.
    """
    from pydantic import BaseModel

    found: list[type] = []
    for spec in steps.values():
        t = spec.state_type
        if isinstance(t, type) and issubclass(t, BaseModel) and t not in found:
            found.append(t)
    if not found:
        return None
    for candidate in found:
        if all(issubclass(candidate, other) for other in found):
            return candidate
    msg = (
        f"{workflow}: the steps' Context[...] state models are not in one"
        " inheritance chain (each must be a base class of the most derived one): "
        + ", ".join(t.__name__ for t in found)
    )
    raise WorkflowValidationError(msg)
