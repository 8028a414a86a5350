"""Identity comparison of list items and the memo of atom-only lists (workflow/_identity.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import Codec, default_codec
from workflow import _identity
from workflow._diff import TrackedDict, TrackedList, Tracker, diff
from workflow._identity import AtomMemo, differing, same_items

ATOMS = frozenset({str, int, float, bool, type(None), bytes})


def test_the_fast_comparison_is_used_here() -> None:
    """On this interpreter the item pointers are compared with memcmp, not walked."""
    assert _identity._FAST
    assert _identity._MEMCMP is not None


WAYS = ["memcmp", "bytes", "walk"]


def _the_way(mp: pytest.MonkeyPatch, way: str) -> None:
    """Compares item pointers with the C memcmp, as copied bytes, or walks the items."""
    if way == "bytes":
        mp.setattr(_identity, "_MEMCMP", None)
    mp.setattr(_identity, "_FAST", way != "walk")


@pytest.mark.parametrize("way", WAYS)
@given(n=st.integers(0, 60), at=st.integers(0, 59), data=st.data())
def test_same_items_is_identity_of_each_item(
    way: str, n: int, at: int, data: st.DataObject
) -> None:
    """Equal items that are other objects (1, 1.0 and True; an equal string) differ."""
    with pytest.MonkeyPatch.context() as mp:
        _the_way(mp, way)
        _check_same_items(n, at, data)


def _check_same_items(n: int, at: int, data: st.DataObject) -> None:
    a: list[Any] = [f"item {i}" for i in range(n)]
    b = [*a, "more"]
    assert same_items(a, b, n)
    if n:
        i = at % n
        other = data.draw(st.sampled_from(["copy", "one", "float", "true"]))
        a[i] = {"copy": "".join(["item ", str(i)]), "one": 1, "float": 1.0, "true": True}[other]
        b[i] = {"copy": f"item {i}", "one": True, "float": 1, "true": 1.0}[other]
        assert a[i] == b[i]
        assert not same_items(a, b, n)
        assert same_items(a, b, i)


def test_memo_sees_an_item_replaced_in_place() -> None:
    """A list seen holding atoms that later holds a list is not taken for atoms."""
    memo = AtomMemo(ATOMS, small=8)
    items: list[Any] = ["a"] * 40
    assert memo.atoms(items)
    items.append("b")
    assert memo.atoms(items)  # only the added item is looked at
    items[3] = ["mutable"]
    assert not memo.atoms(items)
    items[3] = "a"
    assert memo.atoms(items)
    del items[10:]
    assert memo.atoms(items)


def test_memo_is_exact_for_a_new_list_with_an_old_id() -> None:
    """A new list that gets a forgotten list's id is looked at, not trusted."""
    memo = AtomMemo(ATOMS, size=2, small=8)
    for _ in range(50):
        items: list[Any] = ["x"] * 20 + [[1]]
        assert not memo.atoms(items)
        items = ["x"] * 20
        assert memo.atoms(items)
        items.append({"k": 1})
        assert not memo.atoms(items)


def test_memo_of_dict_values_by_their_dict() -> None:
    """A dict's values are remembered under the dict, so its next view looks at new ones."""
    memo = AtomMemo(ATOMS, small=8)
    d: dict[str, Any] = {f"k{i}": i for i in range(30)}
    assert memo.atoms(list(d.values()), d)
    d["new"] = [1]
    assert not memo.atoms(list(d.values()), d)


def test_iterating_a_view_of_a_list_that_gained_a_mutable_item_wraps_it() -> None:
    """The memo never lets a committed mutable item out unwrapped: mutating it changes
    nothing committed, and the patch records the change."""
    base: list[Any] = ["x"] * 40
    TrackedList(base)._wrap_all()  # seen: atoms only
    base.append({"k": [1]})
    tracker = Tracker(base)
    items = [*tracker.view]
    items[-1]["k"].append(2)
    assert base[-1] == {"k": [1]}
    assert tracker.ops() == [("append", (40, "k"), 2)]


def test_large_derived_values_cost_the_change() -> None:
    """``[*items, x]``, ``list(items)``, a deep copy and ``{**d, k: v}`` of views of large
    values are patches of the change, recognised by identity."""
    items = [f"i{i}" for i in range(500)]
    t = Tracker(items)
    assert diff(items, [*t.view, "new"], _codec(), hint=t) == [("append", (), "new")]
    t = Tracker(items)
    deep = copy.deepcopy(t.view)
    deep.append("z")
    assert isinstance(deep, TrackedList)
    assert t.ops() == []
    d = {f"k{i}": i for i in range(500)}
    td = Tracker(d)
    assert isinstance(td.view, TrackedDict)
    assert diff(d, {**td.view, "n": 1.0}, _codec(), hint=td) == [("set", ("n",), 1.0)]
    changed = {**td.view, "n": 1}
    changed["k1"] = True  # equal to the 1 it replaces, but a bool
    ops = diff(d, changed, _codec(), hint=td)
    assert ("set", ("k1",), True) in ops


def _codec() -> Codec:
    return default_codec


