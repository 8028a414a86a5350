"""The live context of a run an executor runs: its committed values, their versions, and
what the attempts reading them pin.

A write is a :class:`~workflow._changes.KeyChange` made where it was set; here it becomes
records (a patch at the size of the change, or the whole value once the patches since its
last full write weigh as much as that write: see ``workflow/_changes.py``) and, once its
commit is durable, the new committed value. The executor owns one; the context's store
reads ``committed``, ``versions`` and ``keylog`` through the executor.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from eventstore import CodecError, LogCorruptedError, Record, UnknownClassError

from . import _journal as journal
from ._changes import ABSENT, MIN_FULL_BYTES, Encoded, KeyChange, encode_ops
from ._diff import apply, diff
from ._folded import not_damage
from ._patch import apply_copied

if TYPE_CHECKING:
    from eventstore import Codec

    from ._attempt import Attempt
    from ._fold import Folded

__all__ = ["LiveContext"]


class LiveContext:
    """A run's context values as its durable commits left them, with their versions.

    ``versions`` is each key's version as the live state has it (the seq of the commit
    that last changed it, once that took effect); ``written`` is the same as the writer
    has it (set in the writer, in seq order, as a commit is written), which conflict
    checks compare an attempt's reads with. ``keylog`` holds each value's bytes in the
    log: its last full write and the patches since.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.committed: dict[str, Any] = {}
        self.versions: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.keylog: dict[str, list[int]] = {}
        # Per list key, its text in the log since its last full write, as pieces: that
        # text, and the text of each item appended since, kept as the bytes of its patch
        # (decoded once, when they are joined: see :func:`_grown_text`).
        self.texts: dict[str, tuple[str, list[bytes]]] = {}
        self.pins: dict[str, int] = {}  # key -> live attempts that read it
        # Held by an edit_state attempt (and one that conflicted too often) until it ends.
        self.state_lock = asyncio.Lock()

    def load(self, folded: Folded) -> None:
        """Loads the values of ``folded`` (JSON form; its objects become the live values).

        :raises UnknownClassError: a value names a class this program lacks.
        :raises LogCorruptedError: a value does not decode (the record is named).
        """
        load = self.codec.load
        for key, entry in folded.context.items():
            try:
                self.committed[key] = load(entry.dump)
            except UnknownClassError as exc:  # not damage: a class this program lacks
                exc.add_note(
                    f"in record seq {entry.seq} of run {folded.run_id!r}, context key {key!r}"
                )
                raise
            except CodecError as exc:  # refused with the record named, before any work
                not_damage(
                    exc, f"record seq {entry.seq} of run {folded.run_id!r}, context key {key!r}"
                )
                msg = f"record seq {entry.seq} of run {folded.run_id!r}: context key {key!r}: {exc}"
                raise LogCorruptedError(msg, seq=entry.seq) from exc
            self.keylog[key] = [entry.full_bytes, entry.patch_bytes]

    def clear(self) -> None:
        """Forgets the values (the executor starts over from a newer fold)."""
        self.committed.clear()
        self.keylog.clear()
        self.texts.clear()

    # ------------------------------------------------------------------ reads

    def pin(self, key: str) -> None:
        """An attempt read ``key``: its value must not change under it until it ends."""
        self.pins[key] = self.pins.get(key, 0) + 1

    def unpin(self, att: Attempt) -> None:
        """The attempt's reads end."""
        pins = self.pins
        for key in att.reads:
            n = pins.get(key, 0) - 1
            if n > 0:
                pins[key] = n
            else:
                pins.pop(key, None)

    def stale(self, att: Attempt) -> list[str]:
        """The keys the attempt read that a written commit changed since (a conflict)."""
        w = self.written
        return [k for k, v in att.reads.items() if w.get(k, 0) != v]

    def stale_of(self, read: Mapping[str, int]) -> list[str]:
        """The keys of ``read`` (key -> the version read) that a written commit changed
        since, sorted: an operator's read-modify-write that a step overtook."""
        w = self.written
        return sorted(k for k, v in read.items() if w.get(k, 0) != v)

    def mark_written(self, keys: list[str], seq: int) -> None:
        """The commit at ``seq`` that changes ``keys`` is written (called in the writer)."""
        for k in keys:
            self.written[k] = seq

    # ------------------------------------------------------------------ changes

    def key_changes(self, att: Attempt) -> list[KeyChange]:
        """What the attempt's writes change, as its commit writes them."""
        out: list[KeyChange] = []
        for key, w in att.writes.items():
            if w.deleted:
                if key in self.committed:
                    out.append(KeyChange(key, deleted=True))
            elif w.tracker is not None or self.versions.get(key, 0) == w.version:
                if w.change is not None:  # made at set()
                    out.append(w.change)
            else:
                # A new value set without reading the key, which a commit changed since:
                # the change made at set() may not fit what is there now; written whole.
                # (A value derived from a view of the key has no text: its attempt read
                # the key, so it conflicts and this commit is not written.)
                text = w.text if w.text is not None else self.codec.encode(w.value, name=key)
                out.append(KeyChange(key, full=self.codec.decode(text), text=text))
        return out

    def update_change(self, key: str, new: Encoded) -> KeyChange | None:
        """An operator's new value of ``key``: the patch from the committed value, or whole."""
        old = self.committed.get(key, ABSENT)
        if old is ABSENT:
            return KeyChange(key, full=new.value, text=new.text)
        ops = diff(old, new.value, self.codec, text=new.text)
        if not ops:
            return None
        if ops[0][:2] == ("replace", ()):
            return KeyChange(key, full=new.value, text=new.text)
        return KeyChange(key, ops=ops, ops_json=encode_ops(self.codec, ops, key)[0])

    def state_records(self, step: str | None, changes: list[KeyChange]) -> list[Record]:
        """The records of context changes; each change learns its record's size."""
        records = []
        for ch in changes:
            if ch.deleted:
                records.append(journal.state_deleted(step, ch.key))
                continue
            if ch.ops is not None:
                assert ch.ops_json is not None
                log = self.keylog.get(ch.key)
                if log is not None and log[1] + len(ch.ops_json) < max(log[0], MIN_FULL_BYTES):
                    rec = journal.state_set_patch(step, ch.key, orjson.Fragment(ch.ops_json))
                    ch.size = len(rec.payload)
                    records.append(rec)
                    continue
                # Time to write the value whole again: the new value, sharing what the
                # patch does not touch with the committed value (no deep copy of it).
                text = _grown_text(self.texts.get(ch.key), ch)
                ch.full, ch.ops = apply_copied(self.committed[ch.key], ch.ops), None
                ch.text = self.codec.encode(ch.full, name=ch.key) if text is None else text
            assert ch.text is not None
            rec = journal.state_set_value(step, ch.key, orjson.Fragment(ch.text))
            ch.size = len(rec.payload)
            records.append(rec)
        return records

    def apply(self, changes: list[KeyChange], seq: int) -> None:
        """The commit at ``seq`` is durable: its changes take effect."""
        for ch in changes:
            key = ch.key
            self.versions[key] = seq
            ch.seq = seq
            if ch.deleted:
                self.committed.pop(key, None)
                self.keylog.pop(key, None)
                self.texts.pop(key, None)
                continue
            size = ch.size
            if ch.ops is not None:
                current = self.committed[key]
                if self.pins.get(key):
                    # Another live attempt reads this value: never change it under it.
                    current = copy.deepcopy(current)
                self.committed[key] = apply(current, ch.ops)
                log = self.keylog.setdefault(key, [size, 0])
                log[1] += size
                known = self.texts.get(key)
                if known is not None:
                    item = _appended_text(ch)
                    if item is None:
                        del self.texts[key]
                    else:
                        known[1].append(item)
            else:
                self.committed[key] = ch.full  # plain: no view is ever written whole
                self.keylog[key] = [size, 0]
                if ch.text is not None and ch.text.startswith("["):
                    self.texts[key] = (ch.text, [])
                else:
                    self.texts.pop(key, None)


