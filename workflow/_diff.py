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
import itertools
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Final, SupportsIndex, TypeAlias, overload
from uuid import UUID

import attrs
from pydantic import BaseModel

from eventstore import Codec, default_codec

from ._identity import AtomMemo, same_items
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
    "is_view",
    "materialize",
    "ops_from_json",
    "ops_to_json",
    "patch_size",
    "register_views",
]

_ATOMS: Final = frozenset({str, int, float, bool, type(None), bytes})
# Immutable beyond the atoms: returned as they are, never copied (dt.datetime is a dt.date).
_FROZEN: Final = (complex, range, Decimal, UUID, dt.date, dt.time, dt.timedelta, Enum, PurePath)
_PYDANTIC_EXTRAS: Final = ("__pydantic_extra__", "__pydantic_private__")
_MISSING: Final[Any] = object()
_REPLACE_OVERHEAD: Final = len(b'[["replace",[],]]')  # a whole-value patch, its value aside
# Committed lists (and dicts' values) seen holding atoms only: a view of one wraps nothing.
_MEMO: Final = AtomMemo(_ATOMS)


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
    if t is TrackedList or t is TrackedDict or t is _NestedDict:
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
    if t is TrackedList or t is TrackedDict or t is _NestedDict:
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


def _node(x: Any, codec: Codec) -> _Node | None:
    """The node that tracks x, or None when x is immutable and handed out as it is."""
    t = type(x)
    if t is list:
        return TrackedList(x, codec)
    if t is dict:
        return TrackedDict.of(x, codec)
    return None if _immutable(x) else _Copy(x, codec)


def _view_of(node: _Node) -> Any:
    return node.obj if type(node) is _Copy else node


def _tracked(x: Any) -> bool:
    t = type(x)
    return t is TrackedList or t is TrackedDict or t is _NestedDict


def is_view(x: Any) -> bool:
    """Whether x is a list or dict view made by a :class:`Tracker` (or a copy of one)."""
    return _tracked(x)


class _Copy:
    """A private copy of a committed object that is neither a list nor a dict.

    Dataclass, attrs and pydantic objects are copied shallowly, O(#fields), so ``isinstance``
    still holds; their mutable fields become nested views, and each field is diffed on its own.
    Other values (sets, bytearrays, tuples holding lists...) are deep-copied, O(size), and
    compared whole by encoded value when the patch is taken.
    """

    __slots__ = ("base", "codec", "kids", "names", "obj")

    def __init__(self, base: Any, codec: Codec) -> None:
        self.base, self.codec = base, codec
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
            node = None if type(value) in _ATOMS else _node(value, codec)
            if node is not None:
                self.kids[name] = node
                object.__setattr__(self.obj, name, _view_of(node))

    def _collect(self, out: list[Op], path: Path) -> None:
        _diff_obj(self.base, self.obj, path, self.codec, out, self)


def _register(shared: dict[Any, _Node], key: Any, x: Any, codec: Codec) -> _Node | None:
    """The wrapper of committed item x at key, shared by a view and the copies made of it."""
    node = shared.get(key)
    if node is None:
        node = _node(x, codec)
        if node is not None:
            shared[key] = node
    return node


