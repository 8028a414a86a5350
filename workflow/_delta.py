"""The patch from a committed value to a new one: :func:`diff`, at the size of the change.

What the new value shares with the old is found by identity first (a view's node says
what its items are, :mod:`workflow._identity` compares lists of them at memory speed);
what shares nothing known is compared by its encoding (C speed), so ``1``, ``1.0`` and
``True`` stay apart. The views (:mod:`workflow._diff`) call back into
:func:`diff_into` and :func:`diff_obj` for what their users assigned.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

from eventstore import Codec

from ._identity import differing, same_entries, same_items
from ._patch import KeyRef, Op, Path, ops_to_json, patch_size
from ._values import (
    VIEWS,
    Node,
    elem,
    field_names,
    fresh,
    is_frozen,
    materialize,
    put_op,
    register_views,
    same,
    same_extras,
    tail_ops,
    view_of,
)

__all__ = ["diff", "diff_into", "diff_obj"]

_REPLACE_OVERHEAD: Final = len(b'[["replace",[],]]')  # a whole-value patch, its value aside
# Below this many items a list or dict that shares nothing known is diffed item by item.
_SMALL: Final = 32


def _few(n: int) -> int:
    """How many of n items may differ by identity for a patch of just those (at most 64, so
    finding them stays a few memory comparisons)."""
    return min(64, n // 4)


def diff(
    old: Any,
    new: Any,
    codec: Codec,
    *,
    whole_size: int | None = None,
    hint: Node | None = None,
    text: str | None = None,
    token: object = None,
) -> list[Op]:
    """The patch from old to new, comparing encodings, so ``1``, ``1.0`` and ``True`` differ.

    What new shares with old is found by identity first, so a value derived from a view of
    old (``items + [x]``, ``[*items, x]``, ``{**d, k: v}``, ``model_copy(update=...)``)
    costs the change: ``hint``, the node of that view, says what its items are.
    Large lists and dicts that share most of their items with old by identity (a copy,
    deep or not, changed in places) are patched where they differ, found by halving the
    item arrays (C speed). Large values that share nothing are compared by their
    encodings (C speed) and written from their common prefix when a list grew, else
    whole: never walked item by item in Python. Views in new are
    materialized. Returns [] when nothing changed, and ``[("replace", (), new)]`` when the
    patch would not be smaller than new.

    :param whole_size: the length of new's JSON text, when the caller has encoded it already
        (so new is not encoded again only to be measured).
    :param text: new's JSON text, when the caller has it (so new is not encoded again to be
        compared with old's).
    :param token: the token of the tracker whose views are current (made for old as it is
        now): only those are taken for what they record. A view kept from an earlier
        attempt shows old as it was then, so it is diffed as any other value.
    """
    register_views(codec)
    out: list[Op] = []
    if whole_size is None and text is not None:
        whole_size = len(text)
    diff_into(old, new, (), codec, out, hint, token, text)
    if not out or out[0][:2] == ("replace", ()):
        return out
    if whole_size is None and len(out) == 1 and out[0][0] in ("append", "extend", "trunc"):
        return out  # a list grew or shrank by its end: smaller than the list whole
    if whole_size is None:
        whole = patch_size(ops_to_json([("replace", (), materialize(new))], codec))
    else:
        whole = whole_size + _REPLACE_OVERHEAD
    if patch_size(ops_to_json(out, codec)) >= whole:
        return [("replace", (), fresh(new))]
    return out


def _hint_child(hint: Node | None, elem: Any) -> Node | None:
    if hint is None:
        return None
    if _is_copy(hint):
        return hint.kids.get(elem)  # type: ignore[attr-defined, no-any-return]
    kids: dict[Any, Node] = hint._kids  # type: ignore[attr-defined]
    return kids.get(elem.key if type(elem) is KeyRef else elem)


def _is_copy(node: Node) -> bool:
    return type(node) not in VIEWS  # the copy of an object that is neither list nor dict


def diff_into(
    old: Any,
    new: Any,
    path: Path,
    codec: Codec,
    out: list[Op],
    hint: Node | None,
    token: object,
    text: str | None = None,
) -> None:
    """Appends to out the ops from old to new at path (hint: the node of old's view; token:
    that of the views that are current, see :func:`diff`; text: new encoded, if known)."""
    if old is new:
        return
    if hint is not None and new is view_of(hint):
        hint._collect(out, path)
        return
    t = type(new)
    if t in VIEWS and new._base is old and new._token is token:
        new._collect(out, path)
        return
    to = type(old)
    if to is list and isinstance(new, list):
        _diff_list(old, new, path, codec, out, hint, token, text)
    elif to is dict and isinstance(new, dict):
        _diff_dict(old, new, path, codec, out, hint, token, text)
    elif (
        to is t
        and (names := field_names(old)) is not None
        and names == field_names(new)
        and not is_frozen(t)  # a frozen object may be shared: never patched in place
    ):
        kid = hint if hint is not None and _is_copy(hint) else None
        diff_obj(old, new, path, codec, out, kid, token)
    elif not same(old, new, codec):
        out.append(put_op(path, fresh(new)))


def diff_obj(
    old: Any, new: Any, path: Path, codec: Codec, out: list[Op], hint: Any, token: object
) -> None:
    names = field_names(old) if hint is None else hint.names
    if names is None or not same_extras(new, old, codec):
        if not same(new, old, codec):
            out.append(put_op(path, fresh(new)))
        return
    for name in names:
        kid = None if hint is None else hint.kids.get(name)
        diff_into(getattr(old, name), getattr(new, name), (*path, name), codec, out, kid, token)


def _shares(src: list[Any], new: list[Any], *, private: bool = False) -> bool:
    """Whether new starts with src's items, the same objects (one memory comparison).

    :param private: src is the executor's committed list (only the event loop's thread
        changes it), so it is compared as it is; other lists are copied first.
    """
    n = list.__len__(src)
    if list.__len__(new) < n:
        return False
    if not private:
        src = src._items() if type(src) in VIEWS else list.__getitem__(src, slice(None))  # type: ignore[attr-defined]
    return same_items(list.__getitem__(new, slice(n)), src, n)


def _diff_list(
    old: list[Any],
    new: list[Any],
    path: Path,
    codec: Codec,
    out: list[Op],
    hint: Node | None,
    token: object,
    text: str | None,
) -> None:
    if isinstance(hint, list) and _shares(hint, new):  # derived from the view
        hint._collect(out, path)
        tail_ops(path, list.__getitem__(new, slice(list.__len__(hint), None)), out)
        return
    if _shares(old, new, private=True):  # old's items, then more
        tail_ops(path, list.__getitem__(new, slice(len(old), None)), out)
        return
    n = len(new)
    if n < len(old) and _shares(new, old):
        out.append(("trunc", path, n))
        return
    m = min(len(old), n)
    if m > _SMALL:
        mine = list.__getitem__(new, slice(m))  # a copy: no other thread changes it
        changed = differing(old, mine, m, _few(m))
        if changed is not None:  # most items are old's: patched where they differ
            for i in changed:
                kid = _hint_child(hint, i)
                diff_into(old[i], mine[i], (*path, i), codec, out, kid, token)
            if n < len(old):
                out.append(("trunc", path, n))
            tail_ops(path, list.__getitem__(new, slice(m, None)), out)
            return
    if len(old) > _SMALL or n > _SMALL:
        _diff_encoded(old, new, path, codec, out, text)
        return
    sub: list[Op] = []
    replaced = 0  # items rewritten whole, not merely changed inside
    for i in range(m):
        before = len(sub)
        kid = _hint_child(hint, i)
        diff_into(old[i], list.__getitem__(new, i), (*path, i), codec, sub, kid, token)
        replaced += len(sub) == before + 1 and sub[-1][:2] == ("set", (*path, i))
    if replaced * 2 > m:  # most items moved (an insert or removal near the front): rewrite
        out.append(put_op(path, fresh(new)))
        return
    out += sub
    if n < len(old):
        out.append(("trunc", path, n))
    tail_ops(path, list.__getitem__(new, slice(m, None)), out)


def _diff_encoded(
    old: list[Any], new: list[Any], path: Path, codec: Codec, out: list[Op], text: str | None
) -> None:
    """Two large lists that share nothing known, compared by their encodings."""
    a, b = codec.encode(old), codec.encode(new) if text is None else text
    if a == b:
        return
    if len(b) > len(a) and (len(a) == 2 or b[len(a) - 1] == ",") and b.startswith(a[:-1]):
        # JSON values are self-delimiting: new's first items encode as old's, exactly.
        tail_ops(path, list.__getitem__(new, slice(len(old), None)), out)
        return
    out.append(put_op(path, fresh(new)))


def _diff_dict(
    old: dict[Any, Any],
    new: dict[Any, Any],
    path: Path,
    codec: Codec,
    out: list[Op],
    hint: Node | None,
    token: object,
    text: str | None,
) -> None:
    src: Any = hint if isinstance(hint, dict) else None
    copied = dict.copy(new)  # compared by identity: a copy no other thread changes
    added = None if src is None else _dict_extends(src._entries(), copied)
    if added is not None:  # derived from the view: {**d, k: v}
        src._collect(out, path)
        out.extend(("set", (*path, elem(k)), fresh(dict.__getitem__(new, k))) for k in added)
        return
    added = _dict_extends(old, copied)
    if added is not None:
        out.extend(("set", (*path, elem(k)), fresh(dict.__getitem__(new, k))) for k in added)
        return
    keys, values = list(dict.keys(old)), list(dict.values(old))
    n = len(keys)
    if n > _SMALL and dict.__len__(new) == n and same_items(list(dict.keys(new)), keys, n):
        mine = list(dict.values(new))
        changed = differing(values, mine, n, _few(n))
        if changed is not None:  # the same keys, most values old's: patched where they differ
            for i in changed:
                k = keys[i]
                kid = _hint_child(hint, k)
                diff_into(values[i], mine[i], (*path, elem(k)), codec, out, kid, token)
            return
    kept = [k for k in old if dict.__contains__(new, k)]
    if list(dict.keys(new))[: len(kept)] != kept:  # reordered: a patch adds keys at the end
        out.append(put_op(path, fresh(new)))
        return
    if n > _SMALL and codec.encode(old) == (codec.encode(new) if text is None else text):
        return
    out.extend(("del", (*path, elem(k))) for k in old if not dict.__contains__(new, k))
    for k, v in dict.items(new):
        if k in old:
            diff_into(old[k], v, (*path, elem(k)), codec, out, _hint_child(hint, k), token)
        else:
            out.append(("set", (*path, elem(k)), fresh(v)))


def _dict_extends(src: dict[Any, Any], new: dict[Any, Any]) -> list[Any] | None:
    """The keys new has after src's entries, if it starts with them: the same key and
    value objects, in order; None if it does not. No other thread may change src or new.

    Their entry tables are compared at memory speed (:func:`same_entries`), and the keys
    after src's are taken from new's end, so a dict that grew costs its growth; where the
    tables cannot be compared so, keys and values are listed and compared by identity.
    """
    n = dict.__len__(src)
    extra = dict.__len__(new) - n
    if extra < 0:
        return None
    same = same_entries(src, new)
    if same is None:
        values = list(dict.values(src))
        if not same_items(list(dict.values(new)), values, n):
            return None
        keys = list(dict.keys(new))
        return keys[n:] if same_items(keys, list(dict.keys(src)), n) else None
    if not same:
        return None
    added = list(itertools.islice(dict.__reversed__(new), extra))
    added.reverse()
    return added
