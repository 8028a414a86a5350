"""LlamaIndex Workflows' public API under our package (issue 15): names, steps, validation.

A LlamaIndex user changes ``workflows`` to ``workflow`` in the imports; these tests pin that
each name is where LlamaIndex puts it and behaves as it does there.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import eventstore
from workflow import Context, RunNotFoundError, Workflow, WorkflowError
from workflow.decorators import StepConfig, step
from workflow.errors import (
    ContextSerdeError,
    ContextStateError,
    WorkflowCancelledByUser,
    WorkflowConfigurationError,
    WorkflowDone,
    WorkflowRuntimeError,
    WorkflowStepDoesNotExistError,
    WorkflowTimeoutError,
    WorkflowValidationError,
)
from workflow.events import (
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    StartEvent,
    StopEvent,
)
from workflow.testing import WorkflowTestRunner

# Every public name LlamaIndex Workflows 2.26.1 defines in each module we mirror (those of
# .context belong to their own issue).
LLAMA_NAMES = {
    "workflow": ["Context", "Workflow", "catch_error", "step"],
    "workflow.events": [
        "DictLikeModel",
        "Event",
        "EventType",
        "HumanResponseEvent",
        "InputRequiredEvent",
        "InternalDispatchEvent",
        "StartEvent",
        "StepFailedEvent",
        "StepState",
        "StepStateChanged",
        "StopEvent",
        "UnhandledEvent",
        "WorkflowCancelledEvent",
        "WorkflowFailedEvent",
        "WorkflowIdleEvent",
        "WorkflowTimedOutEvent",
    ],
    "workflow.errors": [
        "ContextSerdeError",
        "ContextStateError",
        "WorkflowCancelledByUser",
        "WorkflowConfigurationError",
        "WorkflowDone",
        "WorkflowRuntimeError",
        "WorkflowStepDoesNotExistError",
        "WorkflowTimeoutError",
        "WorkflowValidationError",
    ],
    "workflow.decorators": [
        "StepConfig",
        "StepFailedEvent",
        "StepGraphCheck",
        "WorkflowGraphCheck",
        "catch_error",
        "step",
    ],
    "workflow.resource": [
        "Resource",
        "ResourceConfig",
        "ResourceDefinition",
        "ResourceDescriptor",
        "ResourceManager",
    ],
    "workflow.handler": ["WorkflowHandler"],
    "workflow.workflow": ["Workflow"],
    "workflow.testing": ["WorkflowTestRunner"],
    "workflow.testing.runner": ["WorkflowTestResult", "WorkflowTestRunner"],
    "workflow.retry_policy": [
        "ConstantDelayRetryPolicy",
        "ExponentialBackoffRetryPolicy",
        "RetryCondition",
        "RetryInfo",
        "RetryPolicy",
        "StopCondition",
        "WaitStrategy",
        "retry_all",
        "retry_always",
        "retry_any",
        "retry_if_exception",
        "retry_if_exception_cause_type",
        "retry_if_exception_message",
        "retry_if_exception_type",
        "retry_if_not_exception_message",
        "retry_if_not_exception_type",
        "retry_never",
        "retry_policy",
        "retry_unless_exception_type",
        "stop_after_attempt",
        "stop_after_delay",
        "stop_all",
        "stop_any",
        "stop_before_delay",
        "stop_never",
        "wait_chain",
        "wait_combine",
        "wait_exponential",
        "wait_exponential_jitter",
        "wait_fixed",
        "wait_full_jitter",
        "wait_incrementing",
        "wait_none",
        "wait_random",
        "wait_random_exponential",
    ],
}


@pytest.mark.parametrize("module", sorted(LLAMA_NAMES))
def test_every_llama_name_is_where_llama_puts_it(module: str) -> None:
    """Each LlamaIndex name imports from the same module path under ``workflow``."""
    mod = importlib.import_module(module)
    missing = [n for n in LLAMA_NAMES[module] if not hasattr(mod, n)]
    assert missing == []


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (WorkflowValidationError, (WorkflowError, ValueError)),
        (WorkflowConfigurationError, (WorkflowValidationError, WorkflowError)),
        (WorkflowTimeoutError, (WorkflowError, TimeoutError)),
        (WorkflowRuntimeError, (WorkflowError, RuntimeError)),
        (WorkflowCancelledByUser, (WorkflowError,)),
        (WorkflowStepDoesNotExistError, (WorkflowRuntimeError, WorkflowError)),
        (WorkflowDone, (WorkflowError,)),
        (ContextSerdeError, (WorkflowError, ValueError)),
        (ContextStateError, (WorkflowError, RuntimeError)),
    ],
)
def test_errors_sit_under_both_bases(error: type[Exception], bases: tuple[type, ...]) -> None:
    """``except`` clauses written for LlamaIndex's classes or for ours both catch them."""
    assert all(issubclass(error, b) for b in bases)
    assert error.__module__ == "workflow._errors"