class TrackedList(list):  # type: ignore[type-arg]
    """A copy-on-write view of a committed list: a real ``list`` whose mutations are recorded.

    Its items are a shallow copy of the committed list's (one C-speed copy), so C code that
    reads a list's storage (``json.dumps``, ``==``, ``in``, ``sorted``) sees the right items;
    the committed list is never changed. A mutable committed item is wrapped in a view of its
    own when first read (by index, iteration, slicing), so mutating it changes nothing
    committed either. Assignments, appends and removals at the end are recorded as such and
    cost O(1); an insert or removal among the committed items, ``sort`` and ``reverse`` turn
    the patch into a rewrite of the whole list.

    ``items + [x]``, ``items[:]``, ``items.copy()`` and ``copy.deepcopy(items)`` are views
    too (of the same committed list), so ``set()`` of them costs the change.
    """

    __slots__ = ("_base", "_codec", "_kids", "_n", "_n0", "_own", "_set", "_shared", "_wrapped")

    _base: list[Any]
    _codec: Codec
    _kids: dict[int, _Node]  # index < _n, not in _set -> the wrapper stored there
    _n: int  # leading items still at their committed index
    _n0: int  # committed items shown at creation
    _own: bool  # rewritten: the patch replaces the whole list
    _set: dict[int, None]  # index < _n -> assigned, in order (an ordered set)
    _shared: dict[int, _Node]  # committed index -> its wrapper, shared with copies
    _wrapped: bool  # no committed mutable item is left unwrapped

    def __init__(self, base: list[Any], codec: Codec = default_codec) -> None:
        list.__init__(self, base)
        self._base, self._codec = base, codec
        self._n = self._n0 = len(base)
        self._set, self._kids, self._shared = {}, {}, {}
        self._own = self._wrapped = False

    def _derive(self, *, deep: bool = False, memo: dict[int, Any] | None = None) -> TrackedList:
        """A view of the same committed list showing what this one shows now.

        Shallow: committed items share their wrappers with this view (one object, as in a
        plain copy). Deep: every item this view holds is copied, committed ones lazily.
        """
        new = TrackedList.__new__(TrackedList)
        list.extend(new, list.__iter__(self))
        new._base, new._codec, new._n, new._n0 = self._base, self._codec, self._n, self._n0
        new._own, new._set = self._own, dict(self._set)
        if not deep:
            new._kids, new._shared, new._wrapped = dict(self._kids), self._shared, self._wrapped
            return new
        new._kids, new._shared, new._wrapped = {}, {}, False
        memo = {} if memo is None else memo
        # Committed items not read yet stay shared: the new view wraps them when read.
        n = list.__len__(self)
        mine: Iterable[int] = (
            range(n) if self._own else itertools.chain(self._set, range(self._n, n))
        )
        for i in mine:
            x = list.__getitem__(self, i)
            if type(x) not in _ATOMS:
                list.__setitem__(new, i, copy.deepcopy(x, memo))
        for i in self._kids:  # a wrapper: its copy is a view of the same committed item
            y = copy.deepcopy(list.__getitem__(self, i), memo)
            list.__setitem__(new, i, y)
            if _tracked(y):
                new._kids[i] = y
            else:
                new._set[i] = None
        if self._own:
            new._wrapped = True
        return new

    def _wrap(self, i: int) -> Any:
        """The item at index i (0 <= i < len), its committed value wrapped if mutable."""
        x = list.__getitem__(self, i)
        if type(x) in _ATOMS or self._own or i >= self._n or i in self._set or i in self._kids:
            return x
        node = _register(self._shared, i, x, self._codec)
        if node is None:
            return x
        self._kids[i] = node
        view = _view_of(node)
        list.__setitem__(self, i, view)
        return view

    def _wrap_all(self) -> None:
        """Wraps every committed mutable item (one C-speed look when there is none).

        The committed items still shown are the committed list's, at their index: when
        that list holds atoms only there is nothing to wrap (the memo looks only at the
        items added since it last looked).
        """
        if self._wrapped:
            return
        if self._own or not _MEMO.atoms(self._base):
            for i in range(min(self._n, list.__len__(self))):
                self._wrap(i)
        self._wrapped = True

    def _items(self) -> list[Any]:
        """A list holding what this view shows, no other thread can resize: the committed
        list itself while the view shows exactly it (no copy), else a copy."""
        base = self._base
        n = list.__len__(self)
        if not (self._own or self._set or self._kids) and self._n == n == list.__len__(base):
            return base
        return list.__getitem__(self, slice(None))

    def _make_own(self) -> None:
        if not self._own:
            self._wrap_all()
            self._own = True
            self._set, self._kids = {}, {}

    def _truncate(self, n: int) -> None:
        if n < self._n:
            self._set = {i: None for i in self._set if i < n}
            self._kids = {i: k for i, k in self._kids.items() if i < n}
            self._n = n

    # -- reading: items come out wrapped ------------------------------------------------

    @overload
    def __getitem__(self, i: SupportsIndex) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Any:
        if isinstance(i, slice):
            if i == slice(None):
                return self._derive()
            self._wrap_all()
            return list.__getitem__(self, i)
        x = list.__getitem__(self, i)  # IndexError as a list raises it
        if type(x) in _ATOMS:
            return x
        j = operator.index(i)
        return self._wrap(j + list.__len__(self) if j < 0 else j)

    def __iter__(self) -> Iterator[Any]:
        self._wrap_all()
        return list.__iter__(self)

    def __reversed__(self) -> Iterator[Any]:
        self._wrap_all()
        return list.__reversed__(self)

    def copy(self) -> TrackedList:
        """A shallow copy, as ``list.copy``: a view too, so setting it costs the change."""
        return self._derive()

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> TrackedList:
        return self._derive(deep=True, memo=memo)

    def __add__(self, other: Any) -> Any:
        if not isinstance(other, list):
            return NotImplemented
        new = self._derive()
        new.extend(other)
        return new

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, list):
            return NotImplemented
        self._wrap_all()
        return list.__add__(other, self)

    def __iadd__(self, other: Iterable[Any]) -> TrackedList:  # type: ignore[misc]
        self.extend(other)
        return self

    def __mul__(self, n: SupportsIndex) -> list[Any]:
        self._wrap_all()
        return list.__mul__(self, n)

    __rmul__ = __mul__

    def __imul__(self, n: SupportsIndex) -> TrackedList:
        k = operator.index(n)
        if k <= 0:
            self.clear()
        elif k > 1:
            self._wrap_all()
            list.extend(self, list.__mul__(self, k - 1))
        return self

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (list, (list(self),))

    # -- writing: recorded ----------------------------------------------------------------

    def __setitem__(self, i: Any, value: Any) -> None:
        if isinstance(i, slice):
            self._set_slice(i, list(value))
            return
        n = list.__len__(self)
        j = operator.index(i)
        j = j + n if j < 0 else j
        if not 0 <= j < n:
            msg = "list assignment index out of range"
            raise IndexError(msg)
        if not self._own and j < self._n:
            node = self._kids.get(j)
            if node is not None and value is _view_of(node):
                return  # a child put back changes nothing
            self._kids.pop(j, None)
            self._set[j] = None
        list.__setitem__(self, j, value)

    def _set_slice(self, s: slice, values: list[Any]) -> None:
        n = list.__len__(self)
        start, stop, step = s.indices(n)
        idx = range(start, stop, step)
        if self._own:
            pass
        elif step == 1 and start >= self._n:
            pass  # within the tail
        elif len(idx) == len(values):
            for j, v in zip(idx, values, strict=True):
                self[j] = v
            return
        elif step == 1 and stop >= n:  # a new end from start on
            self._truncate(start)
        elif step == 1:
            self._make_own()
        list.__setitem__(self, s, values)  # an extended slice of another length raises here

    def __delitem__(self, i: Any) -> None:
        n = list.__len__(self)
        if not self._own:
            if isinstance(i, slice):
                idx = range(*i.indices(n))
                if not idx:
                    return
                if abs(idx.step) != 1 and len(idx) > 1:
                    self._make_own()
                    list.__delitem__(self, i)
                    return
                lo, hi = min(idx), max(idx) + 1
            else:
                lo = operator.index(i)
                lo = lo + n if lo < 0 else lo
                if not 0 <= lo < n:
                    msg = "list assignment index out of range"
                    raise IndexError(msg)
                hi = lo + 1
            if lo >= self._n:
                pass
            elif hi >= self._n:  # the end of the committed items, maybe some of the tail
                self._truncate(lo)
            else:
                self._make_own()
        list.__delitem__(self, i)

    def insert(self, index: SupportsIndex, value: Any) -> None:
        """Insert value before index; O(1) at or after the committed items, else a rewrite."""
        n = list.__len__(self)
        i = operator.index(index)
        i = min(max(i + n, 0) if i < 0 else i, n)
        if not self._own and i < self._n:
            self._make_own()
        list.insert(self, i, value)

    def append(self, value: Any) -> None:
        """Append value; the patch carries only the appended items."""
        list.append(self, value)

    def extend(self, values: Iterable[Any]) -> None:
        """Append each of values (``v.extend(v)`` works)."""
        if isinstance(values, TrackedList):
            values._wrap_all()
            list.extend(self, list(list.__iter__(values)))
        else:
            list.extend(self, values)

    def pop(self, index: SupportsIndex = -1) -> Any:
        """Remove and return the item at index (the last by default), as ``list.pop``."""
        if not list.__len__(self):
            msg = "pop from empty list"
            raise IndexError(msg)
        x = self[index]
        del self[index]
        return x

    def remove(self, value: Any) -> None:
        """Remove the first item equal to value, as ``list.remove``."""
        del self[list.index(self, value)]

    def clear(self) -> None:
        """Remove all items; the patch replaces the list by an empty one."""
        self._own, self._wrapped = True, True
        self._set, self._kids = {}, {}
        list.clear(self)

    def reverse(self) -> None:
        """Reverse in place; the patch replaces the whole list."""
        self._make_own()
        list.reverse(self)

    def sort(self, *, key: Callable[[Any], Any] | None = None, reverse: bool = False) -> None:
        """Sort in place like ``list.sort``; the patch replaces the whole list."""
        self._make_own()
        list.sort(self, key=key, reverse=reverse)

    # -- the patch ------------------------------------------------------------------------

    def _materialize(self) -> list[Any]:
        return [_fresh(v) for v in list.__iter__(self)]

    def _collect(self, out: list[Op], path: Path) -> None:
        if self._own:
            out.append(("replace", path, self._materialize()))
            return
        base, codec, shared = self._base, self._codec, self._shared
        for i in self._set:  # diffed against the committed item: items + [x] costs x
            _diff(base[i], list.__getitem__(self, i), (*path, i), codec, out, shared.get(i))
        for i, node in self._kids.items():
            node._collect(out, (*path, i))
        if self._n < self._n0:
            out.append(("trunc", path, self._n))
        if list.__len__(self) > self._n:
            _tail_ops(path, list.__getitem__(self, slice(self._n, None)), out)


