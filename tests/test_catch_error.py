"""``@catch_error`` and ``StepFailedEvent``: a handler takes over a step out of retries.

The behaviour is LlamaIndex's (scoping, the wildcard, ``max_recoveries`` along a lineage);
what is ours is that the failed attempt's commit holds the handler's input, so the count
holds across a crash and a resume (tested with a real SIGKILL, tests/support/retry_proc.py).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from eventstore import EventStore
from tests.test_durable_retries import killed
from workflow import (
    Context,
    Event,
    StartEvent,
    StepFailedEvent,
    StopEvent,
    Workflow,
    WorkflowTimeoutError,
    WorkflowValidationError,
    catch_error,
    step,
)
from workflow import _journal as J
from workflow._retry import UnreconstructedException
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed

# Set in the process the crash test kills (tests/support/retry_proc.py).
DYING: Final = threading.Event()


def tries(n: int) -> Any:
    """A policy that allows ``n`` attempts, at once."""
    return retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(n))


class Again(Event):
    """A handler's way back into the graph."""


class Marker(Event):
    pass


class Down(Exception):
    """A failure of this module's own class, rebuilt by name after a resume."""


# ---------------------------------------------------------------------- the decorator


def test_a_handler_must_take_step_failed_event() -> None:
    with pytest.raises(WorkflowValidationError, match="must accept StepFailedEvent"):

        @catch_error
        async def bad(self: Any, ctx: Context, ev: StartEvent) -> StopEvent:
            return StopEvent()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_recoveries": 0}, "max_recoveries must be an integer >= 1"),
        ({"max_recoveries": "2"}, "max_recoveries must be an integer >= 1"),
        ({"max_recoveries": True}, "max_recoveries must be an integer >= 1"),
        ({"for_steps": "a"}, "for_steps must be None or a list of step names"),
        ({"for_steps": ["a", 1]}, "for_steps must be None or a list of step names"),
    ],
)
def test_bad_arguments_are_refused_at_the_decorator(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(WorkflowValidationError, match=match):
        catch_error(**kwargs)


def _flow(**handlers: Any) -> type[Workflow]:
    """A workflow of steps ``a`` and ``b`` and the given handlers."""

    class Flow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> Marker:
            return Marker()

        @step
        async def b(self, ev: Marker) -> StopEvent:
            return StopEvent()

    for name, h in handlers.items():
        setattr(Flow, name, h)
    return Flow


def _handler(**kwargs: Any) -> Any:
    async def handle(self: Any, ev: StepFailedEvent) -> StopEvent:
        return StopEvent()

    return catch_error(**kwargs)(handle)


@pytest.mark.parametrize(
    ("handlers", "match"),
    [
        ({"h1": _handler(), "h2": _handler()}, "only one @catch_error handler without for_steps"),
        ({"h": _handler(for_steps=["nope"])}, "names unknown step 'nope'"),
        (
            {"h1": _handler(for_steps=["h2"]), "h2": _handler(for_steps=["a"])},
            "cannot cover handler 'h2'",
        ),
        (
            {"h1": _handler(for_steps=["a"]), "h2": _handler(for_steps=["a"])},
            "step 'a' is claimed by two @catch_error handlers",
        ),
    ],
)
def test_a_workflow_with_conflicting_handlers_is_refused(
    handlers: dict[str, Any], match: str
) -> None:
    with pytest.raises(WorkflowValidationError, match=match):
        _flow(**handlers)()


def test_step_failed_event_keeps_its_exception_in_the_log_as_class_and_message() -> None:
    now = datetime.now(UTC)
    ev = StepFailedEvent(
        step_name="a",
        input_event=StartEvent(),
        exception=Down("gone"),
        attempts=1,
        elapsed_seconds=0.5,
        failed_at=now,
    )
    assert ev.error_type == f"{__name__}:Down"
    assert ev.error_message == "gone"
    assert isinstance(ev.exception, Down)
    # What the log holds is rebuilt from the name, only from classes already imported.
    copy = StepFailedEvent.model_construct(**vars(ev))  # dict(ev): its extra fields only
    assert type(copy.exception) is Down
    assert str(copy.exception) == "gone"
    unknown = copy.model_copy(update={"error_type": "not_imported_anywhere:Gone"})
    assert type(unknown.exception) is UnreconstructedException
    with pytest.raises(TypeError, match="takes an exception"):
        StepFailedEvent(
            step_name="a",
            input_event=StartEvent(),
            exception="gone",  # type: ignore[arg-type]
            attempts=1,
            elapsed_seconds=0.0,
            failed_at=now,
        )


class EarlyFlow(Workflow):
    """Its handler names classes defined below it: checked when the workflow is built."""

    @step
    async def a(self, ev: StartEvent) -> Later:
        raise Down("a-fail")

    @catch_error
    async def handle(self, ev: StepFailedEvent) -> Later:
        return Later()

    @step
    async def b(self, ev: Later) -> StopEvent:
        return StopEvent(result="later")


class EarlyWrong(Workflow):
    @step
    async def a(self, ev: StartEvent) -> StopEvent:
        return StopEvent()

    @catch_error
    async def handle(self, ev: Later) -> StopEvent:
        return StopEvent()


class Later(Event):
    pass


async def test_a_handler_whose_names_come_later_is_checked_when_the_workflow_is_built() -> None:
    assert await EarlyFlow().run() == "later"
    with pytest.raises(WorkflowValidationError, match="'handle' must accept StepFailedEvent"):
        EarlyWrong()


# ---------------------------------------------------------------------- routing


async def test_a_handler_returning_stop_event_ends_the_run_with_its_result() -> None:
    class Flow(Workflow):
        @step(retry_policy=tries(1))
        async def flaky(self, ev: StartEvent) -> StopEvent:
            raise RuntimeError("transient")

        @catch_error
        async def handler(self, ctx: Context, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result={"recovered_from": ev.step_name})

    assert await Flow().run() == {"recovered_from": "flaky"}


async def test_a_handler_that_raises_fails_the_run_with_its_exception() -> None:
    class Flow(Workflow):
        @step(retry_policy=tries(1))
        async def flaky(self, ev: StartEvent) -> StopEvent:
            raise RuntimeError("primary")

        @catch_error
        async def handler(self, ctx: Context, ev: StepFailedEvent) -> StopEvent:
            raise ValueError("handler-failed")

    wf = Flow()
    with pytest.raises(ValueError, match="handler-failed"):
        await wf.run(run_id="r")
    state = wf.state_at("r")
    assert state.status == "failed"


async def test_a_step_that_recovers_within_its_retries_never_reaches_the_handler() -> None:
    called: list[str] = []

    class Flow(Workflow):
        @step(retry_policy=tries(3))
        async def flaky(self, ctx: Context, ev: StartEvent) -> StopEvent:
            if ctx.retry_info().retry_number < 1:
                raise ValueError("transient")
            return StopEvent(result="recovered")

        @catch_error
        async def handler(self, ev: StepFailedEvent) -> StopEvent:
            called.append("handler")
            return StopEvent(result="caught")

    assert await Flow().run() == "recovered"
    assert called == []


async def test_step_failed_event_says_what_failed_how_often_and_when() -> None:
    seen: list[StepFailedEvent] = []

    class Flow(Workflow):
        @step(retry_policy=tries(2))
        async def flaky(self, ev: StartEvent) -> StopEvent:
            raise RuntimeError(f"bad:{ev.query}")

        @catch_error
        async def handler(self, ev: StepFailedEvent) -> StopEvent:
            seen.append(ev)
            return StopEvent(result="caught")

    before = datetime.now(UTC)
    assert await Flow().run(query="hello") == "caught"
    [ev] = seen
    assert ev.step_name == "flaky"
    assert isinstance(ev.input_event, StartEvent)
    assert ev.input_event.query == "hello"
    assert isinstance(ev.exception, RuntimeError)
    assert str(ev.exception) == "bad:hello"
    assert ev.exception.__traceback__ is not None  # in process: the exception itself
    assert ev.attempts == 2
    assert ev.elapsed_seconds >= 0.0
    assert ev.failed_at.tzinfo is not None
    assert ev.failed_at >= before


async def test_a_timeout_is_not_a_step_failure() -> None:
    called: list[str] = []

    class Flow(Workflow):
        @step
        async def slow(self, ev: StartEvent) -> StopEvent:
            await asyncio.sleep(5)
            return StopEvent(result="unreachable")

        @catch_error
        async def handler(self, ev: StepFailedEvent) -> StopEvent:
            called.append("handler")
            return StopEvent(result="caught")

    with pytest.raises(WorkflowTimeoutError):
        await Flow(timeout=0.1).run()
    assert called == []


async def test_the_handler_sees_the_state_the_failed_attempt_did_not_commit() -> None:
    """A documented difference: LlamaIndex's handler would see "halfway", but a failed
    attempt's writes are never committed here (attempts are atomic)."""

    class Flow(Workflow):
        @step(retry_policy=tries(1))
        async def flaky(self, ctx: Context, ev: StartEvent) -> StopEvent:
            await ctx.store.set("progress", "halfway")
            raise RuntimeError("boom")

        @catch_error
        async def handler(self, ctx: Context, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result=await ctx.store.get("progress", default="unset"))

    assert await Flow().run() == "unset"


async def test_a_scoped_handler_covers_its_steps_only() -> None:
    class Flow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> Marker:
            return Marker()

        @step
        async def b(self, ev: Marker) -> StopEvent:
            raise ValueError("b failed")

        @catch_error(for_steps=["a"])
        async def handle_a(self, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result="caught")

    with pytest.raises(ValueError, match="b failed"):
        await Flow().run()


async def test_scoped_handlers_take_their_steps_and_the_wildcard_the_rest() -> None:
    class Flow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> Marker:
            raise RuntimeError("a")

        @step
        async def b(self, ev: Again) -> StopEvent:
            raise RuntimeError("b")

        @catch_error(for_steps=["a"])
        async def handle_a(self, ev: StepFailedEvent) -> Again:
            return Again()

        @catch_error
        async def wildcard(self, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result={"via": "wildcard", "step": ev.step_name})

        @step
        async def unused(self, ev: Marker) -> StopEvent:
            return StopEvent()

    assert await Flow().run() == {"via": "wildcard", "step": "b"}


async def test_max_recoveries_counts_along_the_lineage() -> None:
    calls: list[str] = []

    def flow(limit: int) -> Workflow:
        class Flow(Workflow):
            @step
            async def a(self, ev: StartEvent) -> StopEvent:
                calls.append("a")
                raise RuntimeError("a-fail")

            @catch_error(for_steps=["a", "retry_a"], max_recoveries=limit)
            async def handle(self, ev: StepFailedEvent) -> Again:
                calls.append("handle")
                return Again()

            @step
            async def retry_a(self, ev: Again) -> StopEvent:
                calls.append("retry_a")
                raise RuntimeError(f"retry_a-fail {len(calls)}")

        return Flow()

    with pytest.raises(RuntimeError, match="retry_a-fail 3"):
        await flow(1).run()
    assert calls == ["a", "handle", "retry_a"]
    calls.clear()
    with pytest.raises(RuntimeError, match="retry_a-fail 5"):
        await flow(2).run()
    assert calls == ["a", "handle", "retry_a", "handle", "retry_a"]


async def test_the_failed_attempts_commit_holds_the_handlers_input(store: EventStore) -> None:
    class Flow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            raise Down("a-fail")

        @catch_error(max_recoveries=3)
        async def handle(self, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result="ok")

    wf = Flow(store=store)
    assert await wf.run(run_id="c") == "ok"
    records = list(wf.store.records("c"))
    [failed] = [r for r in records if r.kind == J.STEP_FAILED]
    [given] = [r for r in records if r.kind == J.ENQUEUED and r.step == "handle"]
    assert given.commit_seq == failed.commit_seq
    payload = orjson.loads(given.payload)
    assert payload["recoveries"] == {"handle": 1}
    assert payload["src"] == [1, 1]
    assert orjson.loads(failed.payload)["retry"] is False


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (Down("bad \udc80 text"), "bad \\udc80 text"),  # a lone surrogate, escaped
        (Unprintable(), "<unprintable Unprintable: str() raised RuntimeError('no text')>"),
    ],
)
async def test_a_failure_whose_text_json_cannot_hold_still_reaches_the_handler(
    error: Exception, shown: str
) -> None:
    class Flow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            raise error

        @catch_error
        async def handle(self, ev: StepFailedEvent) -> StopEvent:
            return StopEvent(result=ev.error_message)

    wf = Flow()
    assert await wf.run(run_id="t") == shown
    assert wf.state_at("t").status == "finished"


