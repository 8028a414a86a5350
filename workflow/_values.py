"""What the views, the diff and the appliers of context values share: kinds of values.

Atoms and frozen values are handed out as they are; dataclass, attrs and pydantic
objects are walked field by field; everything a patch carries is :func:`fresh` (it shares
nothing mutable). The view classes register here (:data:`VIEWS`, :data:`NODES`) so that
this module, the diff (:mod:`workflow._delta`) and each kind of view depend on none of the
views' modules: :mod:`workflow._diff` imports them all, which registers them.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import operator
import weakref
from collections.abc import Callable
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Final, Protocol
from uuid import UUID

import attrs
from pydantic import BaseModel

from eventstore import Codec

from ._identity import AtomMemo
from ._patch import TAG, KeyRef, Op, Path, PathElem

__all__ = [
    "ATOMS",
    "FROZEN",
    "MEMO",
    "NODES",
    "PYDANTIC_EXTRAS",
    "VIEWS",
    "Node",
    "elem",
    "field_names",
    "fresh",
    "immutable",
    "is_frozen",
    "materialize",
    "node_of",
    "put_op",
    "rebuild",
    "register_views",
    "same",
    "same_extras",
    "shared_node",
    "tail_ops",
    "tracked",
    "view_of",
]

ATOMS: Final = frozenset({str, int, float, bool, type(None), bytes})
# Immutable beyond the atoms: returned as they are, never copied (dt.datetime is a dt.date).
FROZEN: Final = (complex, range, Decimal, UUID, dt.date, dt.time, dt.timedelta, Enum, PurePath)
PYDANTIC_EXTRAS: Final = ("__pydantic_extra__", "__pydantic_private__")
# Committed lists (and dicts' values) seen holding atoms only: a view of one wraps nothing.
MEMO: Final = AtomMemo(ATOMS)


class Node(Protocol):
    """What records the mutations of one mutable part of a committed value: a list or dict
    view, or the private copy of another object (``obj``, its fields' nodes in ``kids``)."""

    def _collect(self, out: list[Op], path: Path) -> None: ...


# The view classes (a list or dict subclass each), with what the codec encodes them as.
VIEWS: Final[dict[type, Callable[[Any], Any]]] = {}
# What makes the node of a committed value: by its type (list, dict), or ``object`` for
# any other mutable value (a copy); filled by the views' modules.
NODES: Final[dict[type, Callable[[Any, Codec, object], Node]]] = {}

# Per class, weakly: classes made at run time (in functions, in tests) may go away.
_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...] | None] = weakref.WeakKeyDictionary()


def field_names(obj: Any) -> tuple[str, ...] | None:
    """The field names of a dataclass, attrs or pydantic instance; None for other values."""
    if isinstance(obj, BaseModel):
        return tuple(obj.__dict__)  # what the codec writes, besides extras and private
    t = type(obj)
    if t not in _FIELD_NAMES:
        if dataclasses.is_dataclass(t):
            _FIELD_NAMES[t] = tuple(f.name for f in dataclasses.fields(t))
        elif attrs.has(t):
            _FIELD_NAMES[t] = tuple(a.name for a in attrs.fields(t))
        else:
            _FIELD_NAMES[t] = None
    return _FIELD_NAMES[t]


def is_frozen(t: type) -> bool:
    if issubclass(t, BaseModel):
        return bool(t.model_config.get("frozen"))
    params = getattr(t, "__dataclass_params__", None)
    if params is not None:
        return bool(params.frozen)
    return getattr(t.__setattr__, "__name__", "") == "_frozen_setattrs"  # attrs' frozen hook


def immutable(x: Any) -> bool:
    """Whether nothing inside x can change, so a view may hand x itself out."""
    t = type(x)
    if t in ATOMS or isinstance(x, FROZEN):
        return True
    if t is tuple or t is frozenset:
        return all(map(immutable, x))
    names = field_names(x)
    return names is not None and is_frozen(t) and all(immutable(getattr(x, f)) for f in names)


def rebuild(obj: Any, values: dict[str, Any], *, deep: bool) -> Any:
    new = copy.copy(obj)  # O(#fields); object.__setattr__ also passes frozen classes
    for name, value in values.items():
        object.__setattr__(new, name, value)
    if deep and isinstance(obj, BaseModel):
        for attr in PYDANTIC_EXTRAS:
            object.__setattr__(new, attr, copy.deepcopy(getattr(obj, attr)))
    return new


def fresh(x: Any) -> Any:
    """A deep copy of x with views materialized: it shares no mutable part with anything.

    Patches carry fresh values, so that neither the user's later mutations nor the executor's
    in-place applies can reach through a patch into another value.
    """
    t = type(x)
    if t in ATOMS:
        return x
    if t is list:
        return [v if type(v) in ATOMS else fresh(v) for v in x]
    if t is dict:
        return {k: v if type(v) in ATOMS else fresh(v) for k, v in x.items()}
    if t in VIEWS:
        return x._materialize()
    if t is tuple:
        return tuple(map(fresh, x))
    if isinstance(x, FROZEN):
        return x
    if _plain_model(t):
        return _fresh_model(x, x.__class__)
    names = field_names(x)
    if names is not None:
        return rebuild(x, {f: fresh(getattr(x, f)) for f in names}, deep=True)
    return copy.deepcopy(x)