class TrackedDict(dict):  # type: ignore[type-arg]
    """A copy-on-write view of a committed dict: a real ``dict`` whose mutations are recorded.

    Its entries are a shallow copy of the committed dict's (one C-speed copy); a mutable
    committed value is wrapped in a view of its own when first read. Assignments and
    deletions are recorded per key; key order follows ``dict`` (a deleted key that is set
    again moves to the end). A dict holding mutable values is a :class:`_NestedDict`, whose
    values C code (``{**d}``, ``dict(d)``) reads through ``__getitem__``, so they come out
    wrapped too. ``d | {k: v}`` and ``d.copy()`` are views of the same committed dict.
    """

    __slots__ = ("_base", "_cleared", "_codec", "_del", "_kids", "_set", "_shared", "_values")

    _base: dict[Any, Any]
    _codec: Codec
    _set: dict[Any, None]  # keys assigned: in place if committed and shown, else at the end
    _del: dict[Any, None]  # committed keys deleted, in order
    _kids: dict[Any, _Node]  # committed keys neither set nor deleted -> the wrapper there
    _shared: dict[Any, _Node]
    _cleared: bool
    _values: list[Any] | None  # the committed values, listed when the view was made

    def __init__(self, base: dict[Any, Any], codec: Codec = default_codec) -> None:
        dict.__init__(self, base)
        self._base, self._codec = base, codec
        self._set, self._del, self._kids, self._shared = {}, {}, {}, {}
        self._cleared = False
        self._values = None

    @staticmethod
    def of(base: dict[Any, Any], codec: Codec = default_codec) -> TrackedDict:
        """A view of base: a :class:`_NestedDict` if a value of base is not an atom."""
        values = list(dict.values(base))
        view = (TrackedDict if _MEMO.atoms(values, base) else _NestedDict)(base, codec)
        view._values = values
        return view

    def _derive(self, *, deep: bool = False, memo: dict[int, Any] | None = None) -> TrackedDict:
        new = type(self).__new__(type(self))
        dict.update(new, dict.copy(self))
        new._base, new._codec, new._cleared = self._base, self._codec, self._cleared
        new._values = self._values
        new._set, new._del = dict(self._set), dict(self._del)
        if not deep:
            new._kids, new._shared = dict(self._kids), self._shared
            return new
        new._kids, new._shared = {}, {}
        memo = {} if memo is None else memo
        # Committed values not read yet stay shared: the new view wraps them when read.
        # Every key a view shows that is not committed there was set (or all, if cleared).
        mine: Iterable[Any] = list(dict.keys(self)) if self._cleared else self._set
        for k in mine:
            x = dict.__getitem__(self, k)
            if type(x) not in _ATOMS:
                dict.__setitem__(new, k, copy.deepcopy(x, memo))
        for k in self._kids:
            y = copy.deepcopy(dict.__getitem__(self, k), memo)
            dict.__setitem__(new, k, y)
            if _tracked(y):
                new._kids[k] = y
            else:
                new._set[k] = None
        return new

    def _entries(self) -> tuple[list[Any], list[Any]]:
        """The keys and the values this view shows, as lists no other thread can change
        (the committed values as listed when the view was made, while it shows them)."""
        base = self._base
        if not (self._cleared or self._set or self._del or self._kids) and dict.__len__(
            self
        ) == dict.__len__(base):
            values = self._values if self._values is not None else list(dict.values(base))
            return list(dict.keys(base)), values
        return list(dict.keys(self)), list(dict.values(self))

    def _added(self, key: Any) -> bool:
        return self._cleared or key not in self._base or key in self._del

    def __getitem__(self, key: Any) -> Any:
        x = dict.__getitem__(self, key)
        if type(x) in _ATOMS or key in self._kids or key in self._set or self._added(key):
            return x
        node = _register(self._shared, key, x, self._codec)
        if node is None:
            return x
        self._kids[key] = node
        view = _view_of(node)
        dict.__setitem__(self, key, view)
        return view

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of key, or default, as ``dict.get``."""
        return self[key] if dict.__contains__(self, key) else default

    def _wrap_all(self) -> None:
        if type(self) is TrackedDict:
            return  # its committed values are atoms: nothing to wrap
        for k in list(dict.keys(self)):
            self[k]

    def values(self) -> Any:
        """The values, as ``dict.values``."""
        self._wrap_all()
        return dict.values(self)

    def items(self) -> Any:
        """The (key, value) pairs, as ``dict.items``."""
        self._wrap_all()
        return dict.items(self)

    def __setitem__(self, key: Any, value: Any) -> None:
        node = self._kids.get(key)
        if node is not None and value is _view_of(node):
            return  # a child put back changes nothing
        self._kids.pop(key, None)
        self._set[key] = None
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)  # KeyError as a dict raises it
        self._set.pop(key, None)
        self._kids.pop(key, None)
        if not self._cleared and key in self._base and key not in self._del:
            self._del[key] = None

    def pop(self, key: Any, *default: Any) -> Any:
        """Remove key and return its value, else default, as ``dict.pop``."""
        if dict.__contains__(self, key):
            x = self[key]
            del self[key]
            return x
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[Any, Any]:
        """Remove and return the last (key, value) pair, as ``dict.popitem`` does (LIFO)."""
        if not dict.__len__(self):
            msg = "popitem(): dictionary is empty"
            raise KeyError(msg)
        key = next(dict.__reversed__(self))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """The value of key; set to default first if missing, as ``dict.setdefault``."""
        if dict.__contains__(self, key):
            return self[key]
        self[key] = default
        return default

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Set each key of the arguments, as ``dict.update``."""
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def clear(self) -> None:
        """Remove all keys; the patch replaces the dict by an empty one."""
        self._cleared = True
        self._set, self._del, self._kids = {}, {}, {}
        dict.clear(self)

    def copy(self) -> TrackedDict:
        """A shallow copy, as ``dict.copy``: a view too, so setting it costs the change."""
        return self._derive()

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> TrackedDict:
        return self._derive(deep=True, memo=memo)

    def __ior__(self, other: Any) -> TrackedDict:
        self.update(other)
        return self

    def __or__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        new = self._derive()
        new.update(other)
        return new

    def __ror__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        new = dict(other)
        new.update(self.items())
        return new

    @classmethod
    def fromkeys(cls, keys: Iterable[Any], value: Any = None) -> dict[Any, Any]:
        """A plain dict, as ``dict.fromkeys``."""
        return dict.fromkeys(keys, value)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        return (dict, (dict(self.items()),))

    def _materialize(self) -> dict[Any, Any]:
        return {k: _fresh(v) for k, v in dict.items(self)}

    def _collect(self, out: list[Op], path: Path) -> None:
        if self._cleared:  # one op: later ops must never write into an earlier op's value
            out.append(("replace", path, self._materialize()))
            return
        base, codec, shared = self._base, self._codec, self._shared
        out.extend(("del", (*path, _elem(k))) for k in self._del)
        for k in self._set:
            v = dict.__getitem__(self, k)
            if k in self._del or k not in base:
                out.append(("set", (*path, _elem(k)), _fresh(v)))
            else:  # diffed against the committed value: {**d, k: v} costs the change
                _diff(base[k], v, (*path, _elem(k)), codec, out, shared.get(k))
        for k, node in self._kids.items():
            node._collect(out, (*path, _elem(k)))


