"""The codec's words: the tagged objects of the JSON text, and the classes it may rebuild.

JSON-native values (str, bool, None, signed 64-bit ints, finite floats, lists, str-keyed
dicts) are written as themselves, so plain SQLite tools can read the log. Any other value is
a small tagged object from which decoding restores its exact type::

    {"$t": "int", "v": "18446744073709551616"}      ints beyond signed 64 bits
    {"$t": "float", "v": "nan"}                       also "inf", "-inf" (orjson writes null)
    {"$t": "bytes", "v": "<base64>"}                  also "bytearray"
    {"$t": "tuple", "v": [...]}                       also "set", "frozenset" (sorted)
    {"$t": "dict", "v": [[key, value], ...]}          non-str keys, or a "$t" key
    {"$t": "datetime", "v": "<iso>"}                  also "time", "date"; and if needed
        "z": "Europe/Paris" (a ZoneInfo), "o": [offset_us, name] (odd fixed offset), "f": 1 (fold)
    {"$t": "timedelta", "v": [days, seconds, microseconds]}
    {"$t": "decimal", "v": "1.10"}   {"$t": "uuid", "v": "<uuid>"}
    {"$t": "path", "k": "PurePosixPath", "v": "a/b"}
    {"$t": "enum", "c": "pkg.mod:Color", "v": <value>}
    {"$t": "dataclass" | "attrs" | "model", "c": "pkg.mod:Cls", "v": {field: value}}
        "c": "pkg.mod:Cls@2" when the class declares ``__version__ = 2`` (no suffix: version 1)
    {"$t": "pickle", "v": "<base64>"}                 only with Codec(allow_pickle=True)

Values nest at most :data:`MAX_DEPTH` containers deep (lists, dicts, tuples, sets, objects):
each container takes at most three levels of JSON, so a record that embeds a value, and the
snapshot that embeds the records' values, stay within the nesting the JSON writer allows. A
deeper value, or one that contains itself, is refused with the path where it goes too deep.

This module holds what the encoder (:mod:`._encode`), the decoder (:mod:`._decode`), the
class allowlist (:mod:`._allowlist`) and the upcasters (:mod:`._upcast`) all speak: the tag
names, the class names the log records, and which classes the codec rebuilds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import PosixPath, PurePosixPath, PureWindowsPath, WindowsPath
from typing import Any, Final

import attrs
from pydantic import BaseModel

__all__ = [
    "FLOATS",
    "MAIN",
    "MALFORMED",
    "MAX_DEPTH",
    "PATHS",
    "ROOT",
    "TAG",
    "UNSUPPORTED",
    "VERSION",
    "PicklePolicy",
    "class_name",
    "class_version",
    "classes_in",
    "fields_of",
    "kind_of",
    "split_version",
]

MAX_DEPTH: Final = 80
"""How many containers deep a value may nest (the value itself is level 1).

A container takes up to three levels of JSON (a dict with non-str keys: the tagged object,
its list of pairs, the pair), and a record or snapshot adds a few more around a value, so 80
keeps every record within the 254 levels that orjson writes.
"""
TAG: Final = "$t"
MAIN: Final = "__main__"  # the module name of the script Python runs
ROOT: Final = "value"  # how error paths name the value given to encode()
VERSION: Final = "__version__"  # the class attribute that declares a shape's version
FLOATS: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
PATHS: Final = {c.__name__: c for c in (PurePosixPath, PureWindowsPath, PosixPath, WindowsPath)}
# What malformed input raises while it is rebuilt; anything else would be a bug of ours.
MALFORMED: Final = (LookupError, TypeError, ValueError, ArithmeticError, NotImplementedError)
UNSUPPORTED: Final = (
    "not a supported type; use a dataclass, attrs class, pydantic model or Enum, "
    "or opt in to pickle with {how}"
)
_log = logging.getLogger("eventstore.codec")


class PicklePolicy:
    """Whether a codec stores and reads pickles, and its one warning when it does.

    Shared by a codec's encoder and decoder, so that the warning is logged once per codec
    and ``codec.allow_pickle = ...`` changes both directions at once.
    """

    def __init__(self, *, allowed: bool, how_to_allow: str) -> None:
        self.allowed = allowed
        self.how_to_allow = how_to_allow  # named by the errors that refuse a pickle
        self.warned = False

    def warn(self, what: str) -> None:
        """Logs, the first time only, that this codec's log is no longer plain JSON."""
        if not self.warned:
            self.warned = True
            _log.warning(
                "pickle is enabled on this codec (%s): the log is no longer plain JSON, and "
                "decoding it runs whatever code it names; read only logs you trust",
                what,
            )


def class_name(cls: type) -> str:
    """Return the name under which the log records ``cls``: ``"module:Qual.Name"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def class_version(cls: type) -> int:
    """The version of ``cls``'s shape: its own ``__version__`` attribute, 1 if it has none.

    Only the class's own declaration counts (a subclass has a shape of its own).

    :raises TypeError: ``__version__`` is not an int of at least 1.
    """
    version = vars(cls).get(VERSION, 1)
    if type(version) is not int or version < 1:
        msg = f"{class_name(cls)}.{VERSION} should be an int >= 1, not {version!r}"
        raise TypeError(msg)
    return version


def split_version(tagged: str) -> tuple[str, int]:
    """A class name as a tag writes it (``"mod:Cls@2"``) -> (``"mod:Cls"``, 2); no suffix: 1."""
    name, at, version = tagged.partition("@")
    if not at:
        return tagged, 1
    if not version.isdigit() or int(version) < 1:
        msg = f"bad version {version!r} in class name {tagged!r}"
        raise ValueError(msg)
    return name, int(version)


def kind_of(cls: type) -> str | None:
    """The tag of a class that the codec may rebuild, None for any other class."""
    if issubclass(cls, Enum):
        return "enum"
    if issubclass(cls, BaseModel):
        return "model"
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    return "attrs" if attrs.has(cls) else None


def fields_of(cls: type, kind: str) -> list[tuple[str, str | None]]:
    """(attribute, __init__ argument or None) of each field of a dataclass or attrs class."""
    if kind == "dataclass":
        return [(f.name, f.name if f.init else None) for f in dataclasses.fields(cls)]
    return [(a.name, a.alias if a.init else None) for a in attrs.fields(cls)]


def classes_in(hint: Any) -> Iterator[type]:
    """Yield the classes inside an annotation: ``list[X]``, ``dict[str, X]``, ``X | None``..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        if isinstance(hint, type):
            yield hint
    elif origin is typing.Annotated:
        yield from classes_in(args[0])
    elif origin is typing.Literal:
        yield from (type(a) for a in args if isinstance(a, Enum))
    else:
        for arg in args:
            yield from classes_in(arg)
