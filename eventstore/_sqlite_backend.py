"""The SQLite backend: an opened store's connections and its write transaction.

Only SQLite's own words are here: ``BEGIN IMMEDIATE``, ``PRAGMA data_version``, new row
ids, the lease statements. The file itself is :mod:`._sqlite`'s, the commit
rules :mod:`._writer`'s, the statements both databases share :mod:`._sql`'s.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any, Final

from . import _sqlite
from ._backend import Busy
from ._sql import StandardWriteSQL

__all__ = ["SQLiteBackend", "SQLiteWriteSQL"]

# Seqs are never reused: when old records are deleted, meta keeps the high-water mark.
_LAST_SEQ_SQL: Final = (
    "SELECT max(coalesce((SELECT max(seq) FROM log), 0),"
    " coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'seq_floor'), 0))"
)


class SQLiteWriteSQL(StandardWriteSQL):
    """The write connection: ``BEGIN IMMEDIATE`` takes the database's one write lock."""

    errors = (sqlite3.Error,)
    PUT_LEASE = "INSERT OR REPLACE INTO leases (run_id, owner, expires) VALUES (?, ?, ?)"

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self.db = conn
        # PRAGMA data_version changes when another connection commits: until it does,
        # what the writer cached stays valid.
        self._data_version = -1

    def begin(self) -> int | None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == 5:  # SQLITE_BUSY
                raise Busy(str(exc)) from exc
            raise
        (version,) = self.db.execute("PRAGMA data_version").fetchone()
        if version == self._data_version:
            return None
        self._data_version = version
        self.forget()
        return int(self.db.execute(_LAST_SEQ_SQL).fetchone()[0])

    def commit(self, last_seq: int) -> None:
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        self._data_version = -1
        self.forget()
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def is_fatal(self, exc: BaseException) -> bool:
        return _sqlite.is_fatal(exc)

    def insert(self, sql: str, params: Sequence[Any], key: str) -> int:
        return int(self.db.execute(sql, params).lastrowid or 0)


class SQLiteBackend:
    """A store in an SQLite file, or in memory (``path`` None): one database shared by
    the writer and every reader of the store object."""

    read_errors = _sqlite.READ_ERRORS
    unavailable_errors: tuple[type[BaseException], ...] = ()  # a file is never unreachable
    writes_inline = True
    listen = None  # nothing announces posts: owners poll their inbox

    def __init__(self, path: str | None, *, readonly: bool, durability: str) -> None:
        self.kind = "memory" if path is None else "sqlite"
        self.where = "the memory store" if path is None else path
        self._durability = durability
        self._target, self._uri, self.schema_version = _sqlite.open_database(
            path,
            readonly=readonly,
            durability=durability,
            memory_name=f"eventstore-{uuid.uuid4().hex}",
        )
        # The in-memory database lives as long as one connection to it is open.
        self._anchor = self.reader() if path is None else None

    def _connect(self, *, readonly: bool, **kw: int) -> sqlite3.Connection:
        # Looked up at each call: tests swap _sqlite.connect for one that fails or crashes.
        return _sqlite.connect(
            self._target,
            uri=self._uri,
            readonly=readonly,
            durability=self._durability,
            memory=self.kind == "memory",
            **kw,
        )

    def reader(self) -> sqlite3.Connection:
        return self._connect(readonly=True)

    def write_sql(self, *, busy_timeout_ms: int | None = None) -> SQLiteWriteSQL:
        kw = {} if busy_timeout_ms is None else {"busy_timeout_ms": busy_timeout_ms}
        return SQLiteWriteSQL(self._connect(readonly=False, **kw))

    def reclaim(self) -> None:
        # Deleted rows' pages go to the free list; incremental_vacuum moves them to the end
        # of the file and truncates it (in WAL mode, at the checkpoint that follows). A store
        # made before auto_vacuum was chosen reuses its free pages instead.
        conn = self._connect(readonly=False)
        try:
            # Each step of the pragma frees one page; executescript steps it to the end
            # (execute would stop after the first, as the pragma returns no rows).
            conn.executescript("PRAGMA incremental_vacuum;")
            if self.kind == "sqlite":
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.close()

    def close(self) -> None:
        if self._anchor is not None:
            self._anchor.close()