class _NestedDict(TrackedDict):
    """A :class:`TrackedDict` holding mutable values: C code reads them through ``__getitem__``.

    (A dict subclass that defines ``__iter__`` is copied by ``{**d}``, ``dict(d)`` and
    ``f(**d)`` key by key through ``keys()`` and ``__getitem__``, not from its storage.)
    """

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        return dict.__iter__(self)


_VIEWS_KNOWN: weakref.WeakSet[Codec] = weakref.WeakSet()


def register_views(codec: Codec) -> None:
    """Teaches codec to encode views as the plain lists and dicts they show (once per codec)."""
    if codec in _VIEWS_KNOWN:
        return
    codec.register_proxy(TrackedList, list.copy)
    codec.register_proxy(TrackedDict, dict.copy)
    codec.register_proxy(_NestedDict, dict.copy)
    _VIEWS_KNOWN.add(codec)


class Tracker:
    """Tracks one attempt's mutations of one committed root value.

    The patch is relative to base as it was when the tracker was made. The view shows base
    as it was then: the executor's later changes of base (other attempts' commits) stay
    invisible to it (such an attempt read a key that changed, so it conflicts anyway).

    :param base: the committed value; never mutated by the tracker or its view.
    :param codec: compares values that are copied rather than viewed (sets, scalars put in
        fields) by their encoding.
    """

    def __init__(self, base: Any, *, codec: Codec | None = None) -> None:
        self._codec = codec or default_codec
        register_views(self._codec)
        self.base = base
        self.node = None if type(base) in _ATOMS else _node(base, self._codec)
        self._view = base if self.node is None else _view_of(self.node)

    @property
    def view(self) -> Any:
        """What ``get`` hands the user: a view, a private copy, or base itself if immutable."""
        return self._view

    def ops(self) -> list[Op]:
        """The patch from base to the view's current value, values fresh; [] when unchanged."""
        out: list[Op] = []
        if self.node is not None:
            self.node._collect(out, ())
        return out

    def is_view(self, obj: Any) -> bool:
        """Whether obj is this tracker's root view, so that ``set(key, obj)`` needs no diff."""
        return obj is self._view