# Per pydantic class: whether it copies as BaseModel does (no __copy__ of its own).
_PLAIN_MODELS: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _plain_model(t: type) -> bool:
    known = _PLAIN_MODELS.get(t)
    if known is None:
        known = _PLAIN_MODELS[t] = issubclass(t, BaseModel) and t.__copy__ is BaseModel.__copy__
    return known


def _fresh_model(x: Any, t: type[BaseModel]) -> Any:
    """:func:`fresh` of a pydantic model whose class copies as ``BaseModel`` does: what
    ``rebuild(copy.copy(x), fresh fields, deep=True)`` makes, built directly (fields
    fresh, extras and private values deep-copied, the set of fields set copied)."""
    new = t.__new__(t)
    setattr_ = object.__setattr__
    setattr_(
        new, "__dict__", {k: v if type(v) in ATOMS else fresh(v) for k, v in x.__dict__.items()}
    )
    setattr_(new, "__pydantic_fields_set__", set(x.__pydantic_fields_set__))
    for attr in PYDANTIC_EXTRAS:
        value = getattr(x, attr, None)
        setattr_(new, attr, None if value is None else copy.deepcopy(value))
    return new


def materialize(obj: Any) -> Any:
    """Return a real Python value for obj: views become fresh plain copies, recursively.

    Plain values come back as they are; plain containers holding views are rebuilt along the
    way to them (copy on write), so the cost is that of walking obj.
    """
    t = type(obj)
    if t in ATOMS:
        return obj
    if t in VIEWS:
        return obj._materialize()
    if t is list or t is tuple:
        items = [materialize(v) for v in obj]
        return obj if all(map(operator.is_, items, obj)) else t(items)
    if t is dict:
        new = {k: materialize(v) for k, v in obj.items()}
        return obj if all(map(operator.is_, new.values(), obj.values())) else new
    names = field_names(obj)
    if names:
        values = {f: materialize(getattr(obj, f)) for f in names}
        if any(v is not getattr(obj, f) for f, v in values.items()):
            return rebuild(obj, values, deep=False)
    return obj


def same(a: Any, b: Any, codec: Codec) -> bool:
    # Encoded, not ==: 1 == 1.0 == True, but the log must record a change between them.
    return a is b or codec.encode(materialize(a)) == codec.encode(materialize(b))


def same_extras(a: Any, b: Any, codec: Codec) -> bool:
    # Pydantic extras and private values are compared whole: rare, and not fields.
    if not isinstance(a, BaseModel):
        return True
    return all(same(getattr(a, x), getattr(b, x), codec) for x in PYDANTIC_EXTRAS)


def elem(key: Any) -> PathElem:
    return key if type(key) is str and key != TAG else KeyRef(key)


def put_op(path: Path, value: Any) -> Op:
    return ("set", path, value) if path else ("replace", path, value)


def tail_ops(path: Path, tail: list[Any], out: list[Op]) -> None:
    if len(tail) == 1:
        out.append(("append", path, fresh(tail[0])))
    elif tail:
        out.append(("extend", path, [fresh(v) for v in tail]))


def node_of(x: Any, codec: Codec, token: object) -> Node | None:
    """The node that tracks x, or None when x is immutable and handed out as it is.

    :param token: its tracker's (each view carries it, so a diff knows the views that are
        current from those kept from an earlier attempt).
    """
    make = NODES.get(type(x))
    if make is not None:
        return make(x, codec, token)
    return None if immutable(x) else NODES[object](x, codec, token)


def view_of(node: Node) -> Any:
    """What a node shows the user: the view itself, or a copy node's object."""
    return node if type(node) in VIEWS else node.obj  # type: ignore[attr-defined]


def tracked(x: Any) -> bool:
    """Whether x is a list or dict view (or a copy of one)."""
    return type(x) in VIEWS


def shared_node(
    shared: dict[Any, Node], key: Any, x: Any, codec: Codec, token: object
) -> Node | None:
    """The wrapper of committed item x at key, shared by a view and the copies made of it."""
    node = shared.get(key)
    if node is None:
        node = node_of(x, codec, token)
        if node is not None:
            shared[key] = node
    return node


_VIEWS_KNOWN: weakref.WeakSet[Codec] = weakref.WeakSet()


def register_views(codec: Codec) -> None:
    """Teaches codec to encode views as the plain lists and dicts they show (once per codec)."""
    if codec in _VIEWS_KNOWN:
        return
    for cls, proxy in VIEWS.items():
        codec.register_proxy(cls, proxy)
    _VIEWS_KNOWN.add(codec)
