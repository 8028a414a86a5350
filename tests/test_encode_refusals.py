"""Values the log cannot hold are refused where they enter, by name, and never strand a run.

Every bad value (lone surrogates, nesting past the codec's limit, cycles through each kind
of container) is sent in by every way a value reaches a commit: context writes by a step,
events a step returns, sends, streams, waits for or ends with, and operator writes. What a
step produced fails that step (``step_failed``, then ``run_failed``); an operator write is
refused at the call. Nothing of the refused write is committed, the run is never left
``interrupted``, and a resume runs the failing step once more, not until the recovery limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from eventstore import Codec, EncodeError, EventStore
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow._changes import encode_ops
from workflow._diff import KeyRef, ops_to_json

TIMEOUT = 20
MAX_DEPTH = Codec.MAX_DEPTH


# ---------------------------------------------------------------------------- bad values


class Tree(BaseModel):
    """A pydantic model that can be made to contain itself."""

    label: str = ""
    children: list[Any] = []


@dataclasses.dataclass(eq=False)
class Link:
    """A dataclass that can point at itself (hashable by identity, so it fits in a set)."""

    next: Any = None


def nested_lists(n: int) -> list[Any]:
    """``n + 1`` lists, each holding the next."""
    v: list[Any] = []
    for _ in range(n):
        v = [v]
    return v


def nested_dicts(n: int) -> dict[str, Any]:
    """``n + 1`` dicts, each holding the next under ``"d"``."""
    v: dict[str, Any] = {}
    for _ in range(n):
        v = {"d": v}
    return v


def cyclic_list() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    return a


def cyclic_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def cyclic_tuple() -> tuple[Any, ...]:
    t: tuple[list[Any]] = ([],)
    t[0].append(t)
    return t


def cyclic_set() -> set[Any]:
    s: set[Any] = set()
    s.add(Link(next=s))
    return s


def cyclic_model() -> Tree:
    m = Tree(label="root")
    m.children.append(m)
    return m


def cyclic_dataclass() -> Link:
    link = Link()
    link.next = link
    return link


@dataclasses.dataclass(frozen=True)
class Bad:
    """A value the log cannot hold, and how the refusal names it.

    ``inner`` is the path inside the value (codec notation); a deep value's path instead
    repeats ``step`` until the first level past the limit, which depends on where the value
    sits, so it is computed from the entry's level.
    """

    make: Callable[[], Any]
    type: type
    detail: str  # a regex the message must match
    inner: str | None = None
    step: str | None = None

    def path(self, prefix: str, level: int) -> str:
        if self.inner is not None:
            return prefix + self.inner
        assert self.step is not None
        return prefix + self.step * (MAX_DEPTH + 1 - level)


SURROGATE = r"lone surrogate .*not valid UTF-8"
TOO_DEEP = rf"nested more than {MAX_DEPTH} levels deep"
CYCLE = r"contains itself"

BAD_VALUES = [
    pytest.param(Bad(lambda: "ab\ud800", str, SURROGATE, inner=""), id="surrogate"),
    pytest.param(
        Bad(lambda: {"a": ["fine", "x\udfffy"]}, str, SURROGATE, inner="['a'][1]"),
        id="surrogate-inside",
    ),
    pytest.param(
        Bad(lambda: {"ok": 1, "b\ud800d": 2}, str, SURROGATE, inner="<key #1>"),
        id="surrogate-key",
    ),
    pytest.param(
        Bad(lambda: Tree(label="\udc80"), str, SURROGATE, inner=".label"), id="surrogate-model"
    ),
    pytest.param(Bad(lambda: nested_lists(300), list, TOO_DEEP, step="[0]"), id="deep-300"),
    pytest.param(
        Bad(lambda: nested_dicts(1000), dict, TOO_DEEP, step="['d']"), id="deep-1000-dicts"
    ),
    pytest.param(Bad(lambda: nested_lists(10_000), list, TOO_DEEP, step="[0]"), id="deep-10000"),
    pytest.param(Bad(cyclic_list, list, CYCLE, inner="[0]"), id="cycle-list"),
    pytest.param(Bad(cyclic_dict, dict, CYCLE, inner="['self']"), id="cycle-dict"),
    pytest.param(Bad(cyclic_tuple, tuple, CYCLE, inner="[0][0]"), id="cycle-tuple"),
    pytest.param(Bad(cyclic_set, set, CYCLE, inner="{#0}.next"), id="cycle-set"),
    pytest.param(Bad(cyclic_model, Tree, CYCLE, inner=".children[0]"), id="cycle-model"),
    pytest.param(Bad(cyclic_dataclass, Link, CYCLE, inner=".next"), id="cycle-dataclass"),
]


# ---------------------------------------------------------------------------- the workflow


class Go(Event):
    """Runs the step under test once the context holds its base value."""


class Note(Event):
    """An event that carries the bad value."""

    payload: Any = None


class Answer(HumanResponseEvent):
    """What a waiting step waits for."""

    response: str = ""
    payload: Any = None


BASE: dict[str, Any] = {"a": 1, "items": []}

# What the step under test does with the bad value; set by each test, read by the step.
ACT: dict[str, Callable[[Context, Any], Awaitable[Any]]] = {}
VALUE: dict[str, Any] = {}


class Refusals(Workflow):
    """``prepare`` commits ``k`` = BASE; ``act`` then does what ACT says with the value."""

    @step
    async def prepare(self, ctx: Context, ev: StartEvent) -> Go:
        await ctx.store.set("k", {"a": 1, "items": []})
        return Go()

    @step
    async def act(self, ctx: Context, ev: Go) -> Note | StopEvent | None:
        result: Note | StopEvent | None = await ACT["act"](ctx, VALUE["bad"])
        return result

    @step
    async def sink(self, ev: Note) -> StopEvent:
        return StopEvent(result="unreachable")


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """The store under test: in memory, or a file."""
    es = EventStore() if request.param == "memory" else EventStore(tmp_path / "refusals.db")
    try:
        yield es
    finally:
        es.close()


def kinds_of(wf: Workflow, run_id: str, step_name: str) -> list[str]:
    return [r.kind for r in wf.store.records(run_id) if r.step == step_name]


def check_refusal(err: BaseException, bad: Bad, prefix: str, level: int, how: str) -> None:
    """The error is an EncodeError naming the path (which starts with the key), the type,
    the problem and what refused it."""
    assert isinstance(err, EncodeError), repr(err)
    want = bad.path(prefix, level)
    assert err.path == want
    assert err.type is bad.type
    text = str(err)
    assert text.startswith(f"cannot encode {want}: {bad.type!r}: "), text
    assert re.search(bad.detail, text), text
    assert how in text, text


# ---------------------------------------------------------------------------- step writes


async def set_whole(ctx: Context, bad: Any) -> StopEvent:
    await ctx.store.set("k", bad)
    return StopEvent(result="unreachable")


async def set_path(ctx: Context, bad: Any) -> StopEvent:
    await ctx.store.set("k.a", bad)
    return StopEvent(result="unreachable")


async def tracked_append(ctx: Context, bad: Any) -> StopEvent:
    k = await ctx.store.get("k")
    k["items"].append(bad)
    await ctx.store.set("k", k)
    return StopEvent(result="unreachable")


async def tracked_new_key(ctx: Context, bad: Any) -> StopEvent:
    k = await ctx.store.get("k")
    k["new"] = bad
    await ctx.store.set("k", k)
    return StopEvent(result="unreachable")


async def edit_state(ctx: Context, bad: Any) -> StopEvent:
    async with ctx.store.edit_state() as state:
        state["other"] = bad
    return StopEvent(result="unreachable")


async def older_spelling(ctx: Context, bad: Any) -> StopEvent:
    await ctx.set("other", bad)
    return StopEvent(result="unreachable")


# (act, path prefix, level of the value inside its key, what refused it)
STEP_WRITES = [
    pytest.param(set_whole, "k", 1, "ctx.store.set('k', ...)", id="set"),
    pytest.param(set_path, "k.a", 2, "ctx.store.set('k.a', ...)", id="set-path"),
    pytest.param(
        tracked_append, "k['items'][0]", 3, "ctx.store.set('k', ...)", id="tracked-append"
    ),
    pytest.param(tracked_new_key, "k['new']", 2, "ctx.store.set('k', ...)", id="tracked-key"),
    pytest.param(edit_state, "other", 1, "ctx.store.set('other', ...)", id="edit-state"),
    pytest.param(older_spelling, "other", 1, "ctx.store.set('other', ...)", id="ctx-set"),
]


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize(("act", "prefix", "level", "how"), STEP_WRITES)
async def test_step_write_is_refused_at_set(
    store: EventStore,
    bad: Bad,
    act: Callable[[Context, Any], Awaitable[Any]],
    prefix: str,
    level: int,
    how: str,
) -> None:
    """A step's context write of a bad value raises EncodeError at set(), fails the step in
    the log, commits nothing of it, and a resume runs the step once more."""
    ACT["act"], VALUE["bad"] = act, bad.make()
    wf = Refusals(store=store)
    handler = wf.run()
    with pytest.raises(EncodeError) as info:
        await asyncio.wait_for(handler, TIMEOUT)
    check_refusal(info.value, bad, prefix, level, how)
    await _check_failed_step(wf, handler.run_id)


async def _check_failed_step(wf: Workflow, run_id: str) -> None:
    """The failing step is recorded as failed, wrote nothing, and a resume fails it once."""
    state = wf.state_at(run_id)
    assert state.status == "failed"
    assert state.context == {"k": BASE}
    # (enqueued: its input, Go, recorded under the step that takes it)
    assert kinds_of(wf, run_id, "act") == [
        "enqueued",
        "dequeued",
        "step_started",
        "step_failed",
        "run_failed",
    ]
    failed = [r.data() for r in wf.store.records(run_id, kinds=["step_failed"])]
    assert [f["error"] for f in failed] == ["EncodeError"]
    assert not list(wf.store.records(run_id, kinds=["streamed", "waiting", "run_finished"]))
    # Resuming the failed run runs the step once more, and it fails the same way.
    with pytest.raises(EncodeError):
        await asyncio.wait_for(wf.resume(run_id), TIMEOUT)
    assert wf.state_at(run_id).status == "failed"
    assert kinds_of(wf, run_id, "act").count("step_started") == 2
    assert wf.state_at(run_id).context == {"k": BASE}


# ---------------------------------------------------------------------------- step events


async def return_event(ctx: Context, bad: Any) -> Note:
    return Note(payload=bad)


async def send_event(ctx: Context, bad: Any) -> None:
    ctx.send_event(Note(payload=bad))


async def stream_event(ctx: Context, bad: Any) -> StopEvent:
    ctx.write_event_to_stream(Note(payload=bad))
    return StopEvent(result="unreachable")


async def wait_with_question(ctx: Context, bad: Any) -> StopEvent:
    await ctx.wait_for_event(Answer, waiter_event=InputRequiredEvent(payload=bad))
    return StopEvent(result="unreachable")


async def wait_with_requirements(ctx: Context, bad: Any) -> StopEvent:
    await ctx.wait_for_event(Answer, requirements={"tag": bad})
    return StopEvent(result="unreachable")


async def stop_with(ctx: Context, bad: Any) -> StopEvent:
    return StopEvent(result=bad)


async def collect(ctx: Context, bad: Any) -> None:
    ctx.collect_events(Note(payload=bad), [Note, Note])


STEP_EVENTS = [
    pytest.param(return_event, "Note.payload", 2, "step 'act' returned it", id="returned"),
    pytest.param(send_event, "Note.payload", 2, "step 'act' sent it", id="sent"),
    pytest.param(stream_event, "Note.payload", 2, "ctx.write_event_to_stream", id="streamed"),
    pytest.param(
        wait_with_question,
        "InputRequiredEvent.payload",
        2,
        "ctx.wait_for_event",
        id="waiter-event",
    ),
    pytest.param(
        wait_with_requirements, "requirements['tag']", 2, "ctx.wait_for_event", id="requirements"
    ),
    pytest.param(stop_with, "StopEvent.result", 2, "step 'act' returned it", id="stop-result"),
    pytest.param(collect, "Note.payload", 2, "step 'act' collected it", id="collected"),
]


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize(("act", "prefix", "level", "how"), STEP_EVENTS)
async def test_step_event_fails_the_step(
    store: EventStore,
    bad: Bad,
    act: Callable[[Context, Any], Awaitable[Any]],
    prefix: str,
    level: int,
    how: str,
) -> None:
    """An event (or a wait's question or requirements, or a result) a step produces that the
    log cannot hold fails the step with EncodeError, recorded, and nothing of it is written."""
    ACT["act"], VALUE["bad"] = act, bad.make()
    wf = Refusals(store=store)
    handler = wf.run()
    with pytest.raises(EncodeError) as info:
        await asyncio.wait_for(handler, TIMEOUT)
    check_refusal(info.value, bad, prefix, level, how)
    assert not [r for r in wf.store.records(handler.run_id, kinds=["enqueued"]) if r.step == "sink"]
    await _check_failed_step(wf, handler.run_id)


# ---------------------------------------------------------------------------- operator writes


async def wait_for_answer(ctx: Context, bad: Any) -> StopEvent:
    answer = await ctx.wait_for_event(Answer)
    return StopEvent(result=answer.response)


async def waiting_run(store: EventStore) -> tuple[Refusals, Any]:
    """A run whose step waits for an Answer (its context holds k = BASE)."""
    ACT["act"] = wait_for_answer
    wf = Refusals(store=store)
    handler = wf.run()
    await handler.wait_until_waiting(TIMEOUT)
    assert wf.state_at(handler.run_id).status == "waiting"
    return wf, handler


async def finish(wf: Workflow, handler: Any) -> None:
    """The run the refused write was aimed at goes on and finishes."""
    await handler.send_event(Answer(response="yes"))
    assert await asyncio.wait_for(handler, TIMEOUT) == "yes"
    assert wf.state_at(handler.run_id).status == "finished"
    assert wf.state_at(handler.run_id).context == {"k": BASE}


async def store_set(handler: Any, bad: Any) -> None:
    await handler.ctx.store.set("k", bad)


async def ctx_set(handler: Any, bad: Any) -> None:
    await handler.ctx.set("k", bad)


async def set_state(handler: Any, bad: Any) -> None:
    await handler.ctx.store.set_state({"k": BASE, "other": bad})


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize(
    ("write", "key"),
    [
        pytest.param(store_set, "k", id="store-set"),
        pytest.param(ctx_set, "k", id="ctx-set"),
        pytest.param(set_state, "other", id="set-state"),
    ],
)
async def test_operator_write_is_refused_at_the_call(
    store: EventStore, bad: Bad, write: Callable[[Any, Any], Awaitable[None]], key: str
) -> None:
    """Writing a bad value through ``handler.ctx`` raises EncodeError at the call and records
    nothing; the run goes on."""
    VALUE["bad"] = bad.make()
    wf, handler = await waiting_run(store)
    before = len(list(wf.store.records(handler.run_id)))
    with pytest.raises(EncodeError) as info:
        await write(handler, VALUE["bad"])
    check_refusal(info.value, bad, key, 1, "operator update")
    assert len(list(wf.store.records(handler.run_id))) == before
    await finish(wf, handler)


@pytest.mark.parametrize("bad", BAD_VALUES)
async def test_resume_updates_are_refused_at_the_call(store: EventStore, bad: Bad) -> None:
    """``resume(updates=...)`` with a bad value raises EncodeError at the call, before the
    run is claimed or anything is recorded; the run stays resumable."""
    VALUE["bad"] = bad.make()
    wf, handler = await waiting_run(store)
    await handler.suspend()
    before = len(list(wf.store.records(handler.run_id)))
    with pytest.raises(EncodeError) as info:
        wf.resume(handler.run_id, updates={"k": VALUE["bad"]})
    check_refusal(info.value, bad, "k", 1, "operator update")
    assert len(list(wf.store.records(handler.run_id))) == before
    assert wf.state_at(handler.run_id).status == "waiting"
    await finish(wf, wf.resume(handler.run_id))


@pytest.mark.parametrize("bad", BAD_VALUES)
async def test_fork_updates_are_refused_at_the_call(store: EventStore, bad: Bad) -> None:
    """``run_from(..., updates=...)`` with a bad value raises EncodeError at the call."""
    VALUE["bad"] = bad.make()
    wf, handler = await waiting_run(store)
    runs = len(wf.runs())
    with pytest.raises(EncodeError) as info:
        wf.run_from((handler.run_id, wf.state_at(handler.run_id).seq), updates={"k": VALUE["bad"]})
    check_refusal(info.value, bad, "k", 1, "operator update")
    assert len(wf.runs()) == runs
    await finish(wf, handler)


async def ctx_send_event(wf: Workflow, handler: Any, event: Event) -> None:
    handler.ctx.send_event(event)


async def handler_send_event(wf: Workflow, handler: Any, event: Event) -> None:
    await handler.send_event(event)


async def wf_send(wf: Workflow, handler: Any, event: Event) -> None:
    wf.send(handler.run_id, event)


@pytest.mark.parametrize("bad", BAD_VALUES)
@pytest.mark.parametrize(
    "send",
    [
        pytest.param(ctx_send_event, id="ctx-send-event"),
        pytest.param(handler_send_event, id="handler-send-event"),
        pytest.param(wf_send, id="wf-send"),
    ],
)
async def test_external_event_is_refused_at_the_call(
    store: EventStore, bad: Bad, send: Callable[[Workflow, Any, Event], Awaitable[None]]
) -> None:
    """An event sent into a run from outside that the log cannot hold raises EncodeError at
    the call; nothing is posted or recorded and the run goes on."""
    VALUE["bad"] = bad.make()
    wf, handler = await waiting_run(store)
    before = len(list(wf.store.records(handler.run_id)))
    event = Answer(response="no", payload=VALUE["bad"])
    with pytest.raises(EncodeError) as info:
        await send(wf, handler, event)
    check_refusal(info.value, bad, "Answer.payload", 2, "")
    await asyncio.sleep(0.01)  # anything taken in would be recorded by now
    assert len(list(wf.store.records(handler.run_id))) == before
    assert wf.store.inbox(handler.run_id) == []
    await finish(wf, handler)


@pytest.mark.parametrize("bad", BAD_VALUES)
async def test_start_event_is_refused_at_the_call(store: EventStore, bad: Bad) -> None:
    """A start event the log cannot hold raises EncodeError at ``run()``; no run is made."""
    wf = Refusals(store=store)
    with pytest.raises(EncodeError) as info:
        wf.run(payload=bad.make())
    check_refusal(info.value, bad, "StartEvent.payload", 2, "")
    assert wf.runs() == []


# ---------------------------------------------------------------------------- near the limit


@pytest.mark.parametrize(("act", "prefix", "level", "how"), STEP_WRITES)
async def test_deepest_value_allowed_is_committed_and_resumed(
    store: EventStore,
    act: Callable[[Context, Any], Awaitable[Any]],
    prefix: str,
    level: int,
    how: str,
) -> None:
    """A value nested exactly as deep as the limit allows, set by each way, is committed
    and read back whole by a fresh fold: set() refuses no more than the commit does."""
    value = nested_lists(MAX_DEPTH - level)  # its innermost list sits at level MAX_DEPTH

    async def act_then_stop(ctx: Context, bad: Any) -> StopEvent:
        await act(ctx, bad)
        return StopEvent(result="ok")

    ACT["act"], VALUE["bad"] = act_then_stop, value
    wf = Refusals(store=store)
    handler = wf.run()
    assert await asyncio.wait_for(handler, TIMEOUT) == "ok"
    context = Refusals(store=store).state_at(handler.run_id).context
    key = prefix.split(".")[0].split("[")[0]
    where: Any = context[key]
    if prefix == "k.a":
        where = where["a"]
    elif prefix == "k['items'][0]":
        where = where["items"][0]
    elif prefix == "k['new']":
        where = where["new"]
    assert where == value


async def test_one_level_past_a_committed_value_is_refused(store: EventStore) -> None:
    """Appending inside a committed value counts the depth from the root of the key, so a
    tracked patch can never make the key's value deeper than the commit can write."""

    async def grow(ctx: Context, bad: Any) -> StopEvent:
        k = await ctx.store.get("k")
        k["items"].append(nested_lists(MAX_DEPTH - 3))  # fits at level 3
        await ctx.store.set("k", k)
        deepest = k["items"][0]
        for _ in range(MAX_DEPTH - 3):
            deepest = deepest[0]
        deepest.append([])  # one level too many, inside a value already set
        await ctx.store.set("k", k)
        return StopEvent(result="unreachable")

    ACT["act"], VALUE["bad"] = grow, None
    wf = Refusals(store=store)
    with pytest.raises(EncodeError, match=TOO_DEEP) as info:
        await asyncio.wait_for(wf.run(), TIMEOUT)
    assert info.value.path == "k['items'][0]" + "[0]" * (MAX_DEPTH - 2)


# ---------------------------------------------------------------------------- commit failures


class Failing(Workflow):
    """One step that fails as ACT says, after a context write."""

    @step
    async def act(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("tried", True)
        result: StopEvent = await ACT["act"](ctx, None)
        return result


class UnprintableError(Exception):
    def __str__(self) -> str:
        msg = "no text for you"
        raise RuntimeError(msg)


async def raise_surrogate_message(ctx: Context, _: Any) -> StopEvent:
    msg = "bad \ud800 input"
    raise ValueError(msg)


async def raise_unprintable(ctx: Context, _: Any) -> StopEvent:
    raise UnprintableError


async def wait_with_a_bad_timeout(ctx: Context, _: Any) -> StopEvent:
    await ctx.wait_for_event(Answer, timeout="soon")  # type: ignore[arg-type]
    return StopEvent(result="unreachable")


@pytest.mark.parametrize(
    ("act", "error", "message"),
    [
        pytest.param(raise_surrogate_message, ValueError, r"bad \\ud800 input", id="surrogate"),
        pytest.param(raise_unprintable, UnprintableError, r"unprintable", id="unprintable"),
        pytest.param(wait_with_a_bad_timeout, ValueError, r"soon", id="bad-timeout"),
    ],
)
async def test_a_commit_that_cannot_be_written_fails_the_attempt(
    store: EventStore, act: Callable[..., Awaitable[Any]], error: type, message: str
) -> None:
    """An attempt whose records cannot be written for a reason other than I/O fails with its
    error recorded as ``step_failed``: the process goes on and the run is not stranded."""
    ACT["act"] = act
    wf = Failing(store=store)
    handler = wf.run()
    with pytest.raises(error):
        await asyncio.wait_for(handler, TIMEOUT)
    state = wf.state_at(handler.run_id)
    assert state.status == "failed"
    assert state.context == {}
    (failed,) = [r.data() for r in wf.store.records(handler.run_id, kinds=["step_failed"])]
    assert failed["error"] == error.__qualname__
    assert re.search(message, failed["message"]), failed["message"]
    with pytest.raises(error):
        await asyncio.wait_for(wf.resume(handler.run_id), TIMEOUT)
    assert kinds_of(wf, handler.run_id, "act").count("step_started") == 2


# ---------------------------------------------------------------------------- patch text


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param([("append", (), "x")], id="append"),
        pytest.param([("extend", ("items",), [1, (2, 3)])], id="extend"),
        pytest.param([("set", ("a", 0, "b"), {1: "one"})], id="set"),
        pytest.param([("set", (KeyRef(5), KeyRef((1, 2))), 1.5)], id="key-refs"),
        pytest.param([("del", ("a",)), ("trunc", ("l",), 2)], id="del-trunc"),
        pytest.param([("replace", (), {"v": [1]})], id="replace"),
    ],
)
def test_patch_text_is_what_the_fold_reads(ops: list[Any]) -> None:
    """encode_ops writes a patch exactly as ops_to_json has always written it."""
    codec = Codec()
    text, whole = encode_ops(codec, ops, "k")
    assert orjson.loads(text) == orjson.loads(orjson.dumps(ops_to_json(ops, codec)))
    if ops[0][0] == "replace":
        assert whole == codec.encode(ops[0][2])
    else:
        assert whole is None