# -- diff -----------------------------------------------------------------------------------

# Below this many items a list or dict that shares nothing known is diffed item by item.
_SMALL: Final = 32


def diff(
    old: Any,
    new: Any,
    codec: Codec,
    *,
    whole_size: int | None = None,
    hint: Tracker | None = None,
) -> list[Op]:
    """The patch from old to new, comparing encodings, so ``1``, ``1.0`` and ``True`` differ.

    What new shares with old is found by identity first, so a value derived from a view of
    old (``items + [x]``, ``[*items, x]``, ``{**d, k: v}``, ``model_copy(update=...)``)
    costs the change: ``hint``, the tracker that made that view, says what its items are.
    Large values that share nothing known are compared by their encodings (C speed) and
    written from their common prefix when a list grew, else whole. Views in new are
    materialized. Returns [] when nothing changed, and ``[("replace", (), new)]`` when the
    patch would not be smaller than new.

    :param whole_size: the length of new's JSON text, when the caller has encoded it already
        (so new is not encoded again only to be measured).
    """
    register_views(codec)
    out: list[Op] = []
    _diff(old, new, (), codec, out, None if hint is None else hint.node)
    if not out or out[0][:2] == ("replace", ()):
        return out
    if whole_size is None and len(out) == 1 and out[0][0] in ("append", "extend", "trunc"):
        return out  # a list grew or shrank by its end: smaller than the list whole
    if whole_size is None:
        whole = patch_size(ops_to_json([("replace", (), materialize(new))], codec))
    else:
        whole = whole_size + _REPLACE_OVERHEAD
    if patch_size(ops_to_json(out, codec)) >= whole:
        return [("replace", (), _fresh(new))]
    return out


