"""What the codec refuses because JSON text cannot hold it: lone surrogates, nesting past
``Codec.MAX_DEPTH``, values that contain themselves. Each refusal names the path and type."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

import orjson
import pytest

from eventstore import Codec, EncodeError

MAX = Codec.MAX_DEPTH


@dataclasses.dataclass(eq=False)
class Node:
    """Hashable by identity, so it fits in a set that it points back to."""

    ref: Any = None


def nest(n: int, wrap: Any) -> Any:
    """``n`` containers, each made by ``wrap`` around the next, around an empty list."""
    v: Any = []
    for _ in range(n - 1):
        v = wrap(v)
    return v


@pytest.mark.parametrize(
    ("value", "path", "type_"),
    [
        pytest.param("a\ud800", "value", str, id="str"),
        pytest.param(["ok", {"k": "\udfff"}], "value[1]['k']", str, id="nested"),
        pytest.param({"ok": 1, "\ud800": 2}, "value<key #1>", str, id="key"),
        pytest.param({(1, "\ud800"): 2}, "value<key #0>[1]", str, id="tuple-key"),
        pytest.param(("x", {"\udc00"}), "value[1]{#0}", str, id="in-a-set"),
        pytest.param(Node(ref=["\ud800"]), "value.ref[0]", str, id="dataclass-field"),
        pytest.param(
            dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1), "\ud800")),
            "value",
            str,
            id="time-zone-name",
        ),
    ],
)
def test_lone_surrogate_is_refused_by_path(value: Any, path: str, type_: type) -> None:
    """A string JSON text cannot hold is refused by encode(), naming where it is."""
    with pytest.raises(EncodeError, match=r"lone surrogate at index \d+ .*not valid UTF-8") as info:
        Codec().encode(value)
    assert (info.value.path, info.value.type) == (path, type_)


def test_dump_leaves_strings_to_the_writer() -> None:
    """dump() does not scan strings (orjson does, as it writes); encode() is the check."""
    assert Codec().dump(["\ud800"]) == ["\ud800"]


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda v: [v], id="list"),
        pytest.param(lambda v: {"k": v}, id="dict"),
        pytest.param(lambda v: {1: v}, id="dict-int-keys"),
        pytest.param(lambda v: (v,), id="tuple"),
        pytest.param(lambda v: Node(ref=v), id="dataclass"),
        pytest.param(lambda v: {frozenset({1}): v, "$t": 0}, id="tagged-dict"),
    ],
)
def test_the_deepest_value_fits_in_any_record(wrap: Any) -> None:
    """A value exactly MAX_DEPTH deep encodes, round-trips, and still fits orjson's nesting
    limit inside the deepest wrapping a record or snapshot gives it; one more level is
    refused at the first container past the limit."""
    codec = Codec()
    deepest = nest(MAX, wrap)
    text = codec.encode(deepest)
    assert codec.encode(codec.decode(text)) == text
    # A snapshot holds a collect buffer's events six levels down; a patch four.
    orjson.dumps({"b": {"t": [[0, [[orjson.loads(text)]]]]}})
    with pytest.raises(EncodeError, match=f"nested more than {MAX} levels deep"):
        codec.encode(wrap(deepest))


def test_depth_counts_from_where_the_value_sits() -> None:
    """encode(depth=d) counts a value's containers from level d, as a patch's values do."""
    codec = Codec()
    codec.encode(nest(MAX - 4, lambda v: [v]), depth=5)
    with pytest.raises(EncodeError, match="nested more than") as info:
        codec.encode(nest(MAX - 3, lambda v: [v]), depth=5, name="k['a']")
    assert info.value.path == "k['a']" + "[0]" * (MAX - 4)


def test_ten_thousand_levels_are_refused_without_recursion_error() -> None:
    """Nesting far past the limit stops at the limit: an EncodeError, not a RecursionError."""
    with pytest.raises(EncodeError, match="nested more than"):
        Codec().encode(nest(10_000, lambda v: [v]))


def _cycles() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    d: dict[str, Any] = {}
    d["me"] = {"again": d}
    t: tuple[list[Any]] = ([],)
    t[0].append(t)
    s: set[Any] = set()
    s.add(Node(ref=s))
    n = Node()
    n.ref = [n]
    return [
        pytest.param(a, "value[0]", list, "value", id="list"),
        pytest.param(d, "value['me']['again']", dict, "value", id="dict"),
        pytest.param(t, "value[0][0]", tuple, "value", id="tuple"),
        pytest.param(s, "value{#0}.ref", set, "value", id="set"),
        pytest.param(n, "value.ref[0]", Node, "value", id="dataclass"),
        pytest.param(["x", a], "value[1][0]", list, "value[1]", id="inside"),
    ]


@pytest.mark.parametrize(("value", "path", "type_", "first"), _cycles())
def test_cycle_is_named_where_it_closes(value: Any, path: str, type_: type, first: str) -> None:
    """A value that contains itself is refused at the first place it meets itself again."""
    with pytest.raises(EncodeError, match=rf"contains itself: this is {re.escape(first)} again"):
        Codec().encode(value)
    with pytest.raises(EncodeError) as info:
        Codec().dump(value)
    assert (info.value.path, info.value.type) == (path, type_)


class View:
    """A read-only stand-in for a list."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def test_a_proxy_is_written_as_the_value_it_stands_for() -> None:
    """register_proxy: instances are encoded as what they unwrap to, checks included."""
    codec = Codec()
    codec.register_proxy(View, lambda v: list(v.items))
    assert codec.decode(codec.encode({"v": View([1, View([2])])})) == {"v": [1, [2]]}
    with pytest.raises(EncodeError, match="lone surrogate") as info:
        codec.encode([View(["ok", "\ud800"])])
    assert info.value.path == "value[0][1]"
    loop = View([])
    loop.items.append(loop)
    with pytest.raises(EncodeError, match="contains itself") as info:
        codec.encode(loop)
    assert info.value.path == "value[0]"
