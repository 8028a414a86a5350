"""LlamaIndex's Context lifecycle, durable: ``Context(wf)``, ``run(ctx=)``, ``to_dict`` /
``from_dict``, and the pause-and-resume pattern of LlamaIndex's human-in-the-loop docs.

A context names a run: unbound until its first run, bound to each run started from it. A
run with start fields is a new run linked to the last (a chat turn); without them the
context's run goes on (resumed, or forked where a restored dict points). Every test uses
real stores; the cross-process ones real subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from eventstore import EncodeError, EventStore
from tests.support import llama_spelling
from tests.support.context_proc import Ask
from workflow import (
    BaseSerializer,
    Context,
    ContextSerdeError,
    ContextStateError,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    JsonPickleSerializer,
    JsonSerializer,
    PickleSerializer,
    RunSuspendedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowCancelledError,
    WorkflowError,
    WorkflowHandler,
    step,
)
from workflow._fold import Folded, fold
from workflow._read import fold_run
from workflow.context import Context as ContextFromModule
from workflow.context.serializers import BaseSerializer as BaseFromModule

ROOT = Path(__file__).resolve().parent.parent
BOUND = 20.0  # seconds: only a hang comes near it


class Turn(Workflow):
    """A chat: each turn appends the message to the history kept in the context."""

    @step
    async def reply(self, ctx: Context, ev: StartEvent) -> StopEvent:
        history: list[str] = await ctx.store.get("history", default=[])
        msg = getattr(ev, "msg", "(continue)")
        await ctx.store.set("history", [*history, msg])
        return StopEvent(result=len(history) + 1)


class Middle(Event):
    n: int


class Flaky(Workflow):
    """Fails in ``finish`` until ``ok`` is set in the context; counts each step's runs."""

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Middle:
        await ctx.store.set("starts", await ctx.store.get("starts", default=0) + 1)
        return Middle(n=1)

    @step
    async def finish(self, ctx: Context, ev: Middle) -> StopEvent:
        if not await ctx.store.get("ok", default=False):
            msg = "not ok yet"
            raise ValueError(msg)
        return StopEvent(result=f"done {ev.n}")


def started_steps(store: EventStore, run_id: str) -> list[str | None]:
    return [r.step for r in store.records(run_id, kinds=["step_started"])]


def run_started(store: EventStore, run_id: str) -> dict[str, Any]:
    (r,) = store.records(run_id, kinds=["run_started"])
    payload: dict[str, Any] = json.loads(r.payload)
    return payload


# ---------------------------------------------------------------------- names


def test_the_names_live_where_llamaindex_puts_them() -> None:
    """workflow.context re-exports Context and the serializers; the errors keep both bases."""
    assert ContextFromModule is Context
    assert BaseFromModule is BaseSerializer
    assert JsonPickleSerializer is PickleSerializer
    assert issubclass(PickleSerializer, JsonSerializer)
    assert issubclass(ContextStateError, WorkflowError)
    assert issubclass(ContextSerdeError, WorkflowError)
    assert issubclass(ContextSerdeError, ValueError)


# ---------------------------------------------------------------------- binding


async def test_an_unbound_context_keeps_its_writes_for_its_first_run(tmp_path: Path) -> None:
    """Writes before the first run are read back, and the first run starts with them in its
    first commit; the context is then bound to that run."""
    wf = Turn(store=tmp_path / "chat.db")
    ctx = Context(wf)
    assert not ctx.is_running
    with pytest.raises(ContextStateError, match="no run yet"):
        _ = ctx.run_id
    with pytest.raises(ContextStateError, match="called before workflow started"):
        ctx.send_event(Middle(n=1))
    await ctx.store.set("history", ["system"])
    assert await ctx.store.get("history") == ["system"]
    with pytest.raises(EncodeError, match="history"):
        await ctx.store.set("history", [object()])  # refused at the call, as in a step
    handler = wf.run(ctx=ctx, msg="hi")
    assert handler.ctx is ctx
    assert ctx.run_id == handler.run_id
    assert await handler == 2
    first = next(iter(wf.store.records(handler.run_id)))
    kinds = [r.kind for r in wf.store.records(handler.run_id) if r.commit_seq == first.commit_seq]
    assert kinds == ["run_started", "state_set", "enqueued"]
    assert await ctx.store.get("history") == ["system", "hi"]  # idle: the run's end


