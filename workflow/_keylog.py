"""A context key's value as the fold keeps it (:class:`KeyLog`), which a snapshot may keep
by reference to the log: the fold then moves it over later patches without building it, and
the reader that loaded the snapshot builds it from the log when it is read.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

import orjson

from ._patch import apply_json

__all__ = ["KeyLog"]


class KeyLog:
    """A context key's JSON value and how many patch bytes followed its last full write.

    ``full_seq`` is the seq of that full write (None in states cached before it was kept).
    A snapshot may keep a value built by patches as a reference to the log: the key's full
    write at ``full_seq`` and its patches up to ``seq``, in the run's own log (``_snapshot``
    writes it). Such a value is ``unread``: the fold moves its ``seq`` over later patches
    without building it, and ``source`` (which the reader binds, so the fold stays pure)
    builds it from the log on the first read of :attr:`dump`.
    """

    __slots__ = (
        "_dump",
        "_size",
        "full_bytes",
        "full_seq",
        "moved",
        "patch_bytes",
        "seq",
        "source",
    )

    def __init__(
        self,
        dump: Any,
        full_bytes: int,
        patch_bytes: int = 0,
        seq: int = 0,
        full_seq: int | None = None,
        *,
        source: Callable[[KeyLog], Any] | None = None,
    ) -> None:
        self._dump = dump
        self.full_bytes = full_bytes
        self.patch_bytes = patch_bytes
        self.seq = seq  # its last write
        self.full_seq = full_seq
        self.source = source
        self.moved = False  # an unread value patched since it was read from its snapshot
        # (about the length of the value's JSON, the history bytes when it was taken): a
        # value just written whole weighs about its record's payload.
        self._size: tuple[int, int] | None = (
            (full_bytes, full_bytes) if patch_bytes == 0 and dump is not _UNREAD else None
        )

    @classmethod
    def unread(cls, full_bytes: int, patch_bytes: int, seq: int, full_seq: int) -> KeyLog:
        """A value a snapshot keeps by reference to the log, to be built when read."""
        return cls(_UNREAD, full_bytes, patch_bytes, seq, full_seq)

    @classmethod
    def deferred(cls, full_bytes: int, seq: int, source: Callable[[KeyLog], Any]) -> KeyLog:
        """A value just written whole at ``seq`` whose record is not decoded: built by
        ``source`` from the log when read. Its size is known as the record's, as for a
        value decoded from it, so a snapshot weighs it alike."""
        new = cls(_UNREAD, full_bytes, 0, seq, seq, source=source)
        new._size = (full_bytes, full_bytes)
        return new

    @property
    def is_unread(self) -> bool:
        """Whether the value is still only a reference to the log."""
        return self._dump is _UNREAD

    @property
    def dump(self) -> Any:
        """The value's JSON, built from the log first if it is :attr:`is_unread`."""
        if self._dump is _UNREAD:
            if self.source is None:
                msg = (
                    f"context value at seq {self.seq} is kept by reference to the log"
                    f" (from seq {self.full_seq}) and no reader bound it to its store"
                )
                raise LookupError(msg)
            self._dump = self.source(self)
            self.source = None
        return self._dump

    @dump.setter
    def dump(self, value: Any) -> None:
        self._dump = value
        self.source = None
        self._size = None

    def json_size(self) -> int:
        """About the length of the value's JSON, for a snapshot's choice between a copy and
        a reference (a heuristic: either is exact).

        Measured (one C-speed encode of the value) at most once per the value's size of
        log written since it was last measured, and taken from the full write's payload
        until then: a snapshot written every few steps would otherwise encode a large
        value each time only to weigh it, a cost growing with the value, not the change.
        """
        history = self.full_bytes + self.patch_bytes
        known = self._size
        if known is not None and history - known[1] < known[0]:
            return known[0]
        size = len(orjson.dumps(self.dump))
        self._size = (size, history)
        return size

    def patched(self, patch: Any, seq: int, size: int) -> None:
        """Applies a patch record's patch (an unread value only moves its seq)."""
        if self._dump is _UNREAD:
            self.moved = True
        else:
            self._dump = apply_json(self._dump, patch)
        self.patch_bytes += size
        self.seq = seq

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyLog):
            return NotImplemented
        mine = (self.full_bytes, self.patch_bytes, self.seq, self.full_seq)
        theirs = (other.full_bytes, other.patch_bytes, other.seq, other.full_seq)
        return mine == theirs and self.dump == other.dump

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict[int, Any]) -> KeyLog:
        # An unread value shares its source (the store it reads from); a value is copied.
        dump = self._dump if self._dump is _UNREAD else copy.deepcopy(self._dump, memo)
        new = KeyLog(dump, self.full_bytes, self.patch_bytes, self.seq, self.full_seq)
        new.source, new.moved, new._size = self.source, self.moved, self._size
        return new

    def __repr__(self) -> str:
        shown = "<unread>" if self._dump is _UNREAD else repr(self._dump)
        return (
            f"KeyLog({shown}, {self.full_bytes}, {self.patch_bytes}, {self.seq},"
            f" full_seq={self.full_seq})"
        )


# What an unread KeyLog holds in place of its value.
_UNREAD: Final = object()
