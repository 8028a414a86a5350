"""Resources: objects a step is given, made by a factory or read from a JSON file.

A step asks for one with a parameter annotated ``Annotated[T, Resource(factory)]`` (or
``Annotated[Model, ResourceConfig(config_file=...)]``); the parameter is never an event.
LlamaIndex Workflows' names and behaviour: a factory may be sync or async and may itself
take resources; ``cache=True`` (the default) builds one value per workflow object, shared
by its steps and runs; ``cache=False`` builds one for each attempt that asks.

Resources are never journaled. The log holds events and context values, not clients,
connections or file handles: a run resumed in another process (or by another workflow
object) builds its resources again, with the factories of that process, the first time a
step asks. A factory that raises fails the attempt that asked, like the step raising (its
retry policy applies).
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Resource",
    "ResourceConfig",
    "ResourceDefinition",
    "ResourceDescriptor",
    "ResourceManager",
]

T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)


@runtime_checkable
class ResourceDescriptor(Protocol):
    """What ``Annotated[T, ...]`` metadata must be to declare a resource."""

    @property
    def name(self) -> str:
        """The key the value is cached under (and how a dependency cycle is named)."""
        ...

    @property
    def cache(self) -> bool:
        """Whether one value serves every step of the workflow object."""
        ...

    async def resolve(self, manager: ResourceManager) -> Any:
        """Builds the value (its own dependencies through ``manager``)."""
        ...

    def set_type_annotation(self, type_annotation: Any) -> None:
        """Tells the descriptor the ``T`` of ``Annotated[T, ...]``."""
        ...

    def set_localns(self, localns: dict[str, Any] | None) -> None:
        """Names for resolving the factory's string annotations."""
        ...

    def get_dependencies(self) -> list[tuple[str, ResourceDescriptor, type | None]]:
        """The factory's resource parameters: (name, descriptor, annotated type)."""
        ...


def resource_of(annotation: Any) -> tuple[ResourceDescriptor, Any] | None:
    """The descriptor and type of an ``Annotated[T, Resource(...)]`` annotation, else None."""
    if typing.get_origin(annotation) is not Annotated:
        return None
    base, *meta = typing.get_args(annotation)
    for m in meta:
        if isinstance(m, ResourceDescriptor):
            return m, base
    return None


class _Resource(Generic[T]):
    """A factory and whether its value is cached; made by :func:`Resource`."""

    def __init__(self, factory: Callable[..., T | Awaitable[T]], cache: bool) -> None:
        if not callable(factory):
            msg = f"Resource() takes a factory function, not {factory!r}"
            raise TypeError(msg)
        self._factory = factory
        self._is_async = inspect.iscoroutinefunction(factory)
        self.name: str = getattr(factory, "__qualname__", type(factory).__name__)
        self.cache: bool = cache
        self._localns: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"Resource({self.name}, cache={self.cache})"

    def get_dependencies(self) -> list[tuple[str, ResourceDescriptor, type | None]]:
        """The factory's parameters annotated as resources."""
        local = self._localns
        if local:
            # Names of the factory's own module win over the caller's locals.
            own = getattr(self._factory, "__globals__", {})
            local = {k: v for k, v in local.items() if k not in own}
        try:
            hints = typing.get_type_hints(self._factory, localns=local, include_extras=True)
        except Exception:  # unresolvable names: only plain annotations count
            hints = {}
        deps: list[tuple[str, ResourceDescriptor, type | None]] = []
        for p in inspect.signature(self._factory).parameters.values():
            found = resource_of(hints.get(p.name, p.annotation))
            if found is not None:
                deps.append((p.name, found[0], found[1]))
        return deps

    async def call(self, manager: ResourceManager | None = None) -> T:
        """Calls the factory with its resource parameters, awaiting it if it is async."""
        manager = manager if manager is not None else ResourceManager()
        kwargs: dict[str, Any] = {}
        for name, dep, annotation in self.get_dependencies():
            dep.set_type_annotation(annotation)
            dep.set_localns(self._localns)
            kwargs[name] = await manager.get(dep)
        if self._is_async:
            return await cast("Callable[..., Awaitable[T]]", self._factory)(**kwargs)
        return cast("Callable[..., T]", self._factory)(**kwargs)

    async def resolve(self, manager: ResourceManager) -> T:
        return await self.call(manager)

    def set_type_annotation(self, type_annotation: Any) -> None:
        return None  # a factory says what it builds

    def set_localns(self, localns: dict[str, Any] | None) -> None:
        self._localns = localns


