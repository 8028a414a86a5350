"""Human in the loop as LlamaIndex documents it: the answer is never lost, whatever the timing.

The consumer loop is LlamaIndex's::

    handler = wf.run()
    async for ev in handler.stream_events():
        if isinstance(ev, InputRequiredEvent):
            handler.ctx.send_event(HumanResponseEvent(response=...))
    result = await handler

Each flow below is a pattern from LlamaIndex's documentation or tests; each answer is sent
every way a user sends one (``handler.ctx.send_event``, ``await handler.send_event``,
``wf.send`` from another thread or another process). Every test runs under a bound, so a
lost answer fails it instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from eventstore import EncodeError, EventStore
from tests.flows import Replies
from tests.test_cli import invoke as cli_invoke
from tests.test_cli import ok as cli_ok
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    RunSuspendedError,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowCancelledError,
    WorkflowHandler,
    WorkflowRuntimeError,
    WorkflowTimeoutError,
    step,
)

ROOT = Path(__file__).resolve().parent.parent
BOUND = 10.0  # seconds: generous; only a lost answer (a hang) comes near it
# A ``workflow send`` process starts Python and imports the engine: 1-2 s idle, up to 8 s
# measured with both cores of a 2-core machine busy. Its time is bounded apart from BOUND,
# and only a hung process comes near this.
PROCESS_BOUND = 120.0


def logged_answers(store: EventStore, run_id: str) -> list[str]:
    """The human answers taken into the run's log, each once, read as plain JSON records."""
    found: dict[int, str] = {}
    for r in store.records(run_id, kinds=["enqueued", "wait_resolved"]):
        payload = json.loads(r.payload)
        ev = payload.get("event")
        if ev is not None and ev["c"].endswith(":HumanResponseEvent"):
            found.setdefault(payload["id"], ev["v"]["response"])
    return list(found.values())


def require_durable(wf: Workflow, run_id: str, response: str) -> None:
    """Fails the step unless the answer it runs on is already in the log."""
    if response not in logged_answers(wf.store, run_id):
        msg = f"the answer {response!r} reached a step before its commit was durable"
        raise AssertionError(msg)


# ---------------------------------------------------------------------------- the patterns


class AskName(Workflow):
    """LlamaIndex's ``wait_for_event``: the question is the waiter event."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix="name?")
        )
        require_durable(self, ctx.run_id, answer.response)
        return StopEvent(result=f"hello {answer.response}")


class Approval(Workflow):
    """LlamaIndex's replay-safe approval: a ``waiter_id`` named in the question and required."""

    @step
    async def wait_for_approval(self, ctx: Context, ev: StartEvent) -> StopEvent:
        waiter_id = "approval:request-1"
        response = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_id=waiter_id,
            waiter_event=InputRequiredEvent(prefix="Approve request?", waiter_id=waiter_id),
            requirements={"waiter_id": waiter_id},
        )
        require_durable(self, ctx.run_id, response.response)
        return StopEvent(result=f"approved {response.response}")


class TwoSteps(Workflow):
    """LlamaIndex's recommended pattern: one step asks, another takes the answer."""

    @step
    async def step1(self, ev: StartEvent) -> InputRequiredEvent:
        return InputRequiredEvent(prefix="Enter a number: ")

    @step
    async def step2(self, ctx: Context, ev: HumanResponseEvent) -> StopEvent:
        require_durable(self, ctx.run_id, ev.response)
        return StopEvent(result=f"got {ev.response}")


class Waiter1(Event):
    msg: str


class Waiter2(Event):
    msg: str


class ResultEvent(Event):
    result: str


