"""Copy-on-write views, patches and their appliers (workflow/_diff.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import operator
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from eventstore import Codec
from workflow._diff import (
    KeyRef,
    Op,
    TrackedDict,
    TrackedList,
    Tracker,
    apply,
    apply_json,
    diff,
    materialize,
    ops_from_json,
    ops_to_json,
    patch_size,
)
from workflow._patch import apply_copied


@dataclasses.dataclass
class Bag:
    items: list[Any]
    meta: dict[Any, Any]
    n: Any = 0


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: Any
    b: Any = None


@attrs.define
class Rec:
    name: str
    tags: list[str]


class Doc(BaseModel):
    title: str
    tags: list[str] = []
    data: dict[str, Any] = {}


@pytest.fixture
def codec() -> Codec:
    return Codec()


def _replay_json(base: Any, ops: list[Op], codec: Codec) -> Any:
    # Both sides decoded from text, as the fold sees them: apply_json changes them in place.
    data = orjson.loads(codec.encode(base))
    ops_json = orjson.loads(orjson.dumps(ops_to_json(ops, codec)))
    return codec.load(apply_json(data, ops_json))


def check(base: Any, tracker: Tracker, expected: Any, codec: Codec) -> list[Op]:
    """Assert that the view and every replay of its patch equal expected, base untouched."""
    before = codec.encode(base)
    ops = tracker.ops()
    want = codec.encode(expected)
    assert codec.encode(materialize(tracker.view)) == want
    assert codec.encode(apply(copy.deepcopy(base), ops)) == want
    assert codec.encode(apply_copied(base, ops)) == want  # base stays as it was (below)
    assert codec.encode(_replay_json(base, ops, codec)) == want
    loaded = ops_from_json(orjson.loads(orjson.dumps(ops_to_json(ops, codec))), codec)
    assert codec.encode(apply(copy.deepcopy(base), loaded)) == want
    assert codec.encode(base) == before
    assert tracker.ops() == ops  # taking the patch changes nothing
    return ops


def _base_list() -> list[Any]:
    return [1, [2, 3], {"a": 4}, "s", 5.0, (6, 7)]


def _pop_all(v: Any) -> Any:
    out = []
    while v:
        out.append(v.pop())
    return out


def _iadd(v: Any) -> Any:
    v += [8, [9]]
    return v


def _set_then_mutate(v: Any) -> Any:
    fresh: list[Any] = []
    v[0] = fresh
    fresh.append(1)  # the view holds the user's object: the patch sees it as it is at ops()
    return fresh


def _nested_then_insert(v: Any) -> Any:
    v[1].append(9)
    v.insert(0, "front")
    v[2].append(10)
    return v


LIST_MUTATIONS = [
    pytest.param(lambda v: v.__setitem__(0, "x"), id="setitem"),
    pytest.param(lambda v: v.__setitem__(-1, [1]), id="setitem-negative"),
    pytest.param(lambda v: v.__setitem__(slice(1, 3), ["a", "b"]), id="slice-same-length"),
    pytest.param(lambda v: v.__setitem__(slice(1, 3), ["a"]), id="slice-shorter"),
    pytest.param(lambda v: v.__setitem__(slice(6, 6), ["t"]), id="slice-at-end"),
    pytest.param(lambda v: v.__setitem__(slice(None, None, 2), "abc"), id="slice-extended"),
    pytest.param(lambda v: v.__delitem__(-1), id="del-last"),
    pytest.param(lambda v: v.__delitem__(2), id="del-middle"),
    pytest.param(lambda v: v.__delitem__(slice(3, None)), id="del-suffix"),
    pytest.param(lambda v: v.__delitem__(slice(None, None, 2)), id="del-extended"),
    pytest.param(lambda v: v.__delitem__(slice(4, 2)), id="del-empty-slice"),
    pytest.param(lambda v: v.insert(0, "f"), id="insert-front"),
    pytest.param(lambda v: v.insert(100, "e"), id="insert-past-end"),
    pytest.param(lambda v: v.insert(-100, "e"), id="insert-before-start"),
    pytest.param(lambda v: (v.append(1), v.append(2), v.insert(7, "m")), id="insert-in-tail"),
    pytest.param(lambda v: v.append({"k": [1]}), id="append"),
    pytest.param(lambda v: v.extend(range(3)), id="extend"),
    pytest.param(lambda v: v.extend(v), id="extend-self"),
    pytest.param(_iadd, id="iadd"),
    pytest.param(lambda v: v.pop(), id="pop"),
    pytest.param(lambda v: v.pop(0), id="pop-front"),
    pytest.param(lambda v: (v.append("t"), v.pop(-2)), id="pop-before-tail"),
    pytest.param(_pop_all, id="pop-all"),
    pytest.param(lambda v: v.remove([2, 3]), id="remove"),
    pytest.param(lambda v: v.clear(), id="clear"),
    pytest.param(lambda v: (v.clear(), v.append(1)), id="clear-append"),
    pytest.param(lambda v: v.reverse(), id="reverse"),
    pytest.param(lambda v: v.sort(key=repr, reverse=True), id="sort"),
    pytest.param(lambda v: v[1].append(4), id="nested-append"),
    pytest.param(lambda v: v[2].update(b=5), id="nested-dict"),
    pytest.param(lambda v: v.__setitem__(0, v[1]), id="alias-child"),
    pytest.param(lambda v: v.__setitem__(1, v[1]), id="child-put-back"),
    pytest.param(_set_then_mutate, id="set-then-mutate"),
    pytest.param(_nested_then_insert, id="nested-then-insert"),
    pytest.param(lambda v: (v.pop(), v.append("z"), v.__setitem__(0, 0)), id="trunc-append"),
]


@pytest.mark.parametrize("mutate", LIST_MUTATIONS)
def test_list_mutation_matches_a_real_list(mutate: Callable[[Any], Any], codec: Codec) -> None:
    """Each list mutation on a view does what it does to a list, and its patch replays it."""
    base = _base_list()
    model = copy.deepcopy(base)
    tracker = Tracker(base, codec=codec)
    got, want = mutate(tracker.view), mutate(model)
    assert materialize(got) == want or got is tracker.view
    assert tracker.view == model
    check(base, tracker, model, codec)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(lambda v: v.append(7), [("append", (), 7)], id="append"),
        pytest.param(lambda v: v.extend([7, 8]), [("extend", (), [7, 8])], id="extend"),
        pytest.param(lambda v: v.__setitem__(3, 0), [("set", (3,), 0)], id="set"),
        pytest.param(lambda v: v.pop(), [("trunc", (), 5)], id="pop"),
        pytest.param(lambda v: v[1].append(4), [("append", (1,), 4)], id="nested"),
        pytest.param(lambda v: v.__setitem__(1, v[1]), [], id="put-back"),
        pytest.param(lambda v: v.clear(), [("replace", (), [])], id="clear"),
        pytest.param(lambda v: v[1].pop(0), [("replace", (1,), [3])], id="rewrite"),
    ],
)
def test_list_patch_has_the_size_of_the_change(
    mutate: Callable[[Any], Any], expected: list[Op], codec: Codec
) -> None:
    """Appends, assignments and removals at the end record only what changed."""
    tracker = Tracker(_base_list(), codec=codec)
    mutate(tracker.view)
    assert tracker.ops() == expected


def test_list_view_reads_like_a_list() -> None:
    """A list view supports the read API of list, slices and negative indexes included."""
    base = _base_list()
    v = Tracker(base).view
    v.append("t")
    want = [*base, "t"]
    assert isinstance(v, TrackedList)
    assert isinstance(v, list)
    assert json.dumps(v) == json.dumps(want)
    assert orjson.dumps(v) == orjson.dumps(want)
    assert len(v) == 7
    assert v[-1] == "t"
    assert v[1:3] == [[2, 3], {"a": 4}]
    assert v[::-2] == want[::-2]
    assert list(v) == want
    assert list(reversed(v)) == want[::-1]
    assert v.index("s") == 3
    assert v.count(1) == 1
    assert [2, 3] in v
    assert "nope" not in v
    assert v == want
    assert want == v
    assert v != [*want, 1]
    assert v != (1,)  # type: ignore[comparison-overlap]
    assert repr(v) == repr(want)
    assert operator.add(v, [0]) == [*want, 0]
    assert operator.add([0], v) == [0, *want]
    assert v.copy() == want
    assert copy.deepcopy(v) == want
    deep: Any = copy.deepcopy(v)
    assert isinstance(deep, list)
    deep[1].append("only in the copy")
    assert v[1] == [2, 3]
    assert v * 2 == want * 2
    assert 2 * v == want * 2
    assert [*v, 0] == [*want, 0]
    assert v[:] + [0] == [*want, 0]  # noqa: RUF005 - the view's __add__
    assert sorted(v[3:4] + v[6:]) == ["s", "t"]
    assert Tracker([1, 2]).view < [1, 3]
    assert Tracker([[1], [0]]).view[1] < Tracker([[1], [0]]).view[0]
    with pytest.raises(IndexError, match="out of range"):
        v[7]
    with pytest.raises(ValueError, match="not in"):
        v.index("nope")


def test_nested_views_are_cached_and_isolated() -> None:
    """Reading a mutable child twice returns the same view, and mutating it touches no base."""
    base: dict[str, Any] = {"a": {"b": [1, 2]}, "n": 1, "t": (1, "x")}
    tracker = Tracker(base)
    v = tracker.view
    assert v["a"] is v["a"]
    assert v["a"]["b"] is v["a"]["b"]
    assert v["t"] is base["t"]  # an immutable value is handed out as it is
    v["a"]["b"].append(3)
    v["a"]["b"][0] = 0
    assert base == {"a": {"b": [1, 2]}, "n": 1, "t": (1, "x")}
    assert tracker.ops() == [("set", ("a", "b", 0), 0), ("append", ("a", "b"), 3)]


def test_replacing_a_child_by_a_plain_value_records_a_set() -> None:
    """A nested view replaced by a plain value is patched as one set, not as its changes."""
    tracker = Tracker({"a": [1, 2]})
    tracker.view["a"].append(3)
    tracker.view["a"] = [9]
    assert tracker.ops() == [("set", ("a",), [9])]


DICT_MUTATIONS = [
    pytest.param(lambda d: d.__setitem__("a", 9), id="set-existing"),
    pytest.param(lambda d: d.__setitem__("new", [1]), id="set-new"),
    pytest.param(lambda d: d.__delitem__("a"), id="del"),
    pytest.param(lambda d: (d.__delitem__("a"), d.__setitem__("a", 1)), id="del-re-add"),
    pytest.param(lambda d: (d.__setitem__("n", 1), d.__delitem__("n")), id="add-del"),
    pytest.param(lambda d: d.pop("l"), id="pop"),
    pytest.param(lambda d: d.pop("missing", 0), id="pop-default"),
    pytest.param(lambda d: d.popitem(), id="popitem-committed"),
    pytest.param(lambda d: (d.__setitem__("n", 1), d.popitem()), id="popitem-added"),
    pytest.param(lambda d: [d.popitem() for _ in range(len(d))], id="popitem-all"),
    pytest.param(lambda d: d.setdefault("a", 0), id="setdefault-existing"),
    pytest.param(lambda d: d.setdefault("z", []).append(1), id="setdefault-new"),
    pytest.param(lambda d: d.update({"a": 0, "q": 1}, w=2), id="update"),
    pytest.param(lambda d: d.__ior__({"a": 0, "q": 1}), id="ior"),
    pytest.param(lambda d: d.clear(), id="clear"),
    pytest.param(lambda d: (d.clear(), d.__setitem__("a", 1)), id="clear-set"),
    pytest.param(lambda d: d["l"].append({"x": 1}), id="nested"),
    pytest.param(lambda d: d.__setitem__(3, "three"), id="int-key"),
    pytest.param(lambda d: d.__setitem__("$t", "tag"), id="tag-key"),
    pytest.param(lambda d: d.__setitem__((1, 2), "tuple"), id="tuple-key"),
    pytest.param(lambda d: d.__setitem__("b", d["l"]), id="alias-child"),
]


@pytest.mark.parametrize("mutate", DICT_MUTATIONS)
def test_dict_mutation_matches_a_real_dict(mutate: Callable[[Any], Any], codec: Codec) -> None:
    """Each dict mutation on a view does what it does to a dict, key order included."""
    base: dict[Any, Any] = {"a": 1, "l": [1, 2], 7: {"x": 0}, "$t": "t"}
    model = copy.deepcopy(base)
    tracker = Tracker(base, codec=codec)
    got, want = mutate(tracker.view), mutate(model)
    assert materialize(got) == want or got is tracker.view
    assert list(tracker.view) == list(model)
    check(base, tracker, model, codec)


def test_dict_view_reads_like_a_dict() -> None:
    """A dict view supports the read API of dict."""
    base = {"a": 1, "b": [2], 3: "c"}
    v = Tracker(base).view
    v["z"] = 0
    del v["a"]
    want = {"b": [2], 3: "c", "z": 0}
    assert isinstance(v, TrackedDict)
    assert isinstance(v, dict)
    assert json.dumps({str(k): x for k, x in v.items()}) == json.dumps({"b": [2], "3": "c", "z": 0})
    assert v | {"q": 1} == {**want, "q": 1}
    assert {"q": 1} | v == {"q": 1, **want}
    assert dict(v, q=1) == {**want, "q": 1}
    assert len(v) == 3
    assert list(v) == list(want)
    assert list(v.keys()) == list(want.keys())
    assert list(v.values()) == list(want.values())
    assert list(v.items()) == list(want.items())
    assert v.get("a") is None
    assert v.get("b") == [2]
    assert "a" not in v
    assert 3 in v
    assert v == want
    assert want == v
    assert repr(v) == repr(want)
    assert v.copy() == want
    assert copy.deepcopy(v) == want
    with pytest.raises(KeyError):
        v["a"]
    with pytest.raises(KeyError):
        del v["a"]
    v.clear()
    with pytest.raises(KeyError, match="empty"):
        v.popitem()


def test_non_str_keys_are_keyrefs_in_paths(codec: Codec) -> None:
    """Non-str keys and the key "$t" travel as KeyRef, and turn a JSON object tagged."""
    base: dict[Any, Any] = {"a": {"x": 1}}
    tracker = Tracker(base, codec=codec)
    tracker.view["a"][1] = "one"
    tracker.view["a"]["$t"] = "tag"
    ops = check(base, tracker, {"a": {"x": 1, 1: "one", "$t": "tag"}}, codec)
    assert ops == [("set", ("a", KeyRef(1)), "one"), ("set", ("a", KeyRef("$t")), "tag")]
    assert ops_to_json(ops, codec)[0] == ["set", ["a", {"k": 1}], "one"]


def test_paths_through_tagged_dicts_and_objects(codec: Codec) -> None:
    """apply_json steps through tagged dicts by key and tagged objects by field."""
    base = {"d": {(1, 2): [Bag([1], {})]}}
    tracker = Tracker(base, codec=codec)
    bag = tracker.view["d"][(1, 2)][0]
    bag.items.append(2)
    bag.meta[5] = "five"
    bag.n = 1.0
    ops = check(base, tracker, {"d": {(1, 2): [Bag([1, 2], {5: "five"}, 1.0)]}}, codec)
    assert [op[0] for op in ops] == ["append", "set", "set"]
    # then delete the non-str key again
    base = _replay_json(base, ops, codec)
    tracker = Tracker(base, codec=codec)
    del tracker.view["d"][(1, 2)][0].meta[5]
    check(base, tracker, {"d": {(1, 2): [Bag([1, 2], {}, 1.0)]}}, codec)
    del tracker.view["d"][(1, 2)]
    check(base, tracker, {"d": {}}, codec)


@pytest.mark.parametrize(
    ("obj", "list_field", "scalar_field"),
    [
        pytest.param(Bag([1], {"k": [2]}), "items", "n", id="dataclass"),
        pytest.param(Rec("r", ["x"]), "tags", "name", id="attrs"),
        pytest.param(Doc(title="t", tags=["x"], data={"k": [2]}), "tags", "title", id="pydantic"),
    ],
)
def test_mutable_objects_are_shallow_copies_with_field_patches(
    obj: Any, list_field: str, scalar_field: str, codec: Codec
) -> None:
    """A mutable object is copied shallowly: isinstance holds, fields are patched one by one."""
    base = {"o": obj}
    tracker = Tracker(base, codec=codec)
    view = tracker.view["o"]
    assert type(view) is type(obj)
    assert view is not obj
    assert tracker.view["o"] is view
    expected = copy.deepcopy(obj)
    for target in (view, expected):
        getattr(target, list_field).append("new")
        object.__setattr__(target, scalar_field, "changed")
    ops = check(base, tracker, {"o": expected}, codec)
    assert sorted(ops) == sorted(
        [("set", ("o", scalar_field), "changed"), ("append", ("o", list_field), "new")]
    )


def test_pydantic_extras_change_rewrites_the_object(codec: Codec) -> None:
    """A pydantic model's private or extra values are compared whole, and rewrite the object."""

    class Loose(BaseModel, extra="allow"):
        kind: str

    codec.register(Loose)
    obj = Loose.model_validate({"kind": "k", "more": [1]})
    tracker = Tracker(obj, codec=codec)
    tracker.view.__pydantic_extra__["more"].append(2)
    assert obj.__pydantic_extra__ == {"more": [1]}
    ops = tracker.ops()
    assert len(ops) == 1
    assert ops[0][0] == "replace"
    assert ops[0][2].__pydantic_extra__ == {"more": [1, 2]}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(5, id="int"),
        pytest.param("s", id="str"),
        pytest.param(None, id="none"),
        pytest.param((1, ("a", 2.0)), id="tuple"),
        pytest.param(frozenset({1, 2}), id="frozenset"),
        pytest.param(Frozen(1, (2,)), id="frozen-dataclass"),
    ],
)
def test_immutable_values_are_handed_out_as_they_are(value: Any) -> None:
    """An immutable value is its own view, and its patch is always empty."""
    tracker = Tracker(value)
    assert tracker.view is value
    assert tracker.is_view(value)
    assert tracker.ops() == []


