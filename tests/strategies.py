"""Hypothesis strategies, and the classes they build, shared by the test modules.

Codec part: ``codec_values()`` draws nested values of every type the codec must round-trip.
State part: ``state_programs()`` draws the steps of a run, each a list of :class:`StateOp`
(one update of context state, in one of the spellings users write).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import math
import pathlib
import zoneinfo
from decimal import Decimal
from enum import Enum, Flag, IntEnum, StrEnum
from typing import Any

import attrs
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, PrivateAttr

# -- classes the codec must rebuild ---------------------------------------------------------


class Color(Enum):
    RED = 1
    GREEN = "green"
    BLUE = (0, 0, 255)  # a tuple value must come back as a tuple


class Priority(IntEnum):
    LOW = 1
    HIGH = 2


class Mode(StrEnum):
    FAST = "fast"
    SLOW = "slow"


class Perm(Flag):
    R = 1
    W = 2
    X = 4


@dataclasses.dataclass
class Point:
    x: int
    y: float


@dataclasses.dataclass(frozen=True)
class Pair:
    a: Any
    b: Any


@dataclasses.dataclass
class Box:
    item: Any
    items: list[Any] = dataclasses.field(default_factory=list)
    origin: Point | None = None


@dataclasses.dataclass
class Counted:
    name: str
    count: int = dataclasses.field(default=0, init=False)


@attrs.define
class Item:
    name: str
    payload: Any


@attrs.frozen
class Tag:
    label: str
    value: Any


@attrs.define
class Secret:
    _token: str  # init argument "token": the codec must use the attrs alias
    seen: int = attrs.field(default=0, init=False)


class User(BaseModel):
    name: str
    age: int
    tags: list[str] = []


class Holder(BaseModel):
    value: Any


class FrozenHolder(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: Any


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str


class Team(BaseModel):
    lead: User
    members: list[User]
    meta: dict[str, Any] = {}


class Cached(BaseModel):
    name: str
    _hits: int = PrivateAttr(default=0)


class Plain:
    """An ordinary class: neither encodable without pickle nor rebuildable from the log."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return type(other) is Plain and other.n == self.n

    def __hash__(self) -> int:
        return hash(self.n)


# -- strategies -----------------------------------------------------------------------------


def _zones() -> list[dt.tzinfo]:
    """Fixed zones, plus a few named ones where the system has zone files."""
    zones: list[dt.tzinfo] = [dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")]
    with contextlib.suppress(zoneinfo.ZoneInfoNotFoundError):
        zones += [zoneinfo.ZoneInfo(k) for k in ("Europe/Paris", "America/New_York", "UTC")]
    return zones


_offsets = st.timedeltas(
    min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59)
).map(dt.timezone)
timezones = st.none() | st.sampled_from(_zones()) | _offsets
big_ints = st.integers(min_value=2**63 - 3, max_value=2**64 + 3).flatmap(
    lambda n: st.sampled_from([n, -n, n**3])
)
# pathlib misreads some UNC paths from their own text; the codec refuses those.
paths = (
    st.sampled_from([pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.Path])
    .flatmap(lambda cls: st.text(alphabet="ab./\\: ", max_size=8).map(cls))
    .filter(lambda p: type(p)(str(p)) == p)
)
enums = st.sampled_from([*Color, *Priority, *Mode, *Perm, Perm.R | Perm.W])


