"""EventStore: the durable log, a group-commit writer thread and short-lived readers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any, Final, Literal, TypeVar

from . import _postgres, _sqlite
from ._errors import (
    LogCorruptedError,
    ReadOnlyStoreError,
    RunNotFoundError,
    StoreClosedError,
    WriterFailedError,
)
from ._records import AppendResult, Commit, RunInfo, Seq, StoredRecord

__all__ = ["Durability", "EventStore", "InboxEntry", "StoreStats"]

Durability = Literal["normal", "full"]
T = TypeVar("T")

# Records that only say work began may wait this long for a commit to ride with.
LAZY_FLUSH_S: Final = 0.05
# How long a write on the event loop's thread may wait for the lock before the batch is
# handed to the writer thread (which waits as long as it takes).
INLINE_BUSY_MS: Final = 20


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


_AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


@dataclass(slots=True)
class _Item:
    op: Callable[[_sqlite.Writer], Any]
    future: _AnyFuture | None
    loop: asyncio.AbstractEventLoop | None


_STOP: Final = _Item(lambda w: None, None, None)
_LAZY: Final = object()  # a wake-up for lazy items: the writer may wait a little for more


def _resolve(batch: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in batch:
        if fut.done() or fut.get_loop().is_closed():
            continue  # nobody can be waiting for it any more
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


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

    Commits are written by one writer thread per store object, which takes every commit
    waiting at that moment into one transaction (a savepoint each): callers never block the
    event loop on SQLite.

    :raises NotAStoreError: the file is not SQLite, or not a store.
    :raises SchemaVersionError: the store was written by a newer version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        readonly: bool = False,
        durability: Durability = "normal",
    ) -> None:
        if durability not in ("normal", "full"):
            msg = f"durability must be 'normal' or 'full', not {durability!r}"
            raise ValueError(msg)
        raw = None if path is None else os.fspath(path)
        self.memory: Final = raw in (None, ":memory:")
        self.path: Final = None if self.memory else raw
        postgres = raw is not None and _postgres.is_url(raw)
        self.kind: Final = "memory" if self.memory else "postgres" if postgres else "sqlite"
        # The backend module: SQLite specifics and PostgreSQL specifics live there alone.
        self._b: Any = _postgres if postgres else _sqlite
        if self.memory and readonly:
            msg = "an in-memory store cannot be opened read-only: it would always be empty"
            raise ValueError(msg)
        self.readonly: Final = readonly
        self.durability: Final = durability
        self._target, self._uri = self._b.open_database(
            self.path,
            readonly=readonly,
            durability=durability,
            memory_name=f"eventstore-{uuid.uuid4().hex}",
        )
        self._lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[Any] = []
        # The in-memory database lives as long as one connection to it is open.
        self._anchor = self._connect(readonly=True) if self.memory else None
        self._queue: deque[_Item] = deque()
        self._wake: SimpleQueue[object] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed: WriterFailedError | None = None
        self._closed = False
        # With durability "normal" a commit costs tens of microseconds of CPU and no fsync,
        # less than waking a thread and being woken by it (~100 us here), so the event loop
        # writes what its tasks queued at the end of each loop iteration, all in one
        # transaction; "full" (an fsync per transaction) keeps the loop free and uses the
        # writer thread. A lock held elsewhere moves the batch to the writer thread too.
        self._inline = durability == "normal" and not readonly and self.kind != "postgres"
        self._inline_loop: asyncio.AbstractEventLoop | None = None
        self._inline_writer: _sqlite.Writer | None = None
        self._pending: list[_Item] = []
        self._flush_scheduled = False
        self._lazy_handle: asyncio.TimerHandle | None = None
        self._operations = 0
        self._transactions = 0
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

    def _connect(self, *, readonly: bool) -> Any:
        return self._b.connect(
            self._target,
            uri=self._uri,
            readonly=readonly,
            durability=self.durability,
            memory=self.memory,
        )

    def _reader(self) -> Any:
        if self._closed:
            msg = f"{self!r} is closed"
            raise StoreClosedError(msg)
        conn: Any = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(readonly=True)
            self._local.conn = conn
            with self._lock:
                self._readers.append(conn)
        return conn

    # ------------------------------------------------------------------ the writer

    def _check_writable(self) -> None:
        if self._closed:
            msg = f"{self!r} is closed"
            raise StoreClosedError(msg)
        if self.readonly:
            msg = f"{self.path}: the store was opened read-only"
            raise ReadOnlyStoreError(msg)
        if self._failed is not None:
            raise self._failed

    def _enqueue(self, item: _Item, *, lazy: bool = False) -> None:
        self._check_writable()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._writer_main, name="eventstore-writer", daemon=True
                    )
                    self._thread.start()
        self._queue.append(item)
        self._wake.put(_LAZY if lazy else None)

    def _writer_main(self) -> None:
        writer = self._b.Writer(self._connect(readonly=False))
        try:
            while True:
                token = self._wake.get()
                if token is _LAZY:
                    # Only work-began records so far: give a commit a moment to join them.
                    deadline = time.monotonic() + LAZY_FLUSH_S
                    while token is _LAZY and (left := deadline - time.monotonic()) > 0:
                        try:
                            token = self._wake.get(timeout=left)
                        except Empty:
                            break
                while True:
                    try:
                        self._wake.get_nowait()
                    except Empty:
                        break
                items: list[_Item] = []
                while self._queue:
                    items.append(self._queue.popleft())
                stop = any(item is _STOP for item in items)
                items = [item for item in items if item is not _STOP]
                if items and not self._write(writer, items):
                    return
                if stop:
                    return
        finally:
            writer.conn.close()

    def _write(self, writer: _sqlite.Writer, items: list[_Item]) -> bool:
        try:
            outcomes = self._run_blocking(writer, items)
        except WriterFailedError as exc:
            self._failed = exc
            while self._queue:
                items.append(self._queue.popleft())
            self._settle(items, [(False, exc)] * len(items))
            return False
        self._operations += len(items)
        self._transactions += 1
        self._settle(items, outcomes)
        return True

    def _run_blocking(self, writer: _sqlite.Writer, items: list[_Item]) -> list[tuple[bool, Any]]:
        # The writer thread may wait: a busy lock after the busy timeout is retried.
        while True:
            try:
                return writer.run_batch([item.op for item in items])
            except self._b.Busy:
                continue

    @staticmethod
    def _settle(items: Sequence[_Item], outcomes: Sequence[tuple[bool, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for item, (ok, value) in zip(items, outcomes, strict=True):
            fut = item.future
            if fut is None:
                continue
            if isinstance(fut, asyncio.Future):
                assert item.loop is not None
                by_loop.setdefault(item.loop, []).append((fut, ok, value))
            elif ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        for loop, batch in by_loop.items():
            # One wake-up of each loop per transaction, acks in commit order.
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve, batch)

    def _submit_async(
        self, op: Callable[[_sqlite.Writer], T], *, lazy: bool = False
    ) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        item = _Item(op, fut, loop)
        if not self._uses_inline(loop):
            self._enqueue(item, lazy=lazy)
            return fut
        self._check_writable()
        self._pending.append(item)
        if self._flush_scheduled:
            return fut
        if not lazy:
            self._flush_scheduled = True
            loop.call_soon(self._flush_inline)
        elif self._lazy_handle is None:
            self._lazy_handle = loop.call_later(LAZY_FLUSH_S, self._flush_inline)
        return fut

    def _uses_inline(self, loop: asyncio.AbstractEventLoop) -> bool:
        if not self._inline:
            return False
        bound = self._inline_loop
        if bound is loop:
            return True
        if bound is None or (bound.is_closed() and not self._pending):
            self._inline_loop = loop
            return True
        return False

    def _flush_inline(self) -> None:
        self._flush_scheduled = False
        if self._lazy_handle is not None:
            self._lazy_handle.cancel()
            self._lazy_handle = None
        items, self._pending = self._pending, []
        if not items:
            return
        writer = self._inline_writer
        if writer is None:
            conn = _sqlite.connect(
                self._target,
                uri=self._uri,
                readonly=False,
                durability=self.durability,
                memory=self.memory,
                busy_timeout_ms=INLINE_BUSY_MS,
            )
            writer = self._inline_writer = _sqlite.Writer(conn)
        try:
            outcomes = writer.run_batch([item.op for item in items])
        except _sqlite.Busy:
            # Contention with another writer: from now on the writer thread, which may
            # wait for the lock, writes for this store (in order: these items go first).
            self._inline = False
            for item in items:
                self._enqueue(item)
            return
        except WriterFailedError as exc:
            self._failed = exc
            outcomes = [(False, exc)] * len(items)
        else:
            self._operations += len(items)
            self._transactions += 1
        _resolve(
            [(item.future, ok, value) for item, (ok, value) in zip(items, outcomes, strict=True)]  # type: ignore[misc]
        )

    def _submit_sync(self, op: Callable[[_sqlite.Writer], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._enqueue(_Item(op, fut, None))
        return fut.result()

    # ------------------------------------------------------------------ writing

    def submit(self, commit: Commit, *, lazy: bool = False) -> asyncio.Future[AppendResult]:
        """Queues a commit from async code; the future resolves once it is durable.

        ``lazy=True`` lets the commit wait (briefly) for the next one to share its
        transaction: for records that only say work began.
        """
        return self._submit_async(lambda w: w.append(commit), lazy=lazy)

    async def append(self, commit: Commit) -> AppendResult:
        """Appends a commit atomically; returns its seqs once it is durable.

        :raises ConcurrencyError: a stale epoch, a failed check, or a run that exists.
        :raises RunNotFoundError: the run does not exist and the commit does not create it.
        :raises WriterFailedError: the database failed (disk full, I/O error).
        """
        return await self.submit(commit)

    def append_sync(self, commit: Commit) -> AppendResult:
        """Appends a commit from synchronous code (tools, tests); blocks until durable."""
        return self._submit_sync(lambda w: w.append(commit))

    async def flush(self) -> None:
        """Waits until every commit queued so far, lazy ones included, is durable."""
        await self._submit_async(lambda w: None)

    async def claim(self, run_id: str) -> int:
        """Takes a run over: returns its new epoch; appends under older epochs now fail."""
        return await self._submit_async(lambda w: w.claim(run_id))

    def claim_sync(self, run_id: str) -> int:
        """Synchronous :meth:`claim`."""
        return self._submit_sync(lambda w: w.claim(run_id))

    async def post(self, run_id: str, payload: str, *, key: str | None = None) -> int:
        """Adds an external event to the run's inbox; a repeated ``key`` posts it once."""
        entry, _ = await self._submit_async(lambda w: w.post(run_id, payload, key))
        return entry

    def post_sync(self, run_id: str, payload: str, *, key: str | None = None) -> int:
        """Synchronous :meth:`post`; returns the entry's id (the first one's, for a key)."""
        entry, _ = self._submit_sync(lambda w: w.post(run_id, payload, key))
        return entry

    async def lease(self, run_id: str, owner: str, ttl: float, *, renew: bool = False) -> bool:
        """Takes the run's lease for ``owner`` for ``ttl`` seconds (or renews it).

        Returns False while another owner's lease has not expired (or, with ``renew``,
        when this owner no longer holds it). Leases keep executors on several hosts
        apart; epochs fence the appends of one that lost its lease.
        """
        ttl_us = int(ttl * 1e6)
        return await self._submit_async(lambda w: w.lease(run_id, owner, ttl_us, renew=renew))

    def lease_sync(self, run_id: str, owner: str, ttl: float, *, renew: bool = False) -> bool:
        """Synchronous :meth:`lease`."""
        ttl_us = int(ttl * 1e6)
        return self._submit_sync(lambda w: w.lease(run_id, owner, ttl_us, renew=renew))

    def release_sync(self, run_id: str, owner: str) -> None:
        """Gives a lease back (a no-op unless ``owner`` holds it)."""
        self._submit_sync(lambda w: w.release(run_id, owner))

    def on_post(self, callback: Callable[[str], None]) -> None:
        """Calls ``callback(run_id)`` (from another thread) whenever an event is posted to a
        run's inbox by any process, on stores that can tell (PostgreSQL's LISTEN/NOTIFY).

        Other stores call nothing; their readers poll the inbox instead.
        """
        if self.kind != "postgres":
            return
        with self._lock:
            self._listeners.append(callback)
            if self._listener is not None:
                return
            self._listener = threading.Thread(
                target=_postgres.listen,
                args=(self._target, self._notify, self._stop_listening),
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
            return self._b.read_lease(self._reader(), run_id)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ reading

    def records(
        self,
        run_id: str | None = None,
        *,
        after: int = 0,
        upto: int | None = None,
        kinds: Sequence[str] | None = None,
        page: int = _sqlite.PAGE_SIZE,
    ) -> Iterator[StoredRecord]:
        """Iterates records in seq order, of one run or of all, lazily, a page at a time.

        :param after: only records with a seq greater than this.
        :param upto: only records with a seq at most this.
        :param kinds: only records of these kinds.
        :raises RunNotFoundError: no such run.
        """
        return self._guarded(
            self._b.iter_records(
                self._reader, run_id, after=after, upto=upto, kinds=kinds, page=page
            )
        )

    def _guarded(self, it: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
        with self._reading():
            yield from it

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Translates the database's read errors (a damaged file) into ours, naming it."""
        try:
            yield
        except self._b.READ_ERRORS as exc:
            where = self.path if self.kind == "sqlite" else f"the {self.kind} store"
            msg = f"{where}: cannot read the store ({exc}); the file may be damaged"
            raise LogCorruptedError(msg) from exc

    def get_run(self, run_id: str) -> RunInfo | None:
        """The run's row, or None when there is no such run."""
        with self._reading():
            return self._b.read_run(self._reader(), run_id)  # type: ignore[no-any-return]

    def run(self, run_id: str) -> RunInfo:
        """The run's row. :raises RunNotFoundError: no such run."""
        info = self.get_run(run_id)
        if info is None:
            where = self.path if self.kind == "sqlite" else None
            raise RunNotFoundError(run_id, where or f"the {self.kind} store")
        return info

    def runs(self) -> list[RunInfo]:
        """Every run in the store, oldest first."""
        with self._reading():
            return self._b.read_runs(self._reader())  # type: ignore[no-any-return]

    def last_seq(self, run_id: str) -> Seq | None:
        """The seq of the run's last record, None for a run without records."""
        return self.run(run_id).last_seq

    def head(self) -> Seq:
        """The last seq of the whole log (0 when empty)."""
        with self._reading():
            return self._b.head(self._reader())  # type: ignore[no-any-return]

    def inbox(self, run_id: str) -> list[InboxEntry]:
        """The run's external events not yet taken into its log, oldest first."""
        with self._reading():
            return [InboxEntry(*row) for row in self._b.read_inbox(self._reader(), run_id)]

    def snapshot(self, run_id: str) -> tuple[Seq, str] | None:
        """The run's cached derived state and the seq it reflects, if one was written."""
        with self._reading():
            return self._b.read_snapshot(self._reader(), run_id)  # type: ignore[no-any-return]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Runs a read-only SQL query on a reader connection (for tools and inspection)."""
        with self._reading():
            if self.kind == "postgres":
                return _postgres.query(self._reader(), sql, params)
            return self._reader().execute(sql, params).fetchall()  # type: ignore[no-any-return]

    @property
    def stats(self) -> StoreStats:
        """How many write transactions carried how many operations so far."""
        return StoreStats(self._transactions, self._operations)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Writes what is queued, stops the writer and closes every connection."""
        if self._closed:
            return
        self._stop_listening.set()
        if self._pending:
            self._flush_inline()
        if self._inline_writer is not None:
            self._inline_writer.conn.close()
        thread = self._thread
        if thread is not None and self._failed is None:
            self._queue.append(_STOP)
            self._wake.put(None)
            thread.join()
        self._closed = True
        with self._lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        if self._anchor is not None:
            self._anchor.close()
        if self._listener is not None:
            self._listener.join(timeout=2)
