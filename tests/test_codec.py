"""The value codec: exact typed round trips, readable JSON, and a strict class allowlist."""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import importlib
import logging
import math
import os
import pathlib
import socket
import subprocess
import sys
import uuid
import zoneinfo
from collections.abc import Iterator
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any

import attrs
import orjson
import pytest
from hypothesis import given
from pydantic import BaseModel

from eventstore import (
    Codec,
    DecodeError,
    EncodeError,
    UnknownClassError,
    class_name,
    default_codec,
)
from tests.strategies import (
    Box,
    Cached,
    Color,
    Counted,
    FrozenHolder,
    Holder,
    Item,
    Loose,
    Mode,
    Pair,
    Perm,
    Plain,
    Point,
    Priority,
    Secret,
    Tag,
    Team,
    User,
    codec_values,
)

# Imported so that "os:system" and "subprocess:Popen" name objects that really exist here.
assert os
assert subprocess


def same(a: Any, b: Any) -> bool:
    """Deep equality that also requires equal types at every level and treats NaN as itself."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Enum):
        return a is b
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, Decimal):
        return str(a) == str(b)  # also tells 1.0 from 1.00, NaN from -NaN
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set | frozenset):
        found = {y: y for y in b}  # maps each item of a to its equal in b
        return len(a) == len(b) and all(x in found and same(x, found[x]) for x in a)
    if isinstance(a, dict):
        keys = {k: k for k in b}
        return len(a) == len(b) and all(
            k in keys and same(k, keys[k]) and same(v, b[keys[k]]) for k, v in a.items()
        )
    if isinstance(a, pathlib.PurePath):
        return str(a) == str(b)  # == ignores case on Windows paths
    if isinstance(a, dt.datetime | dt.time):
        return (a.isoformat(), a.fold, type(a.tzinfo), a.tzinfo, a.tzname()) == (
            b.isoformat(),
            b.fold,
            type(b.tzinfo),
            b.tzinfo,
            b.tzname(),
        )
    if isinstance(a, BaseModel):
        return (
            same(a.__dict__, b.__dict__)
            and same(a.__pydantic_extra__ or {}, b.__pydantic_extra__ or {})
            and same(a.__pydantic_private__ or {}, b.__pydantic_private__ or {})
        )
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if attrs.has(type(a)):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a)))
    return bool(a == b)


def roundtrip(value: Any, codec: Codec | None = None) -> Any:
    codec = codec or Codec()
    return codec.decode(codec.encode(value))


# -- property tests -------------------------------------------------------------------------


@given(codec_values())
def test_roundtrip_keeps_value_and_types(value: Any) -> None:
    """Any supported value decodes to an equal value of the same type at every level."""
    assert same(roundtrip(value), value)


@given(codec_values())
def test_roundtrip_in_a_fresh_process_like_codec(value: Any) -> None:
    """A codec that never saw the classes rebuilds them from their imported modules."""
    assert same(Codec().decode(Codec().encode(value)), value)


@given(codec_values())
def test_dump_is_json_native_and_load_inverts_it(value: Any) -> None:
    """dump() gives what orjson serializes as it is, and load() turns it back."""
    codec = Codec()
    data = codec.dump(value)
    assert orjson.loads(orjson.dumps(data)) == data  # NaN is tagged, so equality holds
    assert same(codec.load(data), value)


# -- unit tests: each type ------------------------------------------------------------------

_paris = zoneinfo.ZoneInfo("Europe/Paris")
EXAMPLES = [
    pytest.param(None, id="none"),
    pytest.param(True, id="true"),
    pytest.param(0, id="int"),
    pytest.param(2**63 - 1, id="int64-max"),
    pytest.param(-(2**63), id="int64-min"),
    pytest.param(2**63, id="int64-max-plus-1"),
    pytest.param(-(2**63) - 1, id="int64-min-minus-1"),
    pytest.param(10**5000, id="int-beyond-str-limit"),
    pytest.param(1.5, id="float"),
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="minus-inf"),
    pytest.param(-0.0, id="minus-zero"),
    pytest.param(5e-324, id="float-subnormal"),
    pytest.param("héllo \x00 \U0001f600", id="str"),
    pytest.param(b"\x00\xff", id="bytes"),
    pytest.param(bytearray(b"ab"), id="bytearray"),
    pytest.param([1, [2, [3]]], id="list"),
    pytest.param((1, (2,), ()), id="tuple"),
    pytest.param({1, "a", (2, 3)}, id="set"),
    pytest.param(frozenset({frozenset({1})}), id="frozenset"),
    pytest.param({"a": {"b": (1,)}}, id="dict"),
    pytest.param(dt.datetime(2024, 1, 2, 3, 4, 5, 6), id="datetime-naive"),
    pytest.param(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), id="datetime-utc"),
    pytest.param(
        dt.datetime(2024, 1, 1, 1, 2, 3, 999999, tzinfo=dt.timezone(dt.timedelta(hours=-3.5))),
        id="datetime-offset",
    ),
    pytest.param(dt.datetime(2024, 7, 1, 12, tzinfo=_paris), id="datetime-zoneinfo"),
    pytest.param(dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=_paris), id="datetime-fold"),
    pytest.param(dt.date(1, 1, 1), id="date"),
    pytest.param(
        dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(microseconds=1), "odd")),
        id="datetime-named-microsecond-offset",
    ),
    pytest.param(dt.time(23, 59, 59, 1), id="time"),
    pytest.param(dt.time(1, tzinfo=dt.timezone(dt.timedelta(hours=2))), id="time-aware"),
    pytest.param(dt.timedelta(days=-1, microseconds=3), id="timedelta"),
    pytest.param(Decimal("1.10"), id="decimal"),
    pytest.param(Decimal("-NaN"), id="decimal-nan"),
    pytest.param(Decimal("Infinity"), id="decimal-inf"),
    pytest.param(uuid.UUID(int=12345), id="uuid"),
    pytest.param(pathlib.Path("/tmp/x"), id="path"),
    pytest.param(pathlib.PurePosixPath("a/b"), id="pure-posix-path"),
    pytest.param(pathlib.PureWindowsPath(r"C:\x\y"), id="pure-windows-path"),
    pytest.param(Color.BLUE, id="enum"),
    pytest.param(Priority.HIGH, id="int-enum"),
    pytest.param(Mode.FAST, id="str-enum"),
    pytest.param(Perm.R | Perm.X, id="flag-combination"),
    pytest.param(Point(1, 2.0), id="dataclass"),
    pytest.param(Pair((1, 2), {3}), id="frozen-dataclass"),
    pytest.param(Box(Box(Pair(1, b"x")), [Point(0, -0.0)], Point(3, 4)), id="nested-dataclass"),
    pytest.param(Item("i", (1, {2})), id="attrs"),
    pytest.param(Tag("t", frozenset()), id="attrs-frozen"),
    pytest.param(Secret("s"), id="attrs-private-attribute"),
    pytest.param(User(name="u", age=3, tags=["a"]), id="model"),
    pytest.param(Holder(value=(1, {2}, b"3", dt.date(2024, 1, 1))), id="model-any-field"),
    pytest.param(FrozenHolder(value=Color.RED), id="model-frozen"),
    pytest.param(Loose(kind="k", **{"extra": (1,), "$t": {2}}), id="model-extra-fields"),
    pytest.param(Team(lead=User(name="l", age=1), members=[User(name="m", age=2)]), id="models"),
    pytest.param({Color.RED: Priority.LOW, Priority.LOW: 1, 1: True}, id="enum-keys"),
]


@pytest.mark.parametrize("value", EXAMPLES)
def test_each_type_roundtrips(value: Any) -> None:
    """Each supported type decodes to an equal value of the same type."""
    assert same(roundtrip(value), value)


def test_dataclass_init_false_field_roundtrips() -> None:
    """A dataclass field outside __init__ is restored after __init__ runs."""
    value = Counted("c")
    value.count = 7
    assert roundtrip(value).count == 7


def test_attrs_init_false_field_roundtrips() -> None:
    """An attrs field outside __init__ is restored, and a private field goes by its alias."""
    value = Secret("tok")
    value.seen = 3
    assert same(roundtrip(value), value)


def test_model_private_attribute_roundtrips() -> None:
    """A pydantic private attribute keeps its value."""
    value = Cached(name="c")
    value._hits = 5
    assert roundtrip(value)._hits == 5


def test_json_native_values_are_written_as_themselves() -> None:
    """str, bool, None, 64-bit ints, finite floats, lists and str-keyed dicts need no tag."""
    value = {"a": 1, "b": [True, None, "x", 1.5, -(2**63)], "c": {"d": []}}
    assert Codec().encode(value) == orjson.dumps(value).decode()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param((1, 2), '{"$t":"tuple","v":[1,2]}', id="tuple"),
        pytest.param({"b", "a"}, '{"$t":"set","v":["a","b"]}', id="set-sorted"),
        pytest.param(2**64, '{"$t":"int","v":"18446744073709551616"}', id="big-int"),
        pytest.param(math.nan, '{"$t":"float","v":"nan"}', id="nan"),
        pytest.param({1: 2}, '{"$t":"dict","v":[[1,2]]}', id="int-key"),
        pytest.param(
            Priority.LOW, '{"$t":"enum","c":"tests.strategies:Priority","v":1}', id="enum"
        ),
        pytest.param(
            dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            '{"$t":"datetime","v":"2024-01-01T00:00:00+00:00"}',
            id="datetime",
        ),
        pytest.param(
            Point(1, 2.5),
            '{"$t":"dataclass","c":"tests.strategies:Point","v":{"x":1,"y":2.5}}',
            id="dataclass",
        ),
    ],
)
def test_tagged_forms_are_readable(value: Any, text: str) -> None:
    """Values that are not JSON-native get a small readable tag."""
    assert Codec().encode(value) == text


def test_dict_with_tag_key_roundtrips() -> None:
    """A plain dict holding the "$t" key is escaped, not mistaken for a tagged value."""
    value = {"$t": "tuple", "v": [1, 2]}
    text = Codec().encode(value)
    assert text.startswith('{"$t":"dict"')
    assert same(Codec().decode(text), value)


def test_non_str_keys_roundtrip() -> None:
    """Dict keys of any supported hashable type keep their type."""
    value = {1: "a", (1, "b"): 2, frozenset({3}): None, None: 4, 2.5: 5, Color.RED: 6, "s": 7}
    assert same(roundtrip(value), value)


def test_bool_and_int_never_swap() -> None:
    """True stays bool and 1 stays int, also as keys and inside sets."""
    value = [True, 1, False, 0, {True: 1}, {1: True}, {False}, {0}, Priority.LOW]
    assert same(roundtrip(value), value)


# -- encode errors --------------------------------------------------------------------------


def test_encode_error_names_the_path_inside_the_value() -> None:
    """The error names the path of the unsupported part, subscripts included."""
    with socket.socket() as sock, pytest.raises(EncodeError) as info:
        Codec().encode({"a": [1, 2, sock]})
    assert info.value.path == "value['a'][2]"
    assert info.value.type is socket.socket
    assert "cannot encode value['a'][2]: <class 'socket.socket'>" in str(info.value)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        pytest.param(Box(item={"k": len}), "value.item['k']", id="dataclass-field"),
        pytest.param(Item("n", (0, Plain(1))), "value.payload[1]", id="attrs-field"),
        pytest.param(Holder(value=[Plain(1)]), "value.value[0]", id="model-field"),
        pytest.param({(1, 2): {Plain(1)}}, "value[(1, 2)]{#0}", id="set-item"),
        pytest.param({Plain(1): 1}, "value<key #0>", id="dict-key"),
    ],
)
def test_encode_error_names_attribute_paths(value: Any, path: str) -> None:
    """Dataclass, attrs and model fields appear as attributes in the error path."""
    with pytest.raises(EncodeError) as info:
        Codec().encode(value)
    assert info.value.path == path


def _gen() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: 0, id="lambda"),
        pytest.param(Plain(1), id="plain-object"),
        pytest.param(_gen(), id="generator"),
        pytest.param(object, id="class"),
        pytest.param(type("S", (str,), {})("x"), id="str-subclass"),
    ],
)
def test_unsupported_types_are_refused(value: Any) -> None:
    """Values of unsupported types raise EncodeError naming the type."""
    with pytest.raises(EncodeError, match=r"cannot encode value: <class"):
        Codec().encode(value)


# -- class resolution -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["os:system", "builtins:eval", "subprocess:Popen"])
@pytest.mark.parametrize("kind", ["dataclass", "attrs", "model", "enum"])
def test_dangerous_names_are_refused(name: str, kind: str) -> None:
    """A log naming a function or a non-data class is refused, and nothing is called."""
    payload = orjson.dumps({"$t": kind, "c": name, "v": {"args": ["true"]}})
    with pytest.raises(UnknownClassError, match=name):
        Codec().decode(payload)


def test_class_of_a_module_not_imported_is_refused() -> None:
    """A class whose module is not imported is refused, and the module stays unimported."""
    name = "json.tool:Thing" if "json.tool" not in sys.modules else "no_such_module_x:Thing"
    module = name.partition(":")[0]
    with pytest.raises(UnknownClassError, match="not imported"):
        Codec().decode(f'{{"$t":"dataclass","c":"{name}","v":{{}}}}')
    assert module not in sys.modules


def test_plain_imported_class_is_refused() -> None:
    """An imported class that is not a dataclass, attrs class, model or Enum is refused."""
    payload = '{"$t":"dataclass","c":"tests.strategies:Plain","v":{"n":1}}'
    with pytest.raises(UnknownClassError, match="only dataclasses"):
        Codec().decode(payload)


def test_tag_must_match_the_kind_of_class() -> None:
    """A dataclass named under another tag is a DecodeError."""
    with pytest.raises(DecodeError, match="tagged 'model'"):
        Codec().decode('{"$t":"model","c":"tests.strategies:Point","v":{"x":1,"y":2}}')


def test_local_class_resolves_only_where_encoded() -> None:
    """A class defined in a function is registered by encoding, and unknown elsewhere."""

    @dataclasses.dataclass
    class Local:
        n: int

    codec = Codec()
    text = codec.encode(Local(1))
    assert codec.decode(text) == Local(1)
    with pytest.raises(UnknownClassError, match="must be registered"):
        Codec().decode(text)
    other = Codec()
    other.register(Local)
    assert other.decode(text) == Local(1)


def test_register_walks_field_annotations() -> None:
    """register() also allows the classes named by field annotations, nested ones included."""

    @dataclasses.dataclass
    class Inner:
        n: int

    class Outer(BaseModel):
        inner: list[Inner | None]
        color: dict[str, Annotated[Color, "meta"]] = {}

    for cls in (Inner, Outer):
        cls.__module__ = "phantom_module"  # as if its module were not imported here
    text = Codec().encode(Outer(inner=[Inner(1), None]))
    with pytest.raises(UnknownClassError, match="phantom_module"):
        Codec().decode(text)
    codec = Codec()
    codec.register(Outer)
    assert codec.decode(text) == Outer(inner=[Inner(1), None])
    assert class_name(Inner).startswith("phantom_module:test_register_walks_field_annotations.")


def test_register_refuses_other_classes() -> None:
    """Only dataclasses, attrs classes, pydantic models and Enums can be registered."""
    with pytest.raises(TypeError, match="cannot register"):
        Codec().register(Plain)


def test_decoding_never_imports() -> None:
    """Decoding every supported type works while all importing is made to fail."""
    values = [v.values[0] for v in EXAMPLES] + [Counted("x"), Secret("y"), Cached(name="z")]
    warm = Codec()
    text = warm.encode(values)
    assert same(warm.decode(text), values)  # warm-up: lazy imports of the libraries
    fresh = Codec()  # resolves every class anew, from sys.modules

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"import during decode: {args[:1]}")

    class RefuseFinder:
        @staticmethod
        def find_spec(*args: Any, **kwargs: Any) -> Any:
            refuse(*args)

    # Patched by hand: monkeypatch itself imports while it patches.
    saved = builtins.__import__, importlib.import_module
    sys.meta_path.insert(0, RefuseFinder())
    importlib.import_module = refuse
    builtins.__import__ = refuse
    try:
        decoded = fresh.decode(text)
    finally:
        builtins.__import__, importlib.import_module = saved
        del sys.meta_path[0]
    assert same(decoded, values)


# -- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{", id="not-json"),
        pytest.param('{"$t":"nope"}', id="unknown-tag"),
        pytest.param('{"$t":7}', id="tag-not-str"),
        pytest.param('{"$t":"int","v":12}', id="int-not-str"),
        pytest.param('{"$t":"tuple","v":"ab"}', id="tuple-not-list"),
        pytest.param('{"$t":"bytes","v":"**"}', id="bad-base64"),
        pytest.param('{"$t":"dict","v":[[[1],2]]}', id="unhashable-key"),
        pytest.param('{"$t":"enum","c":"tests.strategies:Color","v":99}', id="no-such-member"),
        pytest.param('{"$t":"dataclass","c":"tests.strategies:Point","v":{}}', id="missing-field"),
        pytest.param('{"$t":"path","k":"os","v":"x"}', id="unknown-path-kind"),
    ],
)
def test_malformed_text_is_a_decode_error(text: str) -> None:
    """Text the codec did not write raises DecodeError, not some internal error."""
    with pytest.raises(DecodeError):
        Codec().decode(text)


# -- pickle ---------------------------------------------------------------------------------


def test_pickle_is_off_by_default() -> None:
    """Without opt-in, unsupported values are refused and pickles in the log are not loaded."""
    text = Codec(allow_pickle=True).encode(Plain(3))
    assert text.startswith('{"$t":"pickle","v":"')
    with pytest.raises(EncodeError):
        Codec().encode(Plain(3))
    with pytest.raises(DecodeError, match="pickle is disabled"):
        Codec().decode(text)


def test_pickle_opt_in_roundtrips_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """With allow_pickle=True unsupported values round-trip and one warning is logged."""
    codec = Codec(allow_pickle=True)
    with caplog.at_level(logging.WARNING, logger="eventstore.codec"):
        value = {"a": Plain(1), "b": (Plain(2),)}
        assert codec.decode(codec.encode(value)) == value
        assert codec.decode(codec.encode(Plain(3))) == Plain(3)
    warnings = [r for r in caplog.records if r.name == "eventstore.codec"]
    assert len(warnings) == 1
    assert "pickle" in warnings[0].getMessage()


def test_pickle_failure_is_an_encode_error() -> None:
    """A value pickle cannot handle still raises EncodeError with its path."""
    with pytest.raises(EncodeError, match=r"value\['f'\]: <class 'function'>: pickle failed"):
        Codec(allow_pickle=True).encode({"f": lambda: 0})


def test_default_codec_is_a_plain_codec() -> None:
    """The shared module-level codec round-trips values and keeps pickle off."""
    assert isinstance(default_codec, Codec)
    assert not default_codec.allow_pickle
    assert same(default_codec.decode(default_codec.encode((1, {2}))), (1, {2}))
