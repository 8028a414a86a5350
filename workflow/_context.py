"""Context: what a step sees of its run. Writes are buffered per attempt and committed whole.

One ``Context`` serves a run; which attempt a call belongs to is found from the running
task (a context variable set by the executor), so concurrent attempts never share their
buffers. Outside any attempt (``handler.ctx``), reads see committed state and writes are
recorded as operator updates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, cast

import orjson
from typing_extensions import TypeVar

from eventstore import EncodeError, class_name

from ._buffers import buffer_key, default_buffer_id
from ._changes import BY_SET, check_key, encode_tracked, encode_value, refused, value_change
from ._diff import Tracker, is_view, materialize
from ._errors import ContextKeyError, ContextStateError, WorkflowRuntimeError, WorkflowTimeoutError
from ._events import Event
from .retry_policy import RetryInfo

if TYPE_CHECKING:
    from ._changes import KeyChange
    from ._retry import RetryClock
    from ._runner import Executor
    from ._workflow import Workflow
    from .context.serializers import BaseSerializer
    from .retry_policy import RetryPolicy

__all__ = ["Attempt", "Context", "ContextStore", "WaitSuspend"]

# The typed state of Context[MyState]; a bare ``Context`` (LlamaIndex's usual spelling) is
# Context[Any] under mypy --strict too, by PEP 696's default.
S = TypeVar("S", default=Any)
T = TypeVar("T")
_MISSING: Any = object()
COLLECT_PREFIX = "\x00collect:"

current_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "workflow_attempt", default=None
)


# The context of the step attempt running in this task (or its worker thread).
current_context: contextvars.ContextVar[Context[Any] | None] = contextvars.ContextVar(
    "workflow_current_context", default=None
)


class StateDict(dict[str, Any]):
    """The untyped state ``get_state`` / ``edit_state`` give: a dict whose keys are also
    attributes (``state.count += 1``), as LlamaIndex's ``DictState``; ``_data`` is itself."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _data(self) -> dict[str, Any]:
        return self


class WaitSuspend(BaseException):
    """Ends an attempt that waits for an event (a BaseException: user code must not catch it)."""

    def __init__(self, waiter: dict[str, Any]) -> None:
        self.waiter = waiter
        super().__init__(waiter["waiter_id"])


@dataclass(slots=True)
class Write:
    """One key's pending change in an attempt, as ``set()`` encoded it: a tracked view's
    patch, a new value, or a delete.

    What the commit writes is fixed at the ``set()`` call, as a durable store writes what it
    is given: a change made to the value afterwards, without setting it again, is not
    written (the attempt's own reads still see it).
    """

    tracker: Tracker | None = None
    value: Any = _MISSING  # what the attempt reads back, when not the tracker's view
    deleted: bool = False
    change: KeyChange | None = None  # what the commit writes, encoded (None: no change)
    text: str | None = None  # a new value's JSON text
    version: int = 0  # the key's version a new value's change was made against


@dataclass(slots=True)
class Attempt:
    """An attempt's buffers: what it read (with versions), wrote, sent, streamed, collected."""

    step: str
    event_id: int
    attempt: int
    event: Event
    reads: dict[str, int] = field(default_factory=dict)
    trackers: dict[str, Tracker] = field(default_factory=dict)
    writes: dict[str, Write] = field(default_factory=dict)
    sent: list[tuple[Event, str | None]] = field(default_factory=list)
    streamed: list[Event] = field(default_factory=list)
    # (buffer key, buffer id, event put in, names taken out) of each collect_events change
    collects: list[tuple[str, str, tuple[int, Event] | None, list[str] | None]] = field(
        default_factory=list
    )
    buffers: dict[str, dict[str, list[tuple[int, Event]]]] = field(default_factory=dict)
    # What its collect_events calls took out of live buffers (buffer key, entries), the
    # outcomes of the attempts whose puts it took, and its own outcome (True: committed;
    # False: its collects were undone), for those who took what it put.
    taken: list[tuple[str, list[tuple[int, Event]]]] = field(default_factory=list)
    deps: list[Attempt] = field(default_factory=list)
    outcome: asyncio.Future[bool] | None = None
    put_written: bool = False  # its commit, with its puts, is written (set in the writer)
    collect_base: int = 0  # the latest commit of the buffers it collected in (for "base")
    wait_calls: int = 0
    answers_used: list[str] = field(default_factory=list)
    holds_lock: bool = False
    retry: RetryClock | None = None  # where this event's attempts stand (ctx.retry_info())
    # The JSON of events checked when they were streamed or asked, by id(event): the
    # attempt's outcome commit writes it (the events stay alive in ``streamed``).
    encoded: dict[int, orjson.Fragment] | None = None
    # The run it belongs to, for memoized calls (``_memo.MemoHost``), and how many times
    # each memo key was used in it (so repeated calls keep their call order).
    host: Any = None
    memo_keys: dict[str, int] | None = None
    sleep_calls: int = 0
    child_calls: int = 0

    def keep_json(self, event: Event, text: orjson.Fragment) -> None:
        """Keeps the JSON of an event the attempt streams, for its outcome commit."""
        if self.encoded is None:
            self.encoded = {}
        self.encoded[id(event)] = text


