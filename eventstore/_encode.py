"""Encoding: typed values -> the JSON-native structure of :mod:`._tags`, and refusals.

The walk copies on write (a container of JSON-native values goes to orjson as it is) and
counts the depth of containers; what it cannot encode is refused with the path to the part
at fault (``value['a'][2]``, ``value.field``), and a value that contains itself is named so.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import itertools
import math
import pickle
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Final

import orjson
from pydantic import BaseModel

from ._allowlist import ClassAllowlist
from ._errors import EncodeError
from ._tags import (
    MAX_DEPTH,
    PATHS,
    TAG,
    UNSUPPORTED,
    PicklePolicy,
    class_name,
    class_version,
    fields_of,
    kind_of,
)

__all__ = ["Encoder"]

_I64: Final = range(-(2**63), 2**63)
_Handler = Callable[[Any, int], Any]  # (value, its depth) -> its dump


class _Unencodable(Exception):
    """Raised inside the walk; each container on the way out adds its part of the path."""

    def __init__(self, type_: type, detail: str, *, too_deep: bool = False) -> None:
        super().__init__(detail)
        self.type, self.detail, self.too_deep = type_, detail, too_deep
        self.parts: list[str] = []  # innermost first
        self.objs: list[Any] = []  # the containers on the way, innermost first


def _too_deep(value: Any) -> _Unencodable:
    exc = _Unencodable(type(value), f"nested more than {MAX_DEPTH} levels deep", too_deep=True)
    exc.objs.append(value)
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
        item = stack.pop()
        if type(item) is str:
            yield item
        elif type(item) is dict:
            stack.extend(item)
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)


def _clock(tag: str, value: dt.datetime | dt.time) -> dict[str, Any]:
    out: dict[str, Any] = {TAG: tag, "v": value.isoformat()}
    tz = value.tzinfo
    if type(tz) is zoneinfo.ZoneInfo and tz.key:
        out["z"] = tz.key  # the ISO offset alone would lose the zone and its DST rules
    elif type(tz) is dt.timezone:
        offset, name = tz.utcoffset(None), tz.tzname(None)
        # Python 3.11 misreads ISO offsets of microseconds, and ISO has no zone names.
        if offset.microseconds or name != dt.timezone(offset).tzname(None):
            out["o"] = [offset // dt.timedelta(microseconds=1), name]
    if value.fold:
        out["f"] = 1
    return out


def _path(value: PurePath) -> dict[str, Any]:
    text = str(value)
    if type(value)(text) != value:  # some malformed UNC paths: better refused than changed
        raise _Unencodable(type(value), "pathlib does not read this path back from its text")
    return {TAG: "path", "k": type(value).__name__, "v": text}


class Encoder:
    """A codec's encoding half: values -> JSON-native structures -> JSON text.

    :param allowlist: where an encoded class is admitted, so this process decodes it.
    :param pickles: whether values of unsupported types may go as pickles.
    """

    def __init__(self, allowlist: ClassAllowlist, pickles: PicklePolicy) -> None:
        self._allowlist = allowlist
        self._pickles = pickles
        self._proxies: dict[type, Callable[[Any], Any]] = {}
        seq, b64 = self._dump_seq, base64.b64encode
        self._encoders: dict[type, _Handler] = {
            bytes: lambda v, _: {TAG: "bytes", "v": b64(v).decode()},
            bytearray: lambda v, _: {TAG: "bytearray", "v": b64(v).decode()},
            tuple: lambda v, depth: seq("tuple", v, depth),
            set: lambda v, depth: seq("set", v, depth),
            frozenset: lambda v, depth: seq("frozenset", v, depth),
            dt.datetime: lambda v, _: _clock("datetime", v),
            dt.date: lambda v, _: {TAG: "date", "v": v.isoformat()},
            dt.time: lambda v, _: _clock("time", v),
            dt.timedelta: lambda v, _: {
                TAG: "timedelta",
                "v": [v.days, v.seconds, v.microseconds],
            },
            Decimal: lambda v, _: {TAG: "decimal", "v": str(v)},
            uuid.UUID: lambda v, _: {TAG: "uuid", "v": str(v)},
        }
        for path_cls in PATHS.values():
            self._encoders[path_cls] = lambda v, _: _path(v)

    def register_proxy(self, cls: type, unwrap: Callable[[Any], Any]) -> None:
        """Encode instances of ``cls`` as the value ``unwrap(instance)`` returns."""
        dump = self._dump
        self._proxies[cls] = unwrap

        def enc_proxy(value: Any, depth: int) -> Any:
            try:
                return dump(unwrap(value), depth)
            except _Unencodable as exc:
                if exc.objs:
                    exc.objs[-1] = value  # the stand-in is what a cycle goes through
                raise

        self._encoders[cls] = enc_proxy

    def encode(self, value: object, depth: int, name: str) -> str:
        """``value`` as compact JSON text (see ``Codec.encode``).

        :raises EncodeError: as ``Codec.encode`` says.
        """
        data = self.dump(value, depth, name)
        try:
            return orjson.dumps(data).decode()
        except orjson.JSONEncodeError as exc:  # a lone surrogate: JSON text is UTF-8
            raise self._text_error(value, depth, name, exc) from None

    def dump(self, value: object, depth: int, name: str) -> Any:
        """The JSON-native structure of ``value`` (see ``Codec.dump``).

        :raises EncodeError: an unsupported type, or nesting past :data:`MAX_DEPTH`.
        """
        try:
            return self._dump(value, depth)
        except _Unencodable as exc:
            path, type_, detail = _where(name, exc)
            raise EncodeError(path, type_, detail) from exc.__cause__

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

    def _find_text_error(self, value: Any, depth: int) -> tuple[list[str], str] | None:
        """The path parts to the first string of value that JSON text cannot hold, and it.

        Walks value as :meth:`_dump` does, descending only into the part whose dump orjson
        refuses (slow, but only a refused value pays for it).
        """
        t = type(value)
        if t is str:
            return ([], value) if _surrogate_at(value) >= 0 else None
        try:
            orjson.dumps(self._dump(value, depth))
        except orjson.JSONEncodeError:
            pass
        else:
            return None
        children: list[tuple[str, Any]] = []
        if t is dict or t is list:
            items = value.items() if t is dict else enumerate(value)
            for i, (k, item) in enumerate(items):
                if t is dict:
                    key_part = f"<key #{i}>"
                    if type(k) is str and _surrogate_at(k) >= 0:
                        return [key_part], k
                    if type(k) is not str:
                        children.append((key_part, k))
                children.append((f"[{k!r}]", item))
        elif t is tuple or t is set or t is frozenset:
            try:
                ordered = value if t is tuple else sorted(value)
            except TypeError:
                ordered = list(value)
            mark = "[{}]" if t is tuple else "{{#{}}}"
            children = [(mark.format(i), item) for i, item in enumerate(ordered)]
        elif isinstance(value, Enum):
            children = [("", value.value)]
        elif (kind := kind_of(t)) is not None:
            if kind == "model":
                fields = (
                    value.__dict__
                    | (value.__pydantic_extra__ or {})
                    | (value.__pydantic_private__ or {})
                )
            else:
                fields = {n: getattr(value, n) for n, _ in fields_of(t, kind)}
            for n, item in fields.items():
                if _surrogate_at(n) >= 0:
                    return [f"<field #{list(fields).index(n)}>"], n
                children.append((f".{n}", item))
        elif t in self._proxies:
            return self._find_text_error(self._proxies[t](value), depth)
        for part, item in children:
            found = self._find_text_error(item, depth + 1)
            if found is not None:
                return [part, *found[0]], found[1]
        # The container's own text (a class name, a time zone's name, a path) is at fault.
        text = next((s for s in _texts(self._dump(value, depth)) if _surrogate_at(s) >= 0), None)
        return None if text is None else ([], text)

    def _dump(self, value: Any, depth: int) -> Any:
        # depth: the level of value (the root value is 1); a non-JSON-native value past the
        # limit is refused before anything else, which also ends the walk of a cyclic value.
        t = type(value)
        if t is str or t is bool or value is None:
            return value
        if t is int:
            if value in _I64:
                return value
            # str() refuses ints past 4300 digits (~14284 bits); hex has no limit
            return {TAG: "int", "v": str(value) if value.bit_length() < 14000 else hex(value)}
        if t is float:
            if math.isfinite(value):
                return value
            return {TAG: "float", "v": "nan" if value != value else "inf" if value > 0 else "-inf"}
        if depth > MAX_DEPTH:
            raise _too_deep(value)
        if t is dict:
            return self._dump_items(value, value.items(), depth)
        if t is list:
            return self._dump_items(value, enumerate(value), depth)
        return (self._encoders.get(t) or self._encoder_for(t))(value, depth)

    def _dump_items(
        self, container: Any, items: Iterable[Any], depth: int, *, fields: bool = False
    ) -> Any:
        # Copy on write: a container of JSON-native values goes to orjson as it is.
        out, is_dict, k, inner = None, type(container) is dict, None, depth + 1
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
                dumped = self._dump(v, inner)
                if dumped is not v:
                    if out is None:
                        out = container.copy()
                    out[k] = dumped
            else:
                return container if out is None else out
        except _Unencodable as exc:
            exc.parts.append(f".{k}" if fields else f"[{k!r}]")
            exc.objs.append(container)
            raise
        pairs: list[list[Any]] = []  # a non-str or "$t" key: the dict goes as [key, value] pairs
        in_key = True
        try:
            for k, v in container.items():
                in_key = True
                key = self._dump(k, inner)
                in_key = False
                pairs.append([key, self._dump(v, inner)])
        except _Unencodable as exc:
            exc.parts.append(
                f"<key #{len(pairs)}>" if in_key else f".{k}" if fields else f"[{k!r}]"
            )
            exc.objs.append(container)
            raise
        return {TAG: "dict", "v": pairs}

    def _dump_seq(self, tag: str, value: Any, depth: int) -> dict[str, Any]:
        items, out, inner = value, list[Any](), depth + 1
        if tag != "tuple":
            try:  # sorted, so that equal sets give equal text in every process (hashes vary)
                items = sorted(value)
            except TypeError:
                items = None
        try:  # extend keeps what it took before an error: len(out) is where it failed
            out.extend(map(self._dump, value if items is None else items, itertools.repeat(inner)))
        except _Unencodable as exc:
            exc.parts.append(f"[{len(out)}]" if tag == "tuple" else f"{{#{len(out)}}}")
            exc.objs.append(value)
            raise
        if items is None:  # items of no common order: by their JSON text then
            # Text orjson cannot write has no order; encode() then says where it is.
            with contextlib.suppress(orjson.JSONEncodeError):
                out.sort(key=orjson.dumps)
        return {TAG: tag, "v": out}

    def _encoder_for(self, cls: type) -> _Handler:
        kind = kind_of(cls)
        enc: _Handler = self._pickle
        if kind is None and not self._pickles.allowed:
            raise _Unencodable(cls, UNSUPPORTED.format(how=self._pickles.how_to_allow))
        if kind is not None:
            self._allowlist.admit(cls)  # so that this process decodes what it encoded
            enc = self._class_encoder(cls, kind)
        self._encoders[cls] = enc
        return enc

    def _class_encoder(self, cls: type, kind: str) -> _Handler:
        name, dump, fields = class_name(cls), self._dump, self._dump_fields
        if kind == "enum":
            return lambda member, depth: {
                TAG: "enum",
                "c": name,
                "v": dump(member.value, depth + 1),
            }
        version = class_version(cls)
        if version != 1:  # version 1 has no suffix: what was written before versions existed
            name = f"{name}@{version}"
        if kind == "model":

            def enc_model(model: BaseModel, depth: int) -> Any:
                out = {
                    TAG: "model",
                    "c": name,
                    "v": fields(model.__dict__ | (model.__pydantic_extra__ or {}), depth, model),
                }
                if model.__pydantic_private__:
                    out["p"] = fields(dict(model.__pydantic_private__), depth, model)
                return out

            return enc_model
        names = [n for n, _ in fields_of(cls, kind)]
        return lambda obj, depth: {
            TAG: kind,
            "c": name,
            "v": fields({n: getattr(obj, n) for n in names}, depth, obj),
        }

    def _dump_fields(self, raw: dict[str, Any], depth: int, owner: Any) -> Any:
        # raw is a new dict, so the copy-on-write walk may hand it back as it is.
        try:
            return self._dump_items(raw, raw.items(), depth, fields=True)
        except _Unencodable as exc:
            exc.objs[-1] = owner  # the object, not the dict made of its fields, is on the path
            raise

    def _pickle(self, value: object, _depth: int) -> dict[str, Any]:
        self._pickles.warn(f"pickling {type(value)!r}")
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickle raises many kinds
            raise _Unencodable(type(value), f"pickle failed: {exc}") from exc
        return {TAG: "pickle", "v": base64.b64encode(data).decode()}
