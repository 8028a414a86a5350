"""The value types of the log: what is appended, what is read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NewType

import orjson

__all__ = [
    "AppendResult",
    "Commit",
    "NewRun",
    "Record",
    "RunInfo",
    "Seq",
    "Snapshot",
    "StoredRecord",
    "run_info_from_row",
]

# A position in the log: global, increasing, never reused. A checkpoint is a Seq.
Seq = NewType("Seq", int)


@dataclass(frozen=True, slots=True, init=False)
class Record:
    """One record to append: its kind, the step it belongs to (None for run-level) and JSON.

    Frozen, with an ``__init__`` of its own that sets its slots directly: a step builds
    several, and the generated frozen ``__init__`` (``object.__setattr__`` looked up for
    each field) cost twice as much.
    """

    kind: str
    step: str | None = None
    payload: str = "{}"

    def __init__(self, kind: str, step: str | None = None, payload: str = "{}") -> None:
        _set_kind(self, kind)
        _set_step(self, step)
        _set_payload(self, payload)


class Snapshot(NamedTuple):
    """A run's cached derived state: never the source of truth, always reproducible.

    ``seq`` is the seq it reflects (the end of one of the run's commits), ``data`` its text,
    ``version`` the version of the code that derived it (a reader trusts only its own),
    ``records`` how many of the run's records it covers (None: a store written before it was
    kept). A run keeps many, one every so often.
    """

    seq: int
    data: str
    version: int = 0
    records: int | None = None


@dataclass(frozen=True, slots=True)
class NewRun:
    """Creates the run with a commit; the commit is refused if the run already exists."""

    meta: Mapping[str, Any] = field(default_factory=dict)
    parent_run_id: str | None = None
    parent_seq: int | None = None
    status: str | None = None
    created: int | None = None  # when the run was created (µs): a copied run keeps its own


@dataclass(slots=True)
class Commit:
    """Records that take effect together: consecutive seqs, all or nothing.

    ``epoch`` fences the commit: when given, the run's current epoch must equal it.
    ``check`` runs in the writer right before the commit is written, in seq order with
    every other commit; raising :class:`~eventstore.ConcurrencyError` refuses the commit
    alone. ``on_written`` runs in the writer after the commit was written (before the
    transaction is durable); it sees the commit's last seq. Both hooks run again, with the
    new seqs, when their batch is written again because another commit of it failed after
    writing. ``status`` updates the run's status column; ``inbox_taken`` marks inbox
    entries as taken into the log by this commit. ``snapshot`` adds a cached derived state of
    the run (a :class:`Snapshot`, or the pair seq and JSON text), written in the same
    transaction; another one at the same seq is replaced. It is a cache, reproducible from
    the log; a commit may carry only a snapshot. ``seq`` and ``ts``, for a commit copied
    from another store (``workflow export``), keep its first seq (after every seq written
    so far) and its time.
    """

    run_id: str
    records: Sequence[Record]
    epoch: int | None = None
    create: NewRun | None = None
    status: str | None = None
    check: Callable[[], None] | None = None
    on_written: Callable[[Seq], None] | None = None
    inbox_taken: Sequence[int] = ()
    snapshot: Snapshot | tuple[int, str] | None = None
    seq: int | None = None
    ts: int | None = None


@dataclass(frozen=True, slots=True, init=False)
class AppendResult:
    """Where an appended commit landed: its first and last seq (equal for one record).

    Frozen, its slots set directly by its ``__init__`` (one per commit: as for Record).
    """

    first_seq: Seq
    last_seq: Seq
    ts: int = 0  # when it was written: microseconds since the Unix epoch, UTC

    def __init__(self, first_seq: Seq, last_seq: Seq, ts: int = 0) -> None:
        _set_first(self, first_seq)
        _set_last(self, last_seq)
        _set_ts(self, ts)


# The slots' own setters (the frozen classes refuse ``setattr``; their ``__init__`` does not).
_set_kind = Record.__dict__["kind"].__set__
_set_step = Record.__dict__["step"].__set__
_set_payload = Record.__dict__["payload"].__set__
_set_first = AppendResult.__dict__["first_seq"].__set__
_set_last = AppendResult.__dict__["last_seq"].__set__
_set_ts = AppendResult.__dict__["ts"].__set__


class StoredRecord(NamedTuple):
    """A record read back from the log; ``commit_seq`` is the last seq of its commit.

    A named tuple: immutable, and five times cheaper to build than a frozen dataclass,
    which matters when reading a million records.
    """

    seq: Seq
    run_id: str
    kind: str
    step: str | None
    payload: str
    commit_seq: Seq
    ts: int  # microseconds since the Unix epoch, UTC

    def data(self) -> Any:
        """The payload parsed as JSON (plain values; typed decoding is the codec's job)."""
        return orjson.loads(self.payload)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as the ``runs`` table describes it."""

    run_id: str
    status: str | None
    epoch: int
    created: int  # microseconds since the Unix epoch, UTC
    updated: int
    first_seq: Seq | None
    last_seq: Seq | None
    parent_run_id: str | None
    parent_seq: Seq | None
    meta: Mapping[str, Any]
    rid: int = 0  # the run's integer key in this store (stable, never reused)


def run_info_from_row(row: Sequence[Any]) -> RunInfo:
    """A RunInfo from a row of the backends' run query (same columns on both)."""
    return RunInfo(
        run_id=row[0],
        status=row[1],
        epoch=row[2],
        created=row[3],
        updated=row[4],
        first_seq=row[5],
        last_seq=row[6],
        parent_run_id=row[7],
        parent_seq=row[8],
        meta=orjson.loads(row[9] or "{}"),
        rid=row[10],
    )
