"""Context changes: what an attempt's writes become in the log and in the live state.

A write is encoded where it is made (``ctx.store.set``, an operator update) with the
encoder the commit uses, on what the commit writes: a tracked value's patch, each part
counted at the depth where it sits, or a new value whole (its patch from the committed
value is made then too). So ``set()`` refuses exactly what the commit could not write, and
the commit writes the text made then, without encoding the value again.

A write is recorded as a patch at the size of the change, or as the whole value once the
patches since its last full write weigh as much as that write (so the fold replays at most
the value's size in patches, and the bytes stay linear in the changes; a fixed "whole
value every K patches" rule would grow quadratically with a growing value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from eventstore import EncodeError

from ._diff import KeyRef, Op, Tracker, diff
from ._errors import WorkflowRuntimeError
from ._values import ATOMS

if TYPE_CHECKING:
    from eventstore import Codec

__all__ = [
    "ABSENT",
    "BY_SET",
    "BY_UPDATE",
    "MIN_FULL_BYTES",
    "Encoded",
    "KeyChange",
    "check_key",
    "encode_ops",
    "encode_tracked",
    "encode_updates",
    "encode_value",
    "refused",
    "value_change",
]

MIN_FULL_BYTES: Final = 256


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final[Any] = _Absent()


@dataclass(slots=True)
class KeyChange:
    """One key's change by a commit: deleted, written whole, or patched."""

    key: str
    deleted: bool = False
    full: Any = None  # the new Python value, when written whole: plain, holding no view
    text: str | None = None  # its JSON text
    ops: list[Any] | None = None  # Python-form ops, when patched
    ops_json: bytes | None = None  # their JSON text
    size: int = 0  # bytes of its record's payload
    seq: int = 0  # the seq of the commit that applied it (0: not applied)


@dataclass(frozen=True, slots=True)
class Encoded:
    """A value as the log will hold it: its JSON text, and the value read back from it.

    The value read back is what the commit applies: it shares nothing with the caller's
    value (which may change after the call) and equals what a fold of the log gives.
    """

    text: str
    value: Any


def refused(exc: EncodeError, how: str) -> EncodeError:
    """``exc`` with what refused it (``"refused by ctx.store.set('k', ...)"``) appended."""
    return EncodeError(exc.path, exc.type, f"{exc.detail}; {how}")


# What refused a write, formatted with its path only when it is refused.
BY_SET: Final = "refused by ctx.store.set({!r}, ...)"
BY_UPDATE: Final = "refused by an operator update of {!r}"


def check_key(codec: Codec, key: str, how: str, path: str) -> None:
    """Refuses a context key that JSON text cannot hold (a lone surrogate)."""
    try:
        codec.encode(key, name=f"the key {key!r}")
    except EncodeError as exc:
        raise refused(exc, how.format(path)) from None


def encode_value(codec: Codec, key: str, value: Any, how: str, path: str) -> str:
    """A new value of ``key``, encoded whole (views in it are written as what they show).

    :raises EncodeError: it cannot be stored; the path starts with ``key``.
    """
    try:
        return codec.encode(value, name=key)
    except EncodeError as exc:
        raise refused(exc, how.format(path)) from None


def encode_ops(codec: Codec, ops: list[Op], name: str) -> tuple[bytes, str | None]:
    """The JSON text of a patch, and of the new value when the patch replaces it whole.

    Each value is dumped at the level where it sits in the key's value, so a patch never
    makes the value nest deeper than ``Codec.MAX_DEPTH``; the patch is serialized once.
    The text is what :func:`~workflow._patch.ops_to_json` gives, serialized.

    :raises EncodeError: a value of the patch cannot be stored.
    :raises orjson.JSONEncodeError: a string of the patch JSON cannot hold (the caller
        finds it: :func:`encode_tracked`).
    """
    if len(ops) == 1 and ops[0][0] == "replace" and not ops[0][1]:
        whole = codec.encode(ops[0][2], name=name)
        return b'[["replace",[],' + whole.encode() + b"]]", whole
    dump = codec.dump
    out: list[Any] = []
    for kind, path, *args in ops:
        n = len(path)
        elems = [
            {"k": dump(e.key, depth=i + 2, name=name)} if type(e) is KeyRef else e
            for i, e in enumerate(path)
        ]
        if kind in ("set", "replace", "extend"):  # extend: the list of values stands there
            args = [dump(args[0], depth=n + 1, name=name)]
        elif kind == "append":
            args = [dump(args[0], depth=n + 2, name=name)]
        out.append([kind, elems, *args])
    return orjson.dumps(out), None