async def test_chat_turns_are_new_runs_linked_not_forked(store: EventStore) -> None:
    """run(ctx=ctx, msg=...) starts a new run from the context's state each time; each
    names the previous run as a link, and none has a parent."""
    wf = Turn(store=store)
    ctx = Context(wf)
    ids = []
    for i, msg in enumerate(["a", "b", "c"]):
        handler = wf.run(ctx=ctx, msg=msg)
        assert await handler == i + 1
        ids.append(handler.run_id)
    assert len(set(ids)) == 3
    assert wf.state_at(ids[-1]).context["history"] == ["a", "b", "c"]
    for prev, run in itertools.pairwise(ids):
        info = store.get_run(run)
        assert info is not None
        assert info.parent_run_id is None
        link = run_started(store, run)["previous"]
        assert link == {"run_id": prev, "seq": store.last_seq(prev)}
    assert "previous" not in run_started(store, ids[0])


async def test_a_thousand_turn_chat_is_a_thousand_runs_that_fold_on_their_own(
    tmp_path: Path,
) -> None:
    """1,000 turns are 1,000 runs: each folds from its own records alone (no ancestor to
    read, so any older turn can be exported or pruned without it)."""
    wf = Turn(store=tmp_path / "long.db")
    ctx = Context(wf)
    runs = []
    for i in range(1000):
        handler = wf.run(ctx=ctx, msg=str(i))
        assert await handler == i + 1
        runs.append(handler.run_id)
    store = wf.store
    assert len(store.runs()) == 1000
    for i in (0, 1, 499, 999):
        alone = fold(Folded(runs[i]), store.records(runs[i]))
        assert alone.status == "finished"
        history = orjson.loads(orjson.dumps(alone.context["history"].dump))
        assert history == [str(k) for k in range(i + 1)]
        info = store.get_run(runs[i])
        assert info is not None
        assert info.parent_run_id is None


async def test_a_context_without_start_fields_continues_its_failed_run(store: EventStore) -> None:
    """run(ctx=ctx) after a failure resumes the same run: only the failed step runs, after
    the writes made on the idle context, which are recorded as the operator update."""
    wf = Flaky(store=store)
    ctx = Context(wf)
    with pytest.raises(ValueError, match="not ok"):
        await wf.run(ctx=ctx)
    run_id = ctx.run_id
    assert not ctx.is_running
    await ctx.store.set("ok", True)
    assert await ctx.store.get("ok") is True
    assert wf.state_at(run_id).context.get("ok") is None  # still only on the context
    assert await wf.run(ctx=ctx) == "done 1"
    assert ctx.run_id == run_id
    assert started_steps(store, run_id) == ["start", "finish", "finish"]
    kinds = [(r.kind, r.step) for r in store.records(run_id)]
    resumed = kinds.index(("run_resumed", None))
    assert kinds[resumed + 1] == ("state_set", None)


async def test_a_finished_run_s_context_starts_a_new_linked_run(store: EventStore) -> None:
    """run(ctx=ctx) after the run finished starts a new run with the default start event."""
    wf = Turn(store=store)
    ctx = Context(wf)
    first = wf.run(ctx=ctx, msg="x")
    assert await first == 1
    second = wf.run(ctx=ctx)
    assert await second == 2
    assert second.run_id != first.run_id
    assert wf.state_at(second.run_id).context["history"] == ["x", "(continue)"]
    assert run_started(store, second.run_id)["previous"]["run_id"] == first.run_id


