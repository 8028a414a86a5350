"""Which items two lists share, by identity, at the speed of comparing memory.

A view of a committed list learns what a value derived from it shares with it by identity
(``[*items, x]``, ``list(items)``): the new list's first items are the view's own objects.
``all(map(operator.is_, a, b))`` answers that at about 15 ns an item, which at 10,000 items
costs more than the rest of a step. A CPython list keeps its items as an array of object
pointers, so two lists hold the same objects exactly when those arrays hold the same bytes:
:func:`same_items` compares them with one ``memcmp`` (about 0.3 ns an item). Where the
layout is not the one checked at import (another interpreter, another build), it falls back
to the ``operator.is_`` walk: the answer is the same, only slower.

:class:`AtomMemo` remembers which lists were seen holding atoms only (immutable scalars a
view may hand out as they are), so a later view of the same list checks only the items
added since, not every item's type again.
"""

from __future__ import annotations

import ctypes
import operator
import sys
from typing import Any, Final

__all__ = ["AtomMemo", "same_items"]

_PTR: Final = ctypes.sizeof(ctypes.c_void_p)
# PyListObject ends with `PyObject **ob_item; Py_ssize_t allocated;` after its header.
_ITEMS_AT: Final = list.__basicsize__ - 2 * _PTR
# Below this many items the plain walk is as fast as building two byte strings.
_SMALL: Final = 16


def _item_bytes(lst: list[Any], n: int) -> bytes:
    """The first n item pointers of lst (n <= len(lst)), as bytes.

    The caller makes sure no other thread can resize lst meanwhile: lst is private to it
    (a fresh copy), or only the event loop's thread ever changes it.
    """
    if n == 0:
        return b""
    items = ctypes.c_void_p.from_address(id(lst) + _ITEMS_AT).value
    if items is None:  # no storage: only an empty list has none, and n > 0 here
        msg = "a list with items has no item storage"
        raise ValueError(msg)
    return ctypes.string_at(items, n * _PTR)


def _walk(a: list[Any], b: list[Any], n: int) -> bool:
    if n == len(a) and n == len(b):
        return all(map(operator.is_, list.__iter__(a), list.__iter__(b)))
    return all(map(operator.is_, list.__getitem__(a, slice(n)), list.__getitem__(b, slice(n))))


def _layout_known() -> bool:
    """Whether list items sit where :func:`_item_bytes` reads them (checked once)."""
    if sys.implementation.name != "cpython":
        return False
    try:
        probe = [object() for _ in range(3)]
        raw = _item_bytes(probe, 3)
        expected = b"".join(id(x).to_bytes(_PTR, sys.byteorder) for x in probe)
    except (ValueError, TypeError, OSError, OverflowError):
        return False
    return raw == expected


_FAST: Final = _layout_known()


def same_items(a: list[Any], b: list[Any], n: int) -> bool:
    """Whether ``a[:n]`` and ``b[:n]`` are the same objects, item by item (``is``).

    Both lists hold at least n items, and no other thread can change either meanwhile (see
    :func:`_item_bytes`): pass a fresh copy of a list others may hold.
    """
    if n <= _SMALL or not _FAST:
        return _walk(a, b, n)
    return _item_bytes(a, n) == _item_bytes(b, n)


class AtomMemo:
    """Lists (by identity) known to hold atoms only, with the items they held then.

    :meth:`atoms` of a list seen before compares its first items with those remembered, by
    identity (one memory comparison): the same objects are the same atoms, so only the
    items after them are looked at. The remembered items are the memo's own copy, so the
    answer is exact whatever happened to the list since (and even if it is another list
    that got the old one's id). At most ``size`` lists are remembered, the oldest dropped.

    :param atoms: the types whose instances are atoms (exactly these, not subclasses).
    """

    def __init__(self, atoms: frozenset[Any], size: int = 64) -> None:
        self._types = atoms
        self._size = size
        self._seen: dict[int, list[Any]] = {}

    def atoms(self, items: list[Any], owner: object = None) -> bool:
        """Whether every item of items is an atom; items must not change meanwhile.

        :param owner: what items were taken from (a dict's values, copied into a list), if
            not items itself: remembered by its identity.
        """
        key = id(items if owner is None else owner)
        seen = self._seen.get(key)
        n = list.__len__(items)
        if seen is not None:
            m = len(seen)
            if m <= n and same_items(items, seen, m):
                added = list.__getitem__(items, slice(m, None))
                if set(map(type, added)) <= self._types:
                    seen.extend(added)
                    return True
            del self._seen[key]
        if not set(map(type, list.__iter__(items))) <= self._types:
            return False
        if len(self._seen) >= self._size:
            del self._seen[next(iter(self._seen))]
        self._seen[key] = list.__getitem__(items, slice(None))
        return True