# The JSON text of a patch that appends to the root list, around what it appends (one item,
# or the items of an extend, comma-separated), as ``encode_ops`` writes it.
_APPEND: Final = (b'[["append",[],', b"]]")
_EXTEND: Final = (b'[["extend",[],[', b"]]]")


def _appended_text(ch: KeyChange) -> bytes | None:
    """The text of what ch's patch appends to its root list, as bytes (None: it does
    something else).

    The items are dumped at the depth they have in the list, as ``Codec.encode`` of the
    whole list dumps them, and serialized by the same ``orjson.dumps``: the list's text
    is its old text with these items inserted before its closing bracket.
    """
    ops, raw = ch.ops, ch.ops_json
    if ops is None or raw is None or len(ops) != 1 or ops[0][1] != ():
        return None
    kind = ops[0][0]
    if kind == "append":
        head, tail = _APPEND
    elif kind == "extend" and ops[0][2]:
        head, tail = _EXTEND
    else:
        return None
    if not (raw.startswith(head) and raw.endswith(tail)):
        return None
    return raw[len(head) : len(raw) - len(tail)]


def _grown_text(known: tuple[str, list[bytes]] | None, ch: KeyChange) -> str | None:
    """The text of ch's key once ch's patch applies, from the text the log holds and the
    items appended since (None: not known that way; encode the value).

    The same text ``Codec.encode`` writes, made without walking the value in Python: a list
    of models written whole again costs a join of strings, not a walk of every model.
    """
    if known is None:
        return None
    item = _appended_text(ch)
    if item is None:
        return None
    first, items = known
    added = b",".join([*items, item]).decode()
    return "[" + added + "]" if first == "[]" else first[:-1] + "," + added + "]"
