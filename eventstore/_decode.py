"""Decoding: the JSON-native structure of :mod:`._tags` -> the typed values it was made of.

Objects are rebuilt from the runtime types recorded in the log, not from declared field types:
cattrs structuring and pydantic validation go by declarations, which would turn a tuple in an
``Any`` field into a list or an int in a ``float`` field into a float. So dataclasses and
attrs classes are rebuilt by calling the class, and pydantic models by ``model_construct``
(their values were validated when first built). An older version of a class's payload goes
through its upcasters (:mod:`._upcast`) first.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import os
import pickle
import sys
import typing
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

from ._allowlist import ClassAllowlist
from ._errors import CodecError, DecodeError
from ._tags import FLOATS, MALFORMED, PATHS, TAG, PicklePolicy, fields_of, kind_of, split_version
from ._upcast import Upcaster, upcasts_for

__all__ = ["Decoder"]

_Builder = Callable[[Any], Any]  # a tagged object's dump -> the object


def _get(tagged: dict[str, Any], key: str, type_: type) -> Any:
    value = tagged[key]
    if type(value) is not type_:
        msg = f"{key!r} should be a {type_.__name__}"
        raise TypeError(msg)
    return value


def _str(tagged: dict[str, Any]) -> str:
    return typing.cast("str", _get(tagged, "v", str))


def _as_dict(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        msg = "fields should be an object"
        raise TypeError(msg)
    return value


def _unb64(tagged: dict[str, Any]) -> bytes:
    return base64.b64decode(_str(tagged), validate=True)


class Decoder:
    """A codec's decoding half: JSON-native structures -> typed values; never imports.

    :param allowlist: what class a name in the log stands for.
    :param pickles: whether a pickle in the log may be read.
    """

    def __init__(self, allowlist: ClassAllowlist, pickles: PicklePolicy) -> None:
        self._allowlist = allowlist
        self._pickles = pickles
        # class name as tagged -> (its kind, its builder); dropped when the name may resolve anew
        self._builders: dict[str, tuple[str | None, _Builder]] = allowlist.cache()
        self._zones: dict[str, zoneinfo.ZoneInfo] = {}
        load, items = self.load, self._load_items
        self._decoders: dict[str, Callable[[dict[str, Any]], Any]] = {
            "int": lambda t: int(_str(t), 0),
            "float": lambda t: FLOATS[_str(t)],
            "bytes": _unb64,
            "bytearray": lambda t: bytearray(_unb64(t)),
            "tuple": lambda t: tuple(items(t)),
            "set": lambda t: set(items(t)),
            "frozenset": lambda t: frozenset(items(t)),
            "dict": lambda t: {load(k): load(v) for k, v in _get(t, "v", list)},
            "datetime": lambda t: self._zoned(dt.datetime.fromisoformat(_str(t)), t),
            "date": lambda t: dt.date.fromisoformat(_str(t)),
            "time": lambda t: self._zoned(dt.time.fromisoformat(_str(t)), t),
            "timedelta": lambda t: dt.timedelta(*_get(t, "v", list)),
            "decimal": lambda t: Decimal(_str(t)),
            "uuid": lambda t: uuid.UUID(_str(t)),
            "path": lambda t: PATHS[t["k"]](_str(t)),
            "pickle": self._unpickle,
        }
        for kind in ("enum", "model", "dataclass", "attrs"):
            self._decoders[kind] = self._build

    def load(self, data: Any) -> Any:
        """The value whose dump is ``data``; untagged parts are not copied."""
        # Copy on write: only containers with a tag somewhere below them are rebuilt.
        t = type(data)
        if t is dict:
            if TAG in data:
                return self._untag(data)
            items: Iterable[tuple[Any, Any]] = data.items()
        elif t is list:
            items = enumerate(data)
        else:
            return data
        out = None
        for k, v in items:
            if type(v) is dict or type(v) is list:
                loaded = self.load(v)
                if loaded is not v:
                    if out is None:
                        out = data.copy()
                    out[k] = loaded
        return data if out is None else out

    def _load_items(self, tagged: dict[str, Any]) -> Iterator[Any]:
        return map(self.load, _get(tagged, "v", list))

    def _untag(self, tagged: dict[str, Any]) -> Any:
        tag = tagged[TAG]
        dec = self._decoders.get(tag) if type(tag) is str else None
        if dec is None:
            msg = f"unknown tag {tag!r} in {repr(tagged)[:200]}"
            raise DecodeError(msg)
        try:
            return dec(tagged)
        except CodecError:
            raise
        except MALFORMED as exc:
            msg = f"malformed {tag!r} value {repr(tagged)[:200]}: {exc!r}"
            raise DecodeError(msg) from exc

    def _zoned(self, value: Any, tagged: dict[str, Any]) -> Any:
        if "o" in tagged:
            offset, name = _get(tagged, "o", list)
            value = value.replace(tzinfo=dt.timezone(dt.timedelta(microseconds=offset), name))
        if "z" in tagged:
            key = _get(tagged, "z", str)
            zone = self._zones.get(key)
            if zone is None:
                # Without a zone file ZoneInfo imports the tzdata package; decode never may.
                if "tzdata" not in sys.modules and not any(
                    os.path.isfile(os.path.join(root, key)) for root in zoneinfo.TZPATH
                ):
                    msg = f"no zone file for time zone {key!r} (and tzdata is not imported)"
                    raise DecodeError(msg)
                zone = self._zones[key] = zoneinfo.ZoneInfo(key)
            value = value.replace(tzinfo=zone)
        return value.replace(fold=1) if tagged.get("f") else value

    def _unpickle(self, tagged: dict[str, Any]) -> Any:
        if not self._pickles.allowed:
            how = self._pickles.how_to_allow
            msg = f"the value is a pickle and pickle is disabled; use {how}"
            raise DecodeError(msg)
        self._pickles.warn("unpickling")
        return pickle.loads(_unb64(tagged))  # opted in, and warned about

    def _build(self, tagged: dict[str, Any]) -> Any:
        name = _get(tagged, "c", str)
        entry = self._builders.get(name)
        if entry is None:
            base, stored = split_version(name)
            cls = self._allowlist.resolve(base)
            kind = kind_of(cls)
            upcasts = [] if kind == "enum" else upcasts_for(name, cls, stored)
            entry = self._builders[name] = (kind, self._class_builder(cls, upcasts))
        if entry[0] != tagged[TAG]:
            msg = f"{name!r} is tagged {tagged[TAG]!r} but the class is of kind {entry[0]!r}"
            raise DecodeError(msg)
        try:
            return entry[1](tagged)
        except CodecError:
            raise
        except Exception as exc:  # the class's own __init__ may raise anything
            msg = f"cannot rebuild {name!r} from {repr(tagged)[:200]}: {exc!r}"
            raise DecodeError(msg) from exc

    def _class_builder(self, cls: type, upcasts: list[Upcaster]) -> _Builder:
        kind, load = kind_of(cls), self.load
        if kind == "enum":
            return lambda tagged: cls(load(tagged["v"]))

        def values_of(tagged: dict[str, Any]) -> dict[str, Any]:
            values = _as_dict(load(tagged["v"]))
            if upcasts:  # an older version's fields, brought up one version at a time
                values = copy.deepcopy(values)  # untagged parts are the stored dump's own
                for up in upcasts:
                    values = _as_dict(up(values))
            return values

        if kind == "model":

            def build_model(tagged: dict[str, Any]) -> Any:
                obj = cls.model_construct(**values_of(tagged))  # type: ignore[attr-defined]
                if "p" in tagged:
                    private = _as_dict(load(tagged["p"]))
                    if obj.__pydantic_private__ is None:
                        object.__setattr__(obj, "__pydantic_private__", private)
                    else:
                        obj.__pydantic_private__.update(private)
                return obj

            return build_model
        # Init fields go to __init__ (by their attrs alias); the others are set after it.
        fields = fields_of(cls, typing.cast("str", kind))
        init = {n: arg for n, arg in fields if arg is not None}
        late = {n for n, arg in fields if arg is None}

        def build_fields(tagged: dict[str, Any]) -> Any:
            values = values_of(tagged)
            # Names of no field (one since removed) are ignored, as pydantic does by default.
            obj = cls(**{init[k]: v for k, v in values.items() if k in init})
            for k, v in values.items():
                if k in late:
                    object.__setattr__(obj, k, v)
            return obj

        return build_fields