def _hashable_scalars() -> st.SearchStrategy[Any]:
    """Scalars usable as set items and dict keys: no NaN (it never equals its copy)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        big_ints,
        st.floats(allow_nan=False),
        st.text(max_size=10),
        st.binary(max_size=10),
        st.datetimes(timezones=timezones),
        st.dates(),
        st.times(timezones=timezones),
        st.timedeltas(),
        st.decimals(allow_nan=False),
        st.uuids(),
        paths,
        enums,
    )


hashables: st.SearchStrategy[Any] = st.recursive(
    _hashable_scalars(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
        st.builds(Pair, inner, inner),
        st.builds(Tag, st.text(max_size=5), inner),
        st.builds(FrozenHolder, value=inner),
    ),
    max_leaves=4,
)

scalars: st.SearchStrategy[Any] = st.one_of(
    _hashable_scalars(),
    st.floats(),  # NaN, inf and -0.0 included
    st.decimals(allow_nan=True).filter(lambda d: not d.is_snan()),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, Decimal("NaN"), Decimal("-Infinity")]),
    st.binary(max_size=10).map(bytearray),
)

_keys = st.sampled_from(["$t", "v", "c", "k"]) | st.text(max_size=5)
_extra_keys = st.sampled_from(["$t", "v", "c", "extra", "x y"])


def codec_values() -> st.SearchStrategy[Any]:
    """Nested values of every type the codec round-trips, in every kind of container."""

    def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.sets(hashables, max_size=4),
            st.frozensets(hashables, max_size=4),
            st.dictionaries(_keys, children, max_size=4),
            st.dictionaries(hashables, children, max_size=4),
            st.builds(Point, st.integers(), st.floats()),
            st.builds(Pair, children, children),
            st.builds(
                Box, children, st.lists(children, max_size=3), st.none() | st.just(Point(1, 2))
            ),
            st.builds(Item, st.text(max_size=5), children),
            st.builds(Tag, st.text(max_size=5), children),
            st.builds(Holder, value=children),
            st.builds(User, name=st.text(max_size=5), age=st.integers(), tags=st.lists(st.text())),
            st.builds(
                lambda kind, extra: Loose(kind=kind, **extra),
                st.text(max_size=5),
                st.dictionaries(_extra_keys, children, max_size=3),
            ),
            st.builds(
                Team,
                lead=st.builds(User, name=st.text(max_size=5), age=st.integers()),
                members=st.lists(st.builds(User, name=st.just("m"), age=st.integers()), max_size=2),
                meta=st.dictionaries(st.text(max_size=3), children, max_size=2),
            ),
        )

    return st.recursive(scalars, containers, max_leaves=12)


# -- state spellings (tests/test_state_spellings.py) ---------------------------------------

# Values that == confuses: 1 == 1.0 == True, 0 == 0.0 == -0.0 == False; the fold must keep
# each one's type.
confusables = st.sampled_from([1, 1.0, True, 0, 0.0, -0.0, False, "1", (1,), [1], {1}, None])


@functools.cache
def exact_values() -> st.SearchStrategy[Any]:
    """Values for context state: the confusable ones often, small nested values of every
    kind of container otherwise (lighter than ``codec_values()``: a run draws dozens)."""

    def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.sets(confusables.filter(lambda v: v.__hash__ is not None), max_size=3),
            st.frozensets(hashables, max_size=2),
            st.dictionaries(_keys, children, max_size=3),
            st.dictionaries(hashables, children, max_size=2),
            st.builds(Point, st.integers(), st.floats()),
            st.builds(Pair, children, children),
            st.builds(Item, st.text(max_size=3), children),
            st.builds(Holder, value=children),
            st.builds(User, name=st.text(max_size=3), age=st.integers(), tags=st.lists(st.text())),
            st.builds(
                lambda kind, extra: Loose(kind=kind, **extra),
                st.text(max_size=3),
                st.dictionaries(_extra_keys, children, max_size=2),
            ),
        )

    return st.recursive(confusables | scalars, containers, max_leaves=5)


class Inner(BaseModel):
    """A model nested in the typed state, reached by dotted paths (``inner.count``)."""

    tags: list[str] = []
    count: Any = 0


class SpelledState(BaseModel):
    """The typed state of ``Context[SpelledState]``: a list, a dict, a value, a model."""

    items: list[Any] = []
    d: dict[str, Any] = {}
    n: Any = 0
    inner: Inner = Inner()


@dataclasses.dataclass(frozen=True)
class StateOp:
    """One update of context state: the spelling's name and its arguments."""

    name: str
    args: tuple[Any, ...] = ()


_index = st.integers(0, 7)
_str_keys = st.sampled_from(["a", "b", "k", "$t", "v", "c"]) | st.text(max_size=4)
_LIST_ACTIONS = ("setitem", "insert", "pop", "extend", "del_slice", "sort", "reverse", "clear")
_COPIES = ("inplace", "list_copy", "deepcopy")


