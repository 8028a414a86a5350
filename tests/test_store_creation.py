"""Creating a store: published whole, auto_vacuum set, and half-made ones of old versions repaired.

The crash test in ``tests/crash/test_create_crash.py`` kills creators at random moments;
these tests pin each state such a kill can leave, and the fixture ``half-created.sqlite``
(with its ``-journal``) is a file an earlier version left when it was killed while creating
a store (it then refused to open it forever).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eventstore._sqlite as _sqlite
from eventstore import Commit, EventStore, NewRun, NotAStoreError, Record

FIXTURES = Path(__file__).with_name("fixtures")


def pragma(path: Path, name: str) -> object:
    """One PRAGMA's value, read with plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


def works(path: Path) -> None:
    """Checks that ``path`` opens as a store that takes and gives back a commit."""
    with EventStore(path) as store:
        store.append_sync(Commit("r", [Record("k", None, "{}")], create=NewRun()))
        assert [r.kind for r in store.records("r")] == ["k"]
    assert pragma(path, "integrity_check") == "ok"


def half_created(tmp_path: Path) -> Path:
    """A copy of the fixture store whose creation an earlier version did not finish."""
    path = tmp_path / "runs.db"
    shutil.copyfile(FIXTURES / "half-created.sqlite", path)
    shutil.copyfile(FIXTURES / "half-created.sqlite-journal", f"{path}-journal")
    return path


def test_new_store_has_incremental_auto_vacuum(tmp_path: Path) -> None:
    """A new file store is created with auto_vacuum=INCREMENTAL, in WAL mode."""
    path = tmp_path / "new.db"
    EventStore(path).close()
    assert pragma(path, "auto_vacuum") == 2  # INCREMENTAL
    assert pragma(path, "journal_mode") == "wal"


def test_new_store_leaves_only_its_own_files(tmp_path: Path) -> None:
    """Creating a store leaves nothing beside it but the store (no temporary file)."""
    path = tmp_path / "new.db"
    EventStore(path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db"]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_existing_stores_keep_their_auto_vacuum(tmp_path: Path) -> None:
    """A store made before auto_vacuum (NONE) still opens, works and is not rewritten."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    _sqlite._migrate(conn, None)  # the schema as the earlier version created it
    conn.close()
    assert pragma(path, "auto_vacuum") == 0
    works(path)
    assert pragma(path, "auto_vacuum") == 0


def test_store_half_created_by_an_earlier_version_opens(tmp_path: Path) -> None:
    """A file with the hot journal of an interrupted switch to WAL is finished as a store."""
    path = half_created(tmp_path)
    probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            probe.execute("SELECT name FROM sqlite_master")  # what bricked it before
    finally:
        probe.close()
    works(path)
    assert pragma(path, "auto_vacuum") == 2
    assert not Path(f"{path}-journal").exists()


def test_half_created_store_read_only_is_refused_by_name(tmp_path: Path) -> None:
    """Read-only, a half-created store is refused with what to do, and left untouched."""
    path = half_created(tmp_path)
    before = path.read_bytes(), Path(f"{path}-journal").read_bytes()
    with pytest.raises(NotAStoreError, match=r"creation was interrupted.*without readonly=True"):
        EventStore(path, readonly=True)
    assert (path.read_bytes(), Path(f"{path}-journal").read_bytes()) == before


def test_wal_file_without_tables_gets_auto_vacuum(tmp_path: Path) -> None:
    """A file switched to WAL whose schema was never written becomes a store, auto_vacuum on."""
    path = tmp_path / "wal-only.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    works(path)
    assert pragma(path, "auto_vacuum") == 2


def test_empty_file_gets_auto_vacuum(tmp_path: Path) -> None:
    """An empty file becomes a store with auto_vacuum=INCREMENTAL."""
    path = tmp_path / "empty.db"
    path.touch()
    works(path)
    assert pragma(path, "auto_vacuum") == 2


_SPILL = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 2")
conn.execute("BEGIN")
conn.executemany("INSERT INTO people VALUES (?)", [("x" * 2000,)] * 200)
os._exit(0)  # killed mid-transaction, with pages already spilled into the file
"""


def test_foreign_database_with_a_hot_journal_is_refused_untouched(tmp_path: Path) -> None:
    """Another application's database with a crashed writer's journal is refused, untouched."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.commit()
    conn.close()
    subprocess.run([sys.executable, "-c", _SPILL, str(path)], check=True, timeout=60)
    journal = Path(f"{path}-journal")
    assert journal.stat().st_size > 0
    before = path.read_bytes(), journal.read_bytes()
    with pytest.raises(NotAStoreError, match=r"other\.db.*hot rollback journal"):
        EventStore(path)
    assert (path.read_bytes(), journal.read_bytes()) == before


def _leftover(tmp_path: Path, target: str, pid: int, token: str, age_s: float) -> Path:
    name = f".{target}.{pid}.{token}.new"
    path = tmp_path / name
    path.write_bytes(b"")
    Path(f"{path}-wal").write_bytes(b"")
    old = time.time() - age_s
    for p in (path, Path(f"{path}-wal")):
        os.utime(p, (old, old))
    return path


def test_writable_open_removes_what_killed_creators_left(tmp_path: Path) -> None:
    """Old temporary files of killed creators go; fresh ones and other files stay."""
    stale = _leftover(tmp_path, "runs.db", 11, "0a0b0c0d", _sqlite.STALE_TEMP_S + 5)
    fresh = _leftover(tmp_path, "runs.db", 12, "1a1b1c1d", 0)
    other = _leftover(tmp_path, "other.db", 13, "2a2b2c2d", _sqlite.STALE_TEMP_S + 5)
    (tmp_path / ".runs.db.notes").write_text("mine")
    works(tmp_path / "runs.db")
    assert not stale.exists()
    assert not Path(f"{stale}-wal").exists()
    assert fresh.exists()
    assert other.exists()
    assert (tmp_path / ".runs.db.notes").exists()


def test_second_name_of_a_published_store_is_removed(tmp_path: Path) -> None:
    """A temporary name still linked to the published store (killed after the link) goes."""
    path = tmp_path / "runs.db"
    EventStore(path).close()
    extra = tmp_path / ".runs.db.99.3a3b3c3d.new"
    os.link(path, extra)
    works(path)
    assert not extra.exists()
    assert path.stat().st_nlink == 1


def test_creation_without_hard_links_creates_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a filesystem without hard links the store is created in place, and works."""

    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "runs.db"
    works(path)
    assert pragma(path, "auto_vacuum") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def test_a_relative_path_starting_file_colon_is_a_path_not_a_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite reads a name starting ``file:`` as a URI: the store was made at the literal
    path, then an empty database opened beside it (reported as a damaged store). The path
    is the file, for writing and for reading alike, and nothing else is made."""
    monkeypatch.chdir(tmp_path)
    with EventStore("file:runs.db") as store:
        store.append_sync(Commit("r", [Record("note", None, '"x"')], create=NewRun()))
    with EventStore("file:runs.db", readonly=True) as store:
        assert [r.payload for r in store.records("r")] == ['"x"']
    # The store's own files only (the WAL and its index beside it), none named "runs.db".
    assert all(p.name.startswith("file:runs.db") for p in tmp_path.iterdir()), list(
        tmp_path.iterdir()
    )