def _split(path: str) -> tuple[str, list[str]]:
    root, *rest = path.split(".")
    return root, rest


def _step_into(obj: Any, part: str) -> Any:
    if isinstance(obj, Event | dict) or (hasattr(obj, "__getitem__") and not hasattr(obj, part)):
        try:
            return obj[part]
        except (KeyError, TypeError, IndexError):
            pass
    if isinstance(obj, list | tuple):
        return obj[int(part)]
    return getattr(obj, part)


def _assign(parent: Any, part: str, value: Any) -> None:
    """``parent[part] = value`` for a dict or list, else ``setattr`` (an event, a model)."""
    if isinstance(parent, Event) or not hasattr(parent, "__setitem__"):
        setattr(parent, part, value)
    elif isinstance(parent, list):
        parent[int(part)] = value
    else:
        parent[part] = value


class ContextStore(Generic[S]):
    """The run's context data: ``get``/``set`` with dotted paths, ``edit_state``.

    ``get`` returns a copy-on-write view: mutating it changes nothing until ``set``, and
    nothing at all if the attempt fails. A key read by an attempt that another attempt
    changed before it could commit makes it run again (a conflict), so a
    read-modify-write is never lost and never applied twice. A conflicted attempt runs
    again from the start, external calls included.
    """

    def __init__(self, executor: Executor, state_type: type[S] | None) -> None:
        self._x = executor
        self._state_type = state_type

    # -------------------------------------------------------------- reading

    def _root(self, att: Attempt | None, key: str) -> Any:
        x = self._x
        if att is None:
            return x.committed.get(key, _MISSING)
        w = att.writes.get(key)
        if w is not None:
            if w.deleted:
                return _MISSING
            if w.tracker is not None:
                return w.tracker.view
            return w.value
        tracker = att.trackers.get(key)
        if tracker is not None:
            return tracker.view
        if key not in att.reads:
            att.reads[key] = x.versions.get(key, 0)
            x.pin(key)
        value = x.committed.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING
        tracker = att.trackers[key] = Tracker(value)
        return tracker.view

    async def get(self, path: str, default: Any = _MISSING) -> Any:
        """The value at ``path`` (``"key"`` or dotted ``"key.field.0"``), or ``default``.

        :raises ContextKeyError: the path does not exist and no default was given (a
            ``KeyError`` and a ``ValueError``, as LlamaIndex raises).
        """
        root_key, rest = _split(path)
        value = self._root(current_attempt.get(), root_key)
        try:
            if value is _MISSING:
                raise KeyError(root_key)
            for part in rest:
                value = _step_into(value, part)
        except (KeyError, AttributeError, IndexError, ValueError):
            if default is _MISSING:
                msg = f"context has no value at {path!r}"
                raise ContextKeyError(msg) from None
            return default
        return value

    # -------------------------------------------------------------- writing

    async def set(self, path: str, value: Any) -> None:
        """Sets the value at ``path``; committed with the attempt (outside one: at once).

        The value is encoded here, as the commit will write it (a tracked value: only
        what changed), so what the log cannot hold is refused here, and what is written
        is the value as it is now.

        :raises EncodeError: the value holds something the log cannot hold (a type the
            codec does not store, a string with a lone surrogate, nesting deeper than
            ``Codec.MAX_DEPTH``, a cycle); the message names the key, the path
            inside the value and the type.
        """
        att = current_attempt.get()
        root_key, rest = _split(path)
        if att is None:
            await self._x.operator_update({path: value})
            return
        codec = self._x.codec
        if not root_key.isascii():
            check_key(codec, root_key, BY_SET, path)
        x = self._x
        if rest:
            # Checked where it will sit before anything changes, so a refusal leaves no trace
            # (a view's change is checked as the root's patch is encoded).
            if not is_view(value):
                try:
                    codec.encode(value, depth=len(rest) + 1, name=path)
                except EncodeError as exc:
                    raise refused(exc, BY_SET.format(path)) from None
            root = self._root(att, root_key)
            if root is _MISSING:  # missing parents are created as dicts, as in LlamaIndex
                root = {}
            parent = root
            for part in rest[:-1]:
                try:
                    parent = _step_into(parent, part)
                except (KeyError, AttributeError, IndexError, TypeError, ValueError):
                    child: dict[str, Any] = {}
                    _assign(parent, part, child)
                    parent = child
            _assign(parent, rest[-1], value)
            value = root
        tracker = att.trackers.get(root_key)
        if tracker is not None and tracker.is_view(value):
            change = encode_tracked(codec, root_key, tracker, BY_SET, path)
            att.writes[root_key] = Write(tracker=tracker, change=change)
            return
        # A value derived from the view (items + [x], {**d, k: v}) is diffed against it by
        # identity and costs the change; any other value is encoded whole once.
        text = None if tracker is not None else encode_value(codec, root_key, value, BY_SET, path)
        log = x._keylog.get(root_key)
        change, version = value_change(
            codec,
            x.committed,
            x.versions,
            root_key,
            value,
            text,
            hint=tracker,
            size=None if log is None else log[0] + log[1],
            how=BY_SET.format(path),
        )
        att.writes[root_key] = Write(value=value, change=change, text=text, version=version)

    async def delete(self, path: str) -> None:
        """Removes a top-level key (committed with the attempt)."""
        att = current_attempt.get()
        if att is None:
            await self._x.operator_update({}, deletes=[path])
            return
        self._root(att, path)  # a delete depends on what it deletes
        att.writes[path] = Write(deleted=True)

    async def clear(self) -> None:
        """Resets the state: every key removed, or with a typed state, each field back to
        its default (a required field is removed). Committed with the attempt, as
        ``set`` and ``delete`` are (outside one: at once)."""
        att = current_attempt.get()
        keys = list(self._x.committed)
        if att is not None:
            keys += [k for k in att.writes if k not in self._x.committed]
        defaults: dict[str, Any] = {}
        if self._state_type is not None:
            for name, info in getattr(self._state_type, "model_fields", {}).items():
                if not info.is_required():
                    defaults[name] = info.get_default(call_default_factory=True)
        removed = [k for k in keys if k not in defaults]
        if att is None:
            await self._x.operator_update(defaults, deletes=removed)
            return
        for k in removed:
            await self.delete(k)
        for k, v in defaults.items():
            await self.set(k, v)

    # -------------------------------------------------------------- typed state

    async def get_state(self) -> Any:
        """The whole state: the typed state model, or a dict of every key."""
        x = self._x
        att = current_attempt.get()
        if self._state_type is not None:
            fields = getattr(self._state_type, "model_fields", {})
            values = {}
            for name in fields:
                v = self._root(att, name)
                if v is not _MISSING:
                    values[name] = materialize(v) if att is None else v
            model_construct = getattr(self._state_type, "model_construct", None)
            if model_construct is None:
                return self._state_type(**values)
            return model_construct(**values)
        keys = list(x.committed)
        if att is not None:
            keys += [k for k in att.writes if k not in x.committed]
        out = StateDict()
        for k in keys:
            v = self._root(att, k)
            if v is not _MISSING:
                out[k] = v
        return out

    async def set_state(self, state: Any) -> None:
        """Replaces the whole state (each field or key is diffed against what it was)."""
        if self._state_type is not None:
            data = {name: getattr(state, name) for name in type(state).model_fields}
        else:
            data = dict(state)
        att = current_attempt.get()
        if att is None:
            await self._x.operator_update(data)
            return
        for k, v in data.items():
            await self.set(k, v)

    @asynccontextmanager
    async def edit_state(self) -> AsyncIterator[Any]:
        """Holds the run's state lock until the attempt commits: this edit never conflicts.

        Yields the state (the typed model, or a dict of every key whose keys are also
        attributes); what it looks like at the end of the block is written back.
        """
        att = current_attempt.get()
        if att is None:
            state = await self.get_state()
            yield state
            await self.set_state(state)
            return
        if not att.holds_lock:
            await self._x.state_lock.acquire()
            att.holds_lock = True
            # What the attempt read before it held the lock may already be stale.
        state = await self.get_state()
        yield state
        if self._state_type is not None:
            for name in type(state).model_fields:
                if name in state.__dict__:
                    await self.set(name, state.__dict__[name])
            return
        for k, v in state.items():
            await self.set(k, v)
        removed = [k for k in self._x.committed if k not in state and k not in att.writes]
        for k in removed:
            await self.delete(k)