class TwoWaiters(Workflow):
    """LlamaIndex's test: questions streamed before two parallel waits, answers by requirement."""

    @step
    async def spawn_waiters(self, ctx: Context, ev: StartEvent) -> Waiter1 | Waiter2 | None:
        ctx.send_event(Waiter1(msg="foo"))
        ctx.send_event(Waiter2(msg="bar"))
        return None

    @step
    async def waiter_one(self, ctx: Context, ev: Waiter1) -> ResultEvent:
        ctx.write_event_to_stream(InputRequiredEvent(prefix="waiter_one"))
        new_ev = await ctx.wait_for_event(
            HumanResponseEvent, requirements={"waiter_id": "waiter_one"}
        )
        require_durable(self, ctx.run_id, new_ev.response)
        return ResultEvent(result=new_ev.response)

    @step
    async def waiter_two(self, ctx: Context, ev: Waiter2) -> ResultEvent:
        ctx.write_event_to_stream(InputRequiredEvent(prefix="waiter_two"))
        new_ev = await ctx.wait_for_event(
            HumanResponseEvent, requirements={"waiter_id": "waiter_two"}
        )
        require_durable(self, ctx.run_id, new_ev.response)
        return ResultEvent(result=new_ev.response)

    @step
    async def collect_waiters(self, ctx: Context, ev: ResultEvent) -> StopEvent | None:
        events = ctx.collect_events(ev, [ResultEvent, ResultEvent])
        if events is None:
            return None
        return StopEvent(result=sorted(e.result for e in events))


class Turn(Event):
    n: int


class Chat(Workflow):
    """A conversation: the same step asks again until the human says bye."""

    @step
    async def start(self, ev: StartEvent) -> Turn:
        return Turn(n=1)

    @step
    async def turn(self, ctx: Context, ev: Turn) -> Turn | StopEvent:
        reply = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix=f"turn {ev.n}?")
        )
        require_durable(self, ctx.run_id, reply.response)
        if reply.response == "bye":
            return StopEvent(result=f"{ev.n} turns")
        return Turn(n=ev.n + 1)


def answer_for(question: InputRequiredEvent) -> HumanResponseEvent:
    """What the human answers to each question of the flows above."""
    prefix = question.prefix
    if prefix == "name?":
        return HumanResponseEvent(response="ada")
    if prefix == "Approve request?":
        return HumanResponseEvent(response="yes", waiter_id=question.waiter_id)
    if prefix.startswith("waiter_"):
        return HumanResponseEvent(response=prefix[len("waiter_") :], waiter_id=prefix)
    if prefix.startswith("turn "):
        n = int(prefix[len("turn ") : -1])
        return HumanResponseEvent(response="bye" if n == 3 else f"more {n}")
    return HumanResponseEvent(response="42")


FLOWS: dict[str, tuple[type[Workflow], Any, list[str]]] = {
    # flow, its result, the answers its log ends up holding
    "wait_for_event": (AskName, "hello ada", ["ada"]),
    "waiter_id_and_requirements": (Approval, "approved yes", ["yes"]),
    "step_returns_question": (TwoSteps, "got 42", ["42"]),
    "stream_then_wait": (TwoWaiters, ["one", "two"], ["one", "two"]),
    "conversation": (Chat, "3 turns", ["more 1", "more 2", "bye"]),
}
FIRST_QUESTION: dict[str, InputRequiredEvent] = {
    "wait_for_event": InputRequiredEvent(prefix="name?"),
    "step_returns_question": InputRequiredEvent(prefix="Enter a number: "),
}


# ---------------------------------------------------------------------------- the senders


class Sender:
    """Sends a human's answer into a run one of the ways users do."""

    def __init__(self, how: str, wf: Workflow, handler: WorkflowHandler) -> None:
        self.how = how
        self.wf = wf
        self.handler = handler
        self.threads: list[threading.Thread] = []

    async def send(self, ev: HumanResponseEvent) -> None:
        if self.how == "ctx":
            self.handler.ctx.send_event(ev)  # LlamaIndex's spelling: synchronous
        elif self.how == "handler":
            await self.handler.send_event(ev)
        elif self.how == "thread":
            # As a web handler in another thread would: fire and go on.
            t = threading.Thread(target=self.wf.send, args=(self.handler.run_id, ev))
            t.start()
            self.threads.append(t)
        else:
            await send_from_another_process(self.wf, self.handler.run_id, ev)

    def join(self) -> None:
        for t in self.threads:
            t.join()


async def send_from_another_process(wf: Workflow, run_id: str, ev: Event) -> None:
    """``workflow send`` in a real subprocess: ``wf.send`` of the same workflow class."""
    cls = type(wf)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workflow",
        "send",
        str(wf.store.path),
        run_id,
        "--event",
        "workflow:HumanResponseEvent",
        "--data",
        json.dumps(ev.model_dump()),
        "--workflow",
        f"{cls.__module__}:{cls.__qualname__}",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(PROCESS_BOUND):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, out.decode()