@pytest.mark.parametrize(
    ("value", "mutate"),
    [
        pytest.param({1, 2}, lambda s: s.add(3), id="set"),
        pytest.param(bytearray(b"ab"), lambda b: b.extend(b"c"), id="bytearray"),
        pytest.param(([1],), lambda t: t[0].append(2), id="tuple-of-list"),
        pytest.param(Frozen([1]), lambda f: f.a.append(2), id="frozen-with-list"),
    ],
)
def test_copied_values_are_diffed_whole(
    value: Any, mutate: Callable[[Any], Any], codec: Codec
) -> None:
    """Sets, bytearrays and tuples holding lists are copied, and patched whole when changed."""
    base = {"v": value}
    expected = copy.deepcopy(base)
    tracker = Tracker(base, codec=codec)
    assert tracker.ops() == []
    mutate(tracker.view["v"])
    mutate(expected["v"])
    ops = check(base, tracker, expected, codec)
    assert len(ops) == 1


def test_root_view_identity() -> None:
    """is_view recognises only the root view, not an equal value or a nested view."""
    tracker = Tracker({"a": [1]})
    assert tracker.is_view(tracker.view)
    assert not tracker.is_view({"a": [1]})
    assert not tracker.is_view(tracker.view["a"])


def test_many_mutations_leave_the_committed_value_unchanged(codec: Codec) -> None:
    """However a view is mutated, the committed value stays as it was."""
    base = {"l": [[1], {"a": [2]}, Bag([3], {"m": [4]})], "d": {1: {"x": [5]}}, "s": {6}}
    before = codec.encode(base)
    v = Tracker(base, codec=codec).view
    v["l"][0].append(9)
    v["l"][1]["a"].clear()
    v["l"][2].items.append(0)
    v["l"][2].meta["m"].append(0)
    v["l"].insert(0, 0)
    v["l"].sort(key=repr)
    v["d"][1]["x"][0] = 7
    v["d"].popitem()
    v["s"].add(7)
    v.clear()
    assert codec.encode(base) == before


