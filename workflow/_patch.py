"""Patches of context values: the ops, their JSON form, and their appliers.

An op says what changed at a path inside a value (see :mod:`workflow._diff`, which makes
them). :func:`apply` plays ops onto a live Python value and :func:`apply_json` onto the
codec dump that the fold keeps, both in place and at the cost of the change.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import orjson

from eventstore import Codec

__all__ = [
    "KeyRef",
    "Op",
    "Path",
    "PathElem",
    "apply",
    "apply_copied",
    "apply_json",
    "ops_from_json",
    "ops_to_json",
    "patch_size",
]

TAG: Final = "$t"
OBJ_TAGS: Final = frozenset({"model", "dataclass", "attrs"})
VALUE_OPS: Final = frozenset({"set", "replace", "append"})


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRef:
    """A path element naming a dict key that is not a str (or is ``"$t"``).

    Wrapped so that it is never taken for a list index or a field name.
    """

    key: Any


PathElem: TypeAlias = str | int | KeyRef  # a dict key or field (str), list index, other key
Path: TypeAlias = tuple[PathElem, ...]  # from the root value down
Op: TypeAlias = tuple[Any, ...]  # (kind, path, *args), see the module docstring

_Get = Callable[[Any, Any], Any]
_Put = Callable[[Any, Any, Any], None]
_Del = Callable[[Any, Any], None]


def _apply(value: Any, ops: list[Any], get: _Get, put: _Put, delete: _Del) -> Any:
    for op in ops:
        kind, path = op[0], op[1]
        if kind == "append":  # first: a list that grows is the common patch
            node = value
            for elem in path:
                node = get(node, elem)
            node.append(op[2])
            continue
        if kind in ("set", "replace") and not path:
            value = op[2]
            continue
        node = value
        for elem in path[:-1] if kind in ("set", "replace", "del") else path:
            node = get(node, elem)
        if kind in ("set", "replace"):
            put(node, path[-1], op[2])
        elif kind == "del":
            delete(node, path[-1])
        elif kind == "append":
            node.append(op[2])
        elif kind == "extend":
            node.extend(op[2])
        elif kind == "trunc":
            del node[op[2] :]
        else:
            msg = f"unknown patch op {kind!r} in {op!r}"
            raise ValueError(msg)
    return value


def _py_get(node: Any, elem: Any) -> Any:
    if type(elem) is KeyRef:
        return node[elem.key]
    return node[elem] if isinstance(node, list | dict) else getattr(node, elem)


def _py_put(node: Any, elem: Any, value: Any) -> None:
    if type(elem) is KeyRef:
        node[elem.key] = value
    elif isinstance(node, list | dict):
        node[elem] = value
    else:  # a field: bypasses pydantic's validate_assignment, as the codec's rebuild does
        object.__setattr__(node, elem, value)


def _py_del(node: Any, elem: Any) -> None:
    del node[elem.key if type(elem) is KeyRef else elem]


def apply(value: Any, ops: list[Op]) -> Any:
    """Apply ops to a live Python value, in place where possible; return the (new) root.

    The op values become part of value: apply each patch once (``Tracker.ops`` and ``diff``
    give fresh values).
    """
    return _apply(value, ops, _py_get, _py_put, _py_del)


def _shallow(node: Any) -> Any:
    t = type(node)
    if t is list or t is dict:
        return node.copy()
    return copy.copy(node)  # a dataclass, attrs or pydantic object: its fields, shallowly


def apply_copied(value: Any, ops: list[Op]) -> Any:
    """What :func:`apply` gives, without changing value: the containers on the ops' paths
    are copied (shallowly, once each), everything else is shared with value.

    So the new value of a long list that grew costs one C-speed copy of the list, not a
    deep copy. The result shares untouched parts with value: never apply ops in place to
    one while the other is in use.
    """
    copied: set[int] = set()

    def own(node: Any) -> Any:
        new = _shallow(node)
        copied.add(id(new))
        return new

    root = value
    for op in ops:
        kind, path = op[0], op[1]
        if kind in ("set", "replace") and not path:
            root = op[2]
            copied.add(id(root))  # the patch's own value: fresh, changed in place
            continue
        if id(root) not in copied:
            root = own(root)
        node = root
        for elem in path[:-1] if kind in ("set", "replace", "del") else path:
            child = _py_get(node, elem)
            if id(child) not in copied:
                child = own(child)
                _py_put(node, elem, child)
            node = child
        last = (path[-1],) if kind in ("set", "replace", "del") else ()
        _apply(node, [(kind, last, *op[2:])], _py_get, _py_put, _py_del)
    return root


def _j_fields(node: Any) -> Any:
    # A tagged dataclass/attrs/model keeps its fields under "v".
    if type(node) is dict and node.get(TAG) in OBJ_TAGS:
        return node["v"]
    return node


def _j_key(elem: Any) -> Any:
    return elem["k"] if type(elem) is dict else elem


def _j_find(node: dict[str, Any], key: Any) -> int:
    # Linear, as rare as non-str keys; JSON == matches as dict keys do (1 == 1.0 == True).
    return next((i for i, pair in enumerate(node["v"]) if pair[0] == key), -1)


def _j_get(node: Any, elem: Any) -> Any:
    node = _j_fields(node)
    if type(node) is dict and node.get(TAG) == "dict":
        i = _j_find(node, _j_key(elem))
        if i < 0:
            raise KeyError(elem)
        return node["v"][i][1]
    return node[_j_key(elem)]


def _j_put(node: Any, elem: Any, value: Any) -> None:
    node = _j_fields(node)
    if type(node) is list or (type(elem) is str and TAG not in node):
        node[elem] = value
        return
    if TAG not in node:  # the first non-str key: the object takes the tagged form, in place
        pairs = [[k, v] for k, v in node.items()]
        node.clear()
        node.update({TAG: "dict", "v": pairs})
    key = _j_key(elem)
    i = _j_find(node, key)
    if i < 0:
        node["v"].append([key, value])
    else:
        node["v"][i][1] = value


def _j_del(node: Any, elem: Any) -> None:
    node = _j_fields(node)
    if type(node) is list or TAG not in node:
        del node[_j_key(elem)]
        return
    i = _j_find(node, _j_key(elem))
    if i < 0:
        raise KeyError(elem)
    del node["v"][i]


def apply_json(data: Any, ops_json: list[Any]) -> Any:
    """Apply JSON-form ops to a codec dump in place; return the (new) root.

    Both are changed and shared: pass a dump and ops decoded from JSON text, never the
    structures ``Codec.dump`` or :func:`ops_to_json` return, which share live values.
    """
    return _apply(data, ops_json, _j_get, _j_put, _j_del)


def ops_to_json(ops: list[Op], codec: Codec) -> list[Any]:
    """The JSON form of ops: values dumped with codec, a KeyRef as ``{"k": dump(key)}``."""
    out: list[Any] = []
    for kind, path, *args in ops:
        elems = [{"k": codec.dump(e.key)} if type(e) is KeyRef else e for e in path]
        if kind == "extend":
            args = [[codec.dump(v) for v in args[0]]]
        elif kind in VALUE_OPS:
            args = [codec.dump(args[0])]
        out.append([kind, elems, *args])
    return out


def ops_from_json(data: list[Any], codec: Codec) -> list[Op]:
    """The Python form of JSON ops, values loaded with codec; inverse of :func:`ops_to_json`."""
    out: list[Op] = []
    for kind, elems, *args in data:
        path = tuple(KeyRef(codec.load(e["k"])) if type(e) is dict else e for e in elems)
        if kind == "extend":
            args = [[codec.load(v) for v in args[0]]]
        elif kind in VALUE_OPS:
            args = [codec.load(args[0])]
        out.append((kind, path, *args))
    return out


def patch_size(ops_json: list[Any]) -> int:
    """Bytes of the encoded patch, to choose between writing it and rewriting the value."""
    return len(orjson.dumps(ops_json))