async def converse(
    handler: WorkflowHandler,
    sender: Sender,
    answer: Callable[[InputRequiredEvent], HumanResponseEvent] = answer_for,
) -> tuple[Any, list[Event]]:
    """LlamaIndex's consumer loop: answers each question streamed; returns result and stream.

    A question streamed again by a step that runs again (``write_event_to_stream`` before a
    wait) is the same question: it is answered once, as a user interface shows it once.

    BOUND is the longest the run may go without progress (the next event streamed, or its
    result) once an answer is sent, so a lost answer fails the test; the time the sender
    itself takes (another process starting) is not counted in it, as a loaded machine
    stretches that far past any wake-up.
    """
    seen: list[Event] = []
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(BOUND) as bound:
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent) and ev not in seen:
                bound.reschedule(None)
                await sender.send(answer(ev))
            bound.reschedule(loop.time() + BOUND)
            seen.append(ev)
        result = await handler
    sender.join()
    return result, seen


def questions(stream: Sequence[Event]) -> list[str]:
    """The questions in a stream, by their prefix."""
    return [ev.prefix for ev in stream if isinstance(ev, InputRequiredEvent)]


# ---------------------------------------------------------------------------- live runs


@pytest.mark.parametrize("how", ["ctx", "handler", "thread"])
@pytest.mark.parametrize("flow", list(FLOWS))
async def test_documented_loop_gets_its_answer(flow: str, how: str, store: EventStore) -> None:
    """Each documented pattern finishes with the answers sent as its questions are streamed."""
    cls, expected, answers = FLOWS[flow]
    wf = cls(store=store)
    handler = wf.run()
    result, stream = await converse(handler, Sender(how, wf, handler))
    assert result == expected
    assert isinstance(stream[-1], StopEvent)
    assert sorted(logged_answers(store, handler.run_id)) == sorted(answers)
    assert wf.state_at(handler.run_id).status == "finished"


@pytest.mark.parametrize("flow", ["wait_for_event", "step_returns_question", "stream_then_wait"])
async def test_answer_from_another_process(flow: str, tmp_path: Path) -> None:
    """``workflow send`` from another process answers the live owner's question."""
    cls, expected, answers = FLOWS[flow]
    wf = cls(store=tmp_path / "hitl.db")
    handler = wf.run()
    result, _ = await converse(handler, Sender("process", wf, handler))
    assert result == expected
    assert sorted(logged_answers(wf.store, handler.run_id)) == sorted(answers)


