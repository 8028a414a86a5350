"""The errors of the event store.

EventStoreError
  + NotAStoreError          the file is not SQLite, or is SQLite but not one of our stores
  + SchemaVersionError      the store was written by a newer version of this library
  + ConcurrencyError        a commit was refused: stale epoch, or its check failed
  + RunNotFoundError        (also LookupError) no run with that id
  + StoreClosedError        (also RuntimeError) the store was closed
  + StoreUnavailableError   (also ConnectionError) the database server cannot be reached
  + ReadOnlyStoreError      (also PermissionError) a write on a store opened read-only
  + WriterFailedError       the writer stopped on an error that was no single commit's fault
  + LogCorruptedError       a record that cannot be read back (names the seq)
  + CodecError
      + EncodeError         (also TypeError) a value the codec cannot encode (names the path)
      + DecodeError         (also ValueError) text that is not a value the codec wrote
          + PickleDisabledError a pickle in the log, read by a codec that did not opt in
      + UnknownClassError   (also LookupError) a class named in the log is not allowed here
          + UpcastError     a stored version of a class that no upcaster path brings up to date
"""

from __future__ import annotations

__all__ = [
    "CodecError",
    "ConcurrencyError",
    "DecodeError",
    "EncodeError",
    "EventStoreError",
    "LogCorruptedError",
    "NotAStoreError",
    "PickleDisabledError",
    "ReadOnlyStoreError",
    "RunNotFoundError",
    "SchemaVersionError",
    "SnapshotUnreadableError",
    "StoreClosedError",
    "StoreUnavailableError",
    "UnknownClassError",
    "UpcastError",
    "WriterFailedError",
]


class EventStoreError(Exception):
    """Base class of every error raised by :mod:`eventstore`."""


class NotAStoreError(EventStoreError):
    """The file is not an SQLite database, or is one that this library did not create."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        # A directory or a PostgreSQL schema is left as it was too: "it", not "the file".
        super().__init__(f"{path}: not an event store: {reason}; it was left untouched")


class SchemaVersionError(EventStoreError):
    """The store's schema is newer than this library understands."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"{path}: schema version {found} is newer than the {supported} this version of "
            "durable-workflows supports; upgrade the library (it was left untouched)"
        )


class ConcurrencyError(EventStoreError):
    """A commit was refused because the log moved on: a stale epoch or a failed check."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        self.run_id = run_id
        super().__init__(message)


class RunNotFoundError(EventStoreError, LookupError):
    """No run with that id exists in the store."""

    def __init__(self, run_id: str, where: str = "") -> None:
        self.run_id = run_id
        suffix = f" in {where}" if where else ""
        super().__init__(f"no run {run_id!r}{suffix}")


class StoreClosedError(EventStoreError, RuntimeError):
    """The store was closed; open a new one to keep working."""


class StoreUnavailableError(EventStoreError, ConnectionError):
    """The database server cannot be reached (a PostgreSQL store)."""


class StoreURLError(EventStoreError, ValueError):
    """A PostgreSQL store URL the store cannot use (a bad percent-escape, ``schema`` or
    ``reply_spin_us``, one of ours given twice); refused before connecting."""


class ReadOnlyStoreError(EventStoreError, PermissionError):
    """A write was attempted on a store opened with ``readonly=True``."""


class WriterFailedError(EventStoreError):
    """The writer stopped on an error that was not one commit's fault (disk full, I/O)."""


class LogCorruptedError(EventStoreError):
    """A record in the log cannot be read back; the message names its seq."""

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        self.seq = seq
        super().__init__(message)


class SnapshotUnreadableError(LogCorruptedError):
    """A run's snapshot (a cache) cannot be read at all: its text is not valid UTF-8, as
    only damage to the file makes it. ``seq`` is the snapshot's: readers pass over it to
    the one before, or to the log itself, which is the truth."""

    seq: int

    def __init__(self, message: str, *, seq: int) -> None:
        super().__init__(message, seq=seq)


class CodecError(EventStoreError):
    """Base class of the value codec's errors."""


class EncodeError(CodecError, TypeError):
    """A value (or a part of it) has a type the codec cannot encode."""

    def __init__(self, path: str, type_: type, detail: str = "") -> None:
        self.path = path
        self.type = type_
        self.detail = detail
        extra = f": {detail}" if detail else ""
        super().__init__(f"cannot encode {path}: {type_!r}{extra}")


class DecodeError(CodecError, ValueError):
    """Text that is not a value written by the codec."""


class PickleDisabledError(DecodeError):
    """The log holds a pickle (written with the pickle opt-in) and this reader did not opt
    in: the log is not damaged; the message says how to opt in."""


class UnknownClassError(CodecError, LookupError):
    """A class named in the log is neither registered nor an allowed, imported class."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"cannot decode class {name!r}: {reason}")


class UpcastError(UnknownClassError):
    """A payload stored at an older (or newer) version of a class than the code declares,
    with no chain of upcasters that turns it into the current version."""

    def __init__(self, name: str, stored: int, current: int, reason: str) -> None:
        self.stored = stored
        self.current = current
        super().__init__(name, reason)