# ---------------------------------------------------------------------------- what set() writes


class Later(Workflow):
    """Changes values after setting them, without setting them again."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Go:
        await ctx.store.set("items", ["a"])
        return Go()

    @step
    async def change(self, ctx: Context, ev: Go) -> StopEvent:
        items = await ctx.store.get("items")
        items.append("b")
        await ctx.store.set("items", items)
        items.append("not written")
        plain = {"n": 1}
        await ctx.store.set("plain", plain)
        plain["n"] = 2
        return StopEvent(result="done")


async def test_set_writes_the_value_as_it_is_at_the_call(store: EventStore) -> None:
    """What set() encoded is what commits, in the log and live: a change made afterwards
    without setting the value again is not written (as a durable store writes what it got)."""
    wf = Later(store=store)
    handler = wf.run()
    assert await asyncio.wait_for(handler, TIMEOUT) == "done"
    want = {"items": ["a", "b"], "plain": {"n": 1}}
    assert wf.state_at(handler.run_id).context == want
    assert Later(store=store).state_at(handler.run_id).context == want


BLIND: dict[str, asyncio.Event] = {}


class Blind(Workflow):
    """``writer`` sets ``k`` without reading it; ``appender`` commits a change to ``k`` before
    ``writer``'s attempt ends."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Go | Note:
        await ctx.store.set("k", [1] * 20)
        ctx.send_event(Note())
        return Go()

    @step
    async def writer(self, ctx: Context, ev: Go) -> StopEvent:
        await ctx.store.set("k", [1] * 20 + [7])  # its change: append 7, made now
        await asyncio.wait_for(BLIND["appended"].wait(), TIMEOUT)
        return StopEvent(result="written")

    @step
    async def appender(self, ctx: Context, ev: Note) -> None:
        k = await ctx.store.get("k")
        k.append(5)
        await ctx.store.set("k", k)