@pytest.mark.parametrize("turns", [0, 1, 2, 3, 5, 8, 13, 21])
async def test_answer_at_any_point_of_the_wait(turns: int, store: EventStore) -> None:
    """An answer sent after any number of event-loop turns past the question is taken."""
    wf = AskName(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                for _ in range(turns):
                    await asyncio.sleep(0)
                handler.ctx.send_event(HumanResponseEvent(response="ada"))
        assert await handler == "hello ada"
    assert logged_answers(store, handler.run_id) == ["ada"]


async def test_answer_sent_before_the_run_starts(store: EventStore) -> None:
    """An answer sent right after ``run()`` waits for the question and answers it."""
    wf = AskName(store=store)
    handler = wf.run()
    handler.ctx.send_event(HumanResponseEvent(response="ada"))
    async with asyncio.timeout(BOUND):
        assert await handler == "hello ada"
    assert logged_answers(store, handler.run_id) == ["ada"]


async def test_answer_that_does_not_meet_the_requirements_waits(store: EventStore) -> None:
    """An answer for another waiter stays unclaimed; the one required answers the wait."""
    wf = Approval(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                handler.ctx.send_event(HumanResponseEvent(response="no", waiter_id="other"))
                handler.ctx.send_event(HumanResponseEvent(response="yes", waiter_id=ev.waiter_id))
        assert await handler == "approved yes"
    assert logged_answers(store, handler.run_id) == ["no", "yes"]


# ---------------------------------------------------------------------------- resumed runs


@asynccontextmanager
async def left_waiting(cls: type[Workflow], store: EventStore, how: str) -> AsyncIterator[str]:
    """Runs ``cls`` until it asks, then leaves the run (suspended or cancelled)."""
    wf = cls(store=store)
    handler = wf.run()
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                if how == "suspend":
                    await handler.suspend()
                else:
                    await handler.cancel_run()
                break
        with pytest.raises((RunSuspendedError, WorkflowCancelledError)):
            await handler
    yield handler.run_id


@pytest.mark.parametrize("how", ["suspend", "cancel"])
@pytest.mark.parametrize("flow", ["wait_for_event", "step_returns_question"])
async def test_resume_then_send_at_once(flow: str, how: str, store: EventStore) -> None:
    """LlamaIndex's stop-and-resume: the answer sent as the run resumes is taken in."""
    cls, expected, answers = FLOWS[flow]
    async with left_waiting(cls, store, how) as run_id:
        wf = cls(store=store)
        handler = wf.resume(run_id, cancelled=how == "cancel")
        handler.ctx.send_event(answer_for(FIRST_QUESTION[flow]))
        result, stream = await converse(handler, Sender("ctx", wf, handler))
    assert result == expected
    assert questions(stream) == []  # answered before it could be asked again
    assert logged_answers(store, run_id) == answers


@pytest.mark.parametrize("flow", ["wait_for_event", "waiter_id_and_requirements"])
@pytest.mark.parametrize("answered", [True, False], ids=["answer-in-inbox", "no-answer-yet"])
async def test_resumed_run_asks_only_what_is_unanswered(
    flow: str, answered: bool, store: EventStore
) -> None:
    """A resumed run streams its question again only if the inbox holds no answer to it."""
    cls, expected, answers = FLOWS[flow]
    async with left_waiting(cls, store, "suspend") as run_id:
        wf = cls(store=store)
        question = wf.state_at(run_id).waiters[0].waiter_event
        assert isinstance(question, InputRequiredEvent)
        if answered:
            wf.send(run_id, answer_for(question))
        handler = wf.resume(run_id)
        result, stream = await converse(handler, Sender("ctx", wf, handler))
    assert result == expected
    assert questions(stream) == ([] if answered else [question.prefix])
    assert logged_answers(store, run_id) == answers  # answered once, never twice


# ---------------------------------------------------------------------------- asked once


class Ask(Event):
    pass


class Bump(Event):
    pass


class ConflictedQuestion(Workflow):
    """A step that returns a question conflicts with a concurrent write and runs again."""

    bumped: asyncio.Event

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Ask | Bump | None:
        self.bumped = asyncio.Event()
        ctx.send_event(Ask())
        ctx.send_event(Bump())
        return None

    @step
    async def ask(self, ctx: Context, ev: Ask) -> InputRequiredEvent:
        n = await ctx.store.get("n", default=0)
        if not self.bumped.is_set():
            await self.bumped.wait()  # bump commits first: this attempt's read is stale
        return InputRequiredEvent(prefix=f"n={n}?")

    @step
    async def bump(self, ctx: Context, ev: Bump) -> None:
        await ctx.store.set("n", 1)
        self.bumped.set()

    @step
    async def answer(self, ev: HumanResponseEvent) -> StopEvent:
        return StopEvent(result=ev.response)


async def test_returned_question_is_streamed_once_its_commit_is_durable(store: EventStore) -> None:
    """A question of an attempt that conflicted is never streamed: only its re-run's is."""
    wf = ConflictedQuestion(store=store)
    handler = wf.run()
    result, stream = await converse(handler, Sender("ctx", wf, handler))
    assert result == "42"
    assert questions(stream) == ["n=1?"]
    assert questions(wf.state_at(handler.run_id).stream) == ["n=1?"]  # the log agrees
    assert logged_answers(store, handler.run_id) == ["42"]
    kinds = [r.kind for r in store.records(handler.run_id, kinds=["step_conflicted"])]
    assert kinds == ["step_conflicted"]


class Escalate(HumanResponseEvent):
    """The human hands the question on to an approver step."""

    response: str


class AutoApprove(Workflow):
    """Another step answers the wait with ``ctx.send_event`` (an approver on the human's side)."""

    @step
    async def ask(self, ctx: Context, ev: StartEvent) -> StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix="approve?"),
            requirements={"decision": "approved"},
        )
        return StopEvent(result=f"approved by {answer.response}")

    @step
    async def approver(self, ctx: Context, ev: Escalate) -> None:
        ctx.send_event(HumanResponseEvent(response="the approver", decision="approved"))


