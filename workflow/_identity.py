"""Which items two lists share, by identity, at the speed of comparing memory.

A view of a committed list learns what a value derived from it shares with it by identity
(``[*items, x]``, ``list(items)``): the new list's first items are the view's own objects.
``all(map(operator.is_, a, b))`` answers that at about 15 ns an item, which at 10,000 items
costs more than the rest of a step. A CPython list keeps its items as an array of object
pointers, so two lists hold the same objects exactly when those arrays hold the same bytes:
:func:`same_items` compares them with one C ``memcmp`` (well under 1 ns an item; copying
them into bytes where the C library's is not found). Where the layout is not the one
checked at import (another interpreter, another build), it falls back to the
``operator.is_`` walk: the answer is the same, only slower.

:class:`AtomMemo` remembers which lists were seen holding atoms only (immutable scalars a
view may hand out as they are), so a later view of the same list checks only the items
added since, not every item's type again.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import sys
from collections.abc import Callable
from typing import Any, Final, cast

__all__ = ["AtomMemo", "differing", "same_entries", "same_items"]

_PTR: Final = ctypes.sizeof(ctypes.c_void_p)
# PyListObject ends with `PyObject **ob_item; Py_ssize_t allocated;` after its header.
_ITEMS_AT: Final = list.__basicsize__ - 2 * _PTR
# Below this many items the plain walk is as fast as building two byte strings.
_SMALL: Final = 16


def _items(lst: list[Any]) -> int:
    """The address of lst's item pointers (0 for an empty list, which has none).

    The caller makes sure no other thread can resize lst while it uses the address: lst is
    private to it (a fresh copy), or only the event loop's thread ever changes it.
    """
    return ctypes.c_void_p.from_address(id(lst) + _ITEMS_AT).value or 0


def _find_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp``, called holding the GIL (PyDLL); None if not found."""
    try:
        fn = ctypes.PyDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return cast("Callable[[int, int, int], int]", fn)


_MEMCMP: Final = _find_memcmp()


def _same_range(pa: int, pb: int, lo: int, hi: int) -> bool:
    """Whether the pointers lo..hi-1 at addresses pa and pb are equal (hi > lo)."""
    a, b, size = pa + lo * _PTR, pb + lo * _PTR, (hi - lo) * _PTR
    if _MEMCMP is not None:
        return _MEMCMP(a, b, size) == 0
    return ctypes.string_at(a, size) == ctypes.string_at(b, size)


def _walk(a: list[Any], b: list[Any], n: int) -> bool:
    if n == len(a) and n == len(b):
        return all(map(operator.is_, list.__iter__(a), list.__iter__(b)))
    return all(map(operator.is_, list.__getitem__(a, slice(n)), list.__getitem__(b, slice(n))))


def _layout_known() -> bool:
    """Whether list items sit where :func:`_items` says (checked once)."""
    if sys.implementation.name != "cpython":
        return False
    try:
        probe = [object() for _ in range(3)]
        raw = ctypes.string_at(_items(probe), 3 * _PTR)
        expected = b"".join(id(x).to_bytes(_PTR, sys.byteorder) for x in probe)
        twin, other = list(probe), [*probe[:2], object()]
        pa, pb, po = _items(probe), _items(twin), _items(other)
        agrees = _same_range(pa, pb, 0, 3) and not _same_range(pa, po, 0, 3)
    except (ValueError, TypeError, OSError, OverflowError):
        return False
    return raw == expected and agrees


_FAST: Final = _layout_known()


def same_items(a: list[Any], b: list[Any], n: int) -> bool:
    """Whether ``a[:n]`` and ``b[:n]`` are the same objects, item by item (``is``).

    Both lists hold at least n items, and no other thread can change either meanwhile (see
    :func:`_items`): pass a fresh copy of a list others may hold.
    """
    if n <= _SMALL or not _FAST:
        return _walk(a, b, n)
    return _same_range(_items(a), _items(b), 0, n)


# PyDictObject ends with `PyDictKeysObject *ma_keys; PyDictValues *ma_values;` after
# `Py_ssize_t ma_used; uint64_t ma_version_tag;`; its keys object starts with
# `Py_ssize_t dk_refcnt; uint8_t dk_log2_size, dk_log2_index_bytes, dk_kind; uint32_t
# dk_version; Py_ssize_t dk_usable, dk_nentries;` then the index table, then the entries:
# (hash, key, value) of general keys (kind 0), (key, value) of str keys only (kind 1).
_KEYS_AT: Final = dict.__basicsize__ - 2 * _PTR
_ENTRIES_AT: Final = 4 * _PTR
_ENTRY_SIZE: Final = {0: 3 * _PTR, 1: 2 * _PTR}


def _table(d: dict[Any, Any]) -> tuple[int, int, int] | None:
    """Where d's entries start, their size and how many are used (live or deleted); None
    for a table of another kind (a split table). Same conditions as :func:`_items`."""
    at = id(d) + _KEYS_AT
    if ctypes.c_void_p.from_address(at + _PTR).value:  # ma_values: a split table
        return None
    keys = ctypes.c_void_p.from_address(at).value or 0
    size = _ENTRY_SIZE.get(ctypes.c_uint8.from_address(keys + _PTR + 2).value)
    if size is None:
        return None
    index_bytes = 1 << ctypes.c_uint8.from_address(keys + _PTR + 1).value
    used = ctypes.c_ssize_t.from_address(keys + 3 * _PTR).value
    return keys + _ENTRIES_AT + index_bytes, size, used


