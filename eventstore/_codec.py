"""Typed values <-> JSON text: the event log's value codec and its class allowlist.

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

Objects are rebuilt from the runtime types recorded in the log, not from declared field types:
cattrs structuring and pydantic validation go by declarations, which would turn a tuple in an
``Any`` field into a list or an int in a ``float`` field into a float. So dataclasses and
attrs classes are rebuilt by calling the class, and pydantic models by ``model_construct``
(their values were validated when first built).

Versions and upcasting: a dataclass, attrs class or pydantic model may declare the version of
its shape as a class attribute of its own, ``__version__ = 2`` (not inherited; absent means
1). The version is written in the class name of the tag (``"pkg.mod:Cls@2"``; version 1 is
written without a suffix, so logs written before versions existed read as version 1). On
decode, a payload of an older version goes through the upcasters registered with
:func:`upcaster` (1 -> 2, 2 -> 3, ...), each taking the stored fields as a dict of decoded
values and returning the next version's, before the class is built. The stored text is never
changed. A version with no upcaster path is refused with :class:`UpcastError`.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
import logging
import math
import os
import pickle
import sys
import typing
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from enum import Enum
from pathlib import PosixPath, PurePath, PurePosixPath, PureWindowsPath, WindowsPath
from typing import Any, ClassVar, Final

import attrs
import orjson
from pydantic import BaseModel

from ._errors import (
    CodecError,
    DecodeError,
    EncodeError,
    PickleDisabledError,
    UnknownClassError,
    UpcastError,
)

__all__ = [
    "MAX_DEPTH",
    "Codec",
    "class_name",
    "class_version",
    "default_codec",
    "split_version",
    "upcaster",
]

MAX_DEPTH: Final = 80
"""How many containers deep a value may nest (the value itself is level 1).

A container takes up to three levels of JSON (a dict with non-str keys: the tagged object,
its list of pairs, the pair), and a record or snapshot adds a few more around a value, so 80
keeps every record within the 254 levels that orjson writes.
"""
TAG: Final = "$t"
_MAIN: Final = "__main__"  # the module name of the script Python runs
_ROOT: Final = "value"  # how error paths name the value given to encode()
_I64: Final = range(-(2**63), 2**63)
_FLOATS: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_PATHS: Final = {c.__name__: c for c in (PurePosixPath, PureWindowsPath, PosixPath, WindowsPath)}
# What malformed input raises while it is rebuilt; anything else would be a bug of ours.
_MALFORMED: Final = (LookupError, TypeError, ValueError, ArithmeticError, NotImplementedError)
_UNSUPPORTED: Final = (
    "not a supported type; use a dataclass, attrs class, pydantic model or Enum, "
    "or opt in to pickle with {how}"
)
_log = logging.getLogger("eventstore.codec")

_Handler = Callable[[Any, int], Any]  # (value, its depth) -> its dump
_Builder = Callable[[Any], Any]  # a tagged object's dump -> the object
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]  # one version's fields -> the next's
_VERSION: Final = "__version__"
_UPCASTERS: dict[type, dict[int, Upcaster]] = {}  # class -> from_version -> upcaster


class _Unencodable(Exception):
    """Raised inside the walk; each container on the way out adds its part of the path."""

    def __init__(self, type_: type, detail: str, *, too_deep: bool = False) -> None:
        super().__init__(detail)
        self.type, self.detail, self.too_deep = type_, detail, too_deep
        self.parts: list[str] = []  # innermost first
        self.objs: list[Any] = []  # the containers on the way, innermost first


def _too_deep(v: Any) -> _Unencodable:
    exc = _Unencodable(type(v), f"nested more than {MAX_DEPTH} levels deep", too_deep=True)
    exc.objs.append(v)
    return exc


def _where(root: str, exc: _Unencodable) -> tuple[str, type, str]:
    """The path, type and detail of a refusal; a value that contains itself is named so.

    A cycle is found only when the walk went too deep: by the identity of the containers on
    the path, outermost first, so the path names where the value first meets itself again.
    """
    parts = exc.parts[::-1]
    path = root + "".join(parts)
    if exc.too_deep:
        objs = exc.objs[::-1]  # objs[i] is reached by parts[:i]
        seen: dict[int, int] = {}
        for i, obj in enumerate(objs):
            first = seen.setdefault(id(obj), i)
            if first != i:
                again = root + "".join(parts[:i])
                detail = f"contains itself: this is {root + ''.join(parts[:first])} again"
                return again, type(obj), detail + " (a cycle cannot be stored)"
    return path, exc.type, exc.detail


def _surrogate_at(text: str) -> int:
    """The index of the first lone surrogate in text, or -1."""
    if text.isascii():
        return -1
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return -1


def _texts(data: Any) -> Iterator[str]:
    """Every string in a JSON-native structure, keys included."""
    stack = [data]
    while stack:
        x = stack.pop()
        if type(x) is str:
            yield x
        elif type(x) is dict:
            stack.extend(x)
            stack.extend(x.values())
        elif type(x) is list:
            stack.extend(x)


def class_name(cls: type) -> str:
    """Return the name under which the log records ``cls``: ``"module:Qual.Name"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def class_version(cls: type) -> int:
    """The version of ``cls``'s shape: its own ``__version__`` attribute, 1 if it has none.

    Only the class's own declaration counts (a subclass has a shape of its own).

    :raises TypeError: ``__version__`` is not an int of at least 1.
    """
    v = vars(cls).get(_VERSION, 1)
    if type(v) is not int or v < 1:
        msg = f"{class_name(cls)}.{_VERSION} should be an int >= 1, not {v!r}"
        raise TypeError(msg)
    return v