async def test_a_value_set_blind_is_written_whole_when_its_key_changed_since(
    store: EventStore,
) -> None:
    """A change made at set() against a value that another commit replaced before the
    attempt ends is not applied to the new value: the value set is written whole."""
    BLIND["appended"] = asyncio.Event()
    wf = Blind(store=store)

    def hook(x: Any, seq: int) -> None:
        if x.committed.get("k", [])[-1:] == [5]:
            BLIND["appended"].set()

    wf.__workflow_parts__.commit_hook = hook
    handler = wf.run()
    assert await asyncio.wait_for(handler, TIMEOUT) == "written"
    assert wf.state_at(handler.run_id).context == {"k": [1] * 20 + [7]}
    assert Blind(store=store).state_at(handler.run_id).context == {"k": [1] * 20 + [7]}


async def set_bad_key(ctx: Context, bad: Any) -> StopEvent:
    await ctx.store.set("ke\ud800y", 1)
    return StopEvent(result="unreachable")


async def wait_with_bad_id(ctx: Context, bad: Any) -> StopEvent:
    await ctx.wait_for_event(Answer, waiter_id="w\udc00")
    return StopEvent(result="unreachable")


@pytest.mark.parametrize(
    ("act", "path"),
    [
        pytest.param(set_bad_key, "the key 'ke\\ud800y'", id="context-key"),
        pytest.param(wait_with_bad_id, "waiter_id", id="waiter-id"),
    ],
)
async def test_a_name_the_log_cannot_hold_fails_the_step(
    store: EventStore, act: Callable[[Context, Any], Awaitable[Any]], path: str
) -> None:
    """A context key or waiter id with a lone surrogate is refused at the call, by name."""
    ACT["act"], VALUE["bad"] = act, None
    wf = Refusals(store=store)
    handler = wf.run()
    with pytest.raises(EncodeError, match="lone surrogate") as info:
        await asyncio.wait_for(handler, TIMEOUT)
    assert (info.value.path, info.value.type) == (path, str)
    await _check_failed_step(wf, handler.run_id)
