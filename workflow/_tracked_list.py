"""The copy-on-write view of a committed list (:class:`TrackedList`).

See :mod:`workflow._diff` for how views, trackers and patches fit together.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any, SupportsIndex, overload

from eventstore import Codec, default_codec

from ._delta import diff_into
from ._identity import same_items
from ._patch import Op, Path
from ._values import (
    ATOMS,
    MEMO,
    NODES,
    VIEWS,
    Node,
    fresh,
    shared_node,
    tail_ops,
    tracked,
    view_of,
)

__all__ = ["TrackedList"]


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

    __slots__ = (
        "_base",
        "_codec",
        "_kids",
        "_n",
        "_n0",
        "_own",
        "_set",
        "_shared",
        "_token",
        "_wrapped",
    )

    _base: list[Any]
    _codec: Codec
    _kids: dict[int, Node]  # index < _n, not in _set -> the wrapper stored there
    _n: int  # leading items still at their committed index
    _n0: int  # committed items shown at creation
    _own: bool  # rewritten: the patch replaces the whole list
    _set: dict[int, None]  # index < _n -> assigned, in order (an ordered set)
    _shared: dict[int, Node]  # committed index -> its wrapper, shared with copies
    _wrapped: bool  # no committed mutable item is left unwrapped
    _token: object  # its tracker's: the views of one attempt (see _delta.diff)

    def __init__(self, base: list[Any], codec: Codec = default_codec, token: object = None) -> None:
        list.__init__(self, base)
        self._base, self._codec, self._token = base, codec, token
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
        new._token = self._token
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
            if type(x) not in ATOMS:
                list.__setitem__(new, i, copy.deepcopy(x, memo))
        for i in self._kids:  # a wrapper: its copy is a view of the same committed item
            y = copy.deepcopy(list.__getitem__(self, i), memo)
            list.__setitem__(new, i, y)
            if tracked(y):
                new._kids[i] = y
            else:
                new._set[i] = None
        if self._own:
            new._wrapped = True
        return new

    def _renew(
        self, base: list[Any], token: object, since: tuple[list[Op], bool] | None = None
    ) -> bool:
        """Makes this view over into a new view of ``base`` without copying its items; False
        (and this view is left unusable) when it cannot.

        Only what this view changed is put back (its assigned and wrapped items, and its
        end from the first item it no longer shows at its committed index: what its
        attempt appended, and base's own new end), then every item is checked to be
        base's, by identity at memory speed: exact whatever else changed base in place.
        That check is skipped when the caller vouches for what base took since this view
        was made (``since``, as :meth:`TrackedDict._renew` takes it): the view's own patch
        touches only what is put back, and ops from elsewhere are put back too.
        The caller makes sure nothing else holds this view (:func:`workflow._diff.renew`),
        so no other thread can resize it meanwhile.
        """
        if type(self) is not TrackedList or self._own or self._base is not base:
            return False
        m = self._n
        if m > list.__len__(base):
            return False
        touched = [] if since is None or since[1] else _touched(since[0])
        if touched is None:
            since, touched = None, []
        for i in itertools.chain(self._set, self._kids, touched):
            if i < m:
                list.__setitem__(self, i, list.__getitem__(base, i))
        list.__setitem__(self, slice(m, None), list.__getitem__(base, slice(m, None)))
        if since is None and not same_items(self, base, m):
            return False
        self._token = token
        self._n = self._n0 = list.__len__(base)
        self._set, self._kids, self._shared = {}, {}, {}
        self._wrapped = False
        return True

    def _wrap(self, i: int) -> Any:
        """The item at index i (0 <= i < len), its committed value wrapped if mutable."""
        x = list.__getitem__(self, i)
        if type(x) in ATOMS or self._own or i >= self._n or i in self._set or i in self._kids:
            return x
        node = shared_node(self._shared, i, x, self._codec, self._token)
        if node is None:
            return x
        self._kids[i] = node
        view = view_of(node)
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
        if self._own or not MEMO.atoms(self._base):
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
        if type(x) in ATOMS:
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
            if node is not None and value is view_of(node):
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
        return [fresh(v) for v in list.__iter__(self)]

    def _collect(self, out: list[Op], path: Path) -> None:
        if self._own:
            out.append(("replace", path, self._materialize()))
            return
        base, codec, shared = self._base, self._codec, self._shared
        for i in self._set:  # diffed against the committed item: items + [x] costs x
            mine = list.__getitem__(self, i)
            diff_into(base[i], mine, (*path, i), codec, out, shared.get(i), self._token)
        for i, node in self._kids.items():
            node._collect(out, (*path, i))
        if self._n < self._n0:
            out.append(("trunc", path, self._n))
        if list.__len__(self) > self._n:
            tail_ops(path, list.__getitem__(self, slice(self._n, None)), out)


def _touched(ops: list[Op]) -> list[int] | None:
    """The committed indices ops change in place (their end aside: appended, truncated),
    for :meth:`TrackedList._renew`; None when they do more (move items, rewrite the list)."""
    out = []
    for kind, path, *_ in ops:
        if not path:
            if kind not in ("append", "extend", "trunc"):
                return None
        elif type(path[0]) is int and (kind != "del" or len(path) > 1):
            out.append(path[0])
        else:
            return None
    return out


VIEWS[TrackedList] = list.copy
NODES[list] = TrackedList