def test_executor_appends_stay_invisible_to_an_older_view() -> None:
    """The executor appends to the committed list in place; an existing view does not see it."""
    committed = [1, 2, 3]
    tracker = Tracker(committed)
    view = tracker.view
    apply(committed, [("append", (), 4)])
    assert committed == [1, 2, 3, 4]
    assert len(view) == 3
    assert list(view) == [1, 2, 3]
    view.append(9)
    assert view == [1, 2, 3, 9]
    assert tracker.ops() == [("append", (), 9)]


def test_appending_to_a_large_list_costs_the_item(codec: Codec) -> None:
    """Appending 100 bytes to 10,000 items of 100 bytes gives a patch under 200 bytes."""
    base = [f"{i:0100d}" for i in range(10_000)]
    tracker = Tracker(base, codec=codec)
    tracker.view.append("x" * 100)
    ops = tracker.ops()
    assert ops == [("append", (), "x" * 100)]
    assert patch_size(ops_to_json(ops, codec)) < 200
    assert len(orjson.dumps(ops_to_json(ops, codec))) < 200


def test_a_thousand_appends_patch_only_the_appended_items(codec: Codec) -> None:
    """Each get/append/ops cycle on a growing list yields one append op, applied in place."""
    committed = [f"{i:0100d}" for i in range(10_000)]
    data = orjson.loads(codec.encode(committed))
    for i in range(1000):
        tracker = Tracker(committed, codec=codec)
        tracker.view.append(f"{i:0100d}")
        ops = tracker.ops()
        assert ops == [("append", (), f"{i:0100d}")]
        assert apply(committed, ops) is committed
        assert apply_json(data, orjson.loads(orjson.dumps(ops_to_json(ops, codec)))) is data
    assert len(committed) == 11_000
    assert data == committed


