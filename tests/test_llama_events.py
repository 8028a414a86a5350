"""LlamaIndex Workflows' events and streams under our package (issue 15).

Events as mappings, StopEvent's repr and dump, how a stream ends for a failed, cancelled or
timed-out run, the engine's own events (``expose_internal=True``), streaming once, and what
``cancel_run`` raises.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import PrivateAttr

from workflow import Context, Workflow, step
from workflow.errors import WorkflowCancelledByUser, WorkflowRuntimeError, WorkflowTimeoutError
from workflow.events import (
    Event,
    InternalDispatchEvent,
    StartEvent,
    StepState,
    StepStateChanged,
    StopEvent,
    WorkflowCancelledEvent,
    WorkflowFailedEvent,
    WorkflowTimedOutEvent,
)
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_none


class Typed(Event):
    param: str
    _secret: str = PrivateAttr(default="")


def test_an_event_is_a_mapping_of_its_extra_fields() -> None:
    """``ev[k]``, ``get``, ``keys``, ``values``, ``items``, ``len``, ``iter``, ``to_dict``."""
    ev = Typed(param="p", a=1, _secret="s")  # type: ignore[call-arg]  # extras, as LlamaIndex
    assert ev._secret == "s"  # a private attribute given as a keyword is set, not extra
    assert ev["a"] == ev.a == ev.get("a") == 1
    assert ev["param"] == "p"  # a declared field reads as an item too
    assert ev.get("missing", "d") == "d"
    assert list(ev.keys()) == ["a"]
    assert list(ev.values()) == [1]
    assert len(ev) == 1
    ev["b"] = 2
    ev.c = 3  # type: ignore[attr-defined]
    assert dict(ev.items()) == {"a": 1, "b": 2, "c": 3} == ev.to_dict() == ev._data
    assert list(ev) == ["a", "b", "c"]
    assert "b" in ev
    assert "param" in ev
    assert "zzz" not in ev
    assert bool(Typed(param="p")) is True  # empty, still truthy
    with pytest.raises(KeyError):
        ev["zzz"]
    with pytest.raises(AttributeError):
        _ = ev.zzz


def test_an_extra_field_named_like_a_mapping_method_wins() -> None:
    """``Event(items=[...]).items`` is the field, as before events were mappings."""
    assert Event(items=[1, 2]).items == [1, 2]
    assert Event(keys="k").keys == "k"
    assert dict(Event(x=1).items()) == {"x": 1}


async def test_extra_fields_set_on_an_event_are_logged(tmp_path: Path) -> None:
    """Item assignment of an extra field changes the event that is streamed and journaled."""

    class Tags(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            ev["tag"] = "set later"
            stop = StopEvent(result=ev["tag"])
            stop["note"] = "n"
            return stop

    wf = Tags(store=tmp_path / "log.db")
    handler = wf.run()
    stream = [e async for e in handler.stream_events()]
    assert await handler == "set later"
    assert stream[-1].note == "n"
    (finished,) = wf.store.records(handler.run_id, kinds=["run_finished"])
    assert '"note"' in finished.payload
    assert '"set later"' in finished.payload


def test_stop_event_repr_and_dump() -> None:
    """As LlamaIndex's: extra fields first, ``result`` left out while None."""
    assert repr(StopEvent(foo="foo", result=42)) == "StopEvent(foo='foo', result=42)"
    assert StopEvent(result="foo").model_dump() == {"result": "foo"}
    assert str(StopEvent(result=7)) == "7"

    class Custom(StopEvent):
        foo: str
        bar: int

    assert Custom(foo="f", bar=1).model_dump() == {"foo": "f", "bar": 1}
    assert repr(Custom(foo="f", bar=1)) == "Custom(foo='f', bar=1)"


# ---------------------------------------------------------------- how streams end


class Note(Event):
    text: str


async def test_a_failed_run_ends_its_stream_with_workflow_failed_event() -> None:
    """The stream's last event says which step failed, after how many attempts."""

    class Fails(Workflow):
        @step(retry_policy=retry_policy(wait=wait_none(), stop=stop_after_attempt(2)))
        async def a(self, ctx: Context, ev: StartEvent) -> StopEvent:
            ctx.write_event_to_stream(Note(text="trying"))
            raise ValueError("boom")

    handler = Fails().run()
    events = [e async for e in handler.stream_events()]
    assert [type(e) for e in events] == [Note, Note, WorkflowFailedEvent]
    last = events[-1]
    assert isinstance(last, WorkflowFailedEvent)
    assert last.step_name == "a"
    assert last.attempts == 2
    assert last.elapsed_seconds is not None
    assert isinstance(last.exception, ValueError)
    assert last.exception_type == "builtins.ValueError"
    assert last.exception_message == "boom"
    with pytest.raises(ValueError, match="boom"):
        await handler


