"""Everything that knows it talks to SQLite: files, pragmas, schema, the write and read SQL.

The append path uses :mod:`sqlite3` directly; sqlite-utils creates and migrates the schema.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
import sqlite_utils

from ._errors import (
    ConcurrencyError,
    LogCorruptedError,
    NotAStoreError,
    RunNotFoundError,
    SchemaVersionError,
    WriterFailedError,
)
from ._records import AppendResult, Commit, RunInfo, Seq, StoredRecord, run_info_from_row

SCHEMA_VERSION: Final = 2
# What a damaged file raises on reads (SQLite's message can quote text that is not UTF-8).
READ_ERRORS: Final = (sqlite3.DatabaseError, UnicodeDecodeError)
APP_ID: Final = "durable-workflows/eventstore"
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS: Final = 10_000
PAGE_SIZE: Final = 2_000
# New stores give the pages of deleted rows back to the filesystem on request
# (PRAGMA incremental_vacuum); it can only be chosen before the first table exists.
AUTO_VACUUM: Final = "INCREMENTAL"
_AUTO_VACUUM_INCREMENTAL: Final = 2  # what PRAGMA auto_vacuum reads back for it

# SQLite result codes (the primary code is the low byte of an extended code) that mean the
# database as a whole is unwell rather than one commit being wrong.
_FATAL_CODES: Final = frozenset({10, 11, 13, 14, 26, 8})  # IOERR CORRUPT FULL CANTOPEN NOTADB RO


def now_us() -> int:
    """Microseconds since the Unix epoch, UTC: how the log stores time."""
    return time.time_ns() // 1000


def is_fatal(exc: BaseException) -> bool:
    """Whether an sqlite3 error is the database's fault (disk full, I/O) and not a commit's."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError) and "disk" in str(exc)
    return (code & 0xFF) in _FATAL_CODES