def test_run_not_found_is_one_lineage_with_the_stores() -> None:
    """``except eventstore.RunNotFoundError`` catches what Workflow raises for a missing run."""

    class Tiny(Workflow):
        @step
        async def go(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

    with pytest.raises(eventstore.RunNotFoundError) as info:
        Tiny().state_at("nope")
    assert isinstance(info.value, RunNotFoundError)
    assert isinstance(info.value, WorkflowError)
    assert info.value.run_id == "nope"
    assert str(info.value) == "no run 'nope' in the memory store"


# ---------------------------------------------------------------- steps


class Middle(Event):
    n: int


async def test_sync_steps_run_off_the_event_loop() -> None:
    """A plain ``def`` step runs in a worker thread; its ctx calls still reach the run."""
    loop_thread = threading.get_ident()
    seen: list[int] = []

    class Sync(Workflow):
        @step
        def first(self, ctx: Context, ev: StartEvent) -> Middle:
            seen.append(threading.get_ident())
            ctx.write_event_to_stream(Event(msg="from a thread"))
            ctx.send_event(Middle(n=1))
            return Middle(n=2)

        @step
        def second(self, ctx: Context, ev: Middle) -> StopEvent | None:
            seen.append(threading.get_ident())
            got = ctx.collect_events(ev, [Middle, Middle])
            if got is None:
                return None
            return StopEvent(result=sorted(e.n for e in got))

    result = await WorkflowTestRunner(Sync()).run(expose_internal=False)
    assert result.result == [1, 2]
    assert [e.msg for e in result.collected if not isinstance(e, StopEvent)] == ["from a thread"]
    assert seen
    assert loop_thread not in seen


async def test_a_sync_steps_late_outcome_after_the_run_ended_is_dropped(tmp_path: Path) -> None:
    """A sync step cannot be interrupted: when the run ends first, what it returns is dropped."""
    entered = threading.Event()
    release = threading.Event()

    class Stuck(Workflow):
        @step
        def block(self, ev: StartEvent) -> StopEvent:
            entered.set()
            release.wait()
            return StopEvent(result="late")

    wf = Stuck(store=tmp_path / "log.db")
    handler = wf.run()
    await asyncio.to_thread(entered.wait)
    await handler.cancel_run()
    release.set()
    # Waits for the worker thread itself to end, so its late outcome had every chance.
    await asyncio.get_running_loop().shutdown_default_executor()
    with pytest.raises(WorkflowCancelledByUser):
        await handler
    state = wf.state_at(handler.run_id)
    assert state.status == "cancelled"
    assert state.result is None
    kinds = [r.kind for r in wf.store.records(handler.run_id)]
    assert "step_finished" not in kinds
    assert kinds[-1] == "run_cancelled"


class MyStart(StartEvent):
    query: str


class MyStop(StopEvent):
    outcome: str


async def test_steps_may_take_a_start_event_subclass() -> None:
    """A custom start event with fields is the start class; run(**kwargs) builds it."""

    class Custom(Workflow):
        @step
        async def begin(self, ev: MyStart) -> MyStop:
            return MyStop(outcome=ev.query.upper())

    wf = Custom()
    assert wf.start_event_class is MyStart
    assert wf.stop_event_class is MyStop
    result = await wf.run(query="q")
    assert isinstance(result, MyStop)
    assert result.outcome == "Q"
    with pytest.raises(WorkflowRuntimeError, match="Failed creating a start event of type"):
        wf.run(wrong="x")
    with pytest.raises(WorkflowRuntimeError, match=r"no step of .*Custom takes .*StartEvent"):
        wf.run(start_event=StartEvent())  # refused at the call: it would only time out


class Base(Event):
    pass


class Derived(Base):
    pass


async def test_accept_event_subclasses_routes_subclasses() -> None:
    """``accept_event_subclasses=True`` (LlamaIndex's opt-in) is recorded and honoured."""

    class Subs(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> Derived:
            return Derived()

        @step(accept_event_subclasses=True)
        async def take(self, ev: Base) -> StopEvent:
            return StopEvent(result=type(ev).__name__)

    assert Subs.take._step_config.accept_event_subclasses is True  # type: ignore[attr-defined]
    assert await Subs().run() == "Derived"


async def test_events_go_by_their_exact_class_unless_a_step_opts_in() -> None:
    """As in LlamaIndex: a Derived event reaches the Derived step, not the Base one."""
    seen: list[str] = []

    class Exact(Workflow):
        @step
        async def begin(self, ctx: Context, ev: StartEvent) -> Base | Derived:
            ctx.send_event(Base())
            return Derived()

        @step
        async def base(self, ev: Base) -> None:
            seen.append("base")

        @step
        async def derived(self, ev: Derived) -> StopEvent:
            seen.append("derived")
            return StopEvent()

    await Exact().run()
    assert sorted(seen) == ["base", "derived"]  # one each: the Base step never got Derived

    class OnlyBase(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> Derived:
            return Derived()

        @step
        async def base(self, ev: Base) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="consumed but never produced: Base"):
        OnlyBase().validate()


async def test_free_function_steps_join_a_workflow_class() -> None:
    """``@step(workflow=Cls)`` adds a function as a step (``Cls.add_step``), with checks."""

    class Host(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> Middle:
            return Middle(n=1)

    @step(workflow=Host)
    async def finish(ev: Middle) -> StopEvent:
        return StopEvent(result=ev.n + 1)

    assert Host._step_functions == {"finish": finish}
    config = finish._step_config  # type: ignore[attr-defined]
    assert isinstance(config, StepConfig)
    assert config.accepted_events == [Middle]
    assert config.event_name == "ev"
    assert config.return_types == [StopEvent]
    assert await Host().run() == 2

    with pytest.raises(WorkflowValidationError, match="A step finish is already part of"):
        Host.add_step(finish)

    def plain(ev: Middle) -> None:
        return None

    with pytest.raises(WorkflowValidationError, match="missing the `@step` decorator"):
        Host.add_step(plain)

    with pytest.raises(WorkflowValidationError, match="please pass a workflow class"):

        @step
        def orphan(ev: Middle) -> None:
            return None

    with pytest.raises(WorkflowValidationError, match="num_workers must be an integer greater"):
        step(workflow=Host, num_workers=0)

    class Other(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

    def with_self(self, ev: Middle) -> None:  # type: ignore[no-untyped-def]
        return None

    # An unannotated first ``self`` of a function is not its event parameter (LlamaIndex's).
    assert step(workflow=Other)(with_self)._step_config.event_name == "ev"  # type: ignore[attr-defined]


async def test_events_defined_in_a_function_resolve_under_postponed_annotations() -> None:
    """This module has ``from __future__ import annotations``: local classes still resolve."""

    class LocalEvent(Event):
        text: str

    class LocalStop(StopEvent):
        pass

    class Local(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> LocalEvent:
            return LocalEvent(text="hi")

        @step
        async def end(self, ev: LocalEvent) -> LocalStop:
            return LocalStop(result=ev.text)

    assert Local.end._step_config.return_types == [LocalStop]  # type: ignore[attr-defined]
    result = await Local().run()
    assert isinstance(result, LocalStop)
    assert result.result == "hi"


def test_a_name_defined_nowhere_is_reported_when_the_workflow_is_built() -> None:
    """An annotation naming nothing fails with LlamaIndex's message, naming the name."""

    class Broken(Workflow):
        @step
        async def begin(self, ev: StartEvent) -> Missing:  # type: ignore[name-defined]  # noqa: F821
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match=r"Failed to resolve type annotat.*Missing"):
        Broken()


# ---------------------------------------------------------------- validation


def test_validation_checks_and_their_messages() -> None:
    """LlamaIndex's checks, with its messages (which name the workflow)."""

    class NoStop(Workflow):
        @step
        async def a(self, ev: StartEvent) -> None:
            return None

    with pytest.raises(
        WorkflowConfigurationError,
        match=r"At least one Event of type StopEvent must be returned by any step\. "
        r"\(Workflow 'NoStop' has no @step that returns StopEvent\.\)",
    ):
        NoStop()

    class TwoStarts(Workflow):
        @step
        async def a(self, ev: MyStart) -> None:
            return None

        @step
        async def b(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowConfigurationError, match="Only one type of StartEvent is allowed"):
        TwoStarts()

    class TakesStop(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

        @step
        async def bad(self, ev: StopEvent) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="Step 'bad' cannot accept StopEvent"):
        TakesStop().validate()

    class Leak(Workflow):
        @step
        async def a(self, ev: StartEvent) -> Middle | StopEvent:
            return StopEvent()

    with pytest.raises(
        WorkflowValidationError,
        match="The following events are produced but never consumed: Middle",
    ):
        Leak().validate()


class Island(Event):
    pass


class LoopA(Event):
    pass


class LoopB(Event):
    pass


def test_graph_checks_and_skipping_them() -> None:
    """Unreachable and dead-end steps fail the graph check (at the first run) unless the check
    is skipped."""

    class WithIsland(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            return StopEvent()

        @step
        async def island(self, ev: Island) -> Island | StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match=r"\[reachability\] Unreachable steps: isl"):
        WithIsland().validate()
    WithIsland(skip_graph_checks=["reachability"]).validate()

    class DeadEnd(Workflow):
        @step
        async def a(self, ev: StartEvent) -> LoopA | StopEvent:
            return StopEvent()

        @step
        async def b(self, ev: LoopA) -> LoopB:
            return LoopB()

        @step(skip_graph_checks=["dead_end"])
        async def c(self, ev: LoopB) -> LoopA:
            return LoopA()

    with pytest.raises(WorkflowValidationError, match=r"\[dead_end\] Dead-end steps: b\n"):
        DeadEnd().validate()
    DeadEnd(skip_graph_checks=["dead_end"]).validate()
    with pytest.raises(WorkflowValidationError, match="Unknown graph check names: nope"):
        DeadEnd(skip_graph_checks=["nope"])


def test_disable_validation_reads_no_steps() -> None:
    """``disable_validation=True`` skips the checks: ``_validate`` never looks at the steps."""

    class NoStop(Workflow):
        @step
        async def a(self, ev: StartEvent) -> None:
            return None

    wf = NoStop(disable_validation=True)
    calls: list[int] = []

    def counted() -> dict[str, Any]:
        calls.append(1)
        return {}

    wf._get_steps = counted  # type: ignore[method-assign]
    assert wf._validate() is False
    assert calls == []


# ---------------------------------------------------------------- workflow options


class Named(Workflow):
    @step
    async def a(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result=ev.get("n"))


def test_workflow_name() -> None:
    """``workflow_name`` is the one given, else ``module.QualName``."""
    assert Named().workflow_name == "tests.test_llama_api.Named"
    assert Named(workflow_name="mine").workflow_name == "mine"


async def test_num_concurrent_runs_limits_runs_of_an_instance() -> None:
    """With ``num_concurrent_runs=1`` runs of one instance execute one after another."""

    active: list[int] = [0]
    peak: list[int] = [0]

    class Counted(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            for _ in range(5):
                await asyncio.sleep(0)
            active[0] -= 1
            return StopEvent(result=ev.n)

    wf = Counted(num_concurrent_runs=1)
    results = await asyncio.gather(*(wf.run(n=i) for i in range(4)))
    assert results == [0, 1, 2, 3]
    assert peak[0] == 1
    peak[0] = 0
    results = await asyncio.gather(*(Counted().run(n=i) for i in range(4)))
    assert peak[0] > 1


async def test_get_step_context_from_code_the_step_calls() -> None:
    """``Context.get_step_context()`` finds the running step's context; outside it raises."""

    def helper() -> str:
        return Context.get_step_context().run_id

    class UsesHelper(Workflow):
        @step
        async def a(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=helper())

    handler = UsesHelper().run()
    assert await handler == handler.run_id
    with pytest.raises(WorkflowRuntimeError, match="only be called from within a step"):
        helper()


class BaseState(BaseModel):
    a: int = 0


class MoreState(BaseState):
    b: int = 0


class OtherState(BaseModel):
    c: int = 0


async def test_context_state_type_is_the_most_derived_model() -> None:
    """Steps typed ``Context[Base]`` and ``Context[Derived]`` share the derived model."""

    class Typed(Workflow):
        @step
        async def a(self, ctx: Context[BaseState], ev: StartEvent) -> Middle:
            async with ctx.store.edit_state() as state:
                state.a = 1
            return Middle(n=0)

        @step
        async def b(self, ctx: Context[MoreState], ev: Middle) -> StopEvent:
            state = await ctx.store.get_state()
            return StopEvent(result=(type(state).__name__, state.a, state.b))

    assert await Typed().run() == ("MoreState", 1, 0)

    class Unrelated(Workflow):
        @step
        async def a(self, ctx: Context[BaseState], ev: StartEvent) -> Middle:
            return Middle(n=0)

        @step
        async def b(self, ctx: Context[OtherState], ev: Middle) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match="not in one inheritance chain"):
        Unrelated()


async def test_untyped_edit_state_gives_attribute_access() -> None:
    """Without a state model, ``edit_state()`` yields a dict whose keys are attributes."""

    class Untyped(Workflow):
        @step
        async def a(self, ctx: Context, ev: StartEvent) -> Middle:
            async with ctx.store.edit_state() as state:
                state.count = 1
                state["other"] = 2
            return Middle(n=0)

        @step
        async def b(self, ctx: Context, ev: Middle) -> StopEvent:
            async with ctx.store.edit_state() as state:
                state.count += 1
                del state._data["other"]
            return StopEvent(result=await ctx.store.get_state())

    assert await Untyped().run() == {"count": 2}


async def test_test_runner_collects_what_a_run_streams() -> None:
    """``WorkflowTestRunner`` counts the streamed classes and returns result and context."""

    class Streams(Workflow):
        @step
        async def a(self, ctx: Context, ev: StartEvent) -> StopEvent:
            ctx.write_event_to_stream(Middle(n=1))
            await ctx.store.set("k", "v")
            return StopEvent(result="done")

    from workflow.events import StepStateChanged

    got = await WorkflowTestRunner(Streams()).run()
    assert got.result == "done"
    assert got.event_types == {StepStateChanged: 2, Middle: 1, StopEvent: 1}
    assert await got.ctx.store.get("k") == "v"
    quiet = await WorkflowTestRunner(Streams()).run(
        expose_internal=False, exclude_events=[StopEvent]
    )
    assert [type(e) for e in quiet.collected] == [Middle]


# ---------------------------------------------------------------- humans


class AsksAB(Workflow):
    """Step ``a`` asks; step ``b`` takes the answer."""

    @step
    async def a(self, ev: StartEvent) -> InputRequiredEvent:
        return InputRequiredEvent(prefix="?")

    @step
    async def b(self, ev: HumanResponseEvent) -> StopEvent:
        return StopEvent(result=ev.response)


async def test_send_event_to_a_step_that_does_not_exist() -> None:
    """``handler.send_event(ev, step=...)`` names a step the workflow lacks as an error."""

    handler = AsksAB().run()
    with pytest.raises(WorkflowStepDoesNotExistError, match="Step nope does not exist"):
        await handler.send_event(HumanResponseEvent(response="x"), step="nope")
    await handler.send_event(HumanResponseEvent(response="x"), step="b")
    assert await handler == "x"


class Parcel(Event):
    pass


class SubParcel(Parcel):
    pass


class SendsTo(Workflow):
    """Its first step sends one event to the step named in the start event (or says why
    it could not); ``exact`` takes only :class:`Parcel`, ``wide`` its subclasses too."""

    @step
    async def first(self, ctx: Context, ev: StartEvent) -> Parcel | StopEvent | None:
        event = SubParcel() if ev.get("derived") else (Event() if ev.get("plain") else Parcel())
        try:
            ctx.send_event(event, step=ev.to)
        except WorkflowRuntimeError as exc:
            return StopEvent(result=f"{type(exc).__name__}: {exc}")
        return None

    @step
    async def exact(self, ev: Parcel) -> StopEvent:
        return StopEvent(result=f"exact took {type(ev).__name__}")

    @step(accept_event_subclasses=True)
    async def wide(self, ev: Parcel) -> StopEvent:
        return StopEvent(result=f"wide took {type(ev).__name__}")


async def test_send_event_to_a_step_is_checked_against_what_the_step_takes() -> None:
    """As in LlamaIndex, ``ctx.send_event(ev, step=...)`` refuses a step that would not take
    the event (it ran the step with an event its signature does not name) and one that does
    not exist, each with LlamaIndex's words; a step that takes the event gets it."""
    wf = SendsTo()
    assert await wf.run(to="exact") == "exact took Parcel"
    assert await wf.run(to="exact", plain=True) == (
        f"WorkflowRuntimeError: Step exact does not accept event of type {Event!r}"
    )
    assert await wf.run(to="exact", derived=True) == (
        f"WorkflowRuntimeError: Step exact does not accept event of type {SubParcel!r}"
    )
    assert await wf.run(to="wide", derived=True) == "wide took SubParcel"
    assert await wf.run(to="nope") == "WorkflowStepDoesNotExistError: Step nope does not exist"


async def test_send_event_from_outside_to_a_step_that_would_not_take_it() -> None:
    """From outside a step (``handler.ctx.send_event``, ``handler.send_event``) the step
    named is checked the same way, and the run goes on unharmed."""

    handler = AsksAB().run()
    assert handler.ctx is not None
    with pytest.raises(WorkflowRuntimeError, match="Step a does not accept event of type"):
        handler.ctx.send_event(HumanResponseEvent(response="x"), step="a")
    with pytest.raises(WorkflowRuntimeError, match="Step a does not accept event of type"):
        await handler.send_event(HumanResponseEvent(response="x"), step="a")
    with pytest.raises(WorkflowStepDoesNotExistError, match="Step nope does not exist"):
        handler.ctx.send_event(HumanResponseEvent(response="x"), step="nope")
    handler.ctx.send_event(HumanResponseEvent(response="y"), step="b")
    assert await handler == "y"


class Tiny(Workflow):
    @step
    async def only(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="done")


@pytest.mark.parametrize("where", ["memory", "file"])
async def test_a_finished_workflow_is_freed_at_once(where: str, tmp_path: Path) -> None:
    """As LlamaIndex's own test has it: workflows run to the end and dropped are gone after
    a collection and a few loop ticks (a timer of the run's log kept each alive for up to
    its lazy-flush delay)."""
    refs: list[weakref.ReferenceType[Workflow]] = []
    for i in range(10):
        wf = Tiny() if where == "memory" else Tiny(store=tmp_path / f"{i}.db")
        refs.append(weakref.ref(wf))
        assert await WorkflowTestRunner(wf).run() is not None
        del wf
    for _ in range(3):
        gc.collect()
        await asyncio.sleep(0)
    assert [r for r in refs if r() is not None] == []


class EarlyFlow(Workflow):
    """Names a class this module defines only further down."""

    @step
    async def a(self, ev: StartEvent) -> LaterStop:
        return LaterStop()


class LaterStop(StopEvent):
    pass


def test_a_class_defined_after_the_workflow_resolves_when_it_is_built() -> None:
    """Unlike LlamaIndex (which fails at decoration), a later class is resolved when built."""
    assert not hasattr(EarlyFlow.a, "_step_config")  # not resolvable at decoration time
    assert EarlyFlow().stop_event_class is LaterStop


def test_the_readme_lists_every_llama_name_and_what_is_out_of_scope() -> None:
    """The README's "Coming from LlamaIndex" table names each LlamaIndex name we provide."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Coming from LlamaIndex", 1)[1].split("\n## ", 1)[0]
    table = section.split("### Every LlamaIndex name, and ours", 1)[1].split("\n### ", 1)[0]
    retry = [
        n
        for n in LLAMA_NAMES["workflow.retry_policy"]
        if n.split("_")[0] not in ("retry", "stop", "wait")
    ]
    named = [n for m, ns in LLAMA_NAMES.items() if m != "workflow.retry_policy" for n in ns]
    missing = [n for n in named + retry if f"{n}`" not in table and f"{n}," not in table]
    assert missing == []
    for prefix in ("retry_", "stop_", "wait_"):
        assert f"`{prefix}*`" in table
    for module in ("server", "client", "plugins", "runtime", "representation", "protocol"):
        assert f"`{module}`" in section
    assert "### Deliberate differences, and why" in section
