"""LISTEN/NOTIFY: an inbox post to a PostgreSQL store wakes its run's owner on any host.

``dw_write`` notifies the store's channel (one per schema) when it adds an inbox entry;
the notification is delivered when the transaction commits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._pg_connect import connect, psycopg

__all__ = ["listen"]


def _channel(conn: Any) -> str:
    """The notification channel of a store: one per schema, so stores never cross-talk."""
    (schema,) = conn.execute("SELECT current_schema()").fetchone()
    return f"dw_inbox_{schema}"


def listen(target: str, callback: Callable[[str], None], stop: Any) -> None:
    """Calls ``callback(run_id)`` for every inbox post to the store until ``stop`` is set.

    Runs in a thread of its own: LISTEN needs a connection that waits for the server.
    """
    conn = connect(target, readonly=True)
    try:
        conn.execute(f'LISTEN "{_channel(conn)}"')
        while not stop.is_set():
            for note in conn.notifies(timeout=0.5):
                callback(note.payload)
    except psycopg.Error:
        return  # the server went away: owners still poll their inbox
    finally:
        conn.close()