async def test_an_event_a_step_sends_answers_a_wait(store: EventStore) -> None:
    """An event a step sends that no step takes answers a wait already registered."""
    wf = AutoApprove(store=store)
    handler = wf.run()
    result, stream = await converse(
        handler, Sender("ctx", wf, handler), lambda q: Escalate(response="escalated")
    )
    assert result == "approved by the approver"
    assert questions(stream) == ["approve?"]


async def test_an_answer_that_cannot_be_stored_is_refused_at_the_call(store: EventStore) -> None:
    """``handler.ctx.send_event`` refuses an event the codec cannot store; the run goes on."""
    wf = AskName(store=store)
    handler = wf.run()
    with pytest.raises(EncodeError, match="response"):
        handler.ctx.send_event(HumanResponseEvent(response=object()))
    handler.ctx.send_event(HumanResponseEvent(response="ada"))
    async with asyncio.timeout(BOUND):
        assert await handler == "hello ada"


async def test_a_timed_out_question_takes_a_late_answer_when_resumed(tmp_path: Path) -> None:
    """A separate-steps question left unanswered past the run's timeout: the late answer
    sent to it (``wf.send``, as from another shell) is kept in its inbox, and the resume
    takes it in and finishes, rather than sitting out a fresh timeout."""
    db = tmp_path / "late.db"
    wf = Replies(store=db, timeout=0.3)
    handler = wf.run(run_id="late")
    with pytest.raises(WorkflowTimeoutError):
        await handler
    assert wf.state_at("late").status == "timed_out"
    wf.send("late", HumanResponseEvent(response="ada"))
    async with asyncio.timeout(BOUND):
        assert await wf.resume("late") == "hello ada"
    finished = Replies(store=db)
    with pytest.raises(WorkflowRuntimeError, match="has finished; nothing would take the event"):
        finished.send("late", HumanResponseEvent(response="bob"))


def test_workflow_send_to_a_timed_out_run_says_the_resume_takes_it_in(tmp_path: Path) -> None:
    """From the shell: ``workflow send`` to a timed-out run records the answer and says
    which command takes it in; ``workflow resume`` then finishes the run with it."""
    db = tmp_path / "late.db"

    async def times_out() -> None:
        wf = Replies(store=db, timeout=0.3)
        with pytest.raises(WorkflowTimeoutError):
            await wf.run(run_id="q")
        wf.store.close()

    asyncio.run(times_out())
    timed_out = cli_ok("history", db, "q", "--kind", "run_timed_out")
    assert "s of execution" in timed_out, timed_out
    assert "'elapsed'" not in timed_out, timed_out
    data = json.dumps({"response": "cy"})
    sent = cli_ok("send", db, "q", "--event", "workflow:HumanResponseEvent", "--data", data)
    assert "the run timed out: `workflow resume` takes it in" in sent, sent
    resumed = cli_ok("resume", db, "q", "--workflow", "tests.flows:Replies")
    assert "hello cy" in resumed, resumed


def test_workflow_run_says_what_a_returned_question_asks_and_that_the_run_timed_out(
    tmp_path: Path,
) -> None:
    """``workflow run`` of the separate-steps pattern: the run is idle, not waiting, so the
    command says on stderr what it asks and how to answer (stdout stays the outcome's), and
    a run left unanswered is reported as timed out, resumable, not as failed."""
    db = tmp_path / "asks.db"
    result = cli_invoke(
        "run", db, "--workflow", "tests.flows:Replies", "--run-id", "q", "--timeout", "0.5"
    )
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "run q asks: 'name?'; answer it with `workflow send" in result.stderr, result.stderr
    assert "--event workflow:HumanResponseEvent --data" in result.stderr, result.stderr
    assert result.stdout.startswith("run q timed out: "), result.stdout
    assert "`workflow resume " in result.stdout, result.stdout
    assert " failed" not in result.stdout, result.stdout
    as_json = cli_invoke(
        "run", tmp_path / "j.db", "--workflow", "tests.flows:Replies", "--timeout", "0.5", "--json"
    )
    assert json.loads(as_json.stdout)["status"] == "timed_out", as_json.stdout


class Branch(Event):
    name: str


class Approved(Event):
    name: str
    response: str


