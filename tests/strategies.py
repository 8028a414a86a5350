"""Hypothesis strategies, and the classes they build, shared by the test modules.

Codec part: ``codec_values()`` draws nested values of every type the codec must round-trip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
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