# -- diff ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(1, 1.0, id="int-float"),
        pytest.param(1, True, id="int-bool"),
        pytest.param(1.0, True, id="float-bool"),
        pytest.param(0.0, -0.0, id="zero-sign"),
        pytest.param([1], [1.0], id="in-list"),
        pytest.param({"a": 1}, {"a": True}, id="in-dict"),
        pytest.param((1,), [1], id="tuple-list"),
    ],
)
def test_diff_counts_encoding_changes(old: Any, new: Any, codec: Codec) -> None:
    """Values that are == but encode differently are a change."""
    ops = diff(old, new, codec)
    assert ops
    assert codec.encode(apply(copy.deepcopy(old), ops)) == codec.encode(new)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param([1, {"a": (2, 3)}], id="nested"),
        pytest.param(Bag([1], {2: 3}), id="dataclass"),
        pytest.param({1, 2}, id="set"),
    ],
)
def test_diff_of_equal_dumps_is_empty(value: Any, codec: Codec) -> None:
    """A new value that encodes like the old one gives an empty patch."""
    assert diff(value, copy.deepcopy(value), codec) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param([1, 2], [1, 2, 3], [("append", (), 3)], id="append"),
        pytest.param([1, 2], [1, 2, 3, 4], [("extend", (), [3, 4])], id="extend"),
        pytest.param([1, 2, 3, 4], [1, 2, 3], [("trunc", (), 3)], id="trunc"),
        pytest.param({"a": 1, "b": 2}, {"a": 1, "b": 3}, [("set", ("b",), 3)], id="dict-set"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, [("del", ("b",))], id="dict-del"),
        pytest.param({"a": 1}, {"a": 1, 2: 2}, [("set", (KeyRef(2),), 2)], id="dict-add"),
        pytest.param({"a": [1] * 20}, {"a": [*[1] * 20, 2]}, [("append", ("a",), 2)], id="nested"),
        pytest.param([1, 2, 3, 4], [0, 1, 2, 3, 4], [("replace", (), [0, 1, 2, 3, 4])], id="shift"),
        pytest.param(
            {"a": 1, "b": 2}, {"b": 2, "a": 1}, [("replace", (), {"b": 2, "a": 1})], id="reorder"
        ),
        pytest.param(
            Bag(["x"] * 9, {}), Bag(["x"] * 10, {}), [("append", ("items",), "x")], id="fields"
        ),
        pytest.param(
            [[1] * 9, 2], [[*[1] * 9, 3], 4], [("append", (0,), 3), ("set", (1,), 4)], id="deep"
        ),
        pytest.param(1, 2, [("replace", (), 2)], id="scalar"),
    ],
)
def test_diff_patches_the_change(old: Any, new: Any, expected: list[Op], codec: Codec) -> None:
    """Lists and dicts are diffed structurally: appends, per-key sets, or one rewrite."""
    before = codec.encode(old)
    ops = diff(old, new, codec)
    assert ops == expected
    assert codec.encode(apply(copy.deepcopy(old), ops)) == codec.encode(new)
    assert codec.encode(_replay_json(old, ops, codec)) == codec.encode(new)
    assert codec.encode(old) == before