# ---------------------------------------------------------------------- across a crash


class Recovering(Workflow):
    """``a`` fails; the handler (once per lineage) sends ``Again`` to ``retry_a``, which
    hangs in the process the test kills and fails in the one that resumes."""

    @step
    async def a(self, ev: StartEvent) -> StopEvent:
        raise Down("a-fail")

    @catch_error(for_steps=["a", "retry_a"])
    async def handle(self, ctx: Context, ev: StepFailedEvent) -> Again:
        await ctx.store.set("recovered_from", [ev.step_name, str(ev.exception)])
        return Again()

    @step
    async def retry_a(self, ev: Again) -> StopEvent:
        if DYING.is_set():
            await asyncio.sleep(3600)
        raise Down("retry_a-fail")


async def test_recoveries_are_counted_across_a_crash_and_a_resume(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with killed(db, "Recovering", "k1", "running:retry_a"):
        pass
    wf = Recovering(store=db, timeout=60)  # a loop of recoveries fails instead of hanging
    assert wf.state_at("k1").context["recovered_from"] == ["a", "a-fail"]

    # The handler took over once along this lineage: retry_a's failure, after the resume,
    # finds that count in the log and fails the run instead of recovering again.
    with pytest.raises(Down, match="retry_a-fail"):
        await wf.resume("k1")
    with EventStore(db, readonly=True) as store:
        starts = [r.step for r in store.records("k1", kinds=[J.STEP_STARTED])]
    assert starts.count("handle") == 1
    assert wf.state_at("k1").status == "failed"


class Resumed(Workflow):
    """The handler's input is queued when the process dies: a resume gives it over."""

    @step
    async def a(self, ev: StartEvent) -> StopEvent:
        raise Down("before the crash")

    @catch_error
    async def handle(self, ev: StepFailedEvent) -> StopEvent:
        if DYING.is_set():
            await asyncio.sleep(3600)
        return StopEvent(result=[type(ev.exception).__name__, str(ev.exception), ev.attempts])


async def test_a_handler_interrupted_by_a_crash_gets_its_event_after_a_resume(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    with killed(db, "Resumed", "k2", "running:handle"):
        pass
    result = await Resumed(store=db, timeout=None).resume("k2")
    # The exception is rebuilt from its recorded class (this module's) and message.
    assert result == ["Down", "before the crash", 1]
