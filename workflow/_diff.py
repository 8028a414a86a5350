"""Context writes at the size of the change: copy-on-write views, patches, and their appliers.

This module is the front of a few: the list view (:mod:`workflow._tracked_list`), the dict
view and the copy of other objects (:mod:`workflow._tracked_dict`), the diff
(:mod:`workflow._delta`), what they share about kinds of values (:mod:`workflow._values`),
identity at memory speed (:mod:`workflow._identity`) and the ops (:mod:`workflow._patch`).
Importing it registers the views, so import views and trackers from here.

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

import sys
from typing import Any, Final

from eventstore import Codec, default_codec

from . import _delta
from ._patch import (
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
from ._tracked_dict import TrackedDict
from ._tracked_list import TrackedList
from ._values import ATOMS, materialize, node_of, register_views, tracked, view_of

__all__ = [
    "UNSURE",
    "KeyRef",
    "Op",
    "Path",
    "PathElem",
    "TrackedDict",
    "TrackedList",
    "Tracker",
    "apply",
    "apply_json",
    "changes_since",
    "diff",
    "is_view",
    "materialize",
    "ops_from_json",
    "ops_to_json",
    "patch_size",
    "register_views",
    "renew",
    "spare",
]

# A list view of at least this many items is kept to be renewed (a smaller one copies about as
# fast; the spellings property's padded lists, 70 items, are renewed, so it checks renewal).
SPARE_MIN: Final = 64


def is_view(x: Any) -> bool:
    """Whether x is a list or dict view made by a :class:`Tracker` (or a copy of one)."""
    return tracked(x)


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
        self.token = object()  # carried by each view it makes: they show base as it is now
        self.node = None if type(base) in ATOMS else node_of(base, self._codec, self.token)
        self._view = base if self.node is None else view_of(self.node)
        # Kept for its owner (the context's store, see :func:`renew`): the version of the
        # key base was, and what the attempt's last write of the key made of the view.
        self.version = 0
        self.written: Any = None

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


def diff(
    old: Any,
    new: Any,
    codec: Codec,
    *,
    whole_size: int | None = None,
    hint: Tracker | None = None,
    text: str | None = None,
) -> list[Op]:
    """The patch from old to new (:func:`workflow._delta.diff`); ``hint`` is the tracker
    whose view new may derive from (``items + [x]``, ``{**d, k: v}``): what new shares
    with that view by identity costs nothing.

    :param whole_size: the length of new's JSON text, when the caller has encoded it already.
    :param text: new's JSON text, when the caller has it (not encoded again then).
    """
    node, token = (None, None) if hint is None else (hint.node, hint.token)
    return _delta.diff(old, new, codec, whole_size=whole_size, hint=node, text=text, token=token)


def spare(tracker: Tracker) -> bool:
    """Whether to keep tracker once its attempt ends, for :func:`renew` (a large list's
    or dict's)."""
    view = tracker.node
    if type(view) is TrackedList:
        return list.__len__(view) >= SPARE_MIN
    return isinstance(view, TrackedDict) and dict.__len__(view) >= SPARE_MIN


def _take(spares: dict[str, Tracker], key: str) -> tuple[Tracker | None, tuple[int, int]]:
    """Pops key's spare tracker, with the references to it and to its view then: those
    of this function's frame alone when nothing else holds either."""
    kept = spares.pop(key, None)
    if kept is None:
        return None, (0, 0)
    return kept, (sys.getrefcount(kept), sys.getrefcount(kept._view))


def _sole_counts() -> tuple[int, int] | None:
    """What :func:`_take` counts for a spare nothing else holds (None: not CPython with
    its GIL, where counts say who holds an object)."""
    gil = getattr(sys, "_is_gil_enabled", None)
    if sys.implementation.name != "cpython" or (gil is not None and not gil()):
        return None
    probe = Tracker([[] for _ in range(SPARE_MIN)])
    spares = {"probe": probe}
    del probe
    _, counts = _take(spares, "probe")
    return counts


def renew(
    spares: dict[str, Tracker],
    key: str,
    base: Any,
    since: tuple[list[Op], bool] | None = None,
) -> Tracker | None:
    """A tracker of base made from key's spare (popped from spares), when nothing but
    spares holds that tracker and its view: its attempt has ended, and neither the user's
    code nor anything else kept the view. None otherwise.

    A committed list or dict is copied into each attempt's view (C speed, yet a cost
    growing with the value, which a step adding one item to a long one would pay every
    step). The view of the attempt before is made over instead, putting back only what
    changed, so a step costs its change. The owner's word ``since`` says what base (the
    spare's own base, changed in place) took since the spare was made: the ops, and
    whether they are the spare view's own patch; None: not known. A dict's entries cannot
    be compared at memory speed, so its view is renewed only on that word
    (:meth:`TrackedDict._renew`); a list's view without it checks every item is base's,
    by identity at memory speed (:meth:`TrackedList._renew`).
    Reference counts are what proves the view unreachable: where they do not (another
    interpreter, no GIL) every view is a copy.
    """
    kept, counts = _take(spares, key)
    if kept is None or counts != _SOLE:
        return None
    view = kept.node
    token = object()
    if type(view) is TrackedList:
        if not view._renew(base, token, since):
            return None
    elif since is None or not isinstance(view, TrackedDict) or not view._renew(base, token, *since):
        return None
    kept.base, kept.token = base, token
    kept.written = None
    return kept


_SOLE: Final = _sole_counts()


# A tracker's ``written`` while its attempt's write of the key is unknown or not a value.
UNSURE: Any = object()


def changes_since(tracker: Tracker, version: int) -> tuple[list[Op], bool] | None:
    """What the host's committed value took since tracker was made, by the host's word
    (for :func:`renew`): the ops, and whether they are the view's own
    patch; None when not known.

    The host's version of a key changes with each commit that changes it, and the
    change an attempt wrote learns the seq of its commit once applied: so the value is
    unchanged when the version is, and changed by exactly the attempt's last write of
    the key when the version is that write's seq (the attempt read the key, so no other
    commit came between). A host that keeps no versions (0) vouches for nothing.
    """
    if not version:
        return None
    if version == tracker.version:
        return [], False
    written = tracker.written
    if written is None or written is UNSURE:
        return None
    change, own = written
    if change is None or change.seq != version or change.ops is None:
        return None
    return change.ops, own