def _hint_child(hint: _Node | None, elem: Any) -> _Node | None:
    if hint is None:
        return None
    if type(hint) is _Copy:
        return hint.kids.get(elem)
    kids: dict[Any, _Node] = hint._kids  # type: ignore[union-attr]
    return kids.get(elem.key if type(elem) is KeyRef else elem)


def _diff(old: Any, new: Any, path: Path, codec: Codec, out: list[Op], hint: _Node | None) -> None:
    if old is new:
        return
    if hint is not None and new is _view_of(hint):
        hint._collect(out, path)
        return
    t = type(new)
    if (t is TrackedList or t is TrackedDict or t is _NestedDict) and new._base is old:
        new._collect(out, path)
        return
    to = type(old)
    if to is list and isinstance(new, list):
        _diff_list(old, new, path, codec, out, hint)
    elif to is dict and isinstance(new, dict):
        _diff_dict(old, new, path, codec, out, hint)
    elif (
        to is t
        and (names := _fields(old)) is not None
        and names == _fields(new)
        and not _frozen(t)  # a frozen object may be shared: never patched in place
    ):
        _diff_obj(old, new, path, codec, out, hint if type(hint) is _Copy else None)
    elif not _same(old, new, codec):
        out.append(_put(path, _fresh(new)))


def _diff_obj(
    old: Any, new: Any, path: Path, codec: Codec, out: list[Op], hint: _Copy | None
) -> None:
    names = _fields(old) if hint is None else hint.names
    if names is None or not _same_extras(new, old, codec):
        if not _same(new, old, codec):
            out.append(_put(path, _fresh(new)))
        return
    for name in names:
        kid = None if hint is None else hint.kids.get(name)
        _diff(getattr(old, name), getattr(new, name), (*path, name), codec, out, kid)


