"""Context: what a step sees of its run. Writes are buffered per attempt and committed whole.

One ``Context`` serves a run; which attempt a call belongs to is found from the running
task (a context variable set by the executor), so concurrent attempts never share their
buffers. Outside any attempt (``handler.ctx``), reads see committed state and writes are
recorded as operator updates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, cast

import orjson
from typing_extensions import TypeVar

from eventstore import EncodeError

from ._attempt import (
    MISSING,
    Attempt,
    Current,
    WaitRequest,
    WaitSuspend,
    attempt_of,
    current_attempt,
)
from ._changes import Encoded, refused
from ._collect_call import CollectHost, collect
from ._context_store import ContextStore, StoreHost
from ._context_watch import ContextWatch, RunWatch
from ._errors import ContextStateError, WaitTimeoutError, WorkflowRuntimeError
from ._events import Event
from ._on_loop import on_loop
from ._patches import ctx_deprecate_patch, ctx_patched
from .retry_policy import RetryInfo

if TYPE_CHECKING:
    from ._fold import Folded
    from ._graph import Graph
    from ._parts import OwnerParts
    from ._run_config import RunConfig
    from .context.serializers import BaseSerializer
    from .retry_policy import RetryPolicy

# Attempt, WaitSuspend, current_attempt and ContextStore are named here too, where they
# were first defined.
_log = logging.getLogger("workflow")

__all__ = [
    "Attempt",
    "Context",
    "ContextOwner",
    "ContextServices",
    "ContextStore",
    "IdleHost",
    "RunHost",
    "WaitSuspend",
    "current_attempt",
]

# The typed state of Context[MyState]; a bare ``Context`` (LlamaIndex's usual spelling) is
# Context[Any] under mypy --strict too, by PEP 696's default.
S = TypeVar("S", default=Any)
T = TypeVar("T")

# The context of the step attempt running in this task (or its worker thread).
current_context: Current[Context[Any]] = Current("workflow_current_context")


class RunHost(StoreHost, CollectHost, Protocol):
    """What a bound context uses of the executor running its run (or verify's stand-in)."""

    run_id: str
    ctx: Context[Any]

    @property
    def config(self) -> RunConfig: ...

    @property
    def graph(self) -> Graph: ...

    @property
    def closing(self) -> bool: ...

    @property
    def done(self) -> asyncio.Future[Any]: ...

    @property
    def folded(self) -> Folded: ...

    @property
    def answers(self) -> dict[str, tuple[int, Event] | None]: ...

    def stream_now(self, event: Event, att: Attempt | None) -> None: ...

    def send_external_nowait(self, event: Event) -> None: ...


class IdleHost(Protocol):
    """An idle context's state (``_lifecycle.Idle``): where it points, its writes since."""

    seq: int | None
    imported: Folded | None
    origin: tuple[str, int] | None
    pending: dict[str, Encoded]
    deleted: set[str]


class ContextServices(Protocol):
    """What a context asks of the modules above it, via its workflow (_context_services)."""

    def idle(self, ctx: Context[Any]) -> IdleHost: ...

    def restore_into(self, ctx: Context[Any], data: Any, serializer: Any) -> None: ...

    def context_dict(self, ctx: Context[Any], serializer: Any, state: bool) -> dict[str, Any]: ...

    def run_is_live(self, ctx: Context[Any]) -> bool: ...

    def send_idle(self, ctx: Context[Any], event: Event) -> None: ...

    async def run_child(
        self, host: RunHost | None, att: Attempt, flow: Any, kwargs: Any
    ) -> Any: ...

    def running_steps(self, ctx: Context[Any]) -> list[str]: ...

    def handler(self, ctx: Context[Any], call: str) -> RunWatch: ...


class ContextOwner(Protocol):
    """What a context and its lifecycle use of its workflow (``Workflow``): its context
    services, its parts (codec, name, state type, store, owners) and ``send``."""

    __context_services__: ClassVar[ContextServices]

    @property
    def __workflow_parts__(self) -> OwnerParts: ...

    def send(self, run_id: str, event: Event, idempotency_key: str | None = None) -> int: ...


class ContextLink:
    """Where a context stands (``ctx.__context_link__``): its workflow, the executor running
    its run in this process (if any), the run it names and its idle state. Its lifecycle
    (``_lifecycle``, ``_context_dict``, ``_context_run``) reads and moves it under these
    names; the context itself gains no public attribute for them."""

    __slots__ = ("host", "idle", "run_id", "store", "workflow")

    def __init__(self, ctx: Context[Any], workflow: ContextOwner, host: RunHost | None) -> None:
        self.workflow = workflow
        self.host = host
        self.run_id: str | None = None if host is None else host.run_id
        self.store: ContextStore[Any] = ctx.store  # bound to ``host`` while it runs the run
        self.idle: IdleHost = workflow.__context_services__.idle(ctx)

    def live(self) -> RunHost | None:
        """The executor running the context's run in this process, if it still runs it."""
        host = self.host
        if host is None or host.closing or self.store.host is not host:
            return None
        return host


class Context(ContextWatch, Generic[S]):
    """What a step receives: context data, and the ways to send, collect, stream and wait.

    ``Context[MyState]`` types the state with a pydantic model.

    ``Context(wf)`` (LlamaIndex's spelling) makes a context no run is bound to yet: its first
    ``wf.run(ctx=ctx)`` binds it to the run it starts, and each later run started from it
    rebinds it. Between runs (and before the first) it is idle: reads see its run's state,
    and writes stay on it and become the operator update that opens its next run.
    ``to_dict`` / ``from_dict`` carry it anywhere (see :mod:`workflow._lifecycle`).
    """

    __workflow_context__: Final = True  # what the step decorator recognises (``_step``)
    __context_link__: ContextLink

    def __init__(
        self,
        workflow: ContextOwner,
        previous_context: dict[str, Any] | None = None,
        serializer: BaseSerializer | None = None,
    ) -> None:
        services = getattr(workflow, "__context_services__", None)
        if services is None or isinstance(workflow, type):
            msg = f"Context() takes the workflow it runs with, not {type(workflow).__name__}"
            raise WorkflowRuntimeError(msg)
        self.store: ContextStore[S] = ContextStore(
            cast("StoreHost", None), workflow.__workflow_parts__.state_type
        )
        self.__context_link__ = ContextLink(self, workflow, None)
        _go_idle(self)
        if previous_context is not None:
            services.restore_into(self, previous_context, serializer)

    @property
    def run_id(self) -> str:
        """The id of the run this context is bound to.

        :raises ContextStateError: no run is bound to it yet (before its first run).
        """
        run_id = self.__context_link__.run_id
        if run_id is None:
            msg = "this context has no run yet: wf.run(ctx=ctx) binds it to the run it starts"
            raise ContextStateError(msg)
        return run_id

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
        """Runs ``fn`` on the run's event loop (this is a bound context), from any thread."""
        return on_loop(cast("RunHost", self.__context_link__.host).done.get_loop(), fn)

    # The older LlamaIndex spelling of ctx.store.get / ctx.store.set.
    async def get(self, key: str, default: Any = MISSING) -> Any:
        """Same as ``ctx.store.get``."""
        return await self.store.get(key, default)

    async def set(self, key: str, value: Any) -> None:
        """Same as ``ctx.store.set``."""
        await self.store.set(key, value)

    def _attempt(self, what: str) -> Attempt:
        att = attempt_of(self.__context_link__.host)
        if att is None:
            msg = (
                f"ctx.{what}() works inside a step of this context's run; from outside use"
                " handler.send_event()"
            )
            raise WorkflowRuntimeError(msg)
        return att

    def retry_info(self) -> RetryInfo:
        """Where the running step attempt stands in its retries (LlamaIndex's call).

        ``retry_number`` is 0 on the first attempt and counts the failures before this
        one; ``elapsed_seconds`` counts from the first attempt, in whichever process it
        ran; after a resume ``last_exception`` is rebuilt from the log (no traceback).

        :raises WorkflowRuntimeError: called outside a step.
        """
        att = attempt_of(self.__context_link__.host)
        if att is None:
            msg = "ctx.retry_info() works inside a step, about the attempt running it"
            raise WorkflowRuntimeError(msg)
        return RetryInfo() if att.retry is None else att.retry.info()

    def send_event(self, event: Event, step: str | None = None) -> None:
        """Emits an event (to ``step`` only, if given) when the attempt commits.

        Outside a step (``handler.ctx.send_event``, LlamaIndex's way to answer a question)
        the event is taken into the run at once: it answers a wait it matches, or reaches
        its steps once its commit is durable, or waits for a wait that wants it.

        :raises WorkflowRuntimeError: ``step`` names no step of the workflow, or a step
            that does not take events of this class (LlamaIndex's errors and wording),
            inside a step or outside.
        """
        if not isinstance(event, Event):
            msg = f"send_event takes an Event, not {type(event).__name__}"
            raise WorkflowRuntimeError(msg)
        link = self.__context_link__
        host = link.host
        att = attempt_of(host)
        if step is not None:
            graph = host.graph if host is not None else link.workflow.__workflow_parts__.graph
            graph.check_target(step, event)
        if att is None:
            if link.live() is None:
                link.workflow.__context_services__.send_idle(self, event)
                return
            assert host is not None
            self._encode_event(event, "handler.ctx.send_event")  # refused here, not later
            host.send_external_nowait(event)
            return
        assert host is not None
        att.sent.append((event, step))

    def write_event_to_stream(self, event: Event) -> None:
        """Streams an event to the run's consumers now; it is logged with the attempt.

        :raises EncodeError: inside a step, the event holds what the log cannot hold (it
            is not streamed then).
        """
        link = self.__context_link__
        att = attempt_of(link.host)
        host = link.host if att is not None else link.live()
        if host is None:
            msg = "write_event_to_stream() requires a running workflow: call wf.run(ctx=ctx) first"
            raise ContextStateError(msg)
        if att is not None:
            att.keep_json(event, self._encode_event(event, "ctx.write_event_to_stream"))
        self._on_loop(lambda: host.stream_now(event, att))
        if att is not None:
            att.streamed.append(event)

    def _encode_event(self, event: Event, call: str) -> orjson.Fragment:
        try:
            return orjson.Fragment(parts_of(self).codec.encode(event, name=type(event).__name__))
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
        # Inside an attempt: the executor running it is the context's host.
        host = cast("RunHost", self.__context_link__.host)
        return self._on_loop(lambda: collect(host, att, event, expected, buffer_id))

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

        :raises WaitTimeoutError: no matching event came within ``timeout`` seconds (a
            ``WorkflowTimeoutError`` and a ``TimeoutError``).
        """
        att = self._attempt("wait_for_event")
        host = cast("RunHost", self.__context_link__.host)  # inside an attempt: its executor
        att.wait_calls += 1
        wid = waiter_id or f"{att.step}:{att.event_id}:{att.wait_calls}"
        if wid in host.answers:
            answer = host.answers[wid]
            att.answers_used.append(wid)
            if answer is None:
                msg = (
                    f"Timed out waiting for {event_type.__name__}: wait_for_event's timeout of"
                    f" {timeout} s passed"
                )
                raise WaitTimeoutError(msg)
            return answer[1]
        # What the waiting record will hold is checked here, where the step can be told.
        try:
            host.codec.encode(wid, name="waiter_id")
            host.codec.encode(dict(requirements or {}), name="requirements")
        except EncodeError as exc:
            raise refused(exc, "refused by ctx.wait_for_event") from None
        if waiter_event is not None:
            att.keep_json(waiter_event, self._encode_event(waiter_event, "ctx.wait_for_event"))
        if att.sent:
            _log.warning(
                "step %r waits for %s after ctx.send_event of %s: what a waiting attempt sent"
                " is dropped (its re-run sends it once the wait is answered), so an answer that"
                " needs those events never comes; send them from another step, or return them",
                att.step,
                event_type.__name__,
                ", ".join(type(ev).__name__ for ev, _ in att.sent),
            )
        raise WaitSuspend(
            WaitRequest(wid, event_type, dict(requirements or {}), timeout, waiter_event)
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

    patched, deprecate_patch = ctx_patched, ctx_deprecate_patch  # see workflow._patches

    async def run_workflow(self, flow: Any, /, **start_kwargs: Any) -> Any:
        """Runs ``flow`` (a Workflow class or instance) as a child run and returns its result.

        The child is a run of its own in this store, with an id made from this run, the
        step, its input and the call's order (``run_id/step/event/n``): a re-run of this
        step re-attaches to the same child rather than starting another, and once the
        child has finished its result comes from this run's log. Cancelling this run
        while it awaits the child cancels the child.
        """
        link = self.__context_link__
        return await link.workflow.__context_services__.run_child(
            link.host, self._attempt("run_workflow"), flow, start_kwargs
        )

    async def sleep(self, seconds: float) -> None:
        """Sleeps ``seconds``, durably when it is at least the workflow's ``sleep_threshold``.

        A long sleep ends the attempt like a wait (its worker is free, the run waits) and
        the step runs again once it is due, from the start: there this call returns at once.
        It is due also when no process ran the run meanwhile (``recover()`` or a worker then
        takes it). A shorter sleep is ``asyncio.sleep`` and is slept again by a re-run.
        """
        from ._timers import durable_sleep

        await durable_sleep(self.__context_link__.host, self._attempt("sleep"), seconds)

    @classmethod
    def from_dict(
        cls,
        workflow: ContextOwner,
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


# ---------------------------------------------------------------------- a context's life


def bound_context(executor: RunHost, workflow: ContextOwner, state_type: Any) -> Context[Any]:
    """The context of a run this process executes (its steps' ``ctx``)."""
    ctx: Context[Any] = object.__new__(Context)
    ctx.store = ContextStore(executor, state_type)
    ctx.__context_link__ = ContextLink(ctx, workflow, executor)
    return ctx


def context_ended(ctx: Context[Any], executor: RunHost) -> None:
    """The run ``executor`` ran has ended: ``ctx`` is idle, at the run's end."""
    if ctx.__context_link__.host is executor:
        _go_idle(ctx)


def _go_idle(ctx: Context[Any]) -> None:
    ctx.store.bind(cast("StoreHost", ctx.__context_link__.idle))  # an idle context's reads, writes


def parts_of(ctx: Context[Any]) -> OwnerParts:
    """The parts (codec, store, ...) of the workflow ``ctx`` belongs to now."""
    return ctx.__context_link__.workflow.__workflow_parts__
