"""The state path's shortcuts give what the general path gives (issue 17).

``fresh`` copies a pydantic model without ``copy.copy`` (when its class copies as
``BaseModel`` does), a scalar's new value is written whole without a diff, and a snapshot
weighs a context value without encoding it each time: each is checked here against what
the general path makes.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr, RootModel

from eventstore import default_codec
from workflow._changes import value_change
from workflow._keylog import KeyLog
from workflow._values import fresh, rebuild


class Inner(BaseModel):
    tags: list[str] = []


class Msg(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str = ""
    extras: dict[str, Any] = {}
    inner: Inner = Inner()
    _secret: dict[str, Any] = PrivateAttr(default_factory=dict)


class Copying(BaseModel):
    """A model with a copy of its own: fresh goes through it."""

    n: int = 0
    copies: ClassVar[int] = 0

    def __copy__(self) -> Copying:
        type(self).copies += 1
        return Copying(n=self.n)


def _general(x: Any) -> Any:
    return rebuild(x, {f: fresh(getattr(x, f)) for f in x.__dict__}, deep=True)


def _state(m: BaseModel) -> Any:
    return (
        type(m),
        m.__dict__,
        m.__pydantic_fields_set__,
        m.__pydantic_extra__,
        m.__pydantic_private__,
    )


def test_a_fresh_model_is_what_the_general_copy_makes_and_shares_nothing() -> None:
    m = Msg.model_validate(
        {
            "role": "user",
            "extras": {"a": [1, 2.0, True]},
            "inner": {"tags": ["x"]},
            "loose": [{"k": 1}],
        }
    )
    m._secret["s"] = [1]
    new = fresh(m)
    assert _state(new) == _state(_general(m))
    assert new.model_fields_set == m.model_fields_set
    new.extras["a"].append(3)
    new.inner.tags.append("y")
    assert new.__pydantic_extra__ is not None
    new.__pydantic_extra__["loose"][0]["k"] = 2
    new._secret["s"].append(2)
    assert m.extras == {"a": [1, 2.0, True]}
    assert m.inner.tags == ["x"]
    assert m.__pydantic_extra__ == {"loose": [{"k": 1}]}
    assert m._secret == {"s": [1]}


def test_a_model_with_its_own_copy_is_copied_through_it() -> None:
    assert fresh(Copying(n=3)) == Copying(n=3)
    assert Copying.copies == 1
    root = RootModel[list[int]]([1, 2])
    assert fresh(root).root == [1, 2]
    assert fresh(root).root is not root.root


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        (1, 1, False),
        (1, 1.0, True),
        (1, True, True),
        (0.0, -0.0, True),
        (float("nan"), float("nan"), False),
        ("a", "a" * 1, False),
        ("a", "b", True),
        (None, 0, True),
        (b"x", b"x", False),
    ],
)
def test_a_scalar_is_written_whole_when_its_text_changes(old: Any, new: Any, changed: bool) -> None:
    change, version = value_change(default_codec, {"k": old}, {"k": 7}, "k", new, None)
    assert version == 7
    if not changed:
        assert change is None
        return
    assert change is not None
    assert change.ops is None
    assert change.text == default_codec.encode(new)
    assert default_codec.encode(change.full) == change.text


def test_a_scalar_replacing_a_container_is_diffed_as_before() -> None:
    change, _ = value_change(default_codec, {"k": [1, 2]}, {"k": 1}, "k", 3, None)
    assert change is not None
    assert change.full == 3
    change, _ = value_change(default_codec, {"k": 3}, {"k": 1}, "k", [3], None)
    assert change is not None
    assert change.full == [3]


def test_a_value_is_weighed_from_its_full_write_then_measured_once_per_its_size() -> None:
    value = ["x" * 100] * 100
    size = len(orjson.dumps(value))
    entry = KeyLog(value, size + 20, 0, 1, 1)
    assert entry.json_size() == size + 20  # its record's payload: no encode
    entry.dump = value[:1]  # a value set directly is measured
    assert entry.json_size() == len(orjson.dumps(value[:1]))
    grown = KeyLog(value, size, 0, 1, 1)
    for i in range(3):
        grown.patched([["append", [], "y"]], i + 2, 20)
    assert grown.json_size() == size  # less log than the value since: still the estimate
    grown.patch_bytes += size  # as much log again as the value weighed: measured anew
    assert grown.json_size() == len(orjson.dumps(grown.dump))
    assert copy.deepcopy(grown).json_size() == grown.json_size()