async def test_a_live_run_refuses_another_run_from_its_context(store: EventStore) -> None:
    """While a context's run is live, run(ctx=ctx) raises ContextStateError; handler.ctx
    writes on the live run are operator commits the run sees."""
    wf = Ask(store=store)
    ctx = Context(wf)
    handler = wf.run(ctx=ctx, who="me")
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    assert ctx.is_running
    with pytest.raises(ContextStateError, match="running"):
        wf.run(ctx=ctx)
    with pytest.raises(ContextStateError):
        wf.run(ctx=ctx, who="again")
    await handler.ctx.store.set("asked", "operator")
    assert wf.state_at(handler.run_id).context["asked"] == "operator"
    handler.ctx.send_event(HumanResponseEvent(response="ann"))
    async with asyncio.timeout(BOUND):
        assert await handler == "hello ann from operator"
    assert not ctx.is_running


# ---------------------------------------------------------------------- to_dict / from_dict


async def test_a_dict_restored_at_an_older_seq_forks_there(store: EventStore) -> None:
    """A dict taken after the failure, restored after the run went on and finished, forks
    at the dict's seq: the new run's parent is the run at that seq."""
    wf = Flaky(store=store)
    ctx = Context(wf)
    with pytest.raises(ValueError, match="not ok"):
        await wf.run(ctx=ctx)
    data = json.loads(json.dumps(ctx.to_dict()))
    run_id, seq = data["run_id"], data["seq"]
    assert seq == store.last_seq(run_id)
    assert await wf.resume(run_id, updates={"ok": True}) == "done 1"  # the run goes on
    restored = Context.from_dict(wf, data)
    await restored.store.set("ok", "yes")
    handler = wf.run(ctx=restored)
    assert await handler == "done 1"
    info = store.get_run(handler.run_id)
    assert info is not None
    assert (info.parent_run_id, info.parent_seq) == (run_id, seq)
    assert started_steps(store, handler.run_id) == ["finish"]
    assert wf.state_at(handler.run_id).context["ok"] == "yes"