@functools.cache
def _arguments(typed: bool) -> dict[str, st.SearchStrategy[tuple[Any, ...]]]:
    """Each spelling of the (typed or untyped) flow -> the strategy of its arguments.

    Indexes are taken modulo the length when the spelling runs.
    """
    x = exact_values()
    one = st.tuples(x)
    keyed = st.tuples(_str_keys, x)
    args: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
        **dict.fromkeys(
            (
                "append",
                "plus",
                "star",
                "slice_plus",
                "list_copy_append",
                "deepcopy_append",
                "list_radd",
                "list_mul",
                "list_comp",
            ),
            one,
        ),
        "list_action": st.tuples(
            st.sampled_from(_COPIES),
            st.sampled_from(_LIST_ACTIONS),
            _index,
            st.lists(x, max_size=2),
        ),
        "set_index": st.tuples(_index, x),
        **dict.fromkeys(
            ("d_setitem", "d_unpack", "d_call", "d_update", "d_or", "d_copy_set"), keyed
        ),
        **dict.fromkeys(("d_del", "d_drop_copy"), st.tuples(_index)),
    }
    if typed:
        args |= dict.fromkeys(
            (
                "t_edit_append",
                "t_getset_append",
                "t_edit_n",
                "t_getset_n",
                "t_copy_update",
                "t_copy_items",
            ),
            one,
        )
        args["t_edit_d"] = keyed
        args["t_inner_count"] = st.tuples(confusables)
        args["t_inner_tag"] = st.tuples(st.text(max_size=3))
    else:
        args |= dict.fromkeys(("m_setitem", "m_unpack"), st.tuples(hashables, x))
        args["m_del"] = st.tuples(_index)
        args |= dict.fromkeys(
            ("nest_append", "nest_plus", "nest_set", "v_set", "state_append"), one
        )
        args["new_path"] = st.tuples(st.sampled_from("xy"), x)
        args["edit_state_d"] = one
        args["nest_new"] = st.tuples(st.sampled_from("xyz"), x)
        args["v_get_set"] = st.just(())
    return args


@functools.cache
def _init(typed: bool) -> st.SearchStrategy[StateOp]:
    """The first update of a run: every key (or field) gets a first value."""
    x = exact_values()
    items = st.lists(x, max_size=3)
    d = st.dictionaries(_str_keys, x, max_size=3)
    if typed:
        inner = st.builds(Inner, tags=st.lists(st.text(max_size=3), max_size=2), count=confusables)
        state = st.builds(SpelledState, items=items, d=d, n=x, inner=inner)
        return st.builds(StateOp, st.just("t_init"), st.tuples(state))
    m = st.dictionaries(hashables, x, max_size=3)
    nest = st.fixed_dictionaries({"a": items, "b": x})
    return st.builds(StateOp, st.just("init"), st.tuples(items, d, m, nest, x))


@st.composite
def state_programs(draw: st.DrawFn, typed: bool) -> list[list[StateOp]]:
    """The steps of a run: most spellings, some twice, shuffled and cut in 1-5 steps.

    Each spelling is in with chance 3/4 (so every program exercises most of them, where
    a small random one would miss many; and the shrinker can still take them out), in
    random order with random arguments. The first step starts with the init op, which
    gives every key its first value.
    """
    args = _arguments(typed)
    names = [n for n in args if draw(st.integers(0, 3), label=f"has {n}")]
    names += draw(st.lists(st.sampled_from(sorted(args)), max_size=4), label="extra")
    ops = [StateOp(name, draw(args[name], label=name)) for name in names]
    ops = draw(st.permutations(ops), label="order")
    cuts = sorted(draw(st.lists(st.integers(0, len(ops)), max_size=4), label="cuts"))
    bounds = [0, *cuts, len(ops)]
    steps = [ops[a:b] for a, b in itertools.pairwise(bounds)]
    return [[draw(_init(typed), label="init"), *steps[0]], *steps[1:]]