def _dict_layout_known() -> bool:
    """Whether dict entries sit where :func:`_table` says (checked once, both kinds)."""
    if not _FAST:
        return False
    try:
        for probe in ({f"p{i}": object() for i in range(9)}, {(i,): object() for i in range(9)}):
            table = _table(probe)
            if table is None:
                return False
            at, size, used = table
            words = [id(x) for kv in probe.items() for x in kv]
            if size == 3 * _PTR:
                hashes = [hash(k) % (1 << 8 * _PTR) for k in probe]
                words = [w for i, h in enumerate(hashes) for w in (h, *words[2 * i : 2 * i + 2])]
            raw = b"".join(w.to_bytes(_PTR, sys.byteorder) for w in words)
            if used != len(probe) or ctypes.string_at(at, len(raw)) != raw:
                return False
    except (ValueError, TypeError, OSError, OverflowError):
        return False
    return True


_DICT_FAST: Final = _dict_layout_known()


def same_entries(a: dict[Any, Any], b: dict[Any, Any]) -> bool | None:
    """Whether b's first ``len(a)`` entries are a's, the same key and value objects in
    order (one memory comparison of the two entry tables); None when that cannot be told
    so: another layout, tables of different kinds, or a deleted entry in either table.

    b holds at least ``len(a)`` entries, and no other thread can change either meanwhile
    (see :func:`_items`): pass a fresh copy of a dict others may hold.
    """
    n = dict.__len__(a)
    if not n:
        return True
    if not _DICT_FAST:
        return None
    ta, tb = _table(a), _table(b)
    if ta is None or tb is None or ta[1] != tb[1] or ta[2] != n or tb[2] != dict.__len__(b):
        return None
    return _same_range(ta[0], tb[0], 0, n * ta[1] // _PTR)


def differing(a: list[Any], b: list[Any], n: int, limit: int) -> list[int] | None:
    """The indices i < n where ``a[i] is not b[i]``, in order; None when more than limit.

    Found by halving: equal halves of the two pointer arrays are skipped whole, so d
    differences cost about d times log(n) memory comparisons (C speed), never a look at
    each item. Same conditions on a and b as :func:`same_items`.
    """
    if n <= _SMALL or not _FAST:
        pairs = map(operator.is_not, list.__getitem__(a, slice(n)), list.__getitem__(b, slice(n)))
        out = list(itertools.compress(range(n), pairs))
        return out if len(out) <= limit else None
    pa, pb = _items(a), _items(b)
    out = []
    todo = [(0, n)]
    while todo:
        lo, hi = todo.pop()
        if _same_range(pa, pb, lo, hi):
            continue
        if hi - lo == 1:
            out.append(lo)
            if len(out) > limit:
                return None
            continue
        mid = (lo + hi) // 2
        todo += ((mid, hi), (lo, mid))  # the lower half first: indices come out in order
    return out


class AtomMemo:
    """Lists (by identity) known to hold atoms only, with the items they held then.

    :meth:`atoms` of a list seen before compares its first items with those remembered, by
    identity (one memory comparison): the same objects are the same atoms, so only the
    items after them are looked at. The remembered items are the memo's own copy, so the
    answer is exact whatever happened to the list since (and even if it is another list
    that got the old one's id). Lists of up to ``small`` items are looked at whole, never
    remembered; at most ``size`` lists and ``budget`` items in all are, the oldest dropped
    first (what it keeps alive stays bounded).

    :param atoms: the types whose instances are atoms (exactly these, not subclasses).
    """

    def __init__(
        self, atoms: frozenset[Any], *, size: int = 64, budget: int = 1 << 20, small: int = 64
    ) -> None:
        self._types = atoms
        self._size, self._budget, self._small = size, budget, small
        self._seen: dict[int, list[Any]] = {}
        self._total = 0  # items remembered

    def atoms(self, items: list[Any], owner: object = None) -> bool:
        """Whether every item of items is an atom; items must not change meanwhile.

        :param owner: what items were taken from (a dict's values, copied into a list), if
            not items itself: remembered by its identity.
        """
        n = list.__len__(items)
        if n <= self._small:
            return set(map(type, list.__iter__(items))) <= self._types
        key = id(items if owner is None else owner)
        seen = self._seen.pop(key, None)
        if seen is not None:
            self._total -= len(seen)
            m = len(seen)
            if m <= n and same_items(items, seen, m):
                added = list.__getitem__(items, slice(m, None))
                if not set(map(type, added)) <= self._types:
                    return False
                seen.extend(added)
                self._keep(key, seen)
                return True
        if not set(map(type, list.__iter__(items))) <= self._types:
            return False
        self._keep(key, list.__getitem__(items, slice(None)))
        return True

    def _keep(self, key: int, seen: list[Any]) -> None:
        """Remembers seen under key, as the newest; drops the oldest beyond the bounds."""
        self._seen[key] = seen
        self._total += len(seen)
        while len(self._seen) > self._size or (self._total > self._budget and len(self._seen) > 1):
            self._total -= len(self._seen.pop(next(iter(self._seen))))