def split_version(tagged: str) -> tuple[str, int]:
    """A class name as a tag writes it (``"mod:Cls@2"``) -> (``"mod:Cls"``, 2); no suffix: 1."""
    name, at, v = tagged.partition("@")
    if not at:
        return tagged, 1
    if not v.isdigit() or int(v) < 1:
        msg = f"bad version {v!r} in class name {tagged!r}"
        raise ValueError(msg)
    return name, int(v)


def upcaster(cls: type, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Registers a function that turns ``cls``'s stored fields of ``from_version`` into
    those of ``from_version + 1``, for every codec's decoding::

        @upcaster(Answer, from_version=1)
        def _answer_v1(fields: dict[str, Any]) -> dict[str, Any]:
            fields["text"] = fields.pop("body")
            return fields

    The function gets a dict of the stored fields (decoded values, as one may change) and
    returns the next version's dict; it runs at every decode of an old payload, so it must
    be pure. The log keeps the payload as written.

    :raises ValueError: ``from_version`` is not below the class's version, or that version
        of the class already has an upcaster.
    """
    current = class_version(cls)
    if type(from_version) is not int or not 1 <= from_version < current:
        msg = (
            f"upcaster for {class_name(cls)} from version {from_version!r}: the class is at"
            f" version {current} ({_VERSION}), so from_version must be 1..{current - 1}"
        )
        raise ValueError(msg)

    def register(fn: Upcaster) -> Upcaster:
        known = _UPCASTERS.setdefault(cls, {})
        if known.get(from_version, fn) is not fn:
            msg = f"{class_name(cls)} already has an upcaster from version {from_version}"
            raise ValueError(msg)
        known[from_version] = fn
        return fn

    return register


def _upcasts(name: str, cls: type, stored: int) -> list[Upcaster]:
    """The upcasters that bring ``cls``'s fields from version ``stored`` to its current one."""
    current = class_version(cls)
    if stored == current:
        return []
    qual = cls.__qualname__
    if stored > current:
        why = (
            f"stored at version {stored}, newer than this code's {qual} (version {current});"
            " it was written by newer code"
        )
        raise UpcastError(name, stored, current, why)
    known = _UPCASTERS.get(cls, {})
    missing = [v for v in range(stored, current) if v not in known]
    if missing:
        steps = ", ".join(f"@upcaster({qual}, from_version={v})" for v in missing)
        why = (
            f"stored at version {stored}, but {qual} is now version {current} and no upcaster"
            f" turns version {missing[0]} into {missing[0] + 1}; register {steps}"
        )
        raise UpcastError(name, stored, current, why)
    return [known[v] for v in range(stored, current)]


def _kind(cls: type) -> str | None:
    """The tag of a class that the codec may rebuild, None for any other class."""
    if issubclass(cls, Enum):
        return "enum"
    if issubclass(cls, BaseModel):
        return "model"
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    return "attrs" if attrs.has(cls) else None


def _fields(cls: type, kind: str) -> list[tuple[str, str | None]]:
    """(attribute, __init__ argument or None) of each field of a dataclass or attrs class."""
    if kind == "dataclass":
        return [(f.name, f.name if f.init else None) for f in dataclasses.fields(cls)]
    return [(a.name, a.alias if a.init else None) for a in attrs.fields(cls)]


def _clock(tag: str, v: dt.datetime | dt.time) -> dict[str, Any]:
    out: dict[str, Any] = {TAG: tag, "v": v.isoformat()}
    tz = v.tzinfo
    if type(tz) is zoneinfo.ZoneInfo and tz.key:
        out["z"] = tz.key  # the ISO offset alone would lose the zone and its DST rules
    elif type(tz) is dt.timezone:
        offset, name = tz.utcoffset(None), tz.tzname(None)
        # Python 3.11 misreads ISO offsets of microseconds, and ISO has no zone names.
        if offset.microseconds or name != dt.timezone(offset).tzname(None):
            out["o"] = [offset // dt.timedelta(microseconds=1), name]
    if v.fold:
        out["f"] = 1
    return out


def _path(v: PurePath) -> dict[str, Any]:
    text = str(v)
    if type(v)(text) != v:  # some malformed UNC paths: better refused than changed
        raise _Unencodable(type(v), "pathlib does not read this path back from its text")
    return {TAG: "path", "k": type(v).__name__, "v": text}


def _get(x: dict[str, Any], key: str, type_: type) -> Any:
    v = x[key]
    if type(v) is not type_:
        msg = f"{key!r} should be a {type_.__name__}"
        raise TypeError(msg)
    return v


def _str(x: dict[str, Any]) -> str:
    return typing.cast("str", _get(x, "v", str))


def _as_dict(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        msg = "fields should be an object"
        raise TypeError(msg)
    return v


def _unb64(x: dict[str, Any]) -> bytes:
    return base64.b64decode(_str(x), validate=True)


def _classes_in(hint: Any) -> Iterator[type]:
    """Yield the classes inside an annotation: ``list[X]``, ``dict[str, X]``, ``X | None``..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        if isinstance(hint, type):
            yield hint
    elif origin is typing.Annotated:
        yield from _classes_in(args[0])
    elif origin is typing.Literal:
        yield from (type(a) for a in args if isinstance(a, Enum))
    else:
        for arg in args:
            yield from _classes_in(arg)


class Codec:
    """Encode values to JSON text and back to the same types, exactly and recursively.

    :param allow_pickle: store values of unsupported types as base64 pickles. Off by default,
        because unpickling a log runs whatever code the log names.
    :param how_to_register: how a user registers a class, for the error that names a class
        the codec cannot resolve (``{name}`` is replaced by its qualified name).
    :param how_to_allow_pickle: how a user opts in to pickle, for the errors that refuse a
        value only pickle could store or a pickle in the log.

    A name ``module:Qual`` resolves to the class registered (or encoded) under that name,
    else to the class ``Qual`` of ``module`` if that module is imported. ``__main__`` is a
    script's name for itself: ``python app.py`` records ``__main__:X`` where a program that
    imports ``app`` records ``app:X``. So ``__main__:X`` also resolves, in this order, to a
    registered ``X`` of a module given to :meth:`alias_main`, to ``X`` of this process's
    ``__main__``, to the only registered ``X`` of any module, to ``X`` of an aliased module;
    and where this process's ``__main__`` is the file of ``app``, ``app:X`` resolves to its
    registered (or imported) ``__main__:X`` first.
    """

    MAX_DEPTH: ClassVar[int] = MAX_DEPTH
    """How many containers deep a value may nest; see the module's :data:`MAX_DEPTH`."""

    def __init__(
        self,
        *,
        allow_pickle: bool = False,
        how_to_register: str = "Codec.register({name})",
        how_to_allow_pickle: str = "Codec(allow_pickle=True)",
    ) -> None:
        self.allow_pickle = allow_pickle
        self._how_to_allow_pickle = how_to_allow_pickle
        self._pickle_warned = False
        self._private_skipped: set[tuple[type, str]] = set()
        self._how_to_register = how_to_register
        self._classes: dict[str, type] = {}  # registered (or encoded) classes by their name
        self._by_qualname: dict[str, dict[str, type]] = {}  # the same, by qualified name
        self._resolved: dict[str, type] = {}  # names resolved to a class of some module
        self._main_aliases: list[str] = []
        self._builders: dict[str, tuple[str | None, _Builder]] = {}
        self._zones: dict[str, zoneinfo.ZoneInfo] = {}
        self._proxies: dict[type, Callable[[Any], Any]] = {}
        seq, b64 = self._dump_seq, base64.b64encode
        self._encoders: dict[type, _Handler] = {
            bytes: lambda v, d: {TAG: "bytes", "v": b64(v).decode()},
            bytearray: lambda v, d: {TAG: "bytearray", "v": b64(v).decode()},
            tuple: lambda v, d: seq("tuple", v, d),
            set: lambda v, d: seq("set", v, d),
            frozenset: lambda v, d: seq("frozenset", v, d),
            dt.datetime: lambda v, d: _clock("datetime", v),
            dt.date: lambda v, d: {TAG: "date", "v": v.isoformat()},
            dt.time: lambda v, d: _clock("time", v),
            dt.timedelta: lambda v, d: {
                TAG: "timedelta",
                "v": [v.days, v.seconds, v.microseconds],
            },
            Decimal: lambda v, d: {TAG: "decimal", "v": str(v)},
            uuid.UUID: lambda v, d: {TAG: "uuid", "v": str(v)},
        }
        for path_cls in _PATHS.values():
            self._encoders[path_cls] = lambda v, d: _path(v)
        load, items = self._load, self._load_items
        self._decoders: dict[str, Callable[[dict[str, Any]], Any]] = {
            "int": lambda x: int(_str(x), 0),
            "float": lambda x: _FLOATS[_str(x)],
            "bytes": _unb64,
            "bytearray": lambda x: bytearray(_unb64(x)),
            "tuple": lambda x: tuple(items(x)),
            "set": lambda x: set(items(x)),
            "frozenset": lambda x: frozenset(items(x)),
            "dict": lambda x: {load(k): load(v) for k, v in _get(x, "v", list)},
            "datetime": lambda x: self._zoned(dt.datetime.fromisoformat(_str(x)), x),
            "date": lambda x: dt.date.fromisoformat(_str(x)),
            "time": lambda x: self._zoned(dt.time.fromisoformat(_str(x)), x),
            "timedelta": lambda x: dt.timedelta(*_get(x, "v", list)),
            "decimal": lambda x: Decimal(_str(x)),
            "uuid": lambda x: uuid.UUID(_str(x)),
            "path": lambda x: _PATHS[x["k"]](_str(x)),
            "pickle": self._unpickle,
        }
        for kind in ("enum", "model", "dataclass", "attrs"):
            self._decoders[kind] = self._build

    def register(self, *classes: type) -> None:
        """Allow ``classes`` to be rebuilt on decode, with the classes their fields name.

        Needed for classes whose module the decoding process may not have imported, and for
        classes defined in functions; imported module-level classes need no registration.

        :raises TypeError: a class is not a dataclass, attrs class, pydantic model or Enum.
        """
        seen: set[type] = set()
        stack = [(cls, True) for cls in classes]
        while stack:
            cls, explicit = stack.pop()
            kind = _kind(cls) if isinstance(cls, type) else None
            if kind is None and explicit:
                msg = f"cannot register {cls!r}: not a dataclass, attrs class, model or Enum"
                raise TypeError(msg)
            if kind is None or cls in seen:
                continue
            seen.add(cls)
            self._register_one(cls)
            hints: list[Any] = []
            # Unresolvable forward references: register what resolves.
            with contextlib.suppress(Exception):
                hints.extend(typing.get_type_hints(cls, include_extras=True).values())
            if kind == "model":
                # Resolved by pydantic where get_type_hints fails; a model not yet complete
                # holds forward references here, which get_type_hints resolved above.
                hints.extend(f.annotation for f in cls.model_fields.values())  # type: ignore[attr-defined]
            stack.extend((c, False) for hint in hints for c in _classes_in(hint))

    def alias_main(self, *modules: str) -> None:
        """Reads names recorded under ``__main__`` as names of ``modules`` too.

        A script run as ``python app.py`` records its classes as ``__main__:X``; a program
        that imports ``app`` and calls ``alias_main("app")`` reads them back as ``app.X``
        (registered classes of ``app`` first, then the classes of the imported module).
        The other direction needs no call: a process whose ``__main__`` is the file of
        ``app`` reads ``app:X`` as its own ``__main__:X``.
        """
        for module in modules:
            if module != _MAIN and module not in self._main_aliases:
                self._main_aliases.append(module)
                self._forget(lambda name: name.startswith(_MAIN + ":"))

    def resolve(self, name: str) -> type:
        """The class that ``name`` (``"module:Qual.Name"``, as the log writes it) stands for.

        Never imports a module; see the class's docstring for the order of the search.

        :raises UnknownClassError: no allowed class of that name is registered or imported;
            the message says how to register it.
        """
        cls = self._classes.get(name) or self._resolved.get(name)
        if cls is None:
            if "@" in name:  # a versioned tag: the version is the builder's concern
                return self.resolve(split_version(name)[0])
            cls = self._resolved[name] = self._find(name)
        return cls

    def alias(self, name: str, cls: type) -> None:
        """Reads the class name ``name`` (``"old.module:OldName"``, as older logs recorded
        it) as ``cls``: for a class moved to another module or renamed since.

        :raises TypeError: ``cls`` is not a dataclass, attrs class, pydantic model or Enum.
        :raises ValueError: ``name`` is not a class name (``module:QualName``).
        """
        if not isinstance(cls, type) or _kind(cls) is None:
            msg = f"cannot alias {name!r} to {cls!r}: not a dataclass, attrs class, model or Enum"
            raise TypeError(msg)
        module, _, qual = name.partition(":")
        if not module or not qual or "@" in name:
            msg = f"{name!r} is not a class name (module:QualName)"
            raise ValueError(msg)
        self._register_one(cls)
        self._classes[name] = cls
        self._forget(lambda n: split_version(n)[0] == name)

    def register_proxy(self, cls: type, unwrap: Callable[[Any], Any]) -> None:
        """Encode instances of ``cls`` as the value ``unwrap(instance)`` returns.

        For stand-ins of plain values, such as read-only views of a list or dict: they are
        written, and so decoded, as the value they stand for.
        """
        dump = self._dump
        self._proxies[cls] = unwrap

        def enc_proxy(v: Any, d: int) -> Any:
            try:
                return dump(unwrap(v), d)
            except _Unencodable as exc:
                if exc.objs:
                    exc.objs[-1] = v  # the stand-in is what a cycle goes through
                raise

        self._encoders[cls] = enc_proxy

    def encode(self, value: object, *, depth: int = 1, name: str = _ROOT) -> str:
        """Return ``value`` as compact JSON text that :meth:`decode` turns back into it.

        :param depth: the level at which ``value`` sits inside a larger value (1: it is the
            root), so that its containers count toward :data:`MAX_DEPTH` from there.
        :param name: how error paths name ``value``.
        :raises EncodeError: a part of ``value`` has an unsupported type, is a string JSON
            text cannot hold (a lone surrogate), or nests too deep (a cycle, too); the
            message names its path, e.g. ``value['a'][2]`` or ``value.field``.
        """
        data = self.dump(value, depth=depth, name=name)
        try:
            return orjson.dumps(data).decode()
        except orjson.JSONEncodeError as exc:  # a lone surrogate: JSON text is UTF-8
            raise self._text_error(value, depth, name, exc) from None

    def _text_error(self, value: Any, depth: int, name: str, exc: Exception) -> EncodeError:
        """The refusal of a value whose dump orjson could not write, naming the string."""
        found = self._find_text_error(value, depth)
        if found is None:  # nothing of ours: say what orjson said
            return EncodeError(name, type(value), str(exc))
        parts, text = found
        i = _surrogate_at(text)
        shown = repr(text[max(0, i - 10) : i + 11])
        detail = f"holds a lone surrogate at index {i} ({shown}), which is not valid UTF-8"
        return EncodeError(name + "".join(parts), str, detail)

    def _find_text_error(self, v: Any, d: int) -> tuple[list[str], str] | None:
        """The path parts to the first string of v that JSON text cannot hold, and it.

        Walks v as :meth:`_dump` does, descending only into the part whose dump orjson
        refuses (slow, but only a refused value pays for it).
        """
        t = type(v)
        if t is str:
            return ([], v) if _surrogate_at(v) >= 0 else None
        try:
            orjson.dumps(self._dump(v, d))
        except orjson.JSONEncodeError:
            pass
        else:
            return None
        children: list[tuple[str, Any]] = []
        if t is dict or t is list:
            items = v.items() if t is dict else enumerate(v)
            for i, (k, x) in enumerate(items):
                if t is dict:
                    key_part = f"<key #{i}>"
                    if type(k) is str and _surrogate_at(k) >= 0:
                        return [key_part], k
                    if type(k) is not str:
                        children.append((key_part, k))
                children.append((f"[{k!r}]", x))
        elif t is tuple or t is set or t is frozenset:
            try:
                ordered = v if t is tuple else sorted(v)
            except TypeError:
                ordered = list(v)
            mark = "[{}]" if t is tuple else "{{#{}}}"
            children = [(mark.format(i), x) for i, x in enumerate(ordered)]
        elif isinstance(v, Enum):
            children = [("", v.value)]
        elif (kind := _kind(t)) is not None:
            if kind == "model":
                fields = v.__dict__ | (v.__pydantic_extra__ or {}) | (v.__pydantic_private__ or {})
            else:
                fields = {n: getattr(v, n) for n, _ in _fields(t, kind)}
            for n, x in fields.items():
                if _surrogate_at(n) >= 0:
                    return [f"<field #{list(fields).index(n)}>"], n
                children.append((f".{n}", x))
        elif t in self._proxies:
            return self._find_text_error(self._proxies[t](v), d)
        for part, x in children:
            found = self._find_text_error(x, d + 1)
            if found is not None:
                return [part, *found[0]], found[1]
        # The container's own text (a class name, a time zone's name, a path) is at fault.
        text = next((x for x in _texts(self._dump(v, d)) if _surrogate_at(x) >= 0), None)
        return None if text is None else ([], text)

    def decode(self, text: str | bytes) -> Any:
        """Return the value that :meth:`encode` wrote as ``text``, with its exact types.

        Never imports a module: classes resolve (:meth:`resolve`) only among registered
        classes and allowed classes (dataclass, attrs, pydantic model, Enum) of modules
        already imported.

        :raises DecodeError: ``text`` is not a value this codec wrote.
        :raises UnknownClassError: ``text`` names a class that is not allowed here.
        """
        try:
            data = orjson.loads(text)
            # Text without the tag (most of it) needs no walk; "$t" is never escaped by orjson.
            if isinstance(text, str):
                untagged = '"$t"' not in text
            else:
                untagged = isinstance(text, bytes | bytearray) and b'"$t"' not in text
        except (orjson.JSONDecodeError, TypeError) as exc:
            msg = f"not JSON text: {exc}"
            raise DecodeError(msg) from exc
        return data if untagged else self._load(data)

    def dump(self, value: object, *, depth: int = 1, name: str = _ROOT) -> Any:
        """Return the JSON-native structure that :meth:`encode` serializes.

        Containers that need no tag are returned as they are, not copied: don't mutate them.
        Strings are not checked here (orjson checks them as it writes): use :meth:`encode`
        for a value that must be known to be writable.

        :param depth: as for :meth:`encode`.
        :param name: how error paths name ``value``.
        :raises EncodeError: an unsupported type, or nesting past :data:`MAX_DEPTH`.
        """
        try:
            return self._dump(value, depth)
        except _Unencodable as exc:
            path, type_, detail = _where(name, exc)
            raise EncodeError(path, type_, detail) from exc.__cause__

    def load(self, data: Any) -> Any:
        """Return the value whose :meth:`dump` is ``data``; untagged parts are not copied."""
        return self._load(data)

    # -- encoding -----------------------------------------------------------------------------

    def _dump(self, v: Any, d: int) -> Any:
        # d: the level of v (the root value is 1); a non-JSON-native value past the limit is
        # refused before anything else, which also ends the walk of a cyclic value.
        t = type(v)
        if t is str or t is bool or v is None:
            return v
        if t is int:
            if v in _I64:
                return v
            # str() refuses ints past 4300 digits (~14284 bits); hex has no limit
            return {TAG: "int", "v": str(v) if v.bit_length() < 14000 else hex(v)}
        if t is float:
            if math.isfinite(v):
                return v
            return {TAG: "float", "v": "nan" if v != v else "inf" if v > 0 else "-inf"}
        if d > MAX_DEPTH:
            raise _too_deep(v)
        if t is dict:
            return self._dump_items(v, v.items(), d)
        if t is list:
            return self._dump_items(v, enumerate(v), d)
        return (self._encoders.get(t) or self._encoder_for(t))(v, d)

    def _dump_items(self, x: Any, items: Iterable[Any], d: int, *, fields: bool = False) -> Any:
        # Copy on write: a container of JSON-native values goes to orjson as it is.
        out, is_dict, k, d1 = None, type(x) is dict, None, d + 1
        try:
            for k, v in items:
                if is_dict and (type(k) is not str or k == TAG):
                    break
                t = type(v)
                # Inlined checks of the common JSON-native values, as the hottest loop here.
                if t is str or v is None or t is bool:
                    continue
                if t is int:
                    if -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
                        continue
                elif t is float and v - v == 0.0:  # finite: inf - inf and NaN - NaN are NaN
                    continue
                y = self._dump(v, d1)
                if y is not v:
                    if out is None:
                        out = x.copy()
                    out[k] = y
            else:
                return x if out is None else out
        except _Unencodable as exc:
            exc.parts.append(f".{k}" if fields else f"[{k!r}]")
            exc.objs.append(x)
            raise
        pairs: list[list[Any]] = []  # a non-str or "$t" key: the dict goes as [key, value] pairs
        in_key = True
        try:
            for k, v in x.items():
                in_key = True
                key = self._dump(k, d1)
                in_key = False
                pairs.append([key, self._dump(v, d1)])
        except _Unencodable as exc:
            exc.parts.append(
                f"<key #{len(pairs)}>" if in_key else f".{k}" if fields else f"[{k!r}]"
            )
            exc.objs.append(x)
            raise
        return {TAG: "dict", "v": pairs}

    def _dump_seq(self, tag: str, v: Any, d: int) -> dict[str, Any]:
        items, out, d1 = v, list[Any](), d + 1
        if tag != "tuple":
            try:  # sorted, so that equal sets give equal text in every process (hashes vary)
                items = sorted(v)
            except TypeError:
                items = None
        try:  # extend keeps what it took before an error: len(out) is where it failed
            out.extend(map(self._dump, v if items is None else items, itertools.repeat(d1)))
        except _Unencodable as exc:
            exc.parts.append(f"[{len(out)}]" if tag == "tuple" else f"{{#{len(out)}}}")
            exc.objs.append(v)
            raise
        if items is None:  # items of no common order: by their JSON text then
            # Text orjson cannot write has no order; encode() then says where it is.
            with contextlib.suppress(orjson.JSONEncodeError):
                out.sort(key=orjson.dumps)
        return {TAG: tag, "v": out}

    def _encoder_for(self, t: type) -> _Handler:
        kind = _kind(t)
        enc: _Handler = self._pickle
        if kind is None and not self.allow_pickle:
            raise _Unencodable(t, _UNSUPPORTED.format(how=self._how_to_allow_pickle))
        if kind is not None:
            self._register_one(t)  # so that this process decodes what it encoded
            enc = self._class_encoder(t, kind)
        self._encoders[t] = enc
        return enc

    def _class_encoder(self, cls: type, kind: str) -> _Handler:
        name, dump, fields = class_name(cls), self._dump, self._dump_fields
        if kind == "enum":
            return lambda m, d: {TAG: "enum", "c": name, "v": dump(m.value, d + 1)}
        version = class_version(cls)
        if version != 1:  # version 1 has no suffix: what was written before versions existed
            name = f"{name}@{version}"
        if kind == "model":

            def enc_model(m: BaseModel, d: int) -> Any:
                out = {
                    TAG: "model",
                    "c": name,
                    "v": fields(m.__dict__ | (m.__pydantic_extra__ or {}), d, m),
                }
                if m.__pydantic_private__:
                    private = self._private_to_keep(m, d)
                    if private:
                        out["p"] = fields(private, d, m)
                return out

            return enc_model
        names = [n for n, _ in _fields(cls, kind)]
        return lambda obj, d: {
            TAG: kind,
            "c": name,
            "v": fields({n: getattr(obj, n) for n in names}, d, obj),
        }

    def _private_to_keep(self, m: BaseModel, d: int) -> dict[str, Any]:
        """A model's private attributes that the log can hold. Pydantic never serializes
        private attributes (LlamaIndex keeps a lock or a client in one): one this codec
        cannot encode is left out, and comes back with its default, logged once a class."""
        private = dict(m.__pydantic_private__ or {})
        kept = {}
        for key, value in private.items():
            try:
                self._dump_fields({key: value}, d, m)
            except _Unencodable as exc:
                if (type(m), key) not in self._private_skipped:
                    self._private_skipped.add((type(m), key))
                    _log.warning(
                        "%s.%s is not recorded (a private attribute the log cannot hold: %s);"
                        " it comes back with its default",
                        type(m).__qualname__,
                        key,
                        exc.detail,
                    )
                continue
            kept[key] = value
        return kept

    def _dump_fields(self, raw: dict[str, Any], d: int, owner: Any) -> Any:
        # raw is a new dict, so the copy-on-write walk may hand it back as it is.
        try:
            return self._dump_items(raw, raw.items(), d, fields=True)
        except _Unencodable as exc:
            exc.objs[-1] = owner  # the object, not the dict made of its fields, is on the path
            raise

    def _pickle(self, v: object, d: int) -> dict[str, Any]:
        self._warn_pickle(f"pickling {type(v)!r}")
        try:
            data = pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickle raises many kinds
            raise _Unencodable(type(v), f"pickle failed: {exc}") from exc
        return {TAG: "pickle", "v": base64.b64encode(data).decode()}

    def _warn_pickle(self, what: str) -> None:
        if not self._pickle_warned:
            self._pickle_warned = True
            _log.warning(
                "pickle is enabled on this codec (%s): the log is no longer plain JSON, and "
                "decoding it runs whatever code it names; read only logs you trust",
                what,
            )

    # -- decoding -----------------------------------------------------------------------------

    def _load(self, x: Any) -> Any:
        # Copy on write: only containers with a tag somewhere below them are rebuilt.
        t = type(x)
        if t is dict:
            if TAG in x:
                return self._untag(x)
            items: Iterable[tuple[Any, Any]] = x.items()
        elif t is list:
            items = enumerate(x)
        else:
            return x
        out = None
        for k, v in items:
            if type(v) is dict or type(v) is list:
                y = self._load(v)
                if y is not v:
                    if out is None:
                        out = x.copy()
                    out[k] = y
        return x if out is None else out

    def _load_items(self, x: dict[str, Any]) -> Iterator[Any]:
        return map(self._load, _get(x, "v", list))

    def _untag(self, x: dict[str, Any]) -> Any:
        tag = x[TAG]
        dec = self._decoders.get(tag) if type(tag) is str else None
        if dec is None:
            msg = f"unknown tag {tag!r} in {repr(x)[:200]}"
            raise DecodeError(msg)
        try:
            return dec(x)
        except CodecError:
            raise
        except _MALFORMED as exc:
            msg = f"malformed {tag!r} value {repr(x)[:200]}: {exc!r}"
            raise DecodeError(msg) from exc

    def _zoned(self, v: Any, x: dict[str, Any]) -> Any:
        if "o" in x:
            offset, name = _get(x, "o", list)
            v = v.replace(tzinfo=dt.timezone(dt.timedelta(microseconds=offset), name))
        if "z" in x:
            key = _get(x, "z", str)
            zone = self._zones.get(key)
            if zone is None:
                # Without a zone file ZoneInfo imports the tzdata package; decode never may.
                if "tzdata" not in sys.modules and not any(
                    os.path.isfile(os.path.join(root, key)) for root in zoneinfo.TZPATH
                ):
                    msg = f"no zone file for time zone {key!r} (and tzdata is not imported)"
                    raise DecodeError(msg)
                zone = self._zones[key] = zoneinfo.ZoneInfo(key)
            v = v.replace(tzinfo=zone)
        return v.replace(fold=1) if x.get("f") else v

    def _unpickle(self, x: dict[str, Any]) -> Any:
        if not self.allow_pickle:
            msg = (
                "the value is a pickle and pickle is disabled (the log is not damaged: it was"
                f" written with the pickle opt-in); to read it, use {self._how_to_allow_pickle}"
                " (only for a log you trust: unpickling runs code)"
            )
            raise PickleDisabledError(msg)
        self._warn_pickle("unpickling")
        return pickle.loads(_unb64(x))  # opted in, and warned about

    def _build(self, x: dict[str, Any]) -> Any:
        name = _get(x, "c", str)
        entry = self._builders.get(name)
        if entry is None:
            base, stored = split_version(name)
            cls = self.resolve(base)
            kind = _kind(cls)
            upcasts = [] if kind == "enum" else _upcasts(name, cls, stored)
            entry = self._builders[name] = (kind, self._class_builder(cls, upcasts))
        if entry[0] != x[TAG]:
            msg = f"{name!r} is tagged {x[TAG]!r} but the class is of kind {entry[0]!r}"
            raise DecodeError(msg)
        try:
            return entry[1](x)
        except CodecError:
            raise
        except Exception as exc:  # the class's own __init__ may raise anything
            msg = f"cannot rebuild {name!r} from {repr(x)[:200]}: {exc!r}"
            raise DecodeError(msg) from exc

    def _class_builder(self, cls: type, upcasts: list[Upcaster]) -> _Builder:
        kind, load = _kind(cls), self._load
        if kind == "enum":
            return lambda x: cls(load(x["v"]))

        def values_of(x: dict[str, Any]) -> dict[str, Any]:
            values = _as_dict(load(x["v"]))
            if upcasts:  # an older version's fields, brought up one version at a time
                values = copy.deepcopy(values)  # untagged parts are the stored dump's own
                for up in upcasts:
                    values = _as_dict(up(values))
            return values

        if kind == "model":

            def build_model(x: dict[str, Any]) -> Any:
                obj = cls.model_construct(**values_of(x))  # type: ignore[attr-defined]
                if "p" in x:
                    private = _as_dict(load(x["p"]))
                    if obj.__pydantic_private__ is None:
                        object.__setattr__(obj, "__pydantic_private__", private)
                    else:
                        obj.__pydantic_private__.update(private)
                return obj

            return build_model
        # Init fields go to __init__ (by their attrs alias); the others are set after it.
        fields = _fields(cls, typing.cast("str", kind))
        init = {n: arg for n, arg in fields if arg is not None}
        late = {n for n, arg in fields if arg is None}

        def build_fields(x: dict[str, Any]) -> Any:
            values = values_of(x)
            # Names of no field (one since removed) are ignored, as pydantic does by default.
            obj = cls(**{init[k]: v for k, v in values.items() if k in init})
            for k, v in values.items():
                if k in late:
                    object.__setattr__(obj, k, v)
            return obj

        return build_fields

    def _register_one(self, cls: type) -> None:
        name = class_name(cls)
        if self._classes.get(name) is not cls:
            self._classes[name] = cls
            self._by_qualname.setdefault(cls.__qualname__, {})[name] = cls
            # What resolved to another class of this qualified name may resolve to this now.
            qualname = cls.__qualname__
            self._forget(lambda n: n.partition(":")[2] == qualname)

    def _forget(self, which: Callable[[str], bool]) -> None:
        for cache in (self._resolved, self._builders):
            for name in [n for n in cache if which(n)]:
                del cache[name]

    def _find(self, name: str) -> type:
        module_name, _, qualname = name.partition(":")
        if not module_name or not qualname:
            raise UnknownClassError(name, "not a class name (module:QualName)")
        # Where to look, in order: registered classes (a list: one is the answer, several
        # are ambiguous) and the names of modules already imported.
        found = self._by_qualname.get(qualname, {})
        others: list[type] = []
        places: list[list[type] | str]
        if module_name == _MAIN:
            # Written by a script: here, most likely the module of one of our workflows.
            others = [c for c in found.values() if c.__module__ != _MAIN]
            ours = [c for c in others if c.__module__ in self._main_aliases]
            places = [ours, _MAIN, others, *self._main_aliases]
        elif module_name in _main_names():
            # This process runs that very module as its script.
            twin = found.get(f"{_MAIN}:{qualname}")
            places = [[twin] if twin is not None else [], _MAIN, module_name]
        else:
            places = [module_name]
        for place in places:
            if isinstance(place, list):
                if len(place) == 1:
                    return place[0]
                continue
            cls = self._lookup(name, place, qualname)
            if cls is not None:
                return cls
        imported = [p for p in places if isinstance(p, str) and p in sys.modules]
        if len(others) > 1:
            names = ", ".join(sorted(map(class_name, others)))
            why = f"several registered classes are named {qualname!r} ({names})"
        elif not imported:
            why = f"module {module_name!r} is not imported and no class of it is registered"
        else:
            why = f"{' nor '.join(imported)} has no {qualname!r}"
            if "<locals>" in qualname:
                why += " (classes in functions must be registered)"
        how = self._how_to_register.format(name=qualname)
        msg = f"{why}; register it with {how} (decoding never imports modules)"
        raise UnknownClassError(name, msg)

    @staticmethod
    def _lookup(name: str, module_name: str, qualname: str) -> type | None:
        """The allowed class ``qualname`` of an imported module; None if it has none."""
        obj: Any = sys.modules.get(module_name)
        if obj is None:
            return None
        for part in qualname.split("."):
            try:  # vars(), not getattr(): a module __getattr__ could run code, even import
                obj = vars(obj)[part]
            except (KeyError, TypeError):
                return None
        if not isinstance(obj, type):
            raise UnknownClassError(name, f"not a class but {type(obj)!r}")
        if _kind(obj) is None:
            msg = "only dataclasses, attrs classes, pydantic models and Enums are rebuilt"
            raise UnknownClassError(name, msg)
        return obj


def _main_names() -> set[str]:
    """The module names under which this process's ``__main__`` could be imported.

    ``python -m app`` says it in ``__spec__``; ``python app.py`` only gives the file, which
    is module ``app`` (or ``pkg.app``) for each ``sys.path`` entry it is under.
    """
    main = sys.modules.get(_MAIN)
    names: set[str] = set()
    spec = getattr(main, "__spec__", None)
    if spec is not None and isinstance(spec.name, str):
        names.add(spec.name)
    file = getattr(main, "__file__", None)
    if isinstance(file, str) and file.endswith(".py"):
        stem = os.path.realpath(file)[:-3]
        for entry in sys.path:
            root = os.path.join(os.path.realpath(entry or os.curdir), "")
            if stem.startswith(root):
                parts = stem[len(root) :].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                if parts and all(p.isidentifier() for p in parts):
                    names.add(".".join(parts))
    names.discard(_MAIN)
    return names


default_codec: Final[Codec] = Codec()
"""The shared codec; classes encoded through it are registered on it."""
