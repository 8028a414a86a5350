"""How the writer thread waits for a write lock another connection holds: a while, loudly.

A lock held for long is a transaction left open elsewhere (an SQLite shell, a browser of the
file, a stopped process), not another writer at work: waiting for it without end would hang
every run of the store with nothing said. The thread says in the log, at each busy timeout,
that it waits, and gives the batch up after :data:`LOCK_WAIT_S` in all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from ._backend import Busy
from ._errors import StoreUnavailableError
from ._writer import BatchWriter, Op

__all__ = ["LOCK_WAIT_S", "WRITER_BUSY_MS", "run_waiting"]

# How long, in all, a batch waits for the lock before it is given up (nothing of it made).
LOCK_WAIT_S: Final = 30.0
# The writer thread's busy timeout: how long one attempt waits for the lock (SQLite's).
WRITER_BUSY_MS: Final = 10_000

_log = logging.getLogger("eventstore")


def run_waiting(writer: BatchWriter, ops: Sequence[Op], where: str) -> list[tuple[bool, Any]]:
    """The batch of ``ops``, waiting for the write lock up to :data:`LOCK_WAIT_S` in all.

    :raises StoreUnavailableError: another connection held the lock all that time.
    """
    began = time.monotonic()
    while True:
        try:
            return writer.run_batch(ops)
        except Busy as exc:
            waited = time.monotonic() - began
            if waited >= LOCK_WAIT_S:
                msg = (
                    f"{where}: another connection has held the write lock for {waited:.0f} s"
                    " (a transaction left open in another program?); nothing of this write"
                    " was made"
                )
                raise StoreUnavailableError(msg) from exc
            _log.warning(
                "%s: waiting for the write lock another connection holds (%.0f s so far;"
                " giving up after %.0f s)",
                where,
                waited,
                LOCK_WAIT_S,
            )
