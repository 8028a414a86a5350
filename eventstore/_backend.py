"""The seam between the store and a database: what the shared code asks of a backend.

The store's rules live once, above this seam: the commit rules in :mod:`._writer`, the
scheduling of batches in :mod:`._committer`, the reads in :mod:`._sql`. A backend supplies
connections and the SQL its database needs where standard SQL does not do
(:mod:`._sqlite`, :mod:`._postgres`). SQL crosses the seam with ``?`` placeholders; a
backend whose driver wants another style converts them in its :class:`Connection`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._records import Commit, NewRun, Snapshot

__all__ = [
    "Backend",
    "Busy",
    "Connection",
    "Cursor",
    "Listen",
    "LogRow",
    "LoopWriteSQL",
    "PreparedCommit",
    "Reply",
    "Request",
    "ServerWriteSQL",
    "WriteSQL",
    "now_us",
]

# One row of the log table: (seq, rid, kind, step, payload, commit_seq, ts).
LogRow = tuple[int, int, str, str | None, str, int, int]
# Calls back with a run id for every post to the store until the event is set.
Listen = Callable[[Callable[[str], None], threading.Event], None]


def now_us() -> int:
    """Microseconds since the Unix epoch, UTC: how the log stores time."""
    return time.time_ns() // 1000


class Busy(Exception):
    """The write lock is held elsewhere (another process or connection): try again."""


class Cursor(Protocol):
    """What the shared code reads from a cursor (sqlite3's and psycopg's both fit)."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """A database connection that takes SQL with ``?`` placeholders."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> Any: ...

    def close(self) -> None: ...


@dataclass(slots=True)  # not frozen: that costs a microsecond a commit, a tenth of one
class PreparedCommit:
    """One commit with the rules applied (fenced, checked, seqs assigned): what is left
    for the database to write."""

    rid: int
    rows: list[LogRow]
    last_seq: int  # the seq that ends the commit: taken inbox entries are marked with it
    status: str | None
    inbox_taken: Sequence[int]
    snapshot: Snapshot | None


@dataclass(slots=True)
class Request:
    """One operation of a batch, for a database that applies the commit rules itself.

    ``op`` is ``"append"`` (``commit``; ``at`` its timestamp), ``"claim"``, ``"lease"``
    (``text`` the owner, ``at`` now, ``ttl_us``, ``renew``), ``"release"`` (``text`` the
    owner) or ``"post"`` (``text`` the key, ``body`` the payload, ``at`` now).
    """

    op: str
    run_id: str
    commit: Commit | None = None
    at: int = 0
    text: str | None = None
    body: str | None = None
    ttl_us: int = 0
    renew: bool = False


# What the database answers to one request: (code, a, b), or the error that refused it
# alone. Codes: "ok" (append: a, b = first, last seq; claim: a = the new epoch; lease:
# a = 1 if taken; post: a = the entry, b = 1 if new), "fenced" (a = the run's epoch),
# "exists" (a created run exists), "missing" (no such run), "lowseq" (a commit's kept seq
# is not past the log's last, a).
Reply = tuple[str, int | None, int | None] | BaseException


class ServerWriteSQL(Protocol):
    """A write connection whose database applies the commit rules itself (see
    :mod:`._writer`), so that a whole batch is one statement: one round trip, and no
    transaction left open on the server while the client is away.

    The writer still runs each commit's ``check`` and ``on_written`` in commit order; it
    tells the hooks the seqs it expects, and calls ``on_written`` again with the seqs the
    database assigned when they differ (another connection wrote meanwhile).
    """

    @property
    def errors(self) -> tuple[type[BaseException], ...]: ...

    def apply(self, requests: Sequence[Request]) -> tuple[list[Reply], int | None]:
        """Runs the batch in one transaction: a reply per request, in order, and the last
        seq assigned (None when the batch appended nothing).

        :raises: the driver's error when the batch as a whole failed (nothing written).
        """
        ...

    def close(self) -> None: ...

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether an error is the database's fault (disk full, I/O, lost connection)."""
        ...

    def delete_runs(self, runs: Mapping[str, int | None], now: int) -> list[str]:
        """Deletes whole runs in a transaction of its own, by the rules of
        :func:`._sql.delete_runs`; returns those deleted."""
        ...


class LoopWriteSQL(ServerWriteSQL, Protocol):
    """A server-rules write connection that a writer on the event loop's thread drives
    without blocking: it sends a batch, the loop waits on the socket (free meanwhile for
    other tasks), and the reply is read when it came. No thread hand-off either way."""

    # Seconds the loop may busy-wait for a reply before it sleeps (0: never).
    reply_spin_s: float

    @property
    def broken(self) -> bool:
        """Whether the connection is gone (the server may be fine)."""
        ...

    def fileno(self) -> int: ...

    def send(self, requests: Sequence[Request]) -> bool:
        """Sends the batch; False while part of it waits for the socket (:meth:`flush`)."""
        ...

    def flush(self) -> bool:
        """Sends more of the batch; True once all of it went."""
        ...

    def poll(self) -> tuple[list[Reply], int | None] | None:
        """The batch's replies and last seq (as ``apply``'s) once they came, else None.

        :raises: the driver's error when the batch as a whole failed.
        """
        ...

    def wait(self) -> tuple[list[Reply], int | None]:
        """Blocks until the batch in flight was answered."""
        ...

    def discard_input(self) -> None:
        """Reads what the server sent while no batch was in flight (nothing of ours).

        :raises: the driver's error when the connection cannot be read (it is lost).
        """
        ...


