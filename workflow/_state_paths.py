"""Dotted paths into context values (``ctx.store.get("a.b.0")``), as LlamaIndex reads them:
a step into a dict key, a list index or an attribute, and a write at the end of one.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from ._events import Event

__all__ = ["assign", "put_at", "put_on_copied_spine", "split", "step_into"]


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


def put_on_copied_spine(root: Any, rest: list[str], value: Any) -> Any:
    """``root`` with ``value`` put at the path ``rest``, as LlamaIndex's in-memory store
    writes a dotted path: each dict, list or model on the path is a shallow copy, what is
    off the path is shared; any other object on it (a live handle) is written in place.
    Missing parents are created as dicts."""
    top = _copied(root)
    parent = top
    for part in rest[:-1]:
        try:
            child = _copied(step_into(parent, part))
        except (KeyError, AttributeError, IndexError, TypeError, ValueError):
            child = {}
        assign(parent, part, child)
        parent = child
    assign(parent, rest[-1], value)
    return top


def _copied(node: Any) -> Any:
    if isinstance(node, BaseModel):
        return node.model_copy()
    if isinstance(node, dict | list):
        return copy.copy(node)
    return node