class Asks(Workflow):
    """Counts in the context, asks a question, and answers with the count and the reply."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> InputRequiredEvent:
        await ctx.store.set("asked", await ctx.store.get("asked", default=0) + 1)
        return InputRequiredEvent(prefix="ok?")

    @step
    async def answer(self, ctx: Context, ev: HumanResponseEvent) -> StopEvent:
        return StopEvent(result=f"asked {await ctx.store.get('asked')}: {ev.response}")


async def test_include_state_false_on_the_run_s_store_reads_the_log(store: EventStore) -> None:
    """to_dict(include_state=False) is a pointer without the values: where the store holds
    the run, the log is the truth, so nothing is deleted and the values are the log's, for
    a next turn and for a continued run alike."""
    wf = Turn(store=store)
    ctx = Context(wf)
    await wf.run(ctx=ctx, msg="secret")
    data = json.loads(json.dumps(ctx.to_dict(include_state=False)))
    assert data["state"] is None
    assert data["include_state"] is False
    restored = Context.from_dict(wf, data)
    assert await restored.store.get("history") == ["secret"]
    assert await wf.run(ctx=restored, msg="more") == 2
    assert await Context.from_dict(wf, data).store.get("history") == ["secret"]


async def test_include_state_false_continuing_a_run_keeps_its_values(store: EventStore) -> None:
    """A stateless dict of an unfinished run, restored on its store and run without a start
    event, continues the run with the values its log holds (none are deleted)."""
    wf = Asks(store=store)
    handler = wf.run()
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            break
    data = handler.ctx.to_dict(include_state=False)
    await handler.cancel_run()
    with pytest.raises(WorkflowCancelledError):
        await handler
    restored = Context.from_dict(wf, data)
    again = wf.run(ctx=restored)
    again.ctx.send_event(HumanResponseEvent(response="yes"))
    assert await again == "asked 1: yes"
    assert wf.state_at(again.run_id).context["asked"] == 1


async def test_include_state_false_imported_starts_with_no_values(store: EventStore) -> None:
    """Imported into a store without the run, a stateless dict has no values to read:
    the run starts with none (LlamaIndex's meaning)."""
    wf = Turn(store=store)
    ctx = Context(wf)
    await wf.run(ctx=ctx, msg="secret")
    data = ctx.to_dict(include_state=False)
    elsewhere = Turn()  # its own in-memory store
    restored = Context.from_dict(elsewhere, data)
    assert await restored.store.get("history", default=None) is None
    assert await elsewhere.run(ctx=restored, msg="fresh") == 1


async def test_a_dict_whose_state_was_removed_is_refused(store: EventStore) -> None:
    """A dict without its 'state' key that does not say it was written without state has
    lost its values: from_dict refuses it instead of restoring an empty context."""
    wf = Turn(store=store)
    ctx = Context(wf)
    await wf.run(ctx=ctx, msg="secret")
    data = ctx.to_dict()
    del data["state"]
    with pytest.raises(ContextSerdeError, match="no 'state' key"):
        Context.from_dict(wf, data)
    stateless = ctx.to_dict(include_state=False)
    del stateless["state"]  # it says it has none: nothing was lost
    assert await Context.from_dict(wf, stateless).store.get("history") == ["secret"]


class Upper(BaseSerializer):
    """A user's serializer: JSON text with a marker, to show it is the one used."""

    def serialize(self, value: Any) -> str:
        return "U" + json.dumps(value)

    def deserialize(self, value: str) -> Any:
        assert value.startswith("U")
        return json.loads(value[1:])


async def test_serializers_write_and_read_the_values(store: EventStore) -> None:
    """JsonSerializer and PickleSerializer keep the codec's typed JSON (exact types); a
    user's BaseSerializer writes each value as its text and must be given to from_dict."""
    wf = Turn(store=store)
    ctx = Context(wf)
    await ctx.store.set("when", (1, 2))  # a tuple: typed JSON keeps it one
    await wf.run(ctx=ctx, msg="m")
    for ser in (None, JsonSerializer(), PickleSerializer(), JsonPickleSerializer()):
        data = json.loads(json.dumps(ctx.to_dict(serializer=ser)))
        back = Context.from_dict(wf, data, serializer=ser)
        assert await back.store.get("when") == (1, 2)
        assert await back.store.get("history") == ["m"]
    data = json.loads(json.dumps(ctx.to_dict(serializer=Upper())))
    assert data["state"]["history"] == 'U["m"]'
    with pytest.raises(ContextSerdeError, match="Upper"):
        Context.from_dict(wf, data)
    back = Context.from_dict(wf, data, serializer=Upper())
    assert await back.store.get("history") == ["m"]
    assert await back.store.get("when") == (1, 2)  # bound to the run: the store's values
    elsewhere = Turn()  # another store: the dict's values, as the user's serializer gave them
    imported = Context.from_dict(elsewhere, data, serializer=Upper())
    assert await imported.store.get("when") == [1, 2]
    assert await elsewhere.run(ctx=imported, msg="n") == 2


async def test_a_bad_dict_is_a_clear_error(store: EventStore) -> None:
    """A dict of another workflow, of LlamaIndex's format, or damaged, is refused by
    from_dict with ContextSerdeError naming what is wrong."""
    wf = Flaky(store=store)
    ctx = Context(wf)
    with pytest.raises(ValueError, match="not ok"):
        await wf.run(ctx=ctx)
    good = ctx.to_dict()
    with pytest.raises(ContextSerdeError, match="workflow"):
        Context.from_dict(Turn(store=store), good)
    llama_shape = {"state": {}, "streaming_queue": "[]", "queues": {}, "is_running": False}
    with pytest.raises(ContextSerdeError, match="format"):
        Context.from_dict(wf, llama_shape)
    with pytest.raises(ContextSerdeError, match="run state"):
        Context.from_dict(wf, {**good, "run": {**good["run"], "queues": "garbage"}})
    damaged_event = json.loads(json.dumps(good))
    (prog,) = damaged_event["run"]["in_progress"]["finish"]
    prog["event"] = {"$t": "model", "c": "nowhere:Nothing", "v": {}}
    with pytest.raises(ContextSerdeError, match="Nothing"):
        Context.from_dict(wf, damaged_event)
    with pytest.raises(ContextSerdeError, match="version"):
        Context.from_dict(wf, {**good, "version": 99})


async def test_a_dict_from_another_store_is_imported_as_a_new_run(tmp_path: Path) -> None:
    """Restored where its run is not in the store, the dict's state becomes a new run's
    first commit (in-progress events queued again), linked to where it came from."""
    wf = Flaky(store=tmp_path / "a.db")
    ctx = Context(wf)
    with pytest.raises(ValueError, match="not ok"):
        await wf.run(ctx=ctx)
    data = json.loads(json.dumps(ctx.to_dict()))
    other = Flaky(store=tmp_path / "b.db")
    restored = Context.from_dict(other, data)
    assert await restored.store.get("starts") == 1
    await restored.store.set("ok", True)
    handler = other.run(ctx=restored)
    assert await handler == "done 1"
    assert started_steps(other.store, handler.run_id) == ["finish"]
    assert run_started(other.store, handler.run_id)["previous"] == {
        "run_id": data["run_id"],
        "seq": data["seq"],
    }
    assert other.state_at(handler.run_id).context == {"starts": 1, "ok": True}


# ---------------------------------------------------------------------- LlamaIndex's HITL


async def _paused_at_the_question(handler: WorkflowHandler) -> dict[str, Any] | None:
    """LlamaIndex's documented pause: at the first InputRequiredEvent streamed, the
    context's dict, then cancel_run() (None if no question came)."""
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                ctx_dict = handler.ctx.to_dict()
                await handler.cancel_run()
                return ctx_dict
    return None


async def test_pause_and_resume_as_llamaindex_documents_it(store: EventStore) -> None:
    """handler.ctx.to_dict() at the question, cancel_run(), later from_dict and
    run(ctx=restored): the question is asked again and the answer sent arrives."""
    wf = Ask(store=store)
    handler = wf.run(who="doc")
    ctx_dict = await _paused_at_the_question(handler)
    with pytest.raises(WorkflowCancelledError):
        await handler
    assert ctx_dict is not None
    restored = Context.from_dict(wf, json.loads(json.dumps(ctx_dict)))
    handler = wf.run(ctx=restored)
    handler.ctx.send_event(HumanResponseEvent(response="bo"))
    async with asyncio.timeout(BOUND):
        assert await handler == "hello bo from doc"


async def test_pause_and_resume_answered_after_the_question_is_asked_again(
    store: EventStore,
) -> None:
    """The same, answering only once the restored run asks again (the docs' other order)."""
    wf = Ask(store=store)
    handler = wf.run(who="doc")
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    ctx_dict = handler.ctx.to_dict()
    await handler.cancel_run()
    with pytest.raises(WorkflowCancelledError):
        await handler
    handler = wf.run(ctx=Context.from_dict(wf, ctx_dict))
    asked = []
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                asked.append(ev.prefix)
                handler.ctx.send_event(HumanResponseEvent(response="cy"))
        assert await handler == "hello cy from doc"
    assert asked == ["name?"]


def _python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.context_proc", *args],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "WORKFLOW_STORE"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(file: Path, proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The dict the process wrote (it writes it whole, by a rename)."""
    deadline = time.monotonic() + 60
    while not file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the process wrote no context dict"
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(file.read_text("utf-8"))
    return data


async def test_pause_in_one_process_resume_in_another_on_its_own_store(tmp_path: Path) -> None:
    """The dict of a run paused (and cancelled) in a process with an in-memory store
    restores in this one: the wait is imported, asked again and answered."""
    file = tmp_path / "ctx.json"
    proc = _python("dict-memory", str(file))
    data = _wait_for(file, proc)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    wf = Ask()
    handler = wf.run(ctx=Context.from_dict(wf, data))
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                handler.ctx.send_event(HumanResponseEvent(response="di"))
        assert await handler == "hello di from proc"


async def test_separate_steps_pause_resumes_on_a_store_of_its_own() -> None:
    """LlamaIndex's documented pause with the question returned by one step and the answer
    taken by another (no wait): restored where the store has never seen the run (another
    process's, or one in memory), the run goes on idle and the answer runs the second step,
    which does not ask again."""
    wf = Asks()
    handler = wf.run()
    ctx_dict = await _paused_at_the_question(handler)
    assert ctx_dict is not None
    elsewhere = Asks()  # a store of its own, as in a new process
    handler = elsewhere.run(ctx=Context.from_dict(elsewhere, json.loads(json.dumps(ctx_dict))))
    handler.ctx.send_event(HumanResponseEvent(response="42"))
    async with asyncio.timeout(BOUND):
        assert await handler == "asked 1: 42"
    assert started_steps(elsewhere.store, handler.run_id) == ["answer"]


class Stalls(Workflow):
    """Its first step returns nothing: the run has no work left, and nothing from outside
    could give it any (the second step's event is one the first step returns)."""

    @step
    async def first(self, ev: StartEvent) -> Middle | None:
        return None

    @step
    async def second(self, ev: Middle) -> StopEvent:
        return StopEvent(result=ev.n)


async def test_a_dict_with_no_work_and_no_outside_event_is_refused_elsewhere() -> None:
    """Imported where nothing could ever run (no queued work, no wait, no step taking an
    event from outside), the dict is refused at run(ctx=...), loudly, not left to idle."""
    wf = Stalls(timeout=0.3)
    ctx = Context(wf)
    with pytest.raises(WorkflowError, match="timed out"):
        await wf.run(ctx=ctx)
    data = json.loads(json.dumps(ctx.to_dict()))
    elsewhere = Stalls()
    with pytest.raises(WorkflowError, match="no work left to continue, and no step takes"):
        elsewhere.run(ctx=Context.from_dict(elsewhere, data))


async def test_a_run_live_in_another_process_refuses_its_context(tmp_path: Path) -> None:
    """A context bound (by from_dict) to a run another live process holds raises
    ContextStateError; once that process is gone, the same call continues the run."""
    db, file = tmp_path / "shared.db", tmp_path / "ctx.json"
    proc = _python("hold", str(db), str(file))
    try:
        data = _wait_for(file, proc)
        wf = Ask(store=db)
        ctx = Context.from_dict(wf, data)
        assert ctx.is_running
        with pytest.raises(ContextStateError, match="running"):
            wf.run(ctx=ctx)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert not ctx.is_running
    handler = wf.run(ctx=ctx)
    assert handler.run_id == data["run_id"]  # the same run, resumed
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                handler.ctx.send_event(HumanResponseEvent(response="ed"))
        assert await handler == "hello ed from proc"


async def test_the_llama_spelled_lifecycle_runs() -> None:
    """The type-checked LlamaIndex-spelled module's lifecycle
    (tests/support/llama_spelling.py, under mypy and pyright in test_typing) runs as
    LlamaIndex's docs intend."""
    async with asyncio.timeout(BOUND):
        assert await llama_spelling.carry_context() == [4, 10, 12, "hello bo"]


async def test_a_cancelled_run_need_not_be_awaited() -> None:
    """The pause-and-resume pattern cancels and never awaits the handler: asyncio does not
    report its cancellation as an error never retrieved (awaiting it still raises)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        wf = Ask()
        handler = wf.run()
        async with asyncio.timeout(BOUND):
            await handler.wait_until_waiting()
            await handler.cancel_run()
            await asyncio.wait([handler._future])  # ends, without retrieving its error
        assert wf.state_at(handler.run_id).status == "cancelled"
        del handler
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert [c["message"] for c in reported] == []


async def test_an_answer_sent_through_an_idle_context_is_taken_in_by_its_next_run(
    store: EventStore,
) -> None:
    """A run left waiting (suspended): send_event on its idle context records the answer
    for the run, and run(ctx=ctx) resumes it, taking the answer in first."""
    wf = Ask(store=store)
    ctx = Context(wf)
    handler = wf.run(ctx=ctx, who="idle")
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    await handler.suspend()
    with pytest.raises(RunSuspendedError):
        await handler
    assert not ctx.is_running
    ctx.send_event(HumanResponseEvent(response="fa"))
    async with asyncio.timeout(BOUND):
        assert await wf.run(ctx=ctx) == "hello fa from idle"
    assert ctx.run_id == handler.run_id


async def test_a_context_moves_to_another_instance_on_another_store(tmp_path: Path) -> None:
    """A context used with another instance of its workflow, whose store lacks its run,
    carries its run's state there (imported), as a dict of it would."""
    first = Flaky(store=tmp_path / "one.db")
    ctx = Context(first)
    with pytest.raises(ValueError, match="not ok"):
        await first.run(ctx=ctx)
    await ctx.store.set("ok", True)
    second = Flaky(store=tmp_path / "two.db")
    handler = second.run(ctx=ctx)
    assert await handler == "done 1"
    assert started_steps(second.store, handler.run_id) == ["finish"]
    assert ctx.run_id == handler.run_id
    with pytest.raises(WorkflowError, match="takes the workflow"):
        Context(None)  # type: ignore[arg-type]


async def test_history_shows_a_turn_s_link(tmp_path: Path) -> None:
    """`workflow history` names the run a chat turn took its context from."""
    from tests.test_cli import ok

    db = tmp_path / "chat.db"
    wf = Turn(store=db)
    ctx = Context(wf)
    first = wf.run(ctx=ctx, msg="a")
    await first
    second = wf.run(ctx=ctx, msg="b")
    await second
    seq = wf.store.last_seq(first.run_id)
    out = await asyncio.to_thread(ok, "history", db, second.run_id)
    assert f"context of {first.run_id} at seq {seq}" in out


class Sleepy(Workflow):
    """Sleeps in its step until ``awake`` is set in the context (then returns at once)."""

    @step
    async def nap(self, ctx: Context, ev: StartEvent) -> StopEvent:
        if not await ctx.store.get("awake", default=False):
            await asyncio.sleep(60)
        return StopEvent(result="up")


async def test_a_cancelled_or_timed_out_run_goes_on_from_its_context(store: EventStore) -> None:
    """run(ctx=ctx) is the explicit ask: a cancelled run is resumed, and a timed-out one
    with a fresh timeout budget; both are the same run."""
    wf = Sleepy(store=store, timeout=None)
    ctx = Context(wf)
    handler = wf.run(ctx=ctx)
    await asyncio.sleep(0.05)
    await handler.cancel_run()
    with pytest.raises(WorkflowCancelledError):
        await handler
    await ctx.store.set("awake", True)
    async with asyncio.timeout(BOUND):
        assert await wf.run(ctx=ctx) == "up"
    assert ctx.run_id == handler.run_id

    timed = Sleepy(store=store, timeout=0.2)
    ctx = Context(timed)
    handler = timed.run(ctx=ctx)
    with pytest.raises(TimeoutError):
        await handler
    assert timed.state_at(handler.run_id).status == "timed_out"
    await ctx.store.set("awake", True)
    async with asyncio.timeout(BOUND):
        assert await timed.run(ctx=ctx) == "up"
    assert ctx.run_id == handler.run_id


async def test_resuming_a_timed_out_run_gives_it_a_fresh_budget(store: EventStore) -> None:
    """A timed-out run resumed gets its whole timeout again (DESIGN: a fresh budget): the
    fold starts its clock over at that resume, and so does the executor."""
    wf = Sleepy(store=store, timeout=0.2)
    handler = wf.run()
    with pytest.raises(TimeoutError):
        await handler
    assert fold_run(store, handler.run_id, cached=False).exec_us >= 200_000
    async with asyncio.timeout(BOUND):
        assert await wf.resume(handler.run_id, updates={"awake": True}) == "up"
    assert fold_run(store, handler.run_id, cached=False).exec_us < 200_000


class Point:
    """A plain class: stored only by a workflow that opted in to pickle."""

    def __init__(self, x: int) -> None:
        self.x = x


class Pickled(Workflow):
    @step
    async def place(self, ctx: Context, ev: StartEvent) -> StopEvent:
        await ctx.store.set("point", Point(getattr(ev, "x", 1)))
        return StopEvent(result="placed")


async def test_pickles_go_through_pickle_serializer_only(store: EventStore) -> None:
    """A context holding a pickle (Workflow(allow_pickle=True)) is written and restored only
    with PickleSerializer, the explicit opt-in; JsonSerializer says which value it is."""
    wf = Pickled(store=store, allow_pickle=True)
    ctx = Context(wf)
    assert await wf.run(ctx=ctx, x=3) == "placed"
    with pytest.raises(ContextSerdeError, match=r"'point'.*PickleSerializer"):
        ctx.to_dict()
    with pytest.raises(ContextSerdeError, match="PickleSerializer"):
        ctx.to_dict(serializer=JsonSerializer())
    data = json.loads(json.dumps(ctx.to_dict(serializer=PickleSerializer())))
    with pytest.raises(ContextSerdeError, match="serializer=PickleSerializer"):
        Context.from_dict(wf, data)
    elsewhere = Pickled(allow_pickle=True)
    restored = Context.from_dict(elsewhere, data, serializer=JsonPickleSerializer())
    assert (await restored.store.get("point")).x == 3
    assert await elsewhere.run(ctx=restored, x=4) == "placed"


async def test_the_dict_says_whether_its_run_was_under_way(store: EventStore) -> None:
    """``is_running`` in the dict has LlamaIndex's meaning (the run was under way: also once
    cancelled, since a run from the dict goes on with it); ``live`` whether it runs now."""
    wf = Ask(store=store)
    ctx = Context(wf)
    assert (ctx.to_dict()["is_running"], ctx.to_dict()["live"]) == (False, False)
    handler = wf.run(ctx=ctx)
    async with asyncio.timeout(BOUND):
        await handler.wait_until_waiting()
    live = ctx.to_dict()
    assert (live["is_running"], live["live"]) == (True, True)
    await handler.cancel_run()
    with pytest.raises(WorkflowCancelledError):
        await handler
    stopped = ctx.to_dict()
    assert (stopped["is_running"], stopped["live"], stopped["status"]) == (True, False, "cancelled")
    handler = wf.run(ctx=Context.from_dict(wf, stopped))
    handler.ctx.send_event(HumanResponseEvent(response="gu"))
    async with asyncio.timeout(BOUND):
        assert await handler == "hello gu from you"
    assert handler.ctx.to_dict()["is_running"] is False


class Counting(Workflow):
    """A one-step run that counts its turns in the context."""

    @step
    async def a(self, ctx: Context, ev: StartEvent) -> StopEvent:
        turns = await ctx.store.get("turns", default=0) + 1
        await ctx.store.set("turns", turns)
        return StopEvent(result=turns)


@pytest.mark.parametrize("include_state", [True, False])
async def test_a_finished_run_s_dict_in_another_store_runs_a_next_turn(
    include_state: bool,
) -> None:
    """A dict of a finished run, restored on a store that lacks the run, and run with no
    start fields, starts a next turn there (it used to import a run with nothing to do,
    which idled until its timeout); without its state the turn starts from none."""
    wf = Counting(store=None, timeout=10)
    ctx: Context[Any] = Context(wf)
    assert await wf.run(ctx=ctx) == 1
    data = json.loads(json.dumps(ctx.to_dict(include_state=include_state)))
    other = Counting(store=None, timeout=10)
    restored: Context[Any] = Context.from_dict(other, data)
    assert await asyncio.wait_for(other.run(ctx=restored), 10) == (2 if include_state else 1)


class Scheduler(Workflow):
    """A step that schedules an hour-long timer, as code a step calls may: the timer's
    handle keeps a copy of the step's context variables."""

    handles: ClassVar[list[asyncio.TimerHandle]] = []

    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        assert Context.get_step_context() is not None
        Scheduler.handles.append(asyncio.get_running_loop().call_later(3600, lambda: None))
        return StopEvent(result="done")


async def test_a_timer_a_step_scheduled_does_not_keep_the_workflow_alive() -> None:
    """What runs now (the attempt, its context) is held in a box the step's end empties: a
    long timer scheduled in a step kept the run's context, executor and workflow alive
    until it fired (LlamaIndex's own test of the same)."""
    refs: list[weakref.ref[Workflow]] = []
    try:
        for _ in range(3):
            wf = Scheduler(timeout=10)
            refs.append(weakref.ref(wf))
            assert await wf.run() == "done"
            del wf
        for _ in range(3):
            gc.collect()
        assert [r() is None for r in refs] == [True, True, True]
    finally:
        for h in Scheduler.handles:
            h.cancel()
        Scheduler.handles.clear()