class Approvals(Workflow):
    """Three branches, each waiting for an approval; a collector gathers them."""

    @step
    async def dispatch(self, ctx: Context, ev: StartEvent) -> Branch | None:
        for name in "abc":
            ctx.send_event(Branch(name=name))
        return None

    @step(num_workers=3)
    async def branch(self, ctx: Context, ev: Branch) -> Approved:
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix=f"approve {ev.name}")
        )
        return Approved(name=ev.name, response=answer.response)

    @step
    async def gather(self, ctx: Context, ev: Approved) -> StopEvent | None:
        got = ctx.collect_events(ev, [Approved] * 3)
        return None if got is None else StopEvent(result=sorted((a.name, a.response) for a in got))


async def test_one_answer_meets_every_wait_it_matches(store: EventStore) -> None:
    """As in LlamaIndex, one HumanResponseEvent answers all three branches waiting for one
    (it answered only the first, and the others waited for ever); the three answers are
    one commit, so a crash cannot leave some answered and the event taken."""
    wf = Approvals(store=store)
    handler = wf.run()
    asked: set[str] = set()
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                asked.add(ev.prefix)
                if len(asked) == 3:
                    handler.ctx.send_event(HumanResponseEvent(response="ok"))
        assert await handler == [("a", "ok"), ("b", "ok"), ("c", "ok")]
    resolved = [r for r in store.records(handler.run_id) if r.kind == "wait_resolved"]
    assert len(resolved) == 3
    assert len({r.commit_seq for r in resolved}) == 1


async def test_one_answer_sent_to_a_left_run_meets_every_wait_on_resume(
    store: EventStore,
) -> None:
    """The same answer sent to a run nobody runs (``wf.send``) meets every wait when a
    resume takes it in."""
    wf = Approvals(store=store)
    handler = wf.run()
    asked: set[str] = set()
    async with asyncio.timeout(BOUND):
        async for ev in handler.stream_events():
            if isinstance(ev, InputRequiredEvent):
                asked.add(ev.prefix)
                if len(asked) == 3:
                    await handler.suspend()
                    break
        with pytest.raises(RunSuspendedError):
            await handler
        wf.send(handler.run_id, HumanResponseEvent(response="later"))
        again = Approvals(store=store).resume(handler.run_id)
        assert await again == [("a", "later"), ("b", "later"), ("c", "later")]


def test_workflow_run_of_waits_names_the_answer_once_and_no_placeholder(tmp_path: Path) -> None:
    """``workflow run`` of three branches waiting for one answer: stderr says each question
    without a ``MODULE:CLASS`` placeholder or a timeout the command does not sit out (the
    process leaves the waiting run), stdout says the class it waits for and the command
    that sends it, and ``--json`` names that class once."""
    db = tmp_path / "waits.db"
    spec = "tests.test_human_in_the_loop:Approvals"
    result = cli_invoke("run", db, "--workflow", spec, "--run-id", "w")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    asked = [line for line in result.stderr.splitlines() if line.startswith("run w asks:")]
    assert sorted(asked) == [f"run w asks: 'approve {n}'" for n in "abc"], result.stderr
    assert "--event workflow:HumanResponseEvent" in result.stdout, result.stdout
    as_json = cli_invoke("run", db, "--workflow", spec, "--run-id", "w2", "--json")
    assert json.loads(as_json.stdout)["waiting_for"] == ["workflow._events:HumanResponseEvent"]


class SharedId(Workflow):
    """Three branches waiting under one explicit waiter_id."""

    @step
    async def dispatch(self, ctx: Context, ev: StartEvent) -> Branch | None:
        for name in "abc":
            ctx.send_event(Branch(name=name))
        return None

    @step(num_workers=3)
    async def branch(self, ctx: Context, ev: Branch) -> StopEvent:
        answer = await ctx.wait_for_event(
            HumanResponseEvent,
            waiter_event=InputRequiredEvent(prefix=f"approve {ev.name}"),
            waiter_id="approval",
        )
        return StopEvent(result=answer.response)


async def test_a_waiter_id_already_waited_on_elsewhere_is_refused_by_name(
    store: EventStore,
) -> None:
    """Waits are keyed by id: a second wait under an id another input waits on would
    replace it, and the first would never run again. It fails its step, naming the id."""
    with pytest.raises(WorkflowRuntimeError, match="waiter_id 'approval' is already waited on"):
        async with asyncio.timeout(BOUND):
            await SharedId(store=store).run()
