"""The SQL both backends run as it is written: the standard write statements and the reads.

Statements use ``?`` placeholders (see :class:`~._backend.Connection`). What a database
needs said its own way (locks, upserts, new row ids, seq counters) its backend supplies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final

import orjson

from ._backend import Connection, PreparedCommit
from ._errors import LogCorruptedError, RunNotFoundError, SnapshotUnreadableError
from ._records import NewRun, RunInfo, Seq, Snapshot, StoredRecord, run_info_from_row

__all__ = [
    "PAGE_SIZE",
    "StandardWriteSQL",
    "delete_runs",
    "head",
    "iter_records",
    "read_inbox",
    "read_lease",
    "read_run",
    "read_runs",
    "read_snapshot",
    "snapshot_stats",
]

PAGE_SIZE: Final = 2_000

# --------------------------------------------------------------------------- the write side

_INSERT_RUN: Final = (
    "INSERT INTO runs (run_id, epoch, status, created, parent_run_id, parent_seq, meta)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# After a prune, new runs get keys above every key ever given (meta's rid_floor): a key is
# never reused, as caches and owners' locks key runs by it.
_INSERT_RUN_AT: Final = (
    "INSERT INTO runs (rid, run_id, epoch, status, created, parent_run_id, parent_seq, meta)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_LOG: Final = (
    "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SET_STATUS: Final = "UPDATE runs SET status = ? WHERE rid = ?"
_TAKE_INBOX: Final = "UPDATE inbox SET taken_seq = ? WHERE id = ? AND taken_seq IS NULL"
_INSERT_POST: Final = "INSERT INTO inbox (run_id, key, payload, created) VALUES (?, ?, ?, ?)"
_DELETE_SNAPSHOT: Final = "DELETE FROM snapshots WHERE rid = ? AND seq = ?"
_INSERT_SNAPSHOT: Final = (
    "INSERT INTO snapshots (rid, seq, version, records, data) VALUES (?, ?, ?, ?, ?)"
)


class StandardWriteSQL(ABC):
    """The write statements of :class:`~._backend.WriteSQL` that are standard SQL.

    A backend subclasses it, supplies the transaction, the few statements its database
    words differently (the class attributes, :meth:`insert`), and overrides a method where
    it must do more.
    """

    FIND_RUN: ClassVar[str] = "SELECT rid, epoch FROM runs WHERE run_id = ?"
    LEASE_OF: ClassVar[str] = "SELECT owner, expires FROM leases WHERE run_id = ?"
    PUT_LEASE: ClassVar[str]  # inserts or replaces the lease row of (run_id, owner, expires)

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._rid_floor: int | None = -1  # -1: not read yet (see forget)

    def forget(self) -> None:
        """Drops what this connection cached of the store (another one wrote)."""
        self._rid_floor = -1

    @abstractmethod
    def insert(self, sql: str, params: Sequence[Any], key: str) -> int:
        """Runs an INSERT of one row; returns the new row's ``key`` column."""

    def close(self) -> None:
        self.conn.close()

    def find_run(self, run_id: str) -> tuple[int, int] | None:
        row = self.conn.execute(self.FIND_RUN, (run_id,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def insert_run(self, run_id: str, epoch: int, create: NewRun, created: int) -> int:
        meta = orjson.dumps(dict(create.meta)).decode()
        params = (run_id, epoch, create.status, created, create.parent_run_id, create.parent_seq)
        if self._rid_floor == -1:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'rid_floor'").fetchone()
            self._rid_floor = None if row is None else int(row[0])
        if self._rid_floor is None:
            return self.insert(_INSERT_RUN, (*params, meta), "rid")
        (top,) = self.conn.execute("SELECT coalesce(max(rid), 0) FROM runs").fetchone()
        rid = max(int(top), self._rid_floor) + 1
        self.conn.execute(_INSERT_RUN_AT, (rid, *params, meta))
        return rid

    def write(self, commit: PreparedCommit) -> None:
        conn = self.conn
        if commit.rows:
            conn.executemany(_INSERT_LOG, commit.rows)
        if commit.status is not None:
            conn.execute(_SET_STATUS, (commit.status, commit.rid))
        if commit.inbox_taken:
            conn.executemany(_TAKE_INBOX, [(commit.last_seq, i) for i in commit.inbox_taken])
        if commit.snapshot is not None:
            self.put_snapshot(commit.rid, commit.snapshot)

    def put_snapshot(self, rid: int, snap: Snapshot) -> None:
        """Adds one of the run's snapshots, in place of one at the same seq."""
        # Delete first: the insert then reuses the old row's pages, so replacing a snapshot
        # never leaves its previous size behind as free pages in the file.
        self.conn.execute(_DELETE_SNAPSHOT, (rid, snap.seq))
        self.conn.execute(_INSERT_SNAPSHOT, (rid, snap.seq, snap.version, snap.records, snap.data))

    def set_epoch(self, rid: int, epoch: int) -> None:
        self.conn.execute("UPDATE runs SET epoch = ? WHERE rid = ?", (epoch, rid))

    def delete_runs(self, runs: Mapping[str, int | None], last_seq: int, now: int) -> list[str]:
        """Deletes whole runs (see :func:`delete_runs`); seqs and run keys stay never
        reused: the last of each given is kept in meta, as the deleted rows may have held it."""
        (top,) = self.conn.execute("SELECT coalesce(max(rid), 0) FROM runs").fetchone()
        gone = delete_runs(self.conn, runs, now)
        if gone:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'rid_floor'").fetchone()
            floor = max(int(top), 0 if row is None else int(row[0]))
            for key, value in (("seq_floor", last_seq), ("rid_floor", floor)):
                self.conn.execute("DELETE FROM meta WHERE key = ?", (key,))
                self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, str(value)))
            self._rid_floor = floor
        return gone

    def lease_of(self, run_id: str) -> tuple[str, int] | None:
        row = self.conn.execute(self.LEASE_OF, (run_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def put_lease(self, run_id: str, owner: str, expires: int) -> None:
        self.conn.execute(self.PUT_LEASE, (run_id, owner, expires))

    def delete_lease(self, run_id: str, owner: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))

    def find_post(self, run_id: str, key: str) -> int | None:
        row = self.conn.execute(
            "SELECT id FROM inbox WHERE run_id = ? AND key = ?", (run_id, key)
        ).fetchone()
        return None if row is None else int(row[0])

    def insert_post(self, run_id: str, key: str | None, payload: str, created: int) -> int:
        return self.insert(_INSERT_POST, (run_id, key, payload, created), "id")


# Every table that holds a run, by the run's key in it: deleting a run deletes its rows
# from each (the runs row last: the log's rows refer to it).
_RUN_ROWS: Final = (
    "DELETE FROM log WHERE rid = ?",
    "DELETE FROM snapshots WHERE rid = ?",
    "DELETE FROM inbox WHERE run_id = ?",
    "DELETE FROM leases WHERE run_id = ?",
    "DELETE FROM runs WHERE rid = ?",
)


def delete_runs(conn: Connection, runs: Mapping[str, int | None], now: int) -> list[str]:
    """Deletes whole runs, inside the caller's write transaction; returns those deleted.

    ``runs`` maps each run to the last seq its caller saw (None: no records). A run is kept
    when it has changed since (its last seq is another), when a live lease holds it (an
    executor took it meanwhile), or while a run not deleted with it names it as its parent
    (a fork's ancestors stay as long as the fork: its state starts from theirs).
    """
    rows = {
        str(run_id): (int(rid), parent)
        for rid, run_id, parent in conn.execute(
            "SELECT rid, run_id, parent_run_id FROM runs"
        ).fetchall()
    }
    wanted = {r for r in runs if r in rows}
    for run_id in list(wanted):
        rid = rows[run_id][0]
        (last,) = conn.execute("SELECT max(seq) FROM log WHERE rid = ?", (rid,)).fetchone()
        lease = conn.execute("SELECT expires FROM leases WHERE run_id = ?", (run_id,)).fetchone()
        if last != runs[run_id] or (lease is not None and lease[0] > now):
            wanted.discard(run_id)
    # A parent is kept while any child outside the set is; dropping one may keep its parent.
    changed = True
    while changed:
        changed = False
        for run_id, (_, parent) in rows.items():
            if parent in wanted and run_id not in wanted:
                wanted.discard(parent)
                changed = True
    gone = [r for r in runs if r in wanted]
    for sql in _RUN_ROWS:
        key = "run_id" if "run_id" in sql else "rid"
        params = [(r,) if key == "run_id" else (rows[r][0],) for r in gone]
        if params:
            conn.executemany(sql, params)
    return gone


# --------------------------------------------------------------------------- the read side

# A run's extent is read from the log's (rid, seq) index rather than kept up to date in
# the runs row: that would cost an UPDATE per commit on the append path.
_RUN_COLS: Final = (
    "run_id, status, epoch, created,"
    " coalesce((SELECT ts FROM log WHERE log.rid = runs.rid ORDER BY seq DESC LIMIT 1), created),"
    " (SELECT min(seq) FROM log WHERE log.rid = runs.rid),"
    " (SELECT max(seq) FROM log WHERE log.rid = runs.rid),"
    " parent_run_id, parent_seq, meta, rid"
)
# One run's records name the run by a parameter instead of joining runs on every row.
_RUN_RECORD_COLS: Final = "log.seq, ?, log.kind, log.step, log.payload, log.commit_seq, log.ts"
_ALL_RECORD_COLS: Final = (
    "log.seq, runs.run_id, log.kind, log.step, log.payload, log.commit_seq, log.ts"
)


def read_run(conn: Connection, run_id: str) -> RunInfo | None:
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else run_info_from_row(row)


def read_runs(conn: Connection) -> list[RunInfo]:
    rows = conn.execute(f"SELECT {_RUN_COLS} FROM runs ORDER BY rid").fetchall()
    return [run_info_from_row(r) for r in rows]


def head(conn: Connection) -> Seq:
    row = conn.execute("SELECT max(seq) FROM log").fetchone()
    return Seq(row[0] or 0)


def iter_records(
    connect_reader: Callable[[], Connection],
    run_id: str | None,
    *,
    after: int,
    upto: int | None,
    kinds: Sequence[str] | None,
    page: int,
    read_errors: tuple[type[BaseException], ...],
) -> Iterator[StoredRecord]:
    """Pages through the log by key; each page is its own short read transaction.

    A page that fails to read (``read_errors``: a damaged file) is read again record by
    record, so that the record to blame is named (:class:`LogCorruptedError`).
    """
    rid: int | None = None
    if run_id is not None:
        found = connect_reader().execute("SELECT rid FROM runs WHERE run_id = ?", (run_id,))
        row = found.fetchone()
        if row is None:
            raise RunNotFoundError(run_id, "the store")
        rid = row[0]
    where = ["log.seq > ?"]
    if rid is not None:
        where.append("log.rid = ?")
    if upto is not None:
        where.append("log.seq <= ?")
    if kinds:
        where.append(f"log.kind IN ({', '.join('?' * len(kinds))})")
    if run_id is None:
        cols, source = _ALL_RECORD_COLS, "log JOIN runs ON runs.rid = log.rid"
    else:
        cols, source = _RUN_RECORD_COLS, "log"
    rest = f" FROM {source} WHERE {' AND '.join(where)} ORDER BY log.seq LIMIT ?"
    cursor = after
    while True:
        params: list[Any] = [cursor]
        if rid is not None:
            params.append(rid)
        if upto is not None:
            params.append(upto)
        if kinds:
            params.extend(kinds)
        params.append(page)
        head = [] if run_id is None else [run_id]
        reader = connect_reader()
        try:
            rows = reader.execute(f"SELECT {cols}{rest}", head + params).fetchall()
        except read_errors:
            yield from _until_damaged(reader, run_id, f"SELECT log.seq{rest}", params, read_errors)
            raise  # no single record is to blame: the file is damaged elsewhere
        yield from map(StoredRecord._make, rows)
        if len(rows) < page:
            return
        cursor = rows[-1][0]


def _until_damaged(
    conn: Connection,
    run_id: str | None,
    seqs_sql: str,
    params: list[Any],
    read_errors: tuple[type[BaseException], ...],
) -> Iterator[StoredRecord]:
    """The records of a page that failed to read, one by one, up to the one that fails.

    Raises :class:`LogCorruptedError` naming that record's seq, so that a reader can report
    it and go on after it; returns when every record reads alone (the caller re-raises).
    """
    try:
        seqs = [row[0] for row in conn.execute(seqs_sql, params).fetchall()]
    except read_errors:
        return  # even the seqs cannot be read: nothing to pin on one record
    if run_id is None:
        one = (
            f"SELECT {_ALL_RECORD_COLS} FROM log JOIN runs ON runs.rid = log.rid WHERE log.seq = ?"
        )
    else:
        one = f"SELECT {_RUN_RECORD_COLS} FROM log WHERE log.seq = ?"
    head = [] if run_id is None else [run_id]
    try:
        conn.execute(one, [*head, -1]).fetchall()  # reads no record: is the query itself sound?
    except read_errors:
        return  # the schema is damaged (a column SQLite no longer finds), not one record
    for seq in seqs:
        try:
            row = conn.execute(one, [*head, seq]).fetchone()
        except read_errors as bad:
            msg = f"record seq {seq} cannot be read back ({bad}); the file may be damaged"
            raise LogCorruptedError(msg, seq=seq) from bad
        yield StoredRecord._make(row)


def read_inbox(conn: Connection, run_id: str) -> list[tuple[int, str, str | None]]:
    """The run's inbox entries not yet taken into the log: (id, payload, key), in order."""
    return conn.execute(
        "SELECT id, payload, key FROM inbox WHERE run_id = ? AND taken_seq IS NULL ORDER BY id",
        (run_id,),
    ).fetchall()


def read_lease(conn: Connection, run_id: str) -> tuple[str, int] | None:
    """The run's lease holder and when the lease expires (microseconds), if any."""
    row = conn.execute("SELECT owner, expires FROM leases WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else (row[0], row[1])


_NO_SEQ: Final = 2**62  # above every seq: "no bound"


def read_snapshot(
    conn: Connection,
    run_id: str,
    *,
    upto: int | None = None,
    below: int | None = None,
    version: int | None = None,
    legacy: bool = False,
) -> Snapshot | None:
    """The run's latest snapshot with a seq at most ``upto`` and less than ``below`` (and
    of ``version``, if given).

    ``legacy``: the store's schema predates version 3 (one snapshot a run, no version
    or count kept); its snapshot reads as version 1 with no count.
    """
    hi = _NO_SEQ if upto is None else upto
    lo = _NO_SEQ if below is None else below
    if legacy and version not in (None, 1):
        return None
    if legacy:
        row = conn.execute(
            "SELECT snapshots.seq, snapshots.data, 1, NULL FROM snapshots JOIN runs USING (rid)"
            " WHERE runs.run_id = ? AND snapshots.seq <= ? AND snapshots.seq < ?"
            " ORDER BY snapshots.seq DESC LIMIT 1",
            (run_id, hi, lo),
        ).fetchone()
    else:
        mine = "" if version is None else " AND version = ?"
        where = (
            " WHERE rid = (SELECT rid FROM runs WHERE run_id = ?) AND seq <= ? AND seq < ?"
            f"{mine} ORDER BY seq DESC LIMIT 1"
        )
        params = (run_id, hi, lo) if version is None else (run_id, hi, lo, version)
        try:
            row = conn.execute(
                "SELECT seq, data, version, records FROM snapshots" + where, params
            ).fetchone()
        except Exception as exc:
            if _UNDECODABLE not in str(exc):
                raise
            # Damage in the cache's text (SQLite hands back what a file holds; PostgreSQL
            # refuses such text when it is written): name the snapshot, read without it.
            (seq,) = conn.execute("SELECT seq FROM snapshots" + where, params).fetchone()
            msg = f"run {run_id!r}: the snapshot at seq {seq} is not valid UTF-8 text ({exc})"
            raise SnapshotUnreadableError(msg, seq=seq) from exc
    return None if row is None else Snapshot(row[0], row[1], row[2], row[3])


# What SQLite's driver says of a text column whose bytes are not UTF-8.
_UNDECODABLE: Final = "Could not decode to UTF-8"


def snapshot_stats(conn: Connection, run_id: str | None) -> tuple[int, int]:
    """How many snapshots the store (or one run) keeps and their bytes of text."""
    sql = "SELECT count(*), coalesce(sum(length(data)), 0) FROM snapshots"
    if run_id is None:
        row = conn.execute(sql).fetchone()
    else:
        row = conn.execute(
            f"{sql} WHERE rid = (SELECT rid FROM runs WHERE run_id = ?)", (run_id,)
        ).fetchone()
    return int(row[0]), int(row[1])