def test_diff_materializes_views_and_returns_fresh_values(codec: Codec) -> None:
    """Views inside the new value are materialized, and patch values share nothing with it."""
    old = {"a": [1], "b": [2]}
    view = Tracker(old, codec=codec).view
    view["a"].append(5)
    item = [7]
    new = {"a": view["a"], "b": [2], "c": item}
    ops = diff(old, new, codec)
    assert ops == [("append", ("a",), 5), ("set", ("c",), [7])]
    assert ops[1][2] is not item
    assert old == {"a": [1], "b": [2]}


def test_ops_json_round_trip(codec: Codec) -> None:
    """ops_from_json inverts ops_to_json, KeyRef keys and typed values included."""
    ops: list[Op] = [
        ("set", ("a", KeyRef((1, 2)), 0), (3, 4)),
        ("del", (KeyRef(1),)),
        ("extend", ("l",), [(1,), {2}]),
        ("trunc", ("l",), 1),
        ("replace", (), Bag([], {})),
    ]
    assert ops_from_json(orjson.loads(orjson.dumps(ops_to_json(ops, codec))), codec) == ops


def test_unknown_op_is_refused() -> None:
    """An op kind the appliers do not know raises ValueError, naming it."""
    with pytest.raises(ValueError, match="unknown patch op 'move'"):
        apply([1], [("move", (), 0)])
    with pytest.raises(ValueError, match="unknown patch op 'move'"):
        apply_json([1], [["move", [], 0]])


