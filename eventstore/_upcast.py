"""Versions and upcasting: reading the payloads of a class's older shapes.

A dataclass, attrs class or pydantic model may declare the version of its shape as a class
attribute of its own, ``__version__ = 2`` (not inherited; absent means 1). The version is
written in the class name of the tag (``"pkg.mod:Cls@2"``; version 1 is written without a
suffix, so logs written before versions existed read as version 1). On decode, a payload of
an older version goes through the upcasters registered with :func:`upcaster` (1 -> 2,
2 -> 3, ...), each taking the stored fields as a dict of decoded values and returning the
next version's, before the class is built. The stored text is never changed. A version with
no upcaster path is refused with :class:`UpcastError`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ._errors import UpcastError
from ._tags import VERSION, class_name, class_version

__all__ = ["Upcaster", "upcast", "upcaster", "upcasts_for"]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]  # one version's fields -> the next's
_UPCASTERS: dict[type, dict[int, Upcaster]] = {}  # class -> from_version -> upcaster


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
            f" version {current} ({VERSION}), so from_version must be 1..{current - 1}"
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


def upcasts_for(name: str, cls: type, stored: int) -> list[Upcaster]:
    """The upcasters that bring ``cls``'s fields from version ``stored`` to its current one.

    :param name: the class name as the tag wrote it, for the error.
    :raises UpcastError: ``stored`` is newer than the class, or a step has no upcaster.
    """
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


def upcast(cls: type, stored: int, fields: dict[str, Any], *, name: str = "") -> dict[str, Any]:
    """``cls``'s ``fields`` stored at version ``stored``, brought to its current version by
    the registered upcasters (a copy: ``fields`` is left as it is). For values stored field by
    field rather than as one payload, e.g. a typed state model's context keys.

    :raises UpcastError: no chain of upcasters leads from ``stored`` to the current version.
    """
    ups = upcasts_for(name or class_name(cls), cls, stored)
    values = copy.deepcopy(fields) if ups else fields
    for up in ups:
        values = up(values)
        if not isinstance(values, dict):
            msg = f"an upcaster of {class_name(cls)} returned {type(values).__name__}, not a dict"
            raise TypeError(msg)
    return values