class Context(Generic[S]):
    """What a step receives: context data, and the ways to send, collect, stream and wait.

    ``Context[MyState]`` types the state with a pydantic model.

    ``Context(wf)`` (LlamaIndex's spelling) makes a context no run is bound to yet: its first
    ``wf.run(ctx=ctx)`` binds it to the run it starts, and each later run started from it
    rebinds it. Between runs (and before the first) it is idle: reads see its run's state,
    and writes stay on it and become the operator update that opens its next run.
    ``to_dict`` / ``from_dict`` carry it anywhere (see :mod:`workflow._lifecycle`).
    """

    def __init__(
        self,
        workflow: Workflow,
        previous_context: dict[str, Any] | None = None,
        serializer: BaseSerializer | None = None,
    ) -> None:
        from ._lifecycle import Idle, restore_into
        from ._workflow import Workflow

        if not isinstance(workflow, Workflow):
            msg = f"Context() takes the workflow it runs with, not {type(workflow).__name__}"
            raise WorkflowRuntimeError(msg)
        self._wf = workflow
        self._x: Executor | None = None
        self._run: str | None = None
        self.store: ContextStore[S] = ContextStore(cast("Executor", None), workflow._state_type)
        self._idle = Idle(self)
        self._go_idle()
        if previous_context is not None:
            restore_into(self, previous_context, serializer)

    @classmethod
    def _bound(cls, executor: Executor, state_type: type[Any] | None) -> Context[Any]:
        """The context of a run this process executes (its steps' ``ctx``)."""
        from ._lifecycle import Idle

        ctx: Context[Any] = object.__new__(cls)
        ctx._wf = executor.wf
        ctx._x = executor
        ctx._run = executor.run_id
        ctx.store = ContextStore(executor, state_type)
        ctx._idle = Idle(ctx)
        return ctx

    def _go_idle(self) -> None:
        self.store._x = cast("Executor", self._idle)  # reads and writes of an idle context

    def _bind(self, executor: Executor) -> None:
        """Binds this context to the run ``executor`` runs (a run started from it)."""
        from ._lifecycle import Idle

        executor.ctx = self
        self._wf = executor.wf
        self._x = executor
        self._run = executor.run_id
        self.store._x = executor
        self._idle = Idle(self)

    def _ended(self, executor: Executor) -> None:
        """The run ``executor`` ran has ended: the context is idle, at the run's end."""
        if self._x is executor:
            self._go_idle()

    @property
    def run_id(self) -> str:
        """The id of the run this context is bound to.

        :raises ContextStateError: no run is bound to it yet (before its first run).
        """
        if self._run is None:
            msg = "this context has no run yet: wf.run(ctx=ctx) binds it to the run it starts"
            raise ContextStateError(msg)
        return self._run

    @property
    def is_running(self) -> bool:
        """Whether this context's run is being executed (here, or by another process)."""
        from ._lifecycle import run_is_live

        return run_is_live(self)

    def _live(self) -> Executor | None:
        """The executor running this context's run in this process, if it still runs it."""
        x = self._x
        if x is None or x._closing or self.store._x is not x:
            return None
        return x

    @staticmethod
    def get_step_context() -> Context[Any]:
        """The context of the step running now, for code a step calls (a decorator around
        it) that was not handed one.

        :raises WorkflowRuntimeError: not called from within a step.
        """
        ctx = current_context.get()
        if ctx is None:
            msg = "Context.get_step_context() may only be called from within a step function"
            raise WorkflowRuntimeError(msg)
        return ctx

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the run's event loop: at once from there, else (a synchronous
        step's worker thread) by handing it to the loop and waiting for its outcome."""
        loop = cast("Executor", self._x).done.get_loop()  # called for a bound context only
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed back to the thread that asked
                fut.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return fut.result()

    # The older LlamaIndex spelling of ctx.store.get / ctx.store.set.
    async def get(self, key: str, default: Any = _MISSING) -> Any:
        """Same as ``ctx.store.get``."""
        return await self.store.get(key, default)

    async def set(self, key: str, value: Any) -> None:
        """Same as ``ctx.store.set``."""
        await self.store.set(key, value)

    def _attempt(self, what: str) -> Attempt:
        att = current_attempt.get()
        if att is None:
            msg = f"ctx.{what}() works inside a step; from outside use handler.send_event()"
            raise WorkflowRuntimeError(msg)
        return att

    def retry_info(self) -> RetryInfo:
        """Where the running step attempt stands in its retries (LlamaIndex's call).

        ``retry_number`` is 0 on the first attempt and counts the failures before this
        one; ``elapsed_seconds`` counts from the first attempt, in whichever process it
        ran; after a resume ``last_exception`` is rebuilt from the log (no traceback).

        :raises WorkflowRuntimeError: called outside a step.
        """
        att = current_attempt.get()
        if att is None:
            msg = "ctx.retry_info() works inside a step, about the attempt running it"
            raise WorkflowRuntimeError(msg)
        return RetryInfo() if att.retry is None else att.retry.info()

    def send_event(self, event: Event, step: str | None = None) -> None:
        """Emits an event (to ``step`` only, if given) when the attempt commits.

        Outside a step (``handler.ctx.send_event``, LlamaIndex's way to answer a question)
        the event is taken into the run at once: it answers a wait it matches, or reaches
        its steps once its commit is durable, or waits for a wait that wants it.
        """
        if not isinstance(event, Event):
            msg = f"send_event takes an Event, not {type(event).__name__}"
            raise WorkflowRuntimeError(msg)
        att = current_attempt.get()
        x = self._x
        if att is None:
            if self._live() is None:
                from ._lifecycle import send_idle

                send_idle(self, event)
                return
            assert x is not None
            self._encode_event(event, "handler.ctx.send_event")  # refused here, not later
            x.send_external_nowait(event)
            return
        assert x is not None
        if step is not None and step not in x.graph.steps:
            msg = f"send_event: no step named {step!r}"
            raise WorkflowRuntimeError(msg)
        att.sent.append((event, step))

    def write_event_to_stream(self, event: Event) -> None:
        """Streams an event to the run's consumers now; it is logged with the attempt.

        :raises EncodeError: inside a step, the event holds what the log cannot hold (it
            is not streamed then).
        """
        att = current_attempt.get()
        x = self._x if att is not None else self._live()
        if x is None:
            msg = "write_event_to_stream() needs a running workflow: call wf.run(ctx=ctx) first"
            raise ContextStateError(msg)
        if att is not None:
            att.keep_json(event, self._encode_event(event, "ctx.write_event_to_stream"))
        self._on_loop(lambda: x.stream_now(event, att))
        if att is not None:
            att.streamed.append(event)

    def _encode_event(self, event: Event, call: str) -> orjson.Fragment:
        try:
            return orjson.Fragment(self._wf._codec.encode(event, name=type(event).__name__))
        except EncodeError as exc:
            raise refused(exc, f"refused by {call}") from None

    def collect_events(
        self, event: Event, expected: list[type[Event]], buffer_id: str | None = None
    ) -> list[Event] | None:
        """Buffers ``event``; once one of each ``expected`` class is in, returns them in order.

        An event of a class not in ``expected`` is not buffered. Each step has its own
        buffers: one per ``buffer_id``, or without it one per list of expected classes.
        """
        att = self._attempt("collect_events")
        return self._on_loop(lambda: self._collect(att, event, expected, buffer_id))

    def _collect(
        self, att: Attempt, event: Event, expected: list[type[Event]], buffer_id: str | None
    ) -> list[Event] | None:
        if not expected:
            return []
        names = [t.__qualname__ for t in expected]
        if len(set(names)) != len(set(expected)):
            clash = sorted(class_name(t) for t in set(expected) if names.count(t.__qualname__) > 1)
            msg = f"collect_events: {', '.join(clash)} have the same name; rename one of them"
            raise WorkflowRuntimeError(msg)
        if type(event) not in expected:
            return None
        # Ids name no module: a run of `python app.py` (classes of __main__) continues in a
        # program that imports app.
        bid = default_buffer_id(att.step, names) if buffer_id is None else buffer_id
        key = buffer_key(att.step, bid)
        x = cast("Executor", self._x)  # inside an attempt: the executor running it
        # The live buffer changes now, atomically on the event loop (no other attempt can
        # see it half done); not an OCC key, so collectors never conflict. The change is
        # undone if this attempt does not commit.
        buf = x.live_buffer(key)
        ev_id = att.event_id if event is att.event else x.new_event_id()
        entry = (ev_id, event)
        buf.setdefault(type(event).__qualname__, []).append(entry)
        att.collects.append((key, bid, entry, None))
        x.collect_put(att, key, entry)
        need = Counter(names)
        if any(len(buf.get(n, ())) < k for n, k in need.items()):
            return None
        taken = []
        for n in names:
            events = buf[n]
            taken.append(events.pop(0))
            if not events:
                del buf[n]
        att.collects.append((key, bid, None, names))
        x.collect_take(att, key, taken)
        return [ev for _, ev in taken]

    async def wait_for_event(
        self,
        event_type: type[Event],
        waiter_event: Event | None = None,
        waiter_id: str | None = None,
        requirements: dict[str, Any] | None = None,
        timeout: float | None = 2000.0,  # noqa: ASYNC109 - LlamaIndex's signature
    ) -> Any:
        """Waits for an event of ``event_type`` matching ``requirements``, durably.

        The attempt ends here and its buffered writes are dropped; when a matching event
        arrives (now, or after a restart and a resume) the step runs again from the start
        with the same input, and this call returns the event. Code before the wait runs
        again. ``waiter_event`` (a question for a human) is streamed to consumers once the
        wait is durable, unless an event taken in before already answers it.

        :raises WorkflowTimeoutError: no matching event came within ``timeout`` seconds.
        """
        att = self._attempt("wait_for_event")
        x = cast("Executor", self._x)  # inside an attempt: the executor running it
        att.wait_calls += 1
        wid = waiter_id or f"{att.step}:{att.event_id}:{att.wait_calls}"
        if wid in x.answers:
            answer = x.answers[wid]
            att.answers_used.append(wid)
            if answer is None:
                msg = f"wait_for_event({event_type.__name__}) timed out after {timeout} s"
                raise WorkflowTimeoutError(msg)
            return answer[1]
        # What the waiting record will hold is checked here, where the step can be told.
        try:
            x.codec.encode(wid, name="waiter_id")
            x.codec.encode(dict(requirements or {}), name="requirements")
        except EncodeError as exc:
            raise refused(exc, "refused by ctx.wait_for_event") from None
        if waiter_event is not None:
            att.keep_json(waiter_event, self._encode_event(waiter_event, "ctx.wait_for_event"))
        raise WaitSuspend(
            {
                "waiter_id": wid,
                "awaited": event_type,
                "requirements": dict(requirements or {}),
                "timeout": timeout,
                "waiter_event": waiter_event,
            }
        )

    async def memo(
        self,
        key: str | None,
        fn: Callable[..., Any],
        /,
        *args: Any,
        cache_errors: bool = False,
        reuse_on_retry: bool = False,
        retry_policy: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args, **kwargs)`` (awaited if it returns an awaitable), paid once per input.

        The result is recorded on its own before this returns, whatever the attempt does
        next; a later attempt at the same input whose call has the same ``key`` (None: the
        function's name; ``#2``, ``#3`` for its later uses in one attempt) and arguments gets
        the recorded result without calling ``fn``: after a crash, a conflict, a wait, a
        resume of a failed run, and after a retry policy's re-run only with
        ``reuse_on_retry=True``. ``retry_policy`` retries ``fn`` itself within the call.

        :raises EncodeError: the arguments or the result cannot be stored.
        :raises MemoizedError: ``fn`` raised, with ``cache_errors=True`` (its type's name and
            message; without it the exception propagates and nothing is recorded).
        """
        from ._memo import call_memoized

        att = self._attempt("memo")
        return await call_memoized(
            att,
            key,
            fn,
            args,
            kwargs,
            cache_errors=cache_errors,
            reuse_on_retry=reuse_on_retry,
            retry_policy=retry_policy,
        )

    async def run_workflow(self, flow: Any, /, **start_kwargs: Any) -> Any:
        """Runs ``flow`` (a Workflow class or instance) as a child run and returns its result.

        The child is a run of its own in this store, with an id made from this run, the
        step, its input and the call's order (``run_id/step/event/n``): a re-run of this
        step re-attaches to the same child rather than starting another, and once the
        child has finished its result comes from this run's log. Cancelling this run
        while it awaits the child cancels the child.
        """
        from ._children import run_child

        return await run_child(self._x, self._attempt("run_workflow"), flow, start_kwargs)

    async def sleep(self, seconds: float) -> None:
        """Sleeps ``seconds``, durably when it is at least the workflow's ``sleep_threshold``.

        A long sleep ends the attempt like a wait (its worker is free, the run waits) and
        the step runs again once it is due, from the start: there this call returns at once.
        It is due also when no process ran the run meanwhile (``recover()`` or a worker then
        takes it). A shorter sleep is ``asyncio.sleep`` and is slept again by a re-run.
        """
        from ._timers import durable_sleep

        await durable_sleep(self._x, self._attempt("sleep"), seconds)

    def to_dict(
        self, serializer: BaseSerializer | None = None, *, include_state: bool = True
    ) -> dict[str, Any]:
        """The context as a JSON-native dict: its run and seq, and the run's state there.

        The state (context values, queues, in-progress events, waiters, collect buffers) is
        in the codec's typed JSON; ``include_state=False`` leaves the context values out:
        restored where the store has the run, the values are the log's (the log is the
        truth); imported into a store without it, the run starts with none (LlamaIndex's
        meaning of a stateless dict). ``serializer`` turns each value into its text
        instead (:mod:`workflow.context.serializers`). Restore it with :meth:`from_dict`,
        here or in another process.
        """
        from ._lifecycle import context_dict

        return context_dict(self, serializer, include_state)

    @classmethod
    def from_dict(
        cls,
        workflow: Workflow,
        data: dict[str, Any],
        serializer: BaseSerializer | None = None,
    ) -> Context[Any]:
        """A context back from :meth:`to_dict`'s dict, for ``workflow.run(ctx=...)``.

        When the workflow's store holds the dict's run, the context is bound to it at the
        dict's seq (a later ``run`` continues it, or forks it there if the run went on);
        otherwise the dict's state is imported as a new run when the context next runs,
        keeping where it came from as a link.

        :raises ContextSerdeError: the dict is damaged, of another format, or of another
            workflow.
        """
        return cls(workflow, data, serializer)
