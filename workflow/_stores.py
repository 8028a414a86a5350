"""Which event store a workflow journals to: the one given, a file or database named by a
path or URL (one store object per file and process), or ``WORKFLOW_STORE``'s."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from eventstore import EventStore, load_key_file
from eventstore._location import is_url

__all__ = ["KEY_FILE_ENV", "STORE_ENV", "open_store"]

# Where workflows created without ``store=`` journal: a file path or a PostgreSQL URL. Unset
# (or empty), each such workflow gets a private in-memory store.
STORE_ENV = "WORKFLOW_STORE"
# A key file (``workflow keygen``) that stores opened from a path or URL encrypt with.
KEY_FILE_ENV = "WORKFLOW_KEY_FILE"

_stores_lock = threading.Lock()
_stores: dict[str, EventStore] = {}


def open_store(store: str | os.PathLike[str] | EventStore | None) -> EventStore:
    """The store ``store`` names (see the module's text)."""
    if isinstance(store, EventStore):
        return store
    if store is None:
        # LlamaIndex code passes no store: the environment can make it durable unchanged.
        store = os.environ.get(STORE_ENV) or None
    if store is None or os.fspath(store) == ":memory:":
        return EventStore()
    # One store object per file (or database) and process: its writer batches every run's
    # commits.
    text = os.fspath(store)
    key = text if is_url(text) else str(Path(text).resolve())
    with _stores_lock:
        found = _stores.get(key)
        if found is None or found.closed or found.failed is not None:
            keys = os.environ.get(KEY_FILE_ENV) or None
            codec = None if keys is None else load_key_file(keys)
            found = _stores[key] = EventStore(store, payload_codec=codec)
        return found