class WriteSQL(Protocol):
    """One write connection of a backend, driven by the shared batch writer.

    It runs statements and knows nothing of the rules: the writer decides what is
    written, in which order, and what a failure refuses. Every method but ``begin``,
    ``commit``, ``rollback`` and ``close`` runs inside the transaction ``begin`` opened.
    """

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The driver's errors: an op that one escapes from is taken out of its batch,
        which then runs again without it (the transaction may be unusable)."""
        ...

    def begin(self) -> int | None:
        """Opens the write transaction (taking the write lock).

        Returns None when no other connection can have written since this one's last
        transaction, so what the writer cached still holds; otherwise the last seq ever
        assigned, and the writer forgets its caches.

        :raises Busy: the lock is held elsewhere and may be free later.
        """
        ...

    def commit(self, last_seq: int) -> None:
        """Writes what is left of the batch (the seq high-water mark, if the backend keeps
        one) and commits."""
        ...

    def rollback(self) -> None:
        """Rolls the open transaction back; the next ``begin`` returns the last seq."""
        ...

    def close(self) -> None: ...

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether an error is the database's fault (disk full, I/O, lost connection)."""
        ...

    def find_run(self, run_id: str) -> tuple[int, int] | None:
        """The run's (rid, epoch), or None; the epoch holds until the transaction ends."""
        ...

    def insert_run(self, run_id: str, epoch: int, create: NewRun, created: int) -> int:
        """Adds the run's row; returns its rid."""
        ...

    def write(self, commit: PreparedCommit) -> None:
        """Writes one prepared commit: its records, status, taken inbox entries, snapshot."""
        ...

    def set_epoch(self, rid: int, epoch: int) -> None: ...

    def lease_of(self, run_id: str) -> tuple[str, int] | None:
        """The run's lease (owner, expiry in microseconds), held until the transaction ends."""
        ...

    def put_lease(self, run_id: str, owner: str, expires: int) -> None: ...

    def delete_lease(self, run_id: str, owner: str) -> None: ...

    def find_post(self, run_id: str, key: str) -> int | None:
        """The id of the run's inbox entry posted with ``key``, if there is one."""
        ...

    def insert_post(self, run_id: str, key: str | None, payload: str, created: int) -> int:
        """Adds an inbox entry (and announces it, where the database can); returns its id."""
        ...

    def delete_runs(self, runs: Mapping[str, int | None], last_seq: int, now: int) -> list[str]:
        """Deletes whole runs by the rules of :func:`._sql.delete_runs`, keeping ``last_seq``
        as the seq after which new ones are assigned; returns those deleted."""
        ...


class Backend(Protocol):
    """One opened store: how to connect to it, and what the facade tells its users."""

    @property
    def kind(self) -> str:
        """``"memory"``, ``"sqlite"`` or ``"postgres"``: what ``EventStore.kind`` says."""
        ...

    @property
    def where(self) -> str:
        """How messages name the store: its file, or ``"the postgres store"``."""
        ...

    @property
    def read_errors(self) -> tuple[type[BaseException], ...]:
        """What a damaged store raises on reads."""
        ...

    @property
    def unavailable_errors(self) -> tuple[type[BaseException], ...]:
        """Which of the read errors mean the server is unreachable, not a damaged store."""
        ...

    @property
    def schema_version(self) -> int:
        """The version of the tables readers find (older when opened read-only)."""
        ...

    @property
    def writes_inline(self) -> bool:
        """Whether a write costs microseconds of CPU and no wait on a server, so that the
        event loop's thread may write itself rather than wake the writer thread."""
        ...

    @property
    def listen(self) -> Listen | None:
        """Announces posts made by any process, on databases that can (None elsewhere)."""
        ...

    def reader(self) -> Connection:
        """A new read-only connection (one per thread)."""
        ...

    def write_sql(self, *, busy_timeout_ms: int | None = None) -> WriteSQL | ServerWriteSQL:
        """A new write connection; ``busy_timeout_ms`` bounds how long a lock is waited for."""
        ...

    def reclaim(self) -> None:
        """Gives the space of deleted rows back (an SQLite file shrinks; PostgreSQL's
        tables are vacuumed, their space reused). Runs outside any write transaction."""
        ...

    def close(self) -> None:
        """Lets go of what the backend itself holds open."""
        ...
