"""Context changes: what an attempt's writes become in the log and in the live state.

A write is recorded as a patch at the size of the change, or as the whole value once the
patches since its last full write weigh as much as that write (so the fold replays at most
the value's size in patches, and the bytes stay linear in the changes; a fixed "whole
value every K patches" rule would grow quadratically with a growing value).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from eventstore import Record

from . import _journal as J
from ._diff import apply, diff, materialize
from ._errors import WorkflowRuntimeError
from ._patch import ops_to_json, patch_size

if TYPE_CHECKING:
    from eventstore import Codec

    from ._context import Attempt

__all__ = ["ABSENT", "MIN_FULL_BYTES", "ContextChanges", "KeyChange"]

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
    full: Any = None  # the new Python value, when written whole
    ops: list[Any] | None = None  # Python-form ops, when patched
    size: int = 0  # bytes of its record's payload


class ContextChanges:
    """Context writes of :class:`~workflow._runner.Executor` (its base class)."""

    # What this part uses of the executor.
    codec: Codec
    committed: dict[str, Any]
    versions: dict[str, int]
    _wversions: dict[str, int]
    _keylog: dict[str, list[int]]
    _pins: dict[str, int]
    state_lock: asyncio.Lock

    if TYPE_CHECKING:

        async def append(self, records: list[Record], **kw: Any) -> int: ...

        async def wait_ready(self) -> None: ...

        def _observe(self, seq: int) -> None: ...

    # ------------------------------------------------------------------ context changes

    def _key_changes(self, att: Attempt) -> list[KeyChange]:
        out: list[KeyChange] = []
        for key, w in att.writes.items():
            if w.deleted:
                if key in self.committed:
                    out.append(KeyChange(key, deleted=True))
                continue
            if w.tracker is not None:
                ops = w.tracker.ops()
            else:
                old = self.committed.get(key, ABSENT)
                ops = (
                    [("replace", (), materialize(w.value))]
                    if old is ABSENT
                    else diff(old, w.value, self.codec)
                )
                # The committed value must not share objects with the user's value, which
                # the step may go on mutating; a tracker's ops are fresh already.
                ops = copy.deepcopy(ops)
            if not ops:
                continue
            if len(ops) == 1 and ops[0][0] == "replace" and ops[0][1] == ():
                out.append(KeyChange(key, full=ops[0][2]))
            else:
                out.append(KeyChange(key, ops=ops))
        return out

    def _state_records(self, step: str | None, changes: list[KeyChange]) -> list[Record]:
        """The records of context changes; each change learns its record's size."""
        records = []
        dump = self.codec.dump
        for ch in changes:
            if ch.deleted:
                records.append(J.state_deleted(step, ch.key))
                continue
            if ch.ops is not None:
                ops_json = ops_to_json(ch.ops, self.codec)
                log = self._keylog.get(ch.key)
                if log is not None and log[1] + patch_size(ops_json) < max(log[0], MIN_FULL_BYTES):
                    rec = J.state_set_patch(step, ch.key, ops_json)
                    ch.size = len(rec.payload)
                    records.append(rec)
                    continue
                # Time to write the value whole again: the new value, fully materialized.
                base = copy.deepcopy(self.committed[ch.key])
                ch.full, ch.ops = materialize(apply(base, ch.ops)), None
            rec = J.state_set_value(step, ch.key, dump(ch.full))
            ch.size = len(rec.payload)
            records.append(rec)
        return records

    def _apply_changes(self, changes: list[KeyChange], seq: int) -> None:
        for ch in changes:
            key = ch.key
            self.versions[key] = seq
            if ch.deleted:
                self.committed.pop(key, None)
                self._keylog.pop(key, None)
                continue
            size = ch.size
            if ch.ops is not None:
                current = self.committed[key]
                if self._pins.get(key):
                    # Another live attempt reads this value: never change it under it.
                    current = copy.deepcopy(current)
                self.committed[key] = apply(current, ch.ops)
                log = self._keylog.setdefault(key, [size, 0])
                log[1] += size
            else:
                self.committed[key] = materialize(ch.full)
                self._keylog[key] = [size, 0]

    async def operator_update(
        self, updates: dict[str, Any], deletes: list[str] | None = None
    ) -> int:
        """Records operator writes (``updates`` of ``resume``/``run_from``, ``handler.ctx``)."""
        await self.wait_ready()
        changes: list[KeyChange] = []
        for path, value in updates.items():
            if "." in path:
                msg = f"operator updates take top-level keys, not the path {path!r}"
                raise WorkflowRuntimeError(msg)
            self.codec.dump(value)  # refuse what cannot be stored before writing anything
            old = self.committed.get(path, ABSENT)
            ops = [("replace", (), value)] if old is ABSENT else diff(old, value, self.codec)
            if not ops:
                continue
            if len(ops) == 1 and ops[0][0] == "replace" and ops[0][1] == ():
                changes.append(KeyChange(path, full=value))
            else:
                changes.append(KeyChange(path, ops=ops))
        changes.extend(KeyChange(k, deleted=True) for k in deletes or () if k in self.committed)
        if not changes:
            return 0
        records = self._state_records(None, changes)
        written = [c.key for c in changes]

        def on_written(seq: Any) -> None:
            for k in written:
                self._wversions[k] = int(seq)

        async with self.state_lock:
            seq = await self.append(records, on_written=on_written)
        self._apply_changes(changes, seq)
        self._observe(seq)
        return seq
