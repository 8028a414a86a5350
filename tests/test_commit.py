"""An attempt's outcome becomes records by pure functions (``workflow/_commit.py``): what a
returned, failed or waiting attempt writes, checked here without an executor or a store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from eventstore import Codec, EncodeError, Record
from workflow import Event, InputRequiredEvent, StartEvent, StopEvent
from workflow._attempt import Attempt, WaitRequest
from workflow._commit import (
    Raised,
    Returned,
    commit_of,
    failure_record,
    streamed_records,
    wait_records,
)


class Ping(Event):
    n: int = 0


class Ask(InputRequiredEvent):
    prompt: str = "?"


class Answer(Event):
    text: str = ""


def _codec() -> Codec:
    codec = Codec()
    codec.register(Ping, Ask, Answer, StartEvent, StopEvent)
    return codec


def _route(routes: dict[type, Sequence[str]]) -> Any:
    return lambda t: routes.get(t, ())


def _attempt(**kw: Any) -> Attempt:
    return Attempt("work", 5, 2, StartEvent(), **kw)


def _shape(records: list[Record]) -> list[tuple[str, str | None, Any]]:
    return [(r.kind, r.step, orjson.loads(r.payload)) for r in records]


def test_a_returned_event_is_finished_then_enqueued_for_each_step_that_takes_it() -> None:
    att = _attempt()
    att.reads["k"] = 3
    planned = commit_of(
        att,
        Returned(Ping(n=1)),
        [],
        codec=_codec(),
        route=_route({Ping: ("a", "b")}),
        first_id=10,
    )
    kinds = [(k, s) for k, s, _ in _shape(planned.records)]
    assert kinds == [("step_finished", "work"), ("enqueued", "a"), ("enqueued", "b")]
    finished = _shape(planned.records)[0][2]
    assert finished["id"] == 5
    assert finished["attempt"] == 2
    assert finished["emitted"] == [10]
    assert [(s, i) for s, i, _ in planned.deliveries] == [("a", 10), ("b", 10)]
    assert planned.ids == [10]
    assert planned.stop is None
    assert planned.asked == []


def test_sent_events_come_before_the_returned_one_with_ids_in_order() -> None:
    att = _attempt()
    att.sent.append((Ping(n=1), "b"))
    att.sent.append((Ping(n=2), None))
    planned = commit_of(
        att, Returned(None), [], codec=_codec(), route=_route({Ping: ("a",)}), first_id=7
    )
    assert planned.ids == [7, 8]
    assert [(s, i) for s, i, _ in planned.deliveries] == [("b", 7), ("a", 8)]


def test_a_stop_event_finishes_the_run_in_the_same_commit() -> None:
    planned = commit_of(
        _attempt(), Returned(StopEvent(result=3)), [], codec=_codec(), route=_route({}), first_id=4
    )
    kinds = [k for k, _, _ in _shape(planned.records)]
    assert kinds == ["step_finished", "run_finished"]
    assert planned.stop is not None
    assert planned.stop[0] == 4
    assert _shape(planned.records)[1][2]["id"] == 4


def test_an_event_no_step_takes_is_enqueued_nowhere_and_a_question_is_streamed() -> None:
    planned = commit_of(
        _attempt(sent=[(Answer(text="x"), None)]),
        Returned(Ask()),
        [],
        codec=_codec(),
        route=_route({}),
        first_id=1,
    )
    shape = _shape(planned.records)
    assert [(k, s) for k, s, _ in shape] == [
        ("step_finished", "work"),
        ("enqueued", None),
        ("streamed", "work"),
    ]
    assert planned.deliveries == []
    assert [type(q) for q in planned.asked] == [Ask]


def test_only_events_no_step_takes_are_unrouted_with_their_ids() -> None:
    """``unrouted`` lists the events enqueued for no step (they may answer a wait); a routed
    event, a question no step takes and the StopEvent are not among them."""
    unclaimed = Answer(text="x")
    planned = commit_of(
        _attempt(sent=[(Ping(n=1), None), (unclaimed, None), (Ask(), None)]),
        Returned(StopEvent(result=1)),
        [],
        codec=_codec(),
        route=_route({Ping: ("a",)}),
        first_id=20,
    )
    assert planned.unrouted == [(21, unclaimed)]
    assert [(s, i) for s, i, _ in planned.deliveries] == [("a", 20)]
    assert planned.stop is not None
    assert planned.stop[0] == 23


def test_context_records_and_streams_are_kept_in_place_and_the_input_list_is_untouched() -> None:
    change = Record("state_set", "work", '{"key":"k"}')
    given = [change]
    att = _attempt(streamed=[Ping(n=9)])
    planned = commit_of(att, Returned(None), given, codec=_codec(), route=_route({}), first_id=1)
    assert [r.kind for r in planned.records] == ["step_finished", "state_set", "streamed"]
    assert given == [change]
    assert _shape(streamed_records(_codec(), att))[0][2]["id"] == 5


def test_an_event_the_codec_cannot_store_is_refused_naming_the_step() -> None:
    class Opaque:
        pass

    held = Ping(n=1)
    held.extra = Opaque()  # type: ignore[attr-defined]  # an event field of a plain class: not storable without pickle
    with pytest.raises(EncodeError, match="step 'work' returned it"):
        commit_of(_attempt(), Returned(held), [], codec=_codec(), route=_route({}), first_id=1)
    surrogate = Answer(text="\ud800")  # orjson refuses it as the record is serialized
    with pytest.raises(EncodeError, match="step 'work' sent it"):
        commit_of(
            _attempt(sent=[(surrogate, None)]),
            Returned(None),
            [],
            codec=_codec(),
            route=_route({Answer: ("a",)}),
            first_id=1,
        )


def test_a_failure_is_one_record_with_or_without_its_traceback() -> None:
    outcome = Raised(ValueError("bad"), "Traceback: here")
    rec = failure_record(_attempt(), outcome, delay=1.5, retry_at=100.0, elapsed=2.0)
    bare = failure_record(
        _attempt(), outcome, delay=None, retry_at=None, elapsed=2.0, with_traceback=False
    )
    full, short = orjson.loads(rec.payload), orjson.loads(bare.payload)
    assert rec.kind == bare.kind == "step_failed"
    assert "here" in rec.payload
    assert "here" not in bare.payload
    assert full["retry"] is True
    assert short["retry"] is False


def test_a_wait_records_what_it_awaits_then_what_the_attempt_streamed() -> None:
    att = _attempt(streamed=[Ask()])
    request = WaitRequest("w1", Answer, {"text": "y"}, 30.0, Ask())
    records = wait_records(_codec(), att, request, 1234.5)
    shape = _shape(records)
    assert [k for k, _, _ in shape] == ["waiting", "streamed"]
    waiting = shape[0][2]
    assert waiting["waiter"] == "w1"
    assert waiting["deadline"] == 1234.5
    assert waiting["awaited"] == request.awaited_name
