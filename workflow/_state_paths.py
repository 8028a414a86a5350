"""Dotted paths into context values (``ctx.store.get("a.b.0")``), as LlamaIndex reads them:
a step into a dict key, a list index or an attribute, and a write at the end of one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ._attempt import MISSING
from ._events import Event

__all__ = ["assign", "put_at", "set_path_outside", "split", "step_into"]


class _Host(Protocol):
    """What a write outside an attempt uses of the store's host (``StoreHost``)."""

    @property
    def committed(self) -> dict[str, Any]: ...

    @property
    def versions(self) -> dict[str, int]: ...

    async def operator_update(
        self,
        updates: Mapping[str, Any],
        deletes: list[str] | None = None,
        *,
        read: Mapping[str, int] | None = None,
    ) -> int: ...


def split(path: str) -> tuple[str, list[str]]:
    root, *rest = path.split(".")
    return root, rest


def step_into(obj: Any, part: str) -> Any:
    if isinstance(obj, Event | dict) or (hasattr(obj, "__getitem__") and not hasattr(obj, part)):
        try:
            return obj[part]
        except (KeyError, TypeError, IndexError):
            pass
    if isinstance(obj, list | tuple):
        return obj[int(part)]
    return getattr(obj, part)


def assign(parent: Any, part: str, value: Any) -> None:
    """``parent[part] = value`` for a dict or list, else ``setattr`` (an event, a model)."""
    if isinstance(parent, Event) or not hasattr(parent, "__setitem__"):
        setattr(parent, part, value)
    elif isinstance(parent, list):
        parent[int(part)] = value
    else:
        parent[part] = value


def put_at(root: Any, rest: list[str], value: Any) -> None:
    """Puts ``value`` at the path ``rest`` inside ``root``, in place; missing parents are
    created as dicts, as in LlamaIndex."""
    parent = root
    for part in rest[:-1]:
        try:
            parent = step_into(parent, part)
        except (KeyError, AttributeError, IndexError, TypeError, ValueError):
            child: dict[str, Any] = {}
            assign(parent, part, child)
            parent = child
    assign(parent, rest[-1], value)


async def set_path_outside(
    host: _Host,
    root_key: str,
    rest: list[str],
    value: Any,
    field_default: Callable[[str], Any],
) -> None:
    """``ctx.store.set("key.a.b", value)`` outside an attempt: an operator update of
    ``key``, a copy of its committed value with the change made (missing parents made as
    dicts, a typed field starting from its default), checked against the version it read,
    so a step's commit in between is never undone."""
    version = host.versions.get(root_key, 0)
    root = host.committed.get(root_key, MISSING)
    root = field_default(root_key) if root is MISSING else copy.deepcopy(root)
    if root is MISSING:
        root = {}
    put_at(root, rest, value)
    await host.operator_update({root_key: root}, read={root_key: version})