def Resource(factory: Callable[..., T], cache: bool = True) -> _Resource[T]:
    """Declares a resource for a step parameter: ``Annotated[T, Resource(factory)]``.

    :param factory: builds the value; sync or async; its parameters annotated
        ``Annotated[U, Resource(...)]`` (or ``ResourceConfig``) are resources too.
    :param cache: True (the default): one value per workflow object, built the first time
        a step asks and shared by every step and run of that object (and built again in
        the process that resumes a run). False: built for each attempt that asks.
    """
    return _Resource(factory, cache)


class _ResourceConfig(Generic[B]):
    """A pydantic model read from (a part of) a JSON file; made by :func:`ResourceConfig`."""

    def __init__(
        self,
        config_file: str,
        path_selector: str | None,
        cls_factory: type[B] | None = None,
        label: str | None = None,
        description: str | None = None,
    ) -> None:
        if Path(config_file).suffix != ".json":
            msg = f"ResourceConfig reads JSON files only, not {config_file!r}"
            raise ValueError(msg)
        self._original_config_file = config_file
        self._resolved: str | None = None
        self.path_selector = path_selector
        self.cls_factory = cls_factory
        self.label = label
        self.description = description

    def __repr__(self) -> str:
        return f"ResourceConfig({self.name!r})"

    @property
    def config_file(self) -> str:
        """The file's absolute path, checked to exist the first time it is asked for."""
        if self._resolved is None:
            path = Path(self._original_config_file)
            if not path.is_file():
                msg = f"ResourceConfig: no such file: {self._original_config_file}"
                raise FileNotFoundError(msg)
            self._resolved = str(path.resolve())
        return self._resolved

    @property
    def name(self) -> str:
        base = self._original_config_file
        return base if self.path_selector is None else f"{base}.{self.path_selector}"

    @property
    def cache(self) -> bool:
        """A configuration is read once per workflow object."""
        return True

    def _data(self) -> dict[str, Any]:
        path = self.config_file
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            msg = f"ResourceConfig: {path} is not JSON: {exc}"
            raise ValueError(msg) from exc
        where = ""
        for key in (self.path_selector or "").split(".") if self.path_selector else ():
            where = f"{where}.{key}" if where else key
            data = data.get(key) if isinstance(data, dict) else None
            if not isinstance(data, dict):
                msg = (
                    f"ResourceConfig: {path} has no JSON object at {where!r}"
                    f" (found {type(data).__name__})"
                )
                raise ValueError(msg)
        if not isinstance(data, dict):
            msg = f"ResourceConfig: {path} holds {type(data).__name__}, not a JSON object"
            raise ValueError(msg)
        return data

    def call(self) -> B:
        """Reads the file and validates the selected object as the model class."""
        cls = self.cls_factory
        if cls is None:
            msg = "ResourceConfig: the model class is not known (annotate Annotated[Model, ...])"
            raise ValueError(msg)
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            msg = f"ResourceConfig({self.name!r}) builds pydantic models, not {cls!r}"
            raise TypeError(msg)
        return cls.model_validate(self._data())

    async def resolve(self, manager: ResourceManager) -> B:
        return self.call()

    def set_type_annotation(self, type_annotation: Any) -> None:
        if self.cls_factory is None:
            self.cls_factory = cast("type[B]", type_annotation)

    def set_localns(self, localns: dict[str, Any] | None) -> None:
        return None

    def get_dependencies(self) -> list[tuple[str, ResourceDescriptor, type | None]]:
        return []


