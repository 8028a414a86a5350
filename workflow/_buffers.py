"""Collect buffers: how they are named, in every shape the log has written.

A buffer is a step's (as in LlamaIndex): the executor keeps it under :func:`buffer_key`
and so does the fold, whatever module its classes were imported as. ``collected`` records
before ``"v": 2`` named buffers and classes with their modules; :func:`collect_key` reads
both shapes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

from ._journal import Collected

__all__ = [
    "buffer_key",
    "class_qualname",
    "collect_key",
    "default_buffer_id",
    "legacy_buffer_key",
    "taken",
]


def class_qualname(name: str) -> str:
    """A class name as the log writes it (``module:Qual.Name``) without its module."""
    return name.rpartition(":")[2]


def default_buffer_id(step: str, qualnames: Sequence[str]) -> str:
    """The id of a collect buffer given no ``buffer_id=``: a digest of the step and the
    expected classes' qualified names, the same whatever module they were imported as."""
    text = step + "\n" + ",".join(qualnames)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def join_buffer_id(step: str, qualnames: Sequence[str]) -> str:
    """The id of the buffer where a join (a step with several event parameters) keeps its
    inputs: its own, apart from any the step's code fills with ``collect_events``."""
    return default_buffer_id(step + "\njoin", qualnames)


def buffer_key(step: str, buffer: str) -> str:
    """Where the fold and the executor keep a step's buffer: ids are per step, as in LlamaIndex."""
    return f"{step}:{buffer}"


def collect_key(step: str, payload: Collected) -> str:
    """The :func:`buffer_key` of the buffer a ``collected`` record changes, in every shape.

    Records before ``"v": 2`` named the buffer ``step:mod:A,mod:B`` (by full class names):
    the same buffer as the default id of those classes' qualified names.
    """
    buf = payload["buf"]
    if payload.get("v") is None:
        return legacy_buffer_key(buf)
    return buffer_key(step, buf)


def legacy_buffer_key(buf: str) -> str:
    """The :func:`buffer_key` of a buffer id written before ``"v": 2`` (``step:mod:A,...``)."""
    step, _, names = buf.partition(":")
    return buffer_key(step, default_buffer_id(step, [class_qualname(n) for n in names.split(",")]))


def taken(payload: Collected) -> list[tuple[str, int]]:
    """What a ``collected`` record took out, in every shape: (qualified class name without
    module, how many events of it), each class once.

    Records since ``takes`` count the events of each class; records before named one class
    per event taken (``take``), with modules before ``"v": 2``.
    """
    takes = payload.get("takes")
    if takes is not None:
        return list(takes.items())
    return list(Counter(class_qualname(n) for n in payload.get("take") or ()).items())
