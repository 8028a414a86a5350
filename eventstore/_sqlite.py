"""An SQLite store's file: creating, checking and migrating it, its pragmas, connections.

sqlite-utils creates and migrates the schema, and is imported only then: opening a store of
this version needs none of it (it was a seventh of ``import workflow``'s time). What an
opened store runs on SQLite (its write transaction) is :mod:`._sqlite_backend`'s; the
commit rules are :mod:`._writer`'s.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ._errors import NotAStoreError, SchemaVersionError

if TYPE_CHECKING:
    import sqlite_utils

SCHEMA_VERSION: Final = 3
# What a damaged file raises on reads (SQLite's message can quote text that is not UTF-8).
READ_ERRORS: Final = (sqlite3.DatabaseError, UnicodeDecodeError)
APP_ID: Final = "durable-workflows/eventstore"
SQLITE_MAGIC: Final = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS: Final = 10_000
# New stores give the pages of deleted rows back to the filesystem on request
# (PRAGMA incremental_vacuum); it can only be chosen before the first table exists.
AUTO_VACUUM: Final = "INCREMENTAL"
_AUTO_VACUUM_INCREMENTAL: Final = 2  # what PRAGMA auto_vacuum reads back for it

# SQLite result codes (the primary code is the low byte of an extended code) that mean the
# database as a whole is unwell rather than one commit being wrong.
_FATAL_CODES: Final = frozenset({10, 11, 13, 14, 26, 8})  # IOERR CORRUPT FULL CANTOPEN NOTADB RO


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
) -> tuple[str, bool, int]:
    """Validates (and for a writable store, creates or migrates) the database.

    Returns the connection target, whether it is a URI, and the schema version readers
    find there (an older store opened read-only is not migrated). Foreign files are refused before
    anything is written, so they stay byte-for-byte as they were. A new store is built
    beside its path and published whole (:func:`_create`), so a process killed while it
    creates one leaves no half-made store behind; one left by an earlier version (an
    interrupted switch to WAL) is recognised and finished.
    """
    if path is None:
        target, uri = f"file:/{memory_name}?vfs=memdb", True
        conn = connect(target, uri=uri, readonly=False, durability=durability, memory=True)
        _migrate(conn, None)
        return target, uri, SCHEMA_VERSION
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
        return f"{file.resolve().as_uri()}?mode=ro", True, version
    # Absolute: a relative name starting "file:" would be read by SQLite as a URI naming
    # another file (the store made at the literal path, then an empty one opened beside it).
    target = os.path.abspath(file)
    conn = connect(target, uri=False, readonly=False, durability=durability, memory=False)
    try:
        if version is None:
            _prepare_in_place(conn)
        else:
            _set_wal(conn)
        _migrate(conn, version)
    finally:
        conn.close()
    _sweep(Path(os.path.realpath(file)))
    return target, False, SCHEMA_VERSION


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
    import sqlite_utils  # only a new or older store needs it

    conn.execute("BEGIN IMMEDIATE")
    try:
        current = _inspect(conn, "store")  # another process may have created it meanwhile
        db = sqlite_utils.Database(conn)
        if current is None:
            _create_v1(db)
            current = 1
        if current < 2:
            _migrate_v2(db)
        if current < 3:
            _migrate_v3(db)
        db.table("meta").upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _migrate_v2(db: sqlite_utils.Database) -> None:
    """Version 2: leases, so that workers on several hosts take runs one at a time."""
    db.table("leases").create({"run_id": str, "owner": str, "expires": int}, pk="run_id")


def _migrate_v3(db: sqlite_utils.Database) -> None:
    """Version 3: many snapshots a run, each with the version of the code that derived it
    and the count of records it covers, so that a read at any seq replays only from the
    nearest one. Snapshots kept before were derived by version 1; their count is counted."""
    snapshots = db.table("snapshots")
    snapshots.add_column("version", int, not_null_default=1)
    snapshots.add_column("records", int)
    db.execute(
        "UPDATE snapshots SET records = (SELECT count(*) FROM log"
        " WHERE log.rid = snapshots.rid AND log.seq <= snapshots.seq)"
    )
    snapshots.transform(
        pk=("rid", "seq"),
        not_null={"seq", "data"},
        column_order=["rid", "seq", "version", "records", "data"],
    )


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