# -- property test: a view against a real value ---------------------------------------------

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, width=16),
    st.text("ab$t", max_size=2),
    st.tuples(st.integers(0, 2)),
)
_keys = st.one_of(st.text("abc", max_size=2), st.integers(0, 3), st.just("$t"))
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_keys, inner, max_size=4),
        st.builds(Bag, st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=2)),
        st.sets(st.integers(0, 5), max_size=3),
    ),
    max_leaves=12,
)
_roots = st.one_of(
    st.lists(_values, max_size=5), st.dictionaries(_keys, _values, max_size=5), _values
)


def _containers(x: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The paths of the mutable containers in x (a plain value), x itself included."""
    if type(x) in (list, dict, set, Bag):
        yield path
    if type(x) is list:
        for i, v in enumerate(x):
            yield from _containers(v, (*path, i))
    elif type(x) is dict:
        for k, v in x.items():
            yield from _containers(v, (*path, k))
    elif type(x) is Bag:
        yield from _containers(x.items, (*path, ".items"))
        yield from _containers(x.meta, (*path, ".meta"))


def _nav(x: Any, path: tuple[Any, ...]) -> Any:
    for e in path:
        x = getattr(x, e[1:]) if isinstance(e, str) and e.startswith(".") else x[e]
    return x


def _draw_action(data: st.DataObject, node: Any) -> tuple[str, tuple[Any, ...]]:
    """A method name and arguments that apply to node, a plain list, dict, set or Bag."""
    n = len(node) if not isinstance(node, Bag) else 0
    i = st.integers(-n - 1, n)
    values = st.lists(_values, max_size=3)
    if isinstance(node, list):
        # Each action: its argument strategies; "remove" takes an item that is there.
        item = st.integers(0, n - 1).map(lambda j: copy.deepcopy(node[j])) if n else st.just(0)
        actions: dict[str, tuple[st.SearchStrategy[Any], ...]] = {
            "append": (_values,), "extend": (values,), "insert": (i, _values),
            "__setitem__": (i, _values), "__delitem__": (i,), "pop": (), "pop_at": (i,),
            "del_slice": (i, i, st.sampled_from([1, 1, 2, -1])), "set_slice": (i, i, values),
            "remove": (item,), "clear": (), "reverse": (), "sort": (), "alias": (i, i),
            "iadd": (values,),
        }  # fmt: skip
    elif isinstance(node, dict):
        key = st.sampled_from(list(node)) | _keys if node else _keys
        actions = {
            "__setitem__": (key, _values), "__delitem__": (key,), "pop": (key, st.none()),
            "popitem": (), "setdefault": (key, _values), "clear": (), "alias": (key, key),
            "update": (st.dictionaries(_keys, _values, max_size=2),),
        }  # fmt: skip
    elif isinstance(node, set):
        actions = {"add": (st.integers(0, 6),), "discard": (st.integers(0, 6),)}
    else:
        actions = {"setattr": (st.sampled_from(["n", "items"]), _values)}
    name = data.draw(st.sampled_from(sorted(actions)))
    return name, tuple(data.draw(s) for s in actions[name])


def _act(node: Any, name: str, args: tuple[Any, ...]) -> Any:
    """Run one action on node (a view or a real value) the same way."""
    if name == "pop_at":
        return node.pop(*args)
    if name == "del_slice":
        del node[args[0] : args[1] : args[2]]
        return None
    if name == "set_slice":
        node[args[0] : args[1]] = args[2]
        return None
    if name == "sort":
        return node.sort(key=repr)
    if name == "alias":
        node[args[0]] = node[args[1]]
        return None
    if name == "iadd":
        node += args[0]
        return None
    if name == "setattr":
        return setattr(node, *args)
    return getattr(node, name)(*args)


@given(base=_roots, data=st.data())
def test_view_behaves_like_the_value_and_its_patch_replays(base: Any, data: st.DataObject) -> None:
    """Random mutations of a view match a real copy, and each applier replays the patch."""
    codec = Codec()
    before = codec.encode(base)
    model = copy.deepcopy(base)
    tracker = Tracker(base, codec=codec)
    for _ in range(data.draw(st.integers(0, 10), label="steps")):
        paths = list(_containers(model))
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        name, args = _draw_action(data, _nav(model, path))
        outcomes = []
        for target, call_args in ((model, args), (tracker.view, copy.deepcopy(args))):
            try:
                outcomes.append(materialize(_act(_nav(target, path), name, call_args)))
            except (IndexError, KeyError, ValueError) as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1]
        assert materialize(tracker.view) == model
    check(base, tracker, model, codec)
    # diff finds the same change from the plain value (its patch may differ: it sees no moves)
    ops = diff(base, model, codec)
    assert codec.encode(apply(copy.deepcopy(base), ops)) == codec.encode(model)
    assert codec.encode(_replay_json(base, ops, codec)) == codec.encode(model)
    assert codec.encode(base) == before


@given(old=_roots, new=_roots)
def test_diff_replays_to_the_new_value(old: Any, new: Any) -> None:
    """Whatever two values, the diff replays old into new, in Python and on the JSON dump."""
    codec = Codec()
    before = codec.encode(old)
    ops = diff(old, new, codec)
    assert (ops == []) == (codec.encode(new) == before)
    assert codec.encode(_replay_json(old, ops, codec)) == codec.encode(new)
    assert codec.encode(apply(copy.deepcopy(old), ops)) == codec.encode(new)
    assert codec.encode(apply_copied(old, ops)) == codec.encode(new)
    assert codec.encode(old) == before


# -- views are real lists and dicts, and values derived from them cost the change ----------


def test_copies_made_by_c_code_never_reach_the_committed_value(codec: Codec) -> None:
    """``{**d}``, ``dict(d)``, ``[*v]``, ``list(v)`` and ``f(**d)`` copy views, not base."""
    base: dict[str, Any] = {"a": {"x": [1]}, "b": [{"y": 2}], "n": 1}
    before = codec.encode(base)
    v = Tracker(base, codec=codec).view
    for copied in ({**v}, dict(v), (lambda **kw: kw)(**v)):
        copied["a"]["x"].append(0)
    for items in ([*v["b"]], list(v["b"]), v["b"][:], v["b"] * 1, v["b"] + []):
        items[0]["y"] = 0
    assert codec.encode(base) == before


def test_json_dumps_and_isinstance_see_what_the_view_shows() -> None:
    """C code reading a list's or dict's storage sees the view's items."""
    base = {"l": [1, {"a": [2]}], "s": "t"}
    v = Tracker(base).view
    v["l"][1]["a"].append(3)
    v["l"].append(4)
    v["new"] = (5,)
    assert isinstance(v, dict)
    assert isinstance(v["l"], list)
    assert isinstance(v["l"][1], dict)
    assert json.dumps(v) == json.dumps({"l": [1, {"a": [2, 3]}, 4], "s": "t", "new": [5]})
    assert orjson.loads(orjson.dumps(v)) == {"l": [1, {"a": [2, 3]}, 4], "s": "t", "new": [5]}


@pytest.mark.parametrize(
    ("derive", "expected"),
    [
        pytest.param(lambda v: v + ["x"], [("append", (), "x")], id="plus"),  # noqa: RUF005
        pytest.param(lambda v: [*v, "x"], [("append", (), "x")], id="star"),
        pytest.param(lambda v: v[:] + ["x"], [("append", (), "x")], id="slice-plus"),  # noqa: RUF005
        pytest.param(lambda v: [*list(v), "x"], [("append", (), "x")], id="list-copy"),
        pytest.param(lambda v: [*copy.deepcopy(v), "x"], [("append", (), "x")], id="deepcopy"),
        pytest.param(lambda v: [*v.copy(), "x"], [("append", (), "x")], id="copy"),
        pytest.param(lambda v: [y for y in v], [], id="rebuilt"),  # noqa: C416
        pytest.param(lambda v: v[:-1], [("trunc", (), 9_999)], id="shorter"),
    ],
)
def test_a_list_derived_from_the_view_costs_the_change(
    derive: Callable[[Any], Any], expected: list[Op], codec: Codec
) -> None:
    """A new list made from the view of 10,000 items is diffed by identity: its patch is the
    change, whatever the spelling."""
    base = [f"{i:0100d}" for i in range(10_000)]
    tracker = Tracker(base, codec=codec)
    new = derive(tracker.view)
    assert diff(base, new, codec, hint=tracker, whole_size=1_000_000) == expected


def test_values_derived_from_nested_views_cost_the_change(codec: Codec) -> None:
    """Derived dicts, nested lists and model copies are patched at the size of the change."""
    base = {
        "d": {f"k{i}": {"v": i} for i in range(100)},
        "doc": Doc(title="t", tags=[f"{i}" for i in range(100)]),
    }
    tracker = Tracker(base, codec=codec)
    v = tracker.view
    v["d"]["k0"]["v"] = -1
    d = {**v["d"], "new": 1}
    doc = v["doc"].model_copy(update={"tags": [*v["doc"].tags, "x"]})
    new = {"d": d | {"or": 2}, "doc": doc}
    ops = diff(base, new, codec, hint=tracker, whole_size=1_000_000)
    assert ops == [
        ("set", ("d", "k0", "v"), -1),
        ("set", ("d", "new"), 1),
        ("set", ("d", "or"), 2),
        ("append", ("doc", "tags"), "x"),
    ]
    assert codec.encode(apply(copy.deepcopy(base), ops)) == codec.encode(materialize(new))


def test_an_unrelated_list_that_grew_is_patched_from_its_encoding(codec: Codec) -> None:
    """A list rebuilt from scratch (no shared items) that only grew is patched as an extend."""
    base = [{"i": i} for i in range(100)]
    new = [*orjson.loads(orjson.dumps(base)), {"i": 100}]
    assert diff(base, new, codec) == [("append", (), {"i": 100})]
    assert diff(base, orjson.loads(orjson.dumps(base)), codec) == []
