"""One executor per run: kernel byte-range locks on a sidecar file, released when a process dies.

The lock of a run is one byte of ``<store>-owners`` at the run's integer id. POSIX record
locks belong to a process and vanish when it dies (even by SIGKILL), so a dead executor's
runs can be resumed at once, while a stopped (SIGSTOP) one still holds its runs. Because
closing *any* descriptor of a file drops all of the process's locks on it, each process
keeps exactly one descriptor per sidecar open for its lifetime; runs owned within this
process are tracked in memory too, since the kernel does not stop a process from locking
a byte twice.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

from eventstore import EventStore

from ._errors import RunOwnedError

__all__ = ["LEASE_TTL_S", "LeaseOwners", "Owners", "probe_owners"]

_MEMORY: Final = "<memory>"
# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (native alignment).
_FLOCK: Final = "hhqqi"


class _Sidecar:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.owned: set[int] = set()

    def _open(self) -> int:
        if self.fd is None:
            flags = os.O_RDWR | os.O_CREAT
            self.fd = os.open(self.path, flags, 0o600)
        return self.fd


_lock = threading.Lock()
_sidecars: dict[str, _Sidecar] = {}


class Owners:
    """Ownership of the runs of one store: ``acquire`` before running, ``release`` after."""

    def __init__(self, db_path: str | None, memory_key: str = "") -> None:
        key = (
            f"{_MEMORY}{memory_key}"
            if db_path is None
            else str(Path(db_path).resolve()) + "-owners"
        )
        with _lock:
            side = _sidecars.get(key)
            if side is None:
                side = _sidecars[key] = _Sidecar(key)
        self._side = side
        self._kernel = db_path is not None

    def acquire(self, run_id: str, rid: int) -> None:
        """Takes the run, or raises :class:`RunOwnedError` if a live executor has it.

        ``rid`` is the run's row id in the store: the byte of the lock file that is its.
        """
        side = self._side
        with _lock:
            if rid in side.owned:
                raise RunOwnedError(run_id, "an executor in this process")
            if self._kernel:
                try:
                    fcntl.lockf(side._open(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, rid)
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EAGAIN):
                        raise RunOwnedError(run_id, _holder(side, rid)) from None
                    raise
            side.owned.add(rid)

    def release(self, run_id: str, rid: int) -> None:
        """Gives the run back; a dead process's runs are released by the kernel."""
        side = self._side
        with _lock:
            if rid not in side.owned:
                return
            side.owned.discard(rid)
            if self._kernel and side.fd is not None:
                fcntl.lockf(side.fd, fcntl.LOCK_UN, 1, rid)

    def is_owned(self, run_id: str, rid: int) -> bool:
        """Whether a live executor (here or in another process) holds the run now."""
        side = self._side
        with _lock:
            if rid in side.owned:
                return True
            if not self._kernel:
                return False
            try:
                fd = side._open()
            except OSError:
                return False  # a read-only place: nobody could have locked it here
            return _lock_holder(fd, rid) is not None


def _lock_holder(fd: int, rid: int) -> int | None:
    """The id of the process holding the run's byte, or None when nobody does.

    Asks the kernel (F_GETLK) rather than taking the lock for a moment: a probe that locks
    would make a concurrent resume fail.
    """
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, rid, 1, 0)
    found = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    return None if found[0] == fcntl.F_UNLCK else int(found[4])


def _holder(side: _Sidecar, rid: int) -> str:
    """Who holds a run another process locked, for its :class:`RunOwnedError`."""
    pid = None if side.fd is None else _lock_holder(side.fd, rid)
    return "another process" if pid is None else f"another process, pid {pid}"


# How long a run's lease lasts by default (Workflow(lease_ttl=...) sets another).
LEASE_TTL_S: Final = 10.0


class LeaseOwners:
    """Ownership through leases in the store: for a store that several hosts share.

    A lease lasts ``ttl`` seconds and the executor renews it every third of that; one
    whose owner stopped renewing (a dead or partitioned host) can be taken over, and the
    taker's new epoch fences every append of the old owner. Runs owned here are also
    tracked in memory, so two executors of this process never run the same run.
    """

    def __init__(self, store: EventStore, ttl: float = LEASE_TTL_S) -> None:
        self.store = store
        self.ttl = ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._owned: set[int] = set()

    def acquire(self, run_id: str, rid: int) -> None:
        """Takes the run's lease, or raises :class:`RunOwnedError`."""
        with _lock:
            if rid in self._owned:
                raise RunOwnedError(run_id, "an executor in this process")
            self._owned.add(rid)
        if not self.store.lease_sync(run_id, self.owner, self.ttl):
            with _lock:
                self._owned.discard(rid)
            holder = self.store.lease_of(run_id)
            who = f"its lease is held by {holder[0] if holder else '?'}"
            raise RunOwnedError(run_id, who, None if holder is None else holder[1] / 1e6)

    async def renew(self, run_id: str) -> bool:
        """Extends the lease; False when it was lost (the executor must stop at once)."""
        return await self.store.lease(run_id, self.owner, self.ttl, renew=True)

    def release(self, run_id: str, rid: int) -> None:
        with _lock:
            if rid not in self._owned:
                return
            self._owned.discard(rid)
        if not self.store.closed:
            self.store.release_sync(run_id, self.owner)

    def is_owned(self, run_id: str, rid: int) -> bool:
        with _lock:
            if rid in self._owned:
                return True
        lease = self.store.lease_of(run_id) if run_id else None
        return lease is not None and lease[1] > time.time_ns() // 1000

    def leases_now(self) -> dict[str, tuple[str, float]]:
        """Every live lease at one moment, in one query (a listing of N runs asks the server
        once, not N times): run id -> (its holder, when it lapses unless renewed, as Unix
        seconds). A dead holder's lease stays live until then."""
        now = time.time_ns() // 1000
        rows = self.store.query(
            "SELECT run_id, owner, expires FROM leases WHERE expires > ?", (now,)
        )
        return {str(row[0]): (str(row[1]), int(row[2]) / 1e6) for row in rows}

    def owned_now(
        self, leases: dict[str, tuple[str, float]] | None = None
    ) -> Callable[[str, int], bool]:
        """:meth:`is_owned` for many runs at one moment: every live lease read in one query
        (or ``leases``, :meth:`leases_now` read already)."""
        leased = self.leases_now() if leases is None else leases
        with _lock:
            mine = set(self._owned)
        return lambda run_id, rid: rid in mine or run_id in leased


class _Nobody(Owners):
    """Ownership of a store no executor ever ran: nobody owns any of its runs."""

    def is_owned(self, run_id: str, rid: int) -> bool:
        return False


def probe_owners(store: EventStore) -> Owners | LeaseOwners:
    """The store's ownership as a reader asks it, without creating the lock file when there
    is none (a reader of a store should not leave files behind it)."""
    if store.kind == "postgres":
        return LeaseOwners(store)
    path = store.path
    # Executors create "<db>-owners" when they take a run; without it no run is owned.
    if path is None or not Path(str(Path(path).resolve()) + "-owners").exists():
        return _Nobody(path)
    return Owners(path)
