"""Context writes at the size of the change: copy-on-write views, patches, and their appliers.

A step reads a context value through a :class:`Tracker`. Its ``view`` behaves like the
committed value but never changes it (a failed attempt must leave no trace, and concurrent
attempts share the committed value): the view records its mutations, and ``ops()`` returns
them as a patch whose size is that of the change. :func:`diff` makes the same patch for a
plain new value. :func:`apply` plays a patch onto the live Python value and :func:`apply_json`
onto the codec dump that the fold keeps, both in place.

Ops, Python form; a path holds str keys or fields, int list indexes and :class:`KeyRef`::

    ("replace", path, value)    the value at path becomes value; the only op with path ()
    ("set", path, value)        assign path[-1] in its container: dict key, list index, field
    ("del", path)               delete path[-1] from its dict (or list)
    ("append", path, value)     append to the list at path
    ("extend", path, [values])  append each value to the list at path
    ("trunc", path, n)          del list[n:] on the list at path

"set" and "replace" are applied alike; "replace" marks a whole rewrite that a view could not
express more cheaply (an insert inside a list, sort, clear). JSON form: ``[kind, [elem, ...],
*args]``, values as ``Codec.dump`` gives them and a KeyRef as ``{"k": dump(key)}``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping, MutableSequence
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Final, TypeAlias, overload
from uuid import UUID

import attrs
from pydantic import BaseModel

from eventstore import Codec, default_codec

from ._patch import (
    TAG,
    KeyRef,
    Op,
    Path,
    PathElem,
    apply,
    apply_json,
    ops_from_json,
    ops_to_json,
    patch_size,
)

__all__ = [
    "KeyRef",
    "Op",
    "Path",
    "PathElem",
    "TrackedDict",
    "TrackedList",
    "Tracker",
    "apply",
    "apply_json",
    "diff",
    "materialize",
    "ops_from_json",
    "ops_to_json",
    "patch_size",
]

_ATOMS: Final = frozenset({str, int, float, bool, type(None), bytes})
# Immutable beyond the atoms: returned as they are, never copied (dt.datetime is a dt.date).
_FROZEN: Final = (complex, range, Decimal, UUID, dt.date, dt.time, dt.timedelta, Enum, PurePath)
_PYDANTIC_EXTRAS: Final = ("__pydantic_extra__", "__pydantic_private__")
_MISSING: Final[Any] = object()
_REPLACE_OVERHEAD: Final = len(b'[["replace",[],]]')  # a whole-value patch, its value aside


_Node: TypeAlias = "TrackedList | TrackedDict | _Copy"  # what records one mutable part

# Per class, weakly: classes made at run time (in functions, in tests) may go away.
_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...] | None] = weakref.WeakKeyDictionary()


def _fields(obj: Any) -> tuple[str, ...] | None:
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


def _frozen(t: type) -> bool:
    if issubclass(t, BaseModel):
        return bool(t.model_config.get("frozen"))
    params = getattr(t, "__dataclass_params__", None)
    if params is not None:
        return bool(params.frozen)
    return getattr(t.__setattr__, "__name__", "") == "_frozen_setattrs"  # attrs' frozen hook


def _immutable(x: Any) -> bool:
    """Whether nothing inside x can change, so a view may hand x itself out."""
    t = type(x)
    if t in _ATOMS or isinstance(x, _FROZEN):
        return True
    if t is tuple or t is frozenset:
        return all(map(_immutable, x))
    names = _fields(x)
    return names is not None and _frozen(t) and all(_immutable(getattr(x, f)) for f in names)


def _rebuild(obj: Any, values: dict[str, Any], *, deep: bool) -> Any:
    new = copy.copy(obj)  # O(#fields); object.__setattr__ also passes frozen classes
    for name, value in values.items():
        object.__setattr__(new, name, value)
    if deep and isinstance(obj, BaseModel):
        for attr in _PYDANTIC_EXTRAS:
            object.__setattr__(new, attr, copy.deepcopy(getattr(obj, attr)))
    return new


def _fresh(x: Any) -> Any:
    """A deep copy of x with views materialized: it shares no mutable part with anything.

    Patches carry fresh values, so that neither the user's later mutations nor the executor's
    in-place applies can reach through a patch into another value.
    """
    t = type(x)
    if t in _ATOMS:
        return x
    if t is list:
        return [_fresh(v) for v in x]
    if t is dict:
        return {k: _fresh(v) for k, v in x.items()}
    if t is TrackedList or t is TrackedDict:
        return x._materialize()
    if t is tuple:
        return tuple(map(_fresh, x))
    if isinstance(x, _FROZEN):
        return x
    names = _fields(x)
    if names is not None:
        return _rebuild(x, {f: _fresh(getattr(x, f)) for f in names}, deep=True)
    return copy.deepcopy(x)


def materialize(obj: Any) -> Any:
    """Return a real Python value for obj: views become fresh plain copies, recursively.

    Plain values come back as they are; plain containers holding views are rebuilt along the
    way to them (copy on write), so the cost is that of walking obj.
    """
    t = type(obj)
    if t in _ATOMS:
        return obj
    if t is TrackedList or t is TrackedDict:
        return obj._materialize()
    if t is list or t is tuple:
        items = [materialize(v) for v in obj]
        return obj if all(map(operator.is_, items, obj)) else t(items)
    if t is dict:
        new = {k: materialize(v) for k, v in obj.items()}
        return obj if all(map(operator.is_, new.values(), obj.values())) else new
    names = _fields(obj)
    if names:
        values = {f: materialize(getattr(obj, f)) for f in names}
        if any(v is not getattr(obj, f) for f, v in values.items()):
            return _rebuild(obj, values, deep=False)
    return obj


def _same(a: Any, b: Any, codec: Codec) -> bool:
    # Encoded, not ==: 1 == 1.0 == True, but the log must record a change between them.
    return a is b or codec.encode(materialize(a)) == codec.encode(materialize(b))


def _same_extras(a: Any, b: Any, codec: Codec) -> bool:
    # Pydantic extras and private values are compared whole: rare, and not fields.
    if not isinstance(a, BaseModel):
        return True
    return all(_same(getattr(a, x), getattr(b, x), codec) for x in _PYDANTIC_EXTRAS)


def _elem(key: Any) -> PathElem:
    return key if type(key) is str and key != TAG else KeyRef(key)


def _put(path: Path, value: Any) -> Op:
    return ("set", path, value) if path else ("replace", path, value)


def _tail_ops(path: Path, tail: list[Any], out: list[Op]) -> None:
    if len(tail) == 1:
        out.append(("append", path, _fresh(tail[0])))
    elif tail:
        out.append(("extend", path, [_fresh(v) for v in tail]))


def _node(x: Any, path: Path, codec: Codec) -> _Node | None:
    """The node that tracks x at path, or None when x is immutable and handed out as it is."""
    t = type(x)
    if t is list:
        return TrackedList(x, path, codec)
    if t is dict:
        return TrackedDict(x, path, codec)
    return None if _immutable(x) else _Copy(x, path, codec)


def _view_of(node: _Node) -> Any:
    return node.obj if isinstance(node, _Copy) else node


def _child(
    kids: dict[Any, _Node], key: Any, x: Any, path: Path, elem: PathElem, codec: Codec
) -> Any:
    """What reading committed item x returns: x if immutable, else its view, cached by key."""
    if type(x) in _ATOMS:
        return x
    node = kids.get(key)
    if node is None:
        node = _node(x, (*path, elem), codec)
        if node is None:
            return x
        kids[key] = node
    return _view_of(node)


class _Copy:
    """A private copy of a committed object that is neither a list nor a dict.

    Dataclass, attrs and pydantic objects are copied shallowly, O(#fields), so ``isinstance``
    still holds; their mutable fields become nested views, and each field is diffed on its own.
    Other values (sets, bytearrays, tuples holding lists...) are deep-copied, O(size), and
    compared whole by encoded value when the patch is taken.
    """

    __slots__ = ("base", "codec", "kids", "names", "obj", "path")

    def __init__(self, base: Any, path: Path, codec: Codec) -> None:
        self.base, self.path, self.codec = base, path, codec
        self.names = _fields(base)
        self.kids: dict[str, _Node] = {}
        if self.names is None:
            self.obj = copy.deepcopy(base)
            return
        self.obj = copy.copy(base)
        if isinstance(base, BaseModel):  # extras and private values are rare: copied whole
            for attr in _PYDANTIC_EXTRAS:
                object.__setattr__(self.obj, attr, copy.deepcopy(getattr(base, attr)))
        for name in self.names:
            value = getattr(base, name)
            node = None if type(value) in _ATOMS else _node(value, (*path, name), codec)
            if node is not None:
                self.kids[name] = node
                object.__setattr__(self.obj, name, _view_of(node))

    def _collect(self, out: list[Op]) -> None:
        obj, base, codec = self.obj, self.base, self.codec
        if self.names is None or not _same_extras(obj, base, codec):
            if not _same(obj, base, codec):
                out.append(_put(self.path, _fresh(obj)))
            return
        for name in self.names:
            value, kid = getattr(obj, name), self.kids.get(name)
            if kid is not None and value is _view_of(kid):
                kid._collect(out)
            elif not _same(value, getattr(base, name), codec):
                out.append(("set", (*self.path, name), _fresh(value)))


@functools.total_ordering  # <= and >= from < and ==, like a list
class TrackedList(MutableSequence[Any]):
    """A copy-on-write view of a committed list: mutations are recorded, never applied to it.

    It shows the first ``len`` items of the committed list as they were at creation (items the
    executor appends later stay invisible), overlaid with items assigned by index and an
    appended tail. Reads, assignments, appends and removals at the end are O(1). An insert or
    removal among the committed items, ``sort`` and ``reverse`` copy the list once (O(n),
    nested views kept) and the patch then replaces it whole. Not a ``list`` subclass: C code
    reading a list's storage directly would see an empty list.
    """

    __slots__ = ("_base", "_codec", "_kids", "_n", "_n0", "_own", "_path", "_set", "_tail")

    def __init__(self, base: list[Any], path: Path = (), codec: Codec = default_codec) -> None:
        self._base, self._path, self._codec = base, path, codec
        self._n = self._n0 = len(base)  # committed items shown, and at creation
        self._set: dict[int, Any] = {}  # index < _n -> assigned value
        self._kids: dict[int, _Node] = {}  # index < _n, not in _set -> nested view
        self._tail: list[Any] = []
        self._own: list[Any] | None = None  # the private copy, once the list is rewritten

    def _index(self, i: int) -> int:
        n = len(self)
        j = operator.index(i)
        j = j + n if j < 0 else j
        if not 0 <= j < n:
            msg = f"list index {i} out of range for length {n}"
            raise IndexError(msg)
        return j

    def _get(self, i: int) -> Any:
        if i in self._set:
            return self._set[i]
        return _child(self._kids, i, self._base[i], self._path, i, self._codec)

    def _owned(self) -> list[Any]:
        if self._own is None:
            self._own = list(self)  # every mutable item becomes a view, so none is lost
            self._set, self._kids, self._tail = {}, {}, []
        return self._own

    def _truncate(self, n: int) -> None:
        for i in range(n, self._n):
            self._set.pop(i, None)
            self._kids.pop(i, None)
        self._n = n

    def __len__(self) -> int:
        return len(self._own) if self._own is not None else self._n + len(self._tail)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = self._index(i)
        if self._own is not None:
            return self._own[i]
        return self._get(i) if i < self._n else self._tail[i - self._n]

    @overload
    def __setitem__(self, i: int, value: Any) -> None: ...
    @overload
    def __setitem__(self, i: slice, value: Iterable[Any]) -> None: ...
    def __setitem__(self, i: int | slice, value: Any) -> None:
        if isinstance(i, slice):
            self._set_slice(i, list(value))
            return
        i = self._index(i)
        if self._own is not None:
            self._own[i] = value
        elif i >= self._n:
            self._tail[i - self._n] = value
        else:
            node = self._kids.get(i)
            if node is None or value is not _view_of(node):  # a child put back changes nothing
                self._kids.pop(i, None)
                self._set[i] = value

    def _set_slice(self, s: slice, values: list[Any]) -> None:
        start, stop, step = s.indices(len(self))
        idx = range(start, stop, step)
        if self._own is None and step == 1 and start >= self._n:
            self._tail[start - self._n : max(start, stop) - self._n] = values
        elif self._own is None and len(idx) == len(values):
            for j, v in zip(idx, values, strict=True):
                self[j] = v
        else:
            self._owned()[s] = values

    def __delitem__(self, i: int | slice) -> None:
        if self._own is not None:
            del self._own[i]
            return
        if isinstance(i, slice):
            idx = range(*i.indices(len(self)))
            if not idx:
                return
            if abs(idx.step) != 1 and len(idx) > 1:
                del self._owned()[i]
                return
            lo, hi = min(idx), max(idx) + 1
        else:
            lo = self._index(i)
            hi = lo + 1
        n = self._n
        if lo >= n:
            del self._tail[lo - n : hi - n]
        elif hi >= n:  # the end of the committed items, and maybe the start of the tail
            del self._tail[: hi - n]
            self._truncate(lo)
        else:
            del self._owned()[lo:hi]

    def insert(self, index: int, value: Any) -> None:
        """Insert value before index; O(1) at or after the committed items, else O(n) once."""
        n = len(self)
        i = operator.index(index)
        i = min(max(i + n, 0) if i < 0 else i, n)
        if self._own is not None:
            self._own.insert(i, value)
        elif i >= self._n:
            self._tail.insert(i - self._n, value)
        else:
            self._owned().insert(i, value)

    def append(self, value: Any) -> None:
        """Append value; the patch carries only the appended items."""
        (self._own if self._own is not None else self._tail).append(value)

    def extend(self, values: Iterable[Any]) -> None:
        """Append each of values (taken first, so that ``v.extend(v)`` works)."""
        (self._own if self._own is not None else self._tail).extend(list(values))

    def clear(self) -> None:
        """Remove all items; the patch replaces the list by an empty one."""
        self._own, self._set, self._kids, self._tail = [], {}, {}, []

    def reverse(self) -> None:
        """Reverse in place; the patch replaces the whole list."""
        self._owned().reverse()

    def sort(self, *, key: Callable[[Any], Any] | None = None, reverse: bool = False) -> None:
        """Sort in place like ``list.sort``; the patch replaces the whole list."""
        self._owned().sort(key=key, reverse=reverse)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """The first index of value in ``[start:stop]``, as ``list.index``."""
        try:
            return super().index(value, start, len(self) if stop is None else stop)
        except ValueError:
            msg = f"{value!r} is not in list"
            raise ValueError(msg) from None

    def copy(self) -> list[Any]:
        """A shallow copy, as ``list.copy``: a plain list whose mutable items are still views."""
        return list(self)

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return self._materialize()

    def __iter__(self) -> Iterator[Any]:
        if self._own is not None:
            yield from self._own
            return
        for i in range(self._n):
            yield self._get(i)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, list | TrackedList):
            return NotImplemented
        if len(self) != len(other):
            return False
        return all(a is b or a == b for a, b in zip(self, other, strict=True))

    def __lt__(self, other: Any) -> bool:
        return bool(list(self) < (list(other) if isinstance(other, TrackedList) else other))

    def __gt__(self, other: Any) -> bool:
        return bool(list(self) > (list(other) if isinstance(other, TrackedList) else other))

    def __add__(self, other: Iterable[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Iterable[Any]) -> list[Any]:
        return [*other, *self]

    def __repr__(self) -> str:
        return repr(list(self))

    def _materialize(self) -> list[Any]:
        if self._own is not None:
            items = self._own
        else:
            items = self._base[: self._n]
            for i, node in self._kids.items():
                items[i] = _view_of(node)
            for i, v in self._set.items():
                items[i] = v
            items += self._tail
        return [_fresh(v) for v in items]

    def _collect(self, out: list[Op]) -> None:
        path = self._path
        if self._own is not None:
            out.append(("replace", path, [_fresh(v) for v in self._own]))
            return
        out.extend(("set", (*path, i), _fresh(v)) for i, v in self._set.items())
        for node in self._kids.values():
            node._collect(out)
        if self._n < self._n0:
            out.append(("trunc", path, self._n))
        _tail_ops(path, self._tail, out)


class TrackedDict(MutableMapping[Any, Any]):
    """A copy-on-write view of a committed dict: mutations are recorded, never applied to it.

    An overlay of assigned keys and deleted keys over the committed dict; every operation is
    O(1) but ``len``, which is O(keys added). Key order follows ``dict``: a deleted key that is
    set again moves to the end.
    """

    __slots__ = ("_base", "_cleared", "_codec", "_del", "_kids", "_path", "_set")

    def __init__(self, base: dict[Any, Any], path: Path = (), codec: Codec = default_codec) -> None:
        self._base, self._path, self._codec = base, path, codec
        self._set: dict[Any, Any] = {}  # in place if a shown committed key, else at the end
        self._del: dict[Any, None] = {}  # committed keys deleted, in order (an ordered set)
        self._kids: dict[Any, _Node] = {}  # committed keys neither set nor deleted -> view
        self._cleared = False

    def _added(self, key: Any) -> bool:
        return key not in self._base or key in self._del

    def __getitem__(self, key: Any) -> Any:
        if key in self._set:
            return self._set[key]
        if key in self._del or key not in self._base:
            raise KeyError(key)
        return _child(self._kids, key, self._base[key], self._path, _elem(key), self._codec)

    def __setitem__(self, key: Any, value: Any) -> None:
        node = self._kids.pop(key, None)
        if node is not None and value is _view_of(node):  # a child put back changes nothing
            self._kids[key] = node
        else:
            self._set[key] = value

    def __delitem__(self, key: Any) -> None:
        if key in self._set:
            del self._set[key]
        elif key in self._del or key not in self._base:
            raise KeyError(key)
        if key in self._base:
            self._del[key] = None
        self._kids.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._set or (key in self._base and key not in self._del)

    def __iter__(self) -> Iterator[Any]:
        for key in self._base:
            if key not in self._del:
                yield key
        for key in self._set:
            if self._added(key):
                yield key

    def __len__(self) -> int:
        added = sum(map(self._added, self._set))
        return len(self._base) - len(self._del) + added

    def popitem(self) -> tuple[Any, Any]:
        """Remove and return the last (key, value) pair, as ``dict.popitem`` does (LIFO)."""
        last = next((k for k in reversed(self._set) if self._added(k)), _MISSING)
        if last is _MISSING:
            last = next((k for k in reversed(self._base) if k not in self._del), _MISSING)
            if last is _MISSING:
                msg = "popitem(): dictionary is empty"
                raise KeyError(msg)
        return last, self.pop(last)

    def clear(self) -> None:
        """Remove all keys; the patch replaces the dict by an empty one."""
        self._base, self._cleared = {}, True
        self._set, self._del, self._kids = {}, {}, {}

    def copy(self) -> dict[Any, Any]:
        """A shallow copy, as ``dict.copy``: a plain dict whose mutable values are still views."""
        return dict(self.items())

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return self._materialize()

    def __ior__(self, other: Any) -> TrackedDict:
        self.update(other)
        return self

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def _materialize(self) -> dict[Any, Any]:
        sets, kids, dels = self._set, self._kids, self._del
        out = {
            k: _fresh(sets[k] if k in sets else _view_of(kids[k]) if k in kids else v)
            for k, v in self._base.items()
            if k not in dels
        }
        out.update((k, _fresh(v)) for k, v in sets.items() if self._added(k))
        return out

    def _collect(self, out: list[Op]) -> None:
        path = self._path
        if self._cleared:  # one op: later ops must never write into an earlier op's value
            out.append(("replace", path, self._materialize()))
            return
        out.extend(("del", (*path, _elem(k))) for k in self._del)
        out.extend(("set", (*path, _elem(k)), _fresh(v)) for k, v in self._set.items())
        for node in self._kids.values():
            node._collect(out)


class Tracker:
    """Tracks one attempt's mutations of one committed root value.

    The patch is relative to base as it was when the tracker was made: only appends to a
    committed list stay invisible to the view; any other change of base in place shows through
    (such an attempt read a key that changed, so it conflicts and runs again anyway).

    :param base: the committed value; never mutated by the tracker or its view.
    :param codec: compares values that are copied rather than viewed (sets, scalars put in
        fields) by their encoding.
    """

    def __init__(self, base: Any, *, codec: Codec | None = None) -> None:
        self._codec = codec or default_codec
        self._node = None if type(base) in _ATOMS else _node(base, (), self._codec)
        self._view = base if self._node is None else _view_of(self._node)

    @property
    def view(self) -> Any:
        """What ``get`` hands the user: a view, a private copy, or base itself if immutable."""
        return self._view

    def ops(self) -> list[Op]:
        """The patch from base to the view's current value, values fresh; [] when unchanged."""
        out: list[Op] = []
        if self._node is not None:
            self._node._collect(out)
        return out

    def is_view(self, obj: Any) -> bool:
        """Whether obj is this tracker's root view, so that ``set(key, obj)`` needs no diff."""
        return obj is self._view


def diff(old: Any, new: Any, codec: Codec, *, whole_size: int | None = None) -> list[Op]:
    """The patch from old to new, comparing encodings, so ``1``, ``1.0`` and ``True`` differ.

    Lists and dicts (and mutable objects of one class) are compared item by item, so the patch
    is as large as the change, though the CPU cost is that of the values. Views in new are
    materialized. Returns [] when nothing changed, and ``[("replace", (), new)]`` when the patch
    would not be smaller than new.

    :param whole_size: the length of new's JSON text, when the caller has encoded it already
        (so new is not encoded again only to be measured).
    """
    new = materialize(new)
    out: list[Op] = []
    _diff(old, new, (), codec, out)
    if not out or out[0][:2] == ("replace", ()):
        return out
    if whole_size is None:
        whole = patch_size(ops_to_json([("replace", (), new)], codec))
    else:
        whole = whole_size + _REPLACE_OVERHEAD
    if patch_size(ops_to_json(out, codec)) >= whole:
        return [("replace", (), _fresh(new))]
    return out


def _diff(old: Any, new: Any, path: Path, codec: Codec, out: list[Op]) -> None:
    t = type(old)
    if old is new:
        return
    if t is type(new) is list:
        _diff_list(old, new, path, codec, out)
    elif t is type(new) is dict:
        _diff_dict(old, new, path, codec, out)
    elif (
        t is type(new)
        and (names := _fields(old)) is not None
        and names == _fields(new)
        and not _frozen(t)  # a frozen object may be shared: never patched in place
        and _same_extras(old, new, codec)
    ):
        for name in names:
            _diff(getattr(old, name), getattr(new, name), (*path, name), codec, out)
    elif not _same(old, new, codec):
        out.append(_put(path, _fresh(new)))


def _diff_list(old: list[Any], new: list[Any], path: Path, codec: Codec, out: list[Op]) -> None:
    n = min(len(old), len(new))
    sub: list[Op] = []
    replaced = 0  # items rewritten whole, not merely changed inside
    for i in range(n):
        before = len(sub)
        _diff(old[i], new[i], (*path, i), codec, sub)
        replaced += len(sub) == before + 1 and sub[-1][:2] == ("set", (*path, i))
    if replaced * 2 > n:  # most items moved (an insert or removal near the front): rewrite
        out.append(_put(path, _fresh(new)))
        return
    out += sub
    if len(new) < len(old):
        out.append(("trunc", path, len(new)))
    _tail_ops(path, new[n:], out)


def _diff_dict(
    old: dict[Any, Any], new: dict[Any, Any], path: Path, codec: Codec, out: list[Op]
) -> None:
    kept = [k for k in old if k in new]
    if list(new)[: len(kept)] != kept:  # keys reordered: a patch adds keys only at the end
        out.append(_put(path, _fresh(new)))
        return
    out.extend(("del", (*path, _elem(k))) for k in old if k not in new)
    for k, v in new.items():
        if k in old:
            _diff(old[k], v, (*path, _elem(k)), codec, out)
        else:
            out.append(("set", (*path, _elem(k)), _fresh(v)))


# -- applying -----------------------------------------------------------------------------