@pytest.mark.parametrize("way", WAYS)
@given(n=st.integers(0, 300), changed=st.sets(st.integers(0, 299)), limit=st.integers(0, 70))
def test_differing_finds_each_item_that_is_another_object(
    way: str, n: int, changed: set[int], limit: int
) -> None:
    """The indices found by halving are those a walk finds, or None beyond the limit."""
    a: list[Any] = [f"v{i}" for i in range(n)]
    b = list(a)
    for i in changed:
        if i < n:
            b[i] = "".join(["v", str(i)])  # equal, but another object
    want = sorted(i for i in changed if i < n)
    with pytest.MonkeyPatch.context() as mp:
        _the_way(mp, way)
        got = differing(a, b, n, limit)
    assert got == (want if len(want) <= limit else None)


def test_a_copy_changed_in_places_is_patched_there() -> None:
    """A deep copy of a large plain list or dict, changed in two places, is two ops; a list
    decoded afresh (sharing nothing) that grew is the appended item; one changed is whole."""
    codec = _codec()
    items: list[Any] = [f"i{i}" for i in range(300)] + [[1, 2]]
    new = copy.deepcopy(items)
    new[7], new[-1][0] = 7.0, True
    assert diff(items, new, codec) == [("set", (7,), 7.0), ("set", (300, 0), True)]
    d: dict[str, Any] = {f"k{i}": i for i in range(300)}
    nd = dict(d, k3=False, k200="x")
    assert diff(d, nd, codec) == [("set", ("k3",), False), ("set", ("k200",), "x")]
    fresh = codec.decode(codec.encode(items))
    fresh.append("z")
    assert diff(items, fresh, codec, text=codec.encode(fresh)) == [("append", (), "z")]
    fresh[5] = "changed"
    assert diff(items, fresh, codec)[0][:2] == ("replace", ())


def test_memo_keeps_within_its_bounds() -> None:
    """However many lists it sees, the memo keeps at most its budget of items."""
    memo = AtomMemo(ATOMS, size=4, budget=100, small=8)
    lists = [[f"{j}-{i}" for i in range(30)] for j in range(20)]
    for items in lists:
        assert memo.atoms(items)
    assert len(memo._seen) <= 4
    assert memo._total == sum(map(len, memo._seen.values())) <= 100


def test_the_fast_dict_comparison_is_used_here() -> None:
    """On this interpreter dict entry tables are compared with memcmp."""
    assert _identity._DICT_FAST


def _plain_entries(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    n = len(a)
    pairs = list(b.items())[:n]
    return len(b) >= n and all(
        k is c and v is w for (k, v), (c, w) in zip(a.items(), pairs, strict=True)
    )


@pytest.mark.parametrize("way", ["memcmp", "bytes", "unknown layout"])
@given(
    n=st.integers(0, 60),
    at=st.integers(0, 59),
    change=st.sampled_from(["none", "value", "equal value", "key", "grow", "reorder"]),
    str_keys=st.booleans(),
)
def test_same_entries_is_identity_of_each_key_and_value(
    way: str, n: int, at: int, change: str, str_keys: bool
) -> None:
    """same_entries says whether b starts with a's entries, the same objects in order, as
    comparing each pair does; None only where it cannot tell (an unknown layout, a table
    with a deleted entry)."""
    with pytest.MonkeyPatch.context() as mp:
        if way == "bytes":
            mp.setattr(_identity, "_MEMCMP", None)
        mp.setattr(_identity, "_DICT_FAST", way != "unknown layout")
        a: dict[Any, Any] = {(f"k{i}" if str_keys else (i,)): [i] for i in range(n)}
        b = dict(a)
        if n and change != "none":
            k = list(a)[at % n]
            if change == "value":
                b[k] = [-1]
            elif change == "equal value":
                b[k] = list(a[k])  # equal, another object
            elif change == "key":
                del b[k]
                b[f"other{at}" if str_keys else (-1,)] = a[k]
            elif change == "reorder":
                b[k] = b.pop(k)
        if change == "grow":
            b[f"more{at}" if str_keys else (-2,)] = 1
        got = _identity.same_entries(a, b) if len(b) >= n else False
        if got is None:  # the layout is not known, or b's table has a deleted entry
            assert n > 0
            assert way == "unknown layout" or change in ("key", "reorder")
        else:
            assert way != "unknown layout" or n == 0
            assert got == _plain_entries(a, b)


def test_same_entries_cannot_tell_past_a_deleted_entry() -> None:
    """A table with a deleted entry among its first entries is not compared: None."""
    a = {f"k{i}": i for i in range(40)}
    del a["k3"]
    assert _identity.same_entries(a, dict.copy(a)) is None
    assert _identity.same_entries({}, a) is True


def test_a_dict_derived_from_a_view_costs_the_change() -> None:
    """``{**d, k: v}`` of a view of a large dict is the view's patch and the new key, found
    by comparing entry tables (no list of values), also after a deleted key."""
    base = {f"k{i}": i for i in range(500)}
    tracker = Tracker(base)
    new = {**tracker.view, "x": 1}
    assert diff(base, new, default_codec, hint=tracker) == [("set", ("x",), 1)]
    del base["k7"]
    tracker = Tracker(base)
    new = {**tracker.view, "y": 2}
    assert diff(base, new, default_codec, hint=tracker) == [("set", ("y",), 2)]
