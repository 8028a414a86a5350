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
import threading
from pathlib import Path
from typing import Final

from ._errors import RunOwnedError

__all__ = ["Owners"]

_MEMORY: Final = "<memory>"


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
        """Takes the run, or raises :class:`RunOwnedError` if a live executor has it."""
        side = self._side
        with _lock:
            if rid in side.owned:
                raise RunOwnedError(run_id, "an executor in this process")
            if self._kernel:
                try:
                    fcntl.lockf(side._open(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, rid)
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EAGAIN):
                        raise RunOwnedError(run_id, "another process") from None
                    raise
            side.owned.add(rid)

    def release(self, rid: int) -> None:
        """Gives the run back; a dead process's runs are released by the kernel."""
        side = self._side
        with _lock:
            if rid not in side.owned:
                return
            side.owned.discard(rid)
            if self._kernel and side.fd is not None:
                fcntl.lockf(side.fd, fcntl.LOCK_UN, 1, rid)

    def is_owned(self, rid: int) -> bool:
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
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, rid)
            except OSError:
                return True
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, rid)
            return False