def _shares(src: list[Any], new: list[Any], *, private: bool = False) -> bool:
    """Whether new starts with src's items, the same objects (one memory comparison).

    :param private: src is the executor's committed list (only the event loop's thread
        changes it), so it is compared as it is; other lists are copied first.
    """
    n = list.__len__(src)
    if list.__len__(new) < n:
        return False
    if not private:
        src = src._items() if type(src) is TrackedList else list.__getitem__(src, slice(None))
    return same_items(list.__getitem__(new, slice(n)), src, n)


def _diff_list(
    old: list[Any], new: list[Any], path: Path, codec: Codec, out: list[Op], hint: _Node | None
) -> None:
    if type(hint) is TrackedList and _shares(hint, new):  # derived from the view
        hint._collect(out, path)
        _tail_ops(path, list.__getitem__(new, slice(list.__len__(hint), None)), out)
        return
    if _shares(old, new, private=True):  # old's items, then more
        _tail_ops(path, list.__getitem__(new, slice(len(old), None)), out)
        return
    n = len(new)
    if n < len(old) and _shares(new, old):
        out.append(("trunc", path, n))
        return
    if len(old) > _SMALL or n > _SMALL:
        _diff_encoded(old, new, path, codec, out)
        return
    sub: list[Op] = []
    replaced = 0  # items rewritten whole, not merely changed inside
    m = min(len(old), n)
    for i in range(m):
        before = len(sub)
        _diff(old[i], list.__getitem__(new, i), (*path, i), codec, sub, _hint_child(hint, i))
        replaced += len(sub) == before + 1 and sub[-1][:2] == ("set", (*path, i))
    if replaced * 2 > m:  # most items moved (an insert or removal near the front): rewrite
        out.append(_put(path, _fresh(new)))
        return
    out += sub
    if n < len(old):
        out.append(("trunc", path, n))
    _tail_ops(path, list.__getitem__(new, slice(m, None)), out)