def ResourceConfig(
    config_file: str,
    path_selector: str | None = None,
    label: str | None = None,
    description: str | None = None,
) -> _ResourceConfig[Any]:
    """Declares a configuration resource: ``Annotated[Model, ResourceConfig(...)]``.

    The JSON file (the object at ``path_selector``, dotted keys, if given) is validated
    as the annotated pydantic model, once per workflow object. ``label`` and
    ``description`` are for people reading the workflow.
    """
    return _ResourceConfig(
        config_file=config_file,
        path_selector=path_selector,
        label=label,
        description=description,
    )


class ResourceDefinition(BaseModel):
    """A step parameter that asks for a resource: its name, descriptor and type."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    resource: ResourceDescriptor
    type_annotation: Any = None


class ResourceManager:
    """Builds resources and keeps the cached ones, for one workflow object.

    ``Workflow(resource_manager=...)`` shares one between workflow objects, or gives a
    test its own values (:meth:`set`).
    """

    def __init__(self) -> None:
        self.resources: dict[str, Any] = {}
        self._resolving: list[str] = []
        self._scope: dict[str, Any] = {}
        self._depth = 0

    @contextmanager
    def resolution_scope(self) -> Iterator[None]:
        """Within one scope (one attempt's resources) an uncached resource is built once."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._scope.clear()

    async def set(self, name: str, val: Any) -> None:
        """Puts a value under a resource's name (what a cached resource then gives)."""
        self.resources[name] = val

    async def get(self, resource: ResourceDescriptor) -> Any:
        """The resource's value: the cached one, or built now.

        :raises ValueError: resources that depend on each other in a cycle.
        """
        if self._depth == 0:
            with self.resolution_scope():
                return await self._get(resource)
        return await self._get(resource)

    async def _get(self, resource: ResourceDescriptor) -> Any:
        name = resource.name
        if name in self._resolving:
            chain = " -> ".join([*self._resolving, name])
            msg = f"Circular resource dependency detected: {chain}"
            raise ValueError(msg)
        if resource.cache and name in self.resources:
            return self.resources[name]
        if name in self._scope:
            return self._scope[name]
        self._resolving.append(name)
        try:
            value = await resource.resolve(self)
        finally:
            self._resolving.remove(name)
        if resource.cache:
            self.resources[name] = value
        self._scope[name] = value
        return value

    def get_all(self) -> dict[str, Any]:
        """The cached values by name."""
        return self.resources

    async def inject(self, resources: tuple[ResourceDefinition, ...]) -> dict[str, Any]:
        """The values of one attempt's resource parameters, by parameter name."""
        out: dict[str, Any] = {}
        with self.resolution_scope():
            for r in resources:
                r.resource.set_type_annotation(r.type_annotation)
                out[r.name] = await self.get(r.resource)
        return out


def check_configs(resources: dict[str, tuple[ResourceDefinition, ...]], workflow: str) -> None:
    """Reads every configuration a step (or a factory) asks for, so a missing or invalid
    file is an error when the workflow is built rather than in the middle of a run.

    :raises WorkflowValidationError: naming the step, the parameter and the problem.
    """
    from ._errors import WorkflowValidationError

    problems: list[str] = []
    seen: set[str] = set()
    stack = [
        (step, r.name, r.resource, r.type_annotation) for step, rs in resources.items() for r in rs
    ]
    while stack:
        step, param, res, annotation = stack.pop()
        res.set_type_annotation(annotation)
        if res.name in seen:
            continue
        seen.add(res.name)
        stack.extend((step, param, d, a) for _, d, a in res.get_dependencies())
        if isinstance(res, _ResourceConfig):
            try:
                res.call()
            except Exception as exc:
                problems.append(f"step {step!r}, parameter {param!r} ({res!r}): {exc}")
    if problems:
        raise WorkflowValidationError(f"{workflow}: " + "; ".join(problems))
