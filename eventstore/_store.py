"""EventStore: the durable log, a group-commit writer and short-lived readers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, overload

from . import _sql
from ._backend import Backend, Connection
from ._committer import Committer, Then
from ._encryption import PayloadCodec, Sealer, sealed_key_id
from ._errors import (
    LogCorruptedError,
    ReadOnlyStoreError,
    RunNotFoundError,
    StoreClosedError,
    StoreUnavailableError,
    WriterFailedError,
)
from ._location import is_url
from ._records import AppendResult, Commit, RunInfo, Seq, Snapshot, StoredRecord
from ._sqlite_backend import SQLiteBackend

__all__ = ["Durability", "EventStore", "InboxEntry", "StoreStats"]

Durability = Literal["normal", "full"]


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An external event posted for a run and not yet taken into its log."""

    id: int
    payload: str
    key: str | None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of the writer: how many transactions carried how many operations."""

    transactions: int
    operations: int


def open_backend(location: str | None, *, readonly: bool, durability: Durability) -> Backend:
    """The backend of a store location: a PostgreSQL URL, a file path, or None (memory)."""
    if location is not None and is_url(location):
        from ._postgres import PostgresBackend  # psycopg is imported for PostgreSQL only

        return PostgresBackend(location, readonly=readonly, durability=durability)
    return SQLiteBackend(location, readonly=readonly, durability=durability)


class EventStore:
    """An append-only, durable log of records in SQLite, read by run and by seq range.

    ``EventStore(path)`` opens or creates a file store; ``EventStore()`` (or ``":memory:"``)
    an in-memory store that behaves like a file store: one database shared by the writer
    and every reader of this object. ``readonly=True`` opens an existing store for reading
    only and never creates or changes a file.

    ``durability="normal"`` (the default) uses ``synchronous=NORMAL``: a commit survives a
    crash of the process, and the last commits may be lost if the machine loses power.
    ``durability="full"`` syncs every transaction to disk (``synchronous=FULL``) and survives
    power loss, at the price of one fsync per transaction (group commit shares it).

    Commits are written by one writer per store object, which takes every commit waiting
    at that moment into one transaction; a refused commit leaves the others in.

    ``payload_codec`` (an :class:`~eventstore.AesGcmCodec`, or any
    :class:`~eventstore.PayloadCodec`) encrypts every payload written (records, snapshots,
    inbox entries) and decrypts what is read; seqs, kinds, steps and times stay plain.

    :raises NotAStoreError: the file is not SQLite, or not a store.
    :raises SchemaVersionError: the store was written by a newer version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        durability: Durability = "normal",
        payload_codec: PayloadCodec | None = None,
    ) -> None:
        if durability not in ("normal", "full"):
            msg = f"durability must be 'normal' or 'full', not {durability!r}"
            raise ValueError(msg)
        raw = None if path is None else os.fspath(path)
        self.memory: Final = raw in (None, ":memory:")
        self.path: Final = None if self.memory else raw
        if self.memory and readonly:
            msg = "an in-memory store cannot be opened read-only: it would always be empty"
            raise ValueError(msg)
        self.readonly: Final = readonly
        self.durability: Final = durability
        # Encryption at rest (see _encryption): None keeps payloads as plain JSON text.
        self.payload_codec: Final = payload_codec
        self._sealer = None if payload_codec is None else Sealer(payload_codec)
        self._backend = open_backend(self.path, readonly=readonly, durability=durability)
        self.kind: Final = self._backend.kind
        self._lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[Connection] = []
        self._closed = False
        # What holds commits back to ride with a later one (an executor's records of work
        # begun): told to submit them before a flush or close (:meth:`hold`).
        self._holders: dict[int, Callable[[], None]] = {}
        # Only where a write costs no fsync and no server round trip may the event loop
        # write its own batches (see Committer); otherwise the writer thread does.
        inline = self._backend.writes_inline and durability == "normal" and not readonly
        self._committer = Committer(self._backend, inline=inline, guard=self._check_writable)
        self._listeners: list[Callable[[str], None]] = []
        self._listener: threading.Thread | None = None
        self._stop_listening = threading.Event()

    def __repr__(self) -> str:
        where = ":memory:" if self.memory else self.path
        return f"EventStore({where!r}, durability={self.durability!r})"

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ connections

    def _reader(self) -> Connection:
        if self._closed:
            msg = f"{self!r} is closed"
            raise StoreClosedError(msg)
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._backend.reader()
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    def _check_writable(self) -> None:
        if self._closed:
            msg = f"{self!r} is closed"
            raise StoreClosedError(msg)
        if self.readonly:
            msg = f"{self.path}: the store was opened read-only"
            raise ReadOnlyStoreError(msg)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the store takes no more reads or writes."""
        return self._closed

    @property
    def failed(self) -> WriterFailedError | None:
        """The writer's failure once the database failed (None while it works): the store
        takes no more writes, and a new store object on the same file is needed."""
        return self._committer.failed

    # ------------------------------------------------------------------ writing

    def submit(
        self, commit: Commit, *, lazy: bool = False, then: Then | None = None
    ) -> asyncio.Future[AppendResult]:
        """Queues a commit from async code; the future resolves once it is durable.

        ``lazy=True`` lets the commit wait (briefly) for the next one to share its
        transaction: for records that only say work began. ``then(ok, result or
        exception)`` is called on the loop just before the future resolves, in commit
        order (cheaper than a done-callback, which costs a loop iteration of its own).
        """
        if self._sealer is not None:
            commit = self._sealer.commit(commit)
        return self._committer.submit_async(lambda w: w.append(commit), lazy=lazy, then=then)

    @overload
    def submit_many(
        self,
        commits: Sequence[Commit],
        *,
        lazy: bool = ...,
        then: Then | None = ...,
        last_alone: Literal[False] = ...,
    ) -> asyncio.Future[list[AppendResult]]: ...

    @overload
    def submit_many(
        self,
        commits: Sequence[Commit],
        *,
        lazy: bool = ...,
        then: Then | None = ...,
        last_alone: bool,
    ) -> asyncio.Future[list[AppendResult | Exception]]: ...

    def submit_many(
        self,
        commits: Sequence[Commit],
        *,
        lazy: bool = False,
        then: Then | None = None,
        last_alone: bool = False,
    ) -> asyncio.Future[list[AppendResult]] | asyncio.Future[list[AppendResult | Exception]]:
        """Queues several commits, in order, as one operation: all are written or none.

        Each stays a commit of its own (its own seqs and commit boundary); the future
        resolves with their results once they are durable (``then`` as for
        :meth:`submit`). One submission instead of one per commit, for an executor whose
        records of work begun (a dequeue, an attempt's start) ride with its next commit.
        With ``last_alone`` the last commit may be refused alone: the others are written
        all the same, and the error that refused it is its result.
        """
        batch = list(commits)
        if self._sealer is not None:
            batch = [self._sealer.commit(c) for c in batch]
        return self._committer.submit_async(
            lambda w: w.append_all(batch, last_alone=last_alone), lazy=lazy, then=then
        )

    async def append(self, commit: Commit) -> AppendResult:
        """Appends a commit atomically; returns its seqs once it is durable.

        :raises ConcurrencyError: a stale epoch, a failed check, or a run that exists.
        :raises RunNotFoundError: the run does not exist and the commit does not create it.
        :raises WriterFailedError: the database failed (disk full, I/O error).
        """
        return await self.submit(commit)

    def append_sync(self, commit: Commit) -> AppendResult:
        """Appends a commit from synchronous code (tools, tests); blocks until durable."""
        if self._sealer is not None:
            commit = self._sealer.commit(commit)
        return self._committer.submit_sync(lambda w: w.append(commit))

    async def flush(self) -> None:
        """Waits until every commit queued so far, lazy ones included, is durable (and
        those held back to ride with a later one, :meth:`hold`)."""
        for release in list(self._holders.values()):
            release()
        await self._committer.submit_async(lambda w: None)

    def hold(self, release: Callable[[], None]) -> Callable[[], None]:
        """Registers ``release``, which submits the commits its caller holds back to ride
        with a later one (as a lazy commit would): :meth:`flush` and :meth:`close` call it
        first. Returns the function that unregisters it."""
        key = id(release)
        self._holders[key] = release

        def unhold() -> None:
            self._holders.pop(key, None)

        return unhold

    async def claim(self, run_id: str) -> int:
        """Takes a run over: returns its new epoch; appends under older epochs now fail."""
        return await self._committer.submit_async(lambda w: w.claim(run_id))

    def claim_sync(self, run_id: str) -> int:
        """Synchronous :meth:`claim`."""
        return self._committer.submit_sync(lambda w: w.claim(run_id))

    async def post(self, run_id: str, payload: str, *, key: str | None = None) -> int:
        """Adds an external event to the run's inbox; a repeated ``key`` posts it once."""
        if self._sealer is not None:
            payload = self._sealer.seal(payload, "inbox")
        entry, _ = await self._committer.submit_async(lambda w: w.post(run_id, payload, key))
        return entry

    def post_sync(self, run_id: str, payload: str, *, key: str | None = None) -> int:
        """Synchronous :meth:`post`; returns the entry's id (the first one's, for a key)."""
        if self._sealer is not None:
            payload = self._sealer.seal(payload, "inbox")
        entry, _ = self._committer.submit_sync(lambda w: w.post(run_id, payload, key))
        return entry

    async def lease(self, run_id: str, owner: str, ttl: float, *, renew: bool = False) -> bool:
        """Takes the run's lease for ``owner`` for ``ttl`` seconds (or renews it).

        Returns False while another owner's lease has not expired (or, with ``renew``,
        when this owner no longer holds it). Leases keep executors on several hosts
        apart; epochs fence the appends of one that lost its lease.
        """
        ttl_us = int(ttl * 1e6)
        return await self._committer.submit_async(
            lambda w: w.lease(run_id, owner, ttl_us, renew=renew)
        )

    def lease_sync(self, run_id: str, owner: str, ttl: float, *, renew: bool = False) -> bool:
        """Synchronous :meth:`lease`."""
        ttl_us = int(ttl * 1e6)
        return self._committer.submit_sync(lambda w: w.lease(run_id, owner, ttl_us, renew=renew))

    def release_sync(self, run_id: str, owner: str) -> None:
        """Gives a lease back (a no-op unless ``owner`` holds it)."""
        self._committer.submit_sync(lambda w: w.release(run_id, owner))

    def delete_runs(self, runs: Mapping[str, int | None]) -> list[str]:
        """Deletes whole runs: their records, inbox, snapshots, lease and row, at once.

        ``runs`` maps each run to the last seq the caller saw it at (None: no records); a
        run that changed since, that a live lease holds, or that a run kept names as its
        parent (a fork's ancestors) is kept. Returns the runs deleted. Seqs are never
        reused. The space comes back with :meth:`reclaim`.
        """
        return self._committer.submit_sync(lambda w: w.delete_runs(runs))

    def reclaim(self) -> None:
        """Gives the space of deleted runs back: an SQLite store's file shrinks (incremental
        vacuum, then a checkpoint that empties the WAL); PostgreSQL vacuums the tables."""
        self._check_writable()
        self._backend.reclaim()

    def on_post(self, callback: Callable[[str], None]) -> None:
        """Calls ``callback(run_id)`` (from another thread) whenever an event is posted to a
        run's inbox by any process, on stores that can tell (PostgreSQL's LISTEN/NOTIFY).

        Other stores call nothing; their readers poll the inbox instead.
        """
        listen = self._backend.listen
        if listen is None:
            return
        with self._lock:
            self._listeners.append(callback)
            if self._listener is not None:
                return
            self._listener = threading.Thread(
                target=listen,
                args=(self._notify, self._stop_listening),
                name="eventstore-listener",
                daemon=True,
            )
            self._listener.start()

    def _notify(self, run_id: str) -> None:
        for callback in list(self._listeners):
            with contextlib.suppress(Exception):  # a listener's failure is its own
                callback(run_id)

    def lease_of(self, run_id: str) -> tuple[str, int] | None:
        """Who holds the run's lease and until when (microseconds), if anyone ever did."""
        with self._reading():
            return _sql.read_lease(self._reader(), run_id)

    # ------------------------------------------------------------------ reading

    def records(
        self,
        run_id: str | None = None,
        *,
        after: int = 0,
        upto: int | None = None,
        kinds: Sequence[str] | None = None,
        page: int = _sql.PAGE_SIZE,
    ) -> Iterator[StoredRecord]:
        """Iterates records in seq order, of one run or of all, lazily, a page at a time.

        :param after: only records with a seq greater than this.
        :param upto: only records with a seq at most this.
        :param kinds: only records of these kinds.
        :raises RunNotFoundError: no such run.
        """
        return self._guarded(
            _sql.iter_records(
                self._reader,
                run_id,
                after=after,
                upto=upto,
                kinds=kinds,
                page=page,
                read_errors=self._backend.read_errors,
            )
        )

    def _guarded(self, it: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
        with self._reading():
            yield from it if self._sealer is None else self._sealer.records(it)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Translates the database's read errors (a damaged file) into ours, naming it."""
        try:
            yield
        except self._backend.read_errors as exc:
            if isinstance(exc, self._backend.unavailable_errors):
                # The next read connects again.
                msg = f"{self._backend.where}: cannot read the store now ({exc})"
                raise StoreUnavailableError(msg) from exc
            msg = f"{self._backend.where}: cannot read the store ({exc}); the file may be damaged"
            raise LogCorruptedError(msg) from exc

    def get_run(self, run_id: str) -> RunInfo | None:
        """The run's row, or None when there is no such run."""
        with self._reading():
            return _sql.read_run(self._reader(), run_id)

    def run(self, run_id: str) -> RunInfo:
        """The run's row. :raises RunNotFoundError: no such run."""
        info = self.get_run(run_id)
        if info is None:
            raise RunNotFoundError(run_id, self._backend.where)
        return info

    def runs(self) -> list[RunInfo]:
        """Every run in the store, oldest first."""
        with self._reading():
            return _sql.read_runs(self._reader())

    def last_seq(self, run_id: str) -> Seq | None:
        """The seq of the run's last record, None for a run without records."""
        return self.run(run_id).last_seq

    def head(self) -> Seq:
        """The last seq of the whole log (0 when empty)."""
        with self._reading():
            return _sql.head(self._reader())

    def inbox(self, run_id: str) -> list[InboxEntry]:
        """The run's external events not yet taken into its log, oldest first."""
        with self._reading():
            rows = _sql.read_inbox(self._reader(), run_id)
        if self._sealer is not None:
            rows = [(i, self._sealer.inbox(p, run_id, i), k) for i, p, k in rows]
        return [InboxEntry(*row) for row in rows]

    def snapshot(self, run_id: str) -> tuple[Seq, str] | None:
        """The run's latest cached derived state and the seq it reflects, if one was written."""
        snap = self.find_snapshot(run_id)
        return None if snap is None else (Seq(snap.seq), snap.data)

    def find_snapshot(
        self,
        run_id: str,
        upto: int | None = None,
        *,
        below: int | None = None,
        version: int | None = None,
    ) -> Snapshot | None:
        """The run's latest snapshot at a seq at most ``upto`` and less than ``below``, of
        ``version`` if given (another version's are passed over where they are stored).

        A reader at seq N starts from ``find_snapshot(run, N)``; when that one is of no use,
        from the one before it, ``find_snapshot(run, N, below=its seq)``.
        """
        legacy = self._backend.schema_version < 3
        with self._reading():
            snap = _sql.read_snapshot(
                self._reader(), run_id, upto=upto, below=below, version=version, legacy=legacy
            )
        if self._sealer is not None:
            return self._sealer.snapshot(snap, run_id)
        # A cache sealed with a key this store was not given is none to it: readers fold
        # the log instead, which says what it needs.
        return None if snap is not None and sealed_key_id(snap.data) is not None else snap

    def snapshot_stats(self, run_id: str | None = None) -> tuple[int, int]:
        """How many snapshots the store (or the run) keeps, and their bytes of text."""
        with self._reading():
            return _sql.snapshot_stats(self._reader(), run_id)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Runs a read-only SQL query on a reader connection (for tools and inspection)."""
        with self._reading():
            return self._reader().execute(sql, params).fetchall()

    @property
    def stats(self) -> StoreStats:
        """How many write transactions carried how many operations so far."""
        return StoreStats(self._committer.transactions, self._committer.operations)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Writes what is queued, stops the writer and closes every connection."""
        if self._closed:
            return
        self._stop_listening.set()
        for release in list(self._holders.values()):
            with contextlib.suppress(Exception):  # no loop to submit on, a store failed
                release()
        self._committer.close()
        self._closed = True
        with self._lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._backend.close()
        if self._listener is not None:
            self._listener.join(timeout=2)