def _diff_encoded(old: list[Any], new: list[Any], path: Path, codec: Codec, out: list[Op]) -> None:
    """Two large lists that share nothing known, compared by their encodings."""
    a, b = codec.encode(old), codec.encode(new)
    if a == b:
        return
    if len(b) > len(a) and (len(a) == 2 or b[len(a) - 1] == ",") and b.startswith(a[:-1]):
        # JSON values are self-delimiting: new's first items encode as old's, exactly.
        _tail_ops(path, list.__getitem__(new, slice(len(old), None)), out)
        return
    out.append(_put(path, _fresh(new)))


def _diff_dict(
    old: dict[Any, Any],
    new: dict[Any, Any],
    path: Path,
    codec: Codec,
    out: list[Op],
    hint: _Node | None,
) -> None:
    src: Any = hint if isinstance(hint, TrackedDict) else None
    added = None if src is None else _dict_extends(src._entries(), new)
    if added is not None:  # derived from the view: {**d, k: v}
        src._collect(out, path)
        out.extend(("set", (*path, _elem(k)), _fresh(dict.__getitem__(new, k))) for k in added)
        return
    added = _dict_extends((list(dict.keys(old)), list(dict.values(old))), new)
    if added is not None:
        out.extend(("set", (*path, _elem(k)), _fresh(dict.__getitem__(new, k))) for k in added)
        return
    kept = [k for k in old if dict.__contains__(new, k)]
    if list(dict.keys(new))[: len(kept)] != kept:  # reordered: a patch adds keys at the end
        out.append(_put(path, _fresh(new)))
        return
    if len(old) > _SMALL and codec.encode(old) == codec.encode(new):
        return
    out.extend(("del", (*path, _elem(k))) for k in old if not dict.__contains__(new, k))
    for k, v in dict.items(new):
        if k in old:
            _diff(old[k], v, (*path, _elem(k)), codec, out, _hint_child(hint, k))
        else:
            out.append(("set", (*path, _elem(k)), _fresh(v)))


def _dict_extends(src: tuple[list[Any], list[Any]], new: dict[Any, Any]) -> list[Any] | None:
    """The keys new has after src's entries, if it starts with them: the same key and
    value objects, in order (src: its keys and values); None if it does not.

    new's keys and values are copied into lists (no other thread can change those), which
    :func:`same_items` compares with src's by identity.
    """
    keys, values = src
    n = len(keys)
    if dict.__len__(new) < n or not same_items(list(dict.values(new)), values, n):
        return None
    new_keys = list(dict.keys(new))
    return new_keys[n:] if same_items(new_keys, keys, n) else None