def _check_file(path: Path) -> bool:
    """Refuses a file that is not SQLite without touching it; returns whether it exists."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise NotAStoreError(str(path), "it is a directory") from None
    if head and head != SQLITE_MAGIC:
        raise NotAStoreError(str(path), "the file is not an SQLite database")
    if 0 < len(head) < len(SQLITE_MAGIC):
        raise NotAStoreError(str(path), "the file is truncated (shorter than an SQLite header)")
    return True


def _inspect(conn: sqlite3.Connection, where: str) -> int | None:
    """The store's schema version, None for an empty database; refuses foreign ones."""
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == _READONLY_ROLLBACK:
            raise _HotJournalError(str(exc)) from exc
        raise NotAStoreError(where, f"SQLite cannot read it ({exc})") from exc
    except UnicodeDecodeError as exc:
        # SQLite's message quotes the damaged schema text, which then is not even UTF-8.
        reason = f"its schema (sqlite_master, on page 1) is damaged: text that is not UTF-8 ({exc})"
        raise NotAStoreError(where, reason) from exc
    if not tables:
        return None
    if "meta" not in tables:
        raise NotAStoreError(where, "an SQLite database without the event store's tables")
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta"))
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise NotAStoreError(where, f"its meta table is unreadable ({exc})") from exc
    if rows.get("app") != APP_ID:
        raise NotAStoreError(where, "an SQLite database made by another application")
    version = int(rows.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(where, version, SCHEMA_VERSION)
    return version


def connect(
    target: str,
    *,
    uri: bool,
    readonly: bool,
    durability: str,
    memory: bool,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
) -> sqlite3.Connection:
    """Opens one connection with our pragmas; autocommit mode, transactions are explicit."""
    conn = sqlite3.connect(
        target,
        uri=uri,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_ms / 1e3,
    )
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    if readonly:
        conn.execute("PRAGMA query_only = 1")
    elif memory:
        conn.execute("PRAGMA synchronous = OFF")
    else:
        conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
    return conn


def open_database(
    path: str | None, *, readonly: bool, durability: str, memory_name: str
) -> tuple[str, bool]:
    """Validates (and for a writable store, creates or migrates) the database.

    Returns the connection target and whether it is a URI. Foreign files are refused before
    anything is written, so they stay byte-for-byte as they were. A new store is built
    beside its path and published whole (:func:`_create`), so a process killed while it
    creates one leaves no half-made store behind; one left by an earlier version (an
    interrupted switch to WAL) is recognised and finished.
    """
    if path is None:
        target, uri = f"file:/{memory_name}?vfs=memdb", True
        conn = connect(target, uri=uri, readonly=False, durability=durability, memory=True)
        _migrate(conn, None)
        return target, uri
    file = Path(path)
    exists = _check_file(file)
    if not exists and readonly:
        raise NotAStoreError(path, "no such file (a read-only store is never created)")
    if not exists:
        # Made where a symbolic link points, if the path is one, so that the link names it.
        _create(Path(os.path.realpath(file)))
        if not _check_file(file):
            raise NotAStoreError(path, "it was removed while the store was being created")
    version = _probe(file, path, repair=not readonly)
    if readonly:
        if version is None:
            raise NotAStoreError(path, "an empty SQLite database, not yet an event store")
        return f"{file.resolve().as_uri()}?mode=ro", True
    conn = connect(str(file), uri=False, readonly=False, durability=durability, memory=False)
    try:
        if version is None:
            _prepare_in_place(conn)
        else:
            _set_wal(conn)
        _migrate(conn, version)
    finally:
        conn.close()
    _sweep(Path(os.path.realpath(file)))
    return str(file), False


# ------------------------------------------------------------------ creating a store
#
# SQLite's switch of a new file to WAL is a rollback-journal transaction: a process killed
# during it leaves a hot journal, which the read-only probe every open starts with cannot
# roll back. So a new store is built in a temporary file beside its path (schema, WAL mode,
# meta) and published with os.link, which never replaces a file: the path holds either
# nothing or a whole store, and of several processes creating one store at once the first
# link wins and the others open that one.

_READONLY_ROLLBACK: Final = 776  # SQLITE_READONLY_ROLLBACK: a hot journal, seen read-only
_JOURNAL_MAGIC: Final = bytes.fromhex("d9d505f920a163d7")
_TEMP_SUFFIXES: Final = ("", "-wal", "-shm", "-journal")
# A temporary file is needed for the milliseconds of one creation; older ones were left by
# killed creators and are removed.
STALE_TEMP_S: Final = 60.0


class _HotJournalError(Exception):
    """The read-only probe met a hot rollback journal that it cannot roll back."""


def _temp_name(file: Path) -> Path:
    return file.with_name(f".{file.name}.{os.getpid()}.{secrets.token_hex(4)}.new")


def _temp_pattern(file: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(file.name)}\.\d+\.[0-9a-f]{{8}}\.new(?:-wal|-shm|-journal)?")


def _create(file: Path) -> None:
    """Builds a new store beside ``file`` and publishes it under that name in one step.

    When the filesystem has no hard links, the store is created in place instead, which a
    kill can interrupt; :func:`_probe` repairs what that leaves.
    """
    temp = _temp_name(file)
    # The log holds user data: readable by its owner only (SQLite gives -wal and -shm the
    # same mode).
    try:
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:  # no such directory, no permission: name the store, not the temp
        raise type(exc)(exc.errno, exc.strerror, str(file)) from None
    try:
        _build(temp)
        try:
            os.link(temp, file)
        except FileExistsError:
            return  # another process published its store first: that one is used
        except OSError:
            _create_empty(file)  # no hard links here (some network and FUSE filesystems)
            return
        _sync_dir(file.parent)
    finally:
        for suffix in _TEMP_SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{temp}{suffix}")


def _build(temp: Path) -> None:
    """Makes ``temp`` a whole, empty store in WAL mode, all of it in the main file."""
    conn = sqlite3.connect(temp, isolation_level=None)
    try:
        # auto_vacuum takes effect only if set before the first table is created.
        conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        _migrate(conn, None)
        # Everything into the main file (synced): the published file is the store alone.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _create_empty(file: Path) -> None:
    """Creates an empty file at ``file`` (mode 0600) unless something is there already."""
    # Another process may have created it a moment ago: it initialises it, or we do.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _sync_dir(directory: Path) -> None:
    """Makes a new name in ``directory`` durable (where directories can be synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every filesystem syncs directories; the link is made all the same
    finally:
        os.close(fd)


def _prepare_in_place(conn: sqlite3.Connection) -> None:
    """Readies an existing database without tables (an empty file) to become a store."""
    conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM}")
    _set_wal(conn)
    # An earlier version switched to WAL before anything else: its page 1 was written
    # without auto_vacuum, which a VACUUM of the empty database still sets.
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != _AUTO_VACUUM_INCREMENTAL:
        with contextlib.suppress(sqlite3.OperationalError):  # locked: another opener did it
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                conn.execute("VACUUM")


def _probe(file: Path, where: str, *, repair: bool) -> int | None:
    """The existing database's schema version (:func:`_inspect`), read without writing.

    A hot rollback journal over an empty database is what a creation killed by an earlier
    version left; with ``repair`` it is rolled back (to the empty file it was) and the
    creation finishes. Any other hot journal is not ours: event stores run in WAL mode.
    """
    try:
        return _inspect_readonly(file, where)
    except _HotJournalError as exc:
        if not _interrupted_creation(file):
            reason = (
                "it has a hot rollback journal (a crashed writer's unfinished transaction),"
                " which event stores never leave"
            )
            raise NotAStoreError(where, reason) from exc
        if not repair:
            reason = (
                "its creation was interrupted before it held anything; open it once without"
                " readonly=True to finish creating it"
            )
            raise NotAStoreError(where, reason) from exc
    conn = sqlite3.connect(file, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # rolls the journal back
    finally:
        conn.close()
    return _inspect_readonly(file, where)


def _inspect_readonly(file: Path, where: str) -> int | None:
    probe = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return _inspect(probe, where)
    finally:
        probe.close()


def _interrupted_creation(file: Path) -> bool:
    """Whether ``file``'s hot journal began on an empty database: rolling it back loses nothing.

    A journal's header records the database's size in pages before the transaction.
    """
    try:
        with open(f"{file}-journal", "rb") as fh:
            header = fh.read(20)
    except OSError:
        return False
    if header[:8] != _JOURNAL_MAGIC:
        return file.stat().st_size == 0
    return int.from_bytes(header[16:20], "big") == 0


def _sweep(file: Path) -> None:
    """Removes temporary files that killed creators of ``file`` left beside it.

    They are never opened (closing a file descriptor would drop this process's SQLite locks
    on it): one with a second link is a published store's other name, and one old enough
    cannot belong to a creation still going on.
    """
    pattern = _temp_pattern(file)
    prefix = f".{file.name}."
    now = time.time()
    try:
        entries = list(os.scandir(file.parent))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix) or not pattern.fullmatch(entry.name):
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if st.st_nlink > 1 or now - st.st_mtime > STALE_TEMP_S:
                os.unlink(entry.path)


def _set_wal(conn: sqlite3.Connection) -> None:
    """Switches to WAL; retried, since the switch can meet "locked" without waiting.

    Processes that create one store at the same instant all get here at once.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1e3
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _migrate(conn: sqlite3.Connection, version: int | None) -> None:
    """Creates the schema or brings an older one up to :data:`SCHEMA_VERSION`."""
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = _inspect(conn, "store")  # another process may have created it meanwhile
        db = sqlite_utils.Database(conn)
        if current is None:
            _create_v1(db)
            current = 1
        if current < 2:
            _migrate_v2(db)
        db.table("meta").upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _migrate_v2(db: sqlite_utils.Database) -> None:
    """Version 2: leases, so that workers on several hosts take runs one at a time."""
    db.table("leases").create({"run_id": str, "owner": str, "expires": int}, pk="run_id")


def _create_v1(db: sqlite_utils.Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("meta").insert_all(
        [{"key": "app", "value": APP_ID}, {"key": "schema_version", "value": str(SCHEMA_VERSION)}]
    )
    db.table("runs").create(
        {
            "rid": int,
            "run_id": str,
            "epoch": int,
            "status": str,
            "created": int,
            "parent_run_id": str,
            "parent_seq": int,
            "meta": str,
        },
        pk="rid",
        not_null={"run_id", "epoch", "created"},
        defaults={"epoch": 0, "meta": "{}"},
    )
    db.table("runs").create_index(["run_id"], unique=True)
    # The physical log keys runs by a small integer: an index on random text ids costs
    # ten times more per append (MEASUREMENTS.md).
    db.table("log").create(
        {
            "seq": int,
            "rid": int,
            "kind": str,
            "step": str,
            "payload": str,
            "commit_seq": int,
            "ts": int,
        },
        pk="seq",
        not_null={"rid", "kind", "payload", "commit_seq", "ts"},
        foreign_keys=[("rid", "runs", "rid")],
    )
    db.table("log").create_index(["rid", "seq"])
    db.table("inbox").create(
        {
            "id": int,
            "run_id": str,
            "key": str,
            "payload": str,
            "created": int,
            "taken_seq": int,
        },
        pk="id",
        not_null={"run_id", "payload", "created"},
    )
    db.table("inbox").create_index(["run_id", "key"], unique=True)
    db.table("inbox").create_index(["run_id", "taken_seq"])
    db.table("snapshots").create({"rid": int, "seq": int, "data": str}, pk="rid")
    db.create_view(
        "records",
        "SELECT log.seq, runs.run_id, log.kind, log.step, log.payload, log.commit_seq, log.ts"
        " FROM log JOIN runs ON runs.rid = log.rid",
    )


# --------------------------------------------------------------------------- the write side


Op = Callable[["Writer"], Any]

# Seqs are never reused: when old records are deleted, meta keeps the high-water mark.
_LAST_SEQ_SQL: Final = (
    "SELECT max(coalesce((SELECT max(seq) FROM log), 0),"
    " coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'seq_floor'), 0))"
)


class _Redo(Exception):
    """An op failed after writing: the batch runs again without it."""

    def __init__(self, index: int, error: Exception) -> None:
        self.index = index
        self.error = error
        super().__init__(f"op {index} failed after writing: {error!r}")


class Busy(Exception):
    """The write lock is held elsewhere (another process or connection)."""


class Writer:
    """Writes batches of operations in one transaction, a savepoint per operation.

    One thread at a time uses it. Each operation's error is its own: it rolls back to its
    savepoint and the batch goes on. An error that is the database's fault aborts the
    whole transaction and is raised as :class:`WriterFailedError`.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.last_seq = 0
        # Caches of what only a write can change. They stay valid while no other
        # connection commits, which PRAGMA data_version tells at the start of each batch.
        self._data_version = -1
        self._rids: dict[str, int] = {}
        self._epochs: dict[int, int] = {}

    def _forget(self) -> None:
        self._data_version = -1
        self._rids.clear()
        self._epochs.clear()

    def run_batch(self, ops: Sequence[Op]) -> list[tuple[bool, Any]]:
        """Runs ``ops`` in one transaction; returns (ok, result or exception) per op.

        An op is refused alone when it fails before writing anything, which is how every
        op of ours fails short of a database error (checks, fences and lookups come
        first), so no savepoint is needed on the append path. An op that fails after it
        wrote is not left half-done: the transaction is rolled back and the batch is run
        again without it.

        :raises Busy: the write lock could not be taken within the busy timeout.
        :raises WriterFailedError: the database failed; nothing of the batch was written.
        """
        refused: dict[int, Exception] = {}
        while True:
            try:
                return self._run_once(ops, refused)
            except _Redo as redo:
                refused[redo.index] = redo.error

    def _run_once(self, ops: Sequence[Op], refused: dict[int, Exception]) -> list[tuple[bool, Any]]:
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == 5:  # SQLITE_BUSY
                raise Busy(str(exc)) from exc
            msg = f"cannot start a write transaction: {exc}"
            raise WriterFailedError(msg) from exc
        except sqlite3.Error as exc:
            msg = f"cannot start a write transaction: {exc}"
            raise WriterFailedError(msg) from exc
        try:
            (version,) = conn.execute("PRAGMA data_version").fetchone()
            if version != self._data_version:
                self._forget()
                self.last_seq = conn.execute(_LAST_SEQ_SQL).fetchone()[0]
                self._data_version = version
            outcomes: list[tuple[bool, Any]] = []
            for i, op in enumerate(ops):
                if i in refused:
                    outcomes.append((False, refused[i]))
                    continue
                before, changes = self.last_seq, conn.total_changes
                try:
                    result = op(self)
                except Exception as exc:
                    if isinstance(exc, sqlite3.Error) and is_fatal(exc):
                        raise
                    if conn.total_changes != changes:
                        raise _Redo(i, exc) from exc
                    self.last_seq = before
                    outcomes.append((False, exc))
                    continue
                outcomes.append((True, result))
            conn.execute("COMMIT")
        except _Redo:
            conn.execute("ROLLBACK")
            self._forget()
            raise
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._forget()
            msg = f"the write transaction failed: {exc}"
            raise WriterFailedError(msg) from exc
        return outcomes

    def _rid(self, run_id: str) -> int:
        rid = self._rids.get(run_id)
        if rid is None:
            found = self.conn.execute(
                "SELECT rid, epoch FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if found is None:
                raise RunNotFoundError(run_id, "the store (commits to a new run need create=)")
            rid = self._rids[run_id] = int(found[0])
            self._epochs[rid] = int(found[1])
        return rid

    def _epoch(self, rid: int) -> int:
        epoch = self._epochs.get(rid)
        if epoch is None:
            (epoch,) = self.conn.execute("SELECT epoch FROM runs WHERE rid = ?", (rid,)).fetchone()
            self._epochs[rid] = epoch = int(epoch)
        return epoch

    def create_run(self, commit: Commit) -> int:
        assert commit.create is not None
        spec = commit.create
        try:
            cur = self.conn.execute(
                "INSERT INTO runs (run_id, epoch, status, created, parent_run_id, parent_seq,"
                " meta) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    commit.run_id,
                    commit.epoch or 0,
                    spec.status,
                    now_us(),
                    spec.parent_run_id,
                    spec.parent_seq,
                    orjson.dumps(dict(spec.meta)).decode(),
                ),
            )
        except sqlite3.IntegrityError:
            msg = f"run {commit.run_id!r} already exists"
            raise ConcurrencyError(msg, run_id=commit.run_id) from None
        rid = self._rids[commit.run_id] = int(cur.lastrowid or 0)
        self._epochs[rid] = commit.epoch or 0
        return rid

    def append(self, commit: Commit) -> AppendResult:
        """Writes one commit: checks its fence, assigns its seqs, inserts its records."""
        rid = self.create_run(commit) if commit.create is not None else self._rid(commit.run_id)
        if commit.epoch is not None and commit.epoch != self._epoch(rid):
            msg = (
                f"run {commit.run_id!r}: append under epoch {commit.epoch} refused, the run's"
                f" epoch is {self._epoch(rid)}; another executor took the run over"
            )
            raise ConcurrencyError(msg, run_id=commit.run_id)
        if commit.check is not None:
            commit.check()
        for r in commit.records:
            # Refused here, before anything of the commit is written.
            if not isinstance(r.kind, str) or not isinstance(r.payload, str):
                msg = f"a record needs a str kind and a JSON text payload, got {r!r}"
                raise TypeError(msg)
        n = len(commit.records)
        first = self.last_seq + 1
        last = self.last_seq + n
        ts = now_us()
        if n:
            self.conn.executemany(
                "INSERT INTO log (seq, rid, kind, step, payload, commit_seq, ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (first + i, rid, r.kind, r.step, r.payload, last, ts)
                    for i, r in enumerate(commit.records)
                ],
            )
            self.last_seq = last
        if commit.status is not None and commit.create is None:
            self.conn.execute("UPDATE runs SET status = ? WHERE rid = ?", (commit.status, rid))
        if commit.inbox_taken:
            self.conn.executemany(
                "UPDATE inbox SET taken_seq = ? WHERE id = ? AND taken_seq IS NULL",
                [(last, i) for i in commit.inbox_taken],
            )
        if commit.snapshot is not None:
            # Delete first: the insert then reuses the old row's pages, so replacing the
            # cache never leaves its previous size behind as free pages in the file.
            self.conn.execute("DELETE FROM snapshots WHERE rid = ?", (rid,))
            self.conn.execute(
                "INSERT INTO snapshots (rid, seq, data) VALUES (?, ?, ?)",
                (rid, commit.snapshot[0], commit.snapshot[1]),
            )
        if commit.on_written is not None:
            commit.on_written(Seq(last))
        return AppendResult(Seq(first), Seq(last), ts)

    def claim(self, run_id: str) -> int:
        """Takes the run over: bumps its epoch so that appends under older epochs fail."""
        rid = self._rid(run_id)
        epoch = self._epoch(rid) + 1
        self.conn.execute("UPDATE runs SET epoch = ? WHERE rid = ?", (epoch, rid))
        self._epochs[rid] = epoch
        return epoch

    def lease(self, run_id: str, owner: str, ttl_us: int, *, renew: bool) -> bool:
        """Takes (or renews) the run's lease for ``owner``; False if another owner holds it."""
        now = now_us()
        row = self.conn.execute(
            "SELECT owner, expires FROM leases WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is not None and row[0] != owner and row[1] > now:
            return False
        if renew and (row is None or row[0] != owner):
            return False  # it lapsed and someone else took it meanwhile, or it was released
        self.conn.execute(
            "INSERT OR REPLACE INTO leases (run_id, owner, expires) VALUES (?, ?, ?)",
            (run_id, owner, now + ttl_us),
        )
        return True

    def release(self, run_id: str, owner: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))

    def post(self, run_id: str, payload: str, key: str | None) -> tuple[int, bool]:
        """Adds an inbox entry; with a key already posted, returns the first entry's id."""
        if key is not None:
            found = self.conn.execute(
                "SELECT id FROM inbox WHERE run_id = ? AND key = ?", (run_id, key)
            ).fetchone()
            if found is not None:
                return int(found[0]), False
        cur = self.conn.execute(
            "INSERT INTO inbox (run_id, key, payload, created) VALUES (?, ?, ?, ?)",
            (run_id, key, payload, now_us()),
        )
        return int(cur.lastrowid or 0), True


# --------------------------------------------------------------------------- the read side

_RECORD_COLS: Final = "log.seq, ?, log.kind, log.step, log.payload, log.commit_seq, log.ts"
_ALL_RECORD_COLS: Final = (
    "log.seq, runs.run_id, log.kind, log.step, log.payload, log.commit_seq, log.ts"
)
# A run's extent is read from the log's (rid, seq) index rather than kept up to date in
# the runs row: that would cost an UPDATE per commit on the append path.
_RUN_COLS: Final = (
    "run_id, status, epoch, created,"
    " coalesce((SELECT ts FROM log WHERE log.rid = runs.rid ORDER BY seq DESC LIMIT 1), created),"
    " (SELECT min(seq) FROM log WHERE log.rid = runs.rid),"
    " (SELECT max(seq) FROM log WHERE log.rid = runs.rid),"
    " parent_run_id, parent_seq, meta, rid"
)


def read_run(conn: sqlite3.Connection, run_id: str) -> RunInfo | None:
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else run_info_from_row(row)


def read_runs(conn: sqlite3.Connection) -> list[RunInfo]:
    return [
        run_info_from_row(r) for r in conn.execute(f"SELECT {_RUN_COLS} FROM runs ORDER BY rid")
    ]


def head(conn: sqlite3.Connection) -> Seq:
    row = conn.execute("SELECT max(seq) FROM log").fetchone()
    return Seq(row[0] or 0)


def iter_records(
    connect_reader: Callable[[], sqlite3.Connection],
    run_id: str | None,
    *,
    after: int,
    upto: int | None,
    kinds: Sequence[str] | None,
    page: int,
) -> Iterator[StoredRecord]:
    """Pages through the log by key; each page is its own short read transaction."""
    conn = connect_reader()
    rid: int | None = None
    if run_id is not None:
        found = conn.execute("SELECT rid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is None:
            raise RunNotFoundError(run_id, "the store")
        rid = found[0]
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
        cols, source = _RECORD_COLS, "log"
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
        except READ_ERRORS as exc:
            yield from _until_damaged(reader, run_id, f"SELECT log.seq{rest}", params, exc)
            raise  # no single record is to blame: the file is damaged elsewhere
        yield from map(StoredRecord._make, rows)
        if len(rows) < page:
            return
        cursor = rows[-1][0]


def _until_damaged(
    conn: sqlite3.Connection, run_id: str | None, seqs_sql: str, params: list[Any], exc: Exception
) -> Iterator[StoredRecord]:
    """The records of a page that failed to read, one by one, up to the one that fails.

    Raises :class:`LogCorruptedError` naming that record's seq, so that a reader can report
    it and go on after it; returns when every record reads alone (the caller re-raises).
    """
    try:
        seqs = [row[0] for row in conn.execute(seqs_sql, params)]
    except READ_ERRORS:
        return  # even the seqs cannot be read: nothing to pin on one record
    if run_id is None:
        one = (
            f"SELECT {_ALL_RECORD_COLS} FROM log JOIN runs ON runs.rid = log.rid WHERE log.seq = ?"
        )
    else:
        one = f"SELECT {_RECORD_COLS} FROM log WHERE log.seq = ?"
    head = [] if run_id is None else [run_id]
    try:
        conn.execute(one, [*head, -1]).fetchall()  # reads no record: is the query itself sound?
    except READ_ERRORS:
        return  # the schema is damaged (a column SQLite no longer finds), not one record
    for seq in seqs:
        try:
            row = conn.execute(one, [*head, seq]).fetchone()
        except READ_ERRORS as bad:
            msg = f"record seq {seq} cannot be read back ({bad}); the file may be damaged"
            raise LogCorruptedError(msg, seq=seq) from bad
        yield StoredRecord._make(row)


def read_inbox(conn: sqlite3.Connection, run_id: str) -> list[tuple[int, str, str | None]]:
    """The run's inbox entries not yet taken into the log: (id, payload, key), in order."""
    return conn.execute(
        "SELECT id, payload, key FROM inbox WHERE run_id = ? AND taken_seq IS NULL ORDER BY id",
        (run_id,),
    ).fetchall()


def read_lease(conn: sqlite3.Connection, run_id: str) -> tuple[str, int] | None:
    """The run's lease holder and when the lease expires (microseconds), if any."""
    row = conn.execute("SELECT owner, expires FROM leases WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def read_snapshot(conn: sqlite3.Connection, run_id: str) -> tuple[Seq, str] | None:
    row = conn.execute(
        "SELECT snapshots.seq, snapshots.data FROM snapshots JOIN runs USING (rid)"
        " WHERE runs.run_id = ?",
        (run_id,),
    ).fetchone()
    return None if row is None else (Seq(row[0]), row[1])
