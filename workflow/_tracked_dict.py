"""The copy-on-write view of a committed dict (:class:`TrackedDict`), and the private copy
of any other mutable committed object (:class:`ObjectCopy`).

See :mod:`workflow._diff` for how views, trackers and patches fit together.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, SupportsIndex

from pydantic import BaseModel

from eventstore import Codec, default_codec

from ._delta import diff_into, diff_obj
from ._patch import KeyRef, Op, Path
from ._values import (
    ATOMS,
    MEMO,
    NODES,
    PYDANTIC_EXTRAS,
    VIEWS,
    Node,
    elem,
    field_names,
    fresh,
    node_of,
    shared_node,
    tracked,
    view_of,
)

__all__ = ["ObjectCopy", "TrackedDict"]


class ObjectCopy:
    """A private copy of a committed object that is neither a list nor a dict.

    Dataclass, attrs and pydantic objects are copied shallowly, O(#fields), so ``isinstance``
    still holds; their mutable fields become nested views, and each field is diffed on its own.
    Other values (sets, bytearrays, tuples holding lists...) are deep-copied, O(size), and
    compared whole by encoded value when the patch is taken.
    """

    __slots__ = ("base", "codec", "kids", "names", "obj", "token")

    def __init__(self, base: Any, codec: Codec, token: object = None) -> None:
        self.base, self.codec, self.token = base, codec, token
        self.names = field_names(base)
        self.kids: dict[str, Node] = {}
        if self.names is None:
            self.obj = copy.deepcopy(base)
            return
        self.obj = copy.copy(base)
        if isinstance(base, BaseModel):  # extras and private values are rare: copied whole
            for attr in PYDANTIC_EXTRAS:
                object.__setattr__(self.obj, attr, copy.deepcopy(getattr(base, attr)))
        for name in self.names:
            value = getattr(base, name)
            node = None if type(value) in ATOMS else node_of(value, codec, token)
            if node is not None:
                self.kids[name] = node
                object.__setattr__(self.obj, name, view_of(node))

    def _collect(self, out: list[Op], path: Path) -> None:
        diff_obj(self.base, self.obj, path, self.codec, out, self, self.token)


class TrackedDict(dict):  # type: ignore[type-arg]
    """A copy-on-write view of a committed dict: a real ``dict`` whose mutations are recorded.

    Its entries are a shallow copy of the committed dict's (one C-speed copy); a mutable
    committed value is wrapped in a view of its own when first read. Assignments and
    deletions are recorded per key; key order follows ``dict`` (a deleted key that is set
    again moves to the end). A dict holding mutable values is a :class:`_NestedDict`, whose
    values C code (``{**d}``, ``dict(d)``) reads through ``__getitem__``, so they come out
    wrapped too. ``d | {k: v}`` and ``d.copy()`` are views of the same committed dict.
    """

    __slots__ = (
        "_base",
        "_cleared",
        "_codec",
        "_del",
        "_edits",
        "_kids",
        "_set",
        "_shared",
        "_taken",
        "_token",
    )

    _base: dict[Any, Any]
    _codec: Codec
    _set: dict[Any, None]  # keys assigned: in place if committed and shown, else at the end
    _del: dict[Any, None]  # committed keys deleted, in order
    _kids: dict[Any, Node]  # committed keys neither set nor deleted -> the wrapper there
    _shared: dict[Any, Node]
    _cleared: bool
    _token: object  # its tracker's: the views of one attempt (see _delta.diff)
    _edits: int  # assignments and deletions made through it (its kids' aside)
    _taken: int  # _edits when its patch was last taken (``_collect``)

    def __init__(
        self, base: dict[Any, Any], codec: Codec = default_codec, token: object = None
    ) -> None:
        dict.__init__(self, base)
        self._base, self._codec, self._token = base, codec, token
        self._set, self._del, self._kids, self._shared = {}, {}, {}, {}
        self._cleared = False
        self._edits = self._taken = 0

    @staticmethod
    def of(base: dict[Any, Any], codec: Codec = default_codec, token: object = None) -> TrackedDict:
        """A view of base: a :class:`_NestedDict` if a value of base is not an atom."""
        values = list(dict.values(base))
        return (TrackedDict if MEMO.atoms(values, base) else _NestedDict)(base, codec, token)

    def _derive(self, *, deep: bool = False, memo: dict[int, Any] | None = None) -> TrackedDict:
        new = type(self).__new__(type(self))
        # A view of atoms is merged from its storage (one C-speed clone); a nested one's
        # would be read through __getitem__, wrapping its values: copied as a dict first.
        dict.update(new, self if type(self) is TrackedDict else dict.copy(self))
        new._base, new._codec, new._cleared = self._base, self._codec, self._cleared
        new._token = self._token
        new._edits = new._taken = 0
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
            if type(x) not in ATOMS:
                dict.__setitem__(new, k, copy.deepcopy(x, memo))
        for k in self._kids:
            y = copy.deepcopy(dict.__getitem__(self, k), memo)
            dict.__setitem__(new, k, y)
            if tracked(y):
                new._kids[k] = y
            else:
                new._set[k] = None
        return new

    def _renew(self, base: dict[Any, Any], token: object, since: list[Op], own: bool) -> bool:
        """Makes this view over into a new view of ``base`` without copying it; False (and
        this view is left unusable) when it cannot.

        Nothing compares the entries: the caller vouches for what ``base`` (this view's own
        committed dict, changed in place since) took since this view was made: the ops
        ``since``, this view's own patch when ``own`` (taken after its last edit), else
        ops from elsewhere this unedited view never saw. Either way only the keys those ops
        and this view touched are put back from base, in place or, for keys the ops added
        or deleted, as the ops did (so the order is base's). The caller also makes sure
        nothing else holds this view (:func:`workflow._diff.renew`).
        """
        if self._base is not base or self._cleared:
            return False
        if own:
            if self._edits != self._taken:
                return False
            if any(k in base for k in self._del if k not in self._set):
                return False
            touched: Iterable[Any] = itertools.chain(self._set, self._kids)
        else:
            if self._edits:
                return False
            touched = self._kids
            for kind, path, *_ in since:
                if not path:
                    return False
                k = path[0]
                k = k.key if type(k) is KeyRef else k
                if kind == "del" and len(path) == 1:
                    if not dict.__contains__(self, k):
                        return False
                    dict.__delitem__(self, k)
                elif (len(path) == 1 and kind == "set") or dict.__contains__(self, k):
                    if not dict.__contains__(base, k):
                        return False
                    self._put(k, dict.__getitem__(base, k))
                else:
                    return False
        for k in list(touched):
            if not dict.__contains__(base, k) or not dict.__contains__(self, k):
                return False
            self._put(k, dict.__getitem__(base, k))
        if dict.__len__(self) != dict.__len__(base):
            return False
        self._token = token
        self._set, self._del, self._kids, self._shared = {}, {}, {}, {}
        self._edits = self._taken = 0
        return True

    def _put(self, key: Any, value: Any) -> None:
        """Shows base's value at key (renewing): a view of atoms holding another becomes a
        :class:`_NestedDict`, so that C code reads that value through ``__getitem__``."""
        dict.__setitem__(self, key, value)
        if type(value) not in ATOMS and type(self) is TrackedDict:
            self.__class__ = _NestedDict

    def _entries(self) -> dict[Any, Any]:
        """A dict holding the entries this view shows, no other thread can change: the
        committed dict itself while the view shows exactly it (no copy), else a copy."""
        base = self._base
        if not (self._cleared or self._set or self._del or self._kids) and dict.__len__(
            self
        ) == dict.__len__(base):
            return base
        return dict.copy(self)

    def _added(self, key: Any) -> bool:
        return self._cleared or key not in self._base or key in self._del

    def __getitem__(self, key: Any) -> Any:
        x = dict.__getitem__(self, key)
        if type(x) in ATOMS or key in self._kids or key in self._set or self._added(key):
            return x
        node = shared_node(self._shared, key, x, self._codec, self._token)
        if node is None:
            return x
        self._kids[key] = node
        view = view_of(node)
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
        if node is not None and value is view_of(node):
            return  # a child put back changes nothing
        self._kids.pop(key, None)
        self._set[key] = None
        self._edits += 1
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)  # KeyError as a dict raises it
        self._edits += 1
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
        self._edits += 1
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
        return {k: fresh(v) for k, v in dict.items(self)}

    def _collect(self, out: list[Op], path: Path) -> None:
        self._taken = self._edits
        if self._cleared:  # one op: later ops must never write into an earlier op's value
            out.append(("replace", path, self._materialize()))
            return
        base, codec, shared = self._base, self._codec, self._shared
        out.extend(("del", (*path, elem(k))) for k in self._del)
        for k in self._set:
            v = dict.__getitem__(self, k)
            if k in self._del or k not in base:
                out.append(("set", (*path, elem(k)), fresh(v)))
            else:  # diffed against the committed value: {**d, k: v} costs the change
                diff_into(base[k], v, (*path, elem(k)), codec, out, shared.get(k), self._token)
        for k, node in self._kids.items():
            node._collect(out, (*path, elem(k)))


class _NestedDict(TrackedDict):
    """A :class:`TrackedDict` holding mutable values: C code reads them through ``__getitem__``.

    (A dict subclass that defines ``__iter__`` is copied by ``{**d}``, ``dict(d)`` and
    ``f(**d)`` key by key through ``keys()`` and ``__getitem__``, not from its storage.)
    """

    __slots__ = ()

    def __iter__(self) -> Iterator[Any]:
        return dict.__iter__(self)


VIEWS[TrackedDict] = dict.copy
VIEWS[_NestedDict] = dict.copy
NODES[dict] = TrackedDict.of
NODES[object] = ObjectCopy