def encode_tracked(
    codec: Codec, key: str, tracker: Tracker, how: str, path: str
) -> KeyChange | None:
    """What a tracked value's view has changed so far, encoded: the change the commit
    writes (None: nothing changed). Its values are fresh copies.

    :raises EncodeError: what the view now holds cannot be stored; the path starts with
        ``key`` and goes from the root of the value.
    """
    try:
        ops = tracker.ops()
        text, whole = encode_ops(codec, ops, key)
    except (EncodeError, orjson.JSONEncodeError, RecursionError):
        # Copying a cyclic or very deep part recurses without end, and a patch's error
        # names the path inside one op: the whole view, encoded, says where from the root.
        try:
            codec.encode(tracker.view, name=key)
        except EncodeError as whole_exc:
            raise refused(whole_exc, how.format(path)) from None
        raise
    if not ops:
        return None
    if whole is not None:
        return KeyChange(key, full=ops[0][2], text=whole)
    return KeyChange(key, ops=ops, ops_json=text)


def value_change(
    codec: Codec,
    committed: Mapping[str, Any],
    versions: Mapping[str, int],
    key: str,
    value: Any,
    text: str | None,
    *,
    hint: Tracker | None = None,
    size: int | None = None,
    how: str = "",
) -> tuple[KeyChange | None, int]:
    """The change a new value of ``key`` makes to its committed value, made now (at
    ``set()``), and the key's version it was made against.

    ``text`` is the value encoded whole, or None when the value may derive from ``hint``
    (the attempt's view of the key): what it shares with the committed value, by identity
    (``items + [x]``, ``{**d, k: v}``), is not encoded again, so the change costs its size;
    only the parts that changed are encoded (and so checked). ``size`` is about the bytes
    of the committed value, to choose between a patch and the whole value. The patch's
    values are fresh copies, so what is written is the value as it is now.

    :raises EncodeError: what changed cannot be stored; the path starts with ``key``.
    """
    version = versions.get(key, 0)
    old = committed.get(key, ABSENT)
    if type(value) in ATOMS and (old is ABSENT or type(old) in ATOMS):
        # A scalar is its own smallest patch: written whole, or not at all if its text is
        # the committed one's (so 1, 1.0 and True stay apart).
        if text is None:
            text = encode_value(codec, key, value, "{}", how)
        if old is not ABSENT and (old is value or codec.encode(old) == text):
            return None, version
        return KeyChange(key, full=value, text=text), version
    if old is ABSENT:
        if text is None:
            text = encode_value(codec, key, value, "{}", how)
        return KeyChange(key, full=codec.decode(text), text=text), version
    if hint is not None and hint.base is not old:
        hint = None  # the view is of a value since replaced: identity says nothing
    try:
        whole = len(text) if text is not None else size
        ops = diff(old, value, codec, whole_size=whole, hint=hint, text=text)
        if ops and ops[0][:2] != ("replace", ()):
            ops_json = encode_ops(codec, ops, key)[0]
    except (EncodeError, orjson.JSONEncodeError, RecursionError) as exc:
        if text is not None:
            raise
        encode_value(codec, key, value, "{}", how)  # says where, from the root of the value
        if isinstance(exc, EncodeError):
            raise refused(exc, how) from None
        raise
    if not ops:
        return None, version
    if ops[0][:2] == ("replace", ()):
        if text is None:
            text = encode_value(codec, key, value, "{}", how)
            return KeyChange(key, full=codec.decode(text), text=text), version
        return KeyChange(key, full=ops[0][2], text=text), version
    return KeyChange(key, ops=ops, ops_json=ops_json), version


def encode_updates(codec: Codec, updates: Mapping[str, Any] | None) -> dict[str, Encoded]:
    """Operator updates (``resume``/``run_from`` ``updates``, ``handler.ctx``), encoded.

    Called where the update is asked for, so a value the log cannot hold is refused there,
    before anything is claimed or recorded. Values already encoded are kept.

    :raises EncodeError: a value cannot be stored; the path starts with its key.
    :raises WorkflowRuntimeError: a key is a dotted path.
    """
    out: dict[str, Encoded] = {}
    for key, value in (updates or {}).items():
        if isinstance(value, Encoded):
            out[key] = value
            continue
        if "." in key:
            msg = f"operator updates take top-level keys, not the path {key!r}"
            raise WorkflowRuntimeError(msg)
        if not key.isascii():
            check_key(codec, key, BY_UPDATE, key)
        text = encode_value(codec, key, value, BY_UPDATE, key)
        out[key] = Encoded(text, codec.decode(text))
    return out
