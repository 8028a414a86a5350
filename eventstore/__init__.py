"""eventstore: an append-only, durable, typed log of records in SQLite."""

from ._codec import Codec, class_name, default_codec
from ._errors import (
    CodecError,
    ConcurrencyError,
    DecodeError,
    EncodeError,
    EventStoreError,
    LogCorruptedError,
    NotAStoreError,
    ReadOnlyStoreError,
    RunNotFoundError,
    SchemaVersionError,
    StoreClosedError,
    StoreUnavailableError,
    UnknownClassError,
    WriterFailedError,
)
from ._records import AppendResult, Commit, NewRun, Record, RunInfo, Seq, StoredRecord
from ._store import Durability, EventStore, InboxEntry, StoreStats

__all__ = [
    "AppendResult",
    "Codec",
    "CodecError",
    "Commit",
    "ConcurrencyError",
    "DecodeError",
    "Durability",
    "EncodeError",
    "EventStore",
    "EventStoreError",
    "InboxEntry",
    "LogCorruptedError",
    "NewRun",
    "NotAStoreError",
    "ReadOnlyStoreError",
    "Record",
    "RunInfo",
    "RunNotFoundError",
    "SchemaVersionError",
    "Seq",
    "StoreClosedError",
    "StoreStats",
    "StoreUnavailableError",
    "StoredRecord",
    "UnknownClassError",
    "WriterFailedError",
    "class_name",
    "default_codec",
]