async def test_a_cancelled_run_ends_its_stream_and_raises_cancelled_by_user() -> None:
    """``cancel_run`` raises nothing, also when repeated; awaiting raises LlamaIndex's error."""
    started = asyncio.Event()

    class Slow(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            started.set()
            await asyncio.Event().wait()
            return StopEvent()

    handler = Slow().run()

    async def consume() -> list[Event]:
        return [e async for e in handler.stream_events()]

    events = asyncio.ensure_future(consume())
    await started.wait()
    await handler.cancel_run()
    await handler.cancel_run()  # a run already ended: nothing happens, nothing raised
    assert [type(e) for e in await events] == [WorkflowCancelledEvent]
    with pytest.raises(WorkflowCancelledByUser):
        await handler
    assert handler.cancelled()
    assert isinstance(handler.get_stop_event(), WorkflowCancelledEvent)


async def test_a_timed_out_run_ends_its_stream_with_workflow_timed_out_event() -> None:
    """The last event names the timeout and the steps still running; the error says so too."""

    class Slow(Workflow):
        @step
        async def sleepy(self, ev: StartEvent) -> StopEvent:
            await asyncio.Event().wait()
            return StopEvent()

    handler = Slow(timeout=0.05).run()
    events = [e async for e in handler.stream_events()]
    assert len(events) == 1
    last = events[0]
    assert isinstance(last, WorkflowTimedOutEvent)
    assert last.timeout == 0.05
    assert last.active_steps == ["sleepy"]
    with pytest.raises(WorkflowTimeoutError, match=r"Operation timed out after 0\.05 seconds"):
        await handler


# ---------------------------------------------------------------- internal events


class Mid(Event):
    pass


class TwoSteps(Workflow):
    @step
    async def first(self, ev: StartEvent) -> Mid:
        return Mid()

    @step
    async def second(self, ev: Mid) -> StopEvent:
        return StopEvent(result="ok")


async def test_expose_internal_streams_step_state_changes() -> None:
    """Each attempt's start and end, in order, before the stop event; hidden by default."""
    handler = TwoSteps().run()
    events = [e async for e in handler.stream_events(expose_internal=True)]
    states = [(e.name, e.step_state, e.input_event_name, e.output_event_name) for e in events[:-1]]
    assert all(isinstance(e, StepStateChanged) for e in events[:-1])
    assert states == [
        ("first", StepState.RUNNING, "StartEvent", None),
        ("first", StepState.NOT_RUNNING, "StartEvent", "Mid"),
        ("second", StepState.RUNNING, "Mid", None),
        ("second", StepState.NOT_RUNNING, "Mid", "StopEvent"),
    ]
    assert isinstance(events[-1], StopEvent)
    plain = [e async for e in TwoSteps().run().stream_events()]
    assert not any(isinstance(e, InternalDispatchEvent) for e in plain)
    assert [type(e) for e in plain] == [StopEvent]


async def test_the_stream_is_consumed_once() -> None:
    """Streaming a handler again after its stop event raises, as in LlamaIndex."""
    handler = TwoSteps().run()
    assert [type(e) async for e in handler.stream_events()] == [StopEvent]
    with pytest.raises(WorkflowRuntimeError, match="already been consumed"):
        async for _ in handler.stream_events():
            pass
    assert await handler == "ok"
    assert str(handler) == (
        f"WorkflowHandler(workflow=tests.test_llama_events.TwoSteps, run_id={handler.run_id},"
        " result=ok)"
    )


async def test_an_event_waiting_for_a_worker_is_preparing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With every worker of a step taken, a new event for it is PREPARING (and verbose says so)."""

    class Narrow(Workflow):
        @step
        async def fan(self, ctx: Context, ev: StartEvent) -> Mid | None:
            ctx.send_event(Mid())
            ctx.send_event(Mid())
            return None

        @step(num_workers=1)
        async def one(self, ctx: Context, ev: Mid) -> StopEvent | None:
            got = ctx.collect_events(ev, [Mid, Mid])
            return None if got is None else StopEvent(result="both")

    handler = Narrow(verbose=True).run()
    events = [e async for e in handler.stream_events(expose_internal=True)]
    assert await handler == "both"
    preparing = [
        e for e in events if isinstance(e, StepStateChanged) and e.step_state is StepState.PREPARING
    ]
    assert [(e.name, e.worker_id, e.input_event_name) for e in preparing] == [
        ("one", "<enqueued>", "Mid")
    ]
    assert "[one] enqueued (waiting for capacity)" in capsys.readouterr().out


async def test_a_run_left_only_waiting_streams_workflow_idle_event() -> None:
    """Once nothing is left but a wait, internal-event consumers get a WorkflowIdleEvent."""
    from workflow.events import HumanResponseEvent, InputRequiredEvent, WorkflowIdleEvent

    class Waits(Workflow):
        @step
        async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
            answer = await ctx.wait_for_event(
                HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="?")
            )
            return StopEvent(result=answer.response)

    handler = Waits().run()
    seen: list[type] = []
    async for ev in handler.stream_events(expose_internal=True):
        seen.append(type(ev))
        if isinstance(ev, WorkflowIdleEvent):
            await handler.send_event(HumanResponseEvent(response="yes"))
    assert await handler == "yes"
    assert WorkflowIdleEvent in seen
    assert seen.index(InputRequiredEvent) < seen.index(WorkflowIdleEvent)
