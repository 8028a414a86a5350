"""``WorkflowCheckpointer`` as llama-index-core 0.12 has it (and the checkpointing PR spells
it), as a view over the log; ``Checkpoint`` with LlamaIndex's fields, JSON-native."""

from __future__ import annotations

import json
from typing import Any

import pytest

import workflow._lifecycle as lifecycle
from eventstore import EventStore
from workflow import (
    Checkpoint,
    Context,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowCheckpointer,
    WorkflowRuntimeError,
    WorkflowValidationError,
    step,
)
from workflow._read import fold_run
from workflow.checkpointer import WorkflowCheckpointer as FromModule
from workflow.context.serializers import BaseSerializer


class Middle(Event):
    content: str


class Later(Event):
    content: str


class Three(Workflow):
    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Middle:
        await ctx.store.set("seen", ["start"])
        return Middle(content="foo")

    @step
    async def middle(self, ctx: Context, ev: Middle) -> Later:
        await ctx.store.set("seen", [*await ctx.store.get("seen"), "middle"])
        return Later(content=ev.content + " bar")

    @step
    async def finish(self, ctx: Context, ev: Later) -> StopEvent:
        await ctx.store.set("seen", [*await ctx.store.get("seen"), "finish"])
        return StopEvent(result=ev.content + " baz")


def started(store: EventStore, run_id: str) -> list[str | None]:
    return [r.step for r in store.records(run_id, kinds=["step_started"])]


async def test_one_checkpoint_per_finished_step_with_llamaindex_fields(store: EventStore) -> None:
    """Each finished step is a checkpoint with its step, input and output events (of their
    exact classes); the PR's sample runs from one and only the steps after it run."""
    assert FromModule is WorkflowCheckpointer
    ckptr = WorkflowCheckpointer(workflow=Three(store=store))
    handler = ckptr.run()
    assert await handler == "foo bar baz"
    (run_id, cps), *others = ckptr.checkpoints.items()
    assert not others
    assert run_id == handler.run_id
    assert [c.last_completed_step for c in cps] == ["start", "middle", "finish"]
    assert [type(c.input_event) for c in cps] == [StartEvent, Middle, Later]
    assert [type(c.output_event) for c in cps] == [Middle, Later, StopEvent]
    assert cps[1].input_event == Middle(content="foo")
    assert len({c.id_ for c in cps}) == 3
    cp = ckptr.filter_checkpoints(output_event=Middle)[0]  # the PR's spelling
    assert cp == cps[0]
    forked = ckptr.run_from(checkpoint=cp)
    assert await forked == "foo bar baz"
    assert started(store, forked.run_id) == ["middle", "finish"]
    assert list(ckptr.checkpoints) == [run_id, forked.run_id]
    assert [c.last_completed_step for c in ckptr.checkpoints[forked.run_id]] == [
        "middle",
        "finish",
    ]


async def test_filter_checkpoints_takes_0_12_s_keywords(store: EventStore) -> None:
    """last_completed_step, input_event_type, output_event_type and run_id filter (an event
    type matches its exact class); no filter at all is an error, as in LlamaIndex."""
    ckptr = WorkflowCheckpointer(workflow=Three(store=store))
    first = ckptr.run()
    await first
    second = ckptr.run()
    await second
    assert len(ckptr.filter_checkpoints(last_completed_step="middle")) == 2
    assert len(ckptr.filter_checkpoints(run_id=first.run_id)) == 3
    (cp,) = ckptr.filter_checkpoints(run_id=second.run_id, input_event_type=Later)
    assert cp.last_completed_step == "finish"
    assert ckptr.filter_checkpoints(input_event=Later, run_id=second.run_id) == [cp]
    assert len(ckptr.filter_checkpoints(output_event_type=StopEvent)) == 2
    assert ckptr.filter_checkpoints(output_event_type=Event) == []  # exact classes only
    with pytest.raises(ValueError, match="filter"):
        ckptr.filter_checkpoints()


async def test_disabled_steps_and_enable_disable(store: EventStore) -> None:
    """disabled_steps= and disable_checkpoint leave a step's checkpoints out of the view;
    enable_checkpoint brings them back (the log has them all); an unknown step is named."""
    ckptr = WorkflowCheckpointer(workflow=Three(store=store), disabled_steps=["middle"])
    handler = ckptr.run()
    await handler
    steps = [c.last_completed_step for c in ckptr.checkpoints[handler.run_id]]
    assert steps == ["start", "finish"]
    ckptr.disable_checkpoint(step="start")
    assert [c.last_completed_step for c in ckptr.checkpoints[handler.run_id]] == ["finish"]
    ckptr.enable_checkpoint(step="middle")
    steps = [c.last_completed_step for c in ckptr.checkpoints[handler.run_id]]
    assert steps == ["middle", "finish"]
    with pytest.raises(WorkflowValidationError, match="'nope'"):
        ckptr.enable_checkpoint(step="nope")
    with pytest.raises(WorkflowValidationError, match="'nope'"):
        WorkflowCheckpointer(workflow=Three(store=store), disabled_steps=["nope"])


class Tagged(BaseSerializer):
    def serialize(self, value: Any) -> str:
        return "T" + json.dumps(value)

    def deserialize(self, value: str) -> Any:
        return json.loads(value[1:])


async def test_ctx_state_is_read_only_when_asked(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing checkpoints reads no state; ctx_state folds the run at the checkpoint, with
    the checkpointer's serializer, and restores as a context that forks there."""
    folds: list[tuple[str, int | None]] = []
    real = fold_run

    def counting(es: EventStore, run_id: str, seq: int | None = None, **kw: Any) -> Any:
        folds.append((run_id, seq))
        return real(es, run_id, seq, **kw)

    monkeypatch.setattr(lifecycle, "fold_run", counting)
    wf = Three(store=store)
    ckptr = WorkflowCheckpointer(workflow=wf, checkpoint_serializer=Tagged())
    handler = ckptr.run()
    await handler
    cps = ckptr.checkpoints[handler.run_id]
    assert folds == []
    assert "ctx_state" not in cps[0].model_dump()
    state = cps[0].ctx_state
    assert folds == [(handler.run_id, cps[0].seq)]
    assert state["seq"] == cps[0].seq
    assert state["state"] == {"seen": 'T["start"]'}
    plain = wf.checkpoints(handler.run_id)[-1]
    assert plain.last_completed_step == "finish"
    restored = Context.from_dict(wf, cps[0].ctx_state, serializer=Tagged())
    forked = wf.run(ctx=restored)
    assert await forked == "foo bar baz"
    assert started(store, forked.run_id) == ["middle", "finish"]
    assert wf.state_at(forked.run_id).context["seen"] == ["start", "middle", "finish"]


async def test_a_checkpoint_through_json_is_lossless(store: EventStore) -> None:
    """model_dump is JSON-native; model_validate of its JSON gives an equal checkpoint, its
    events of their exact classes, that runs from where it was taken."""
    ckptr = WorkflowCheckpointer(workflow=Three(store=store))
    handler = ckptr.run()
    await handler
    cp = ckptr.checkpoints[handler.run_id][1]
    text = json.dumps(cp.model_dump())
    back = Checkpoint.model_validate(json.loads(text))
    assert back == cp
    assert hash(back) == hash(cp)
    assert type(back.input_event) is Middle
    assert type(back.output_event) is Later
    assert back.output_event == Later(content="foo bar")
    assert back.id_ == cp.id_ == f"{cp.run_id}:{cp.seq}"
    with pytest.raises(WorkflowRuntimeError, match="state_at"):
        _ = back.ctx_state
    forked = ckptr.run_from(checkpoint=back)
    assert await forked == "foo bar baz"
    assert started(store, forked.run_id) == ["finish"]
    old = Checkpoint.model_validate(
        {"run_id": cp.run_id, "seq": cp.seq, "kind": cp.kind, "step": cp.step}
    )
    assert old.id_ == cp.id_  # a checkpoint stored before these fields still validates
    assert old.last_completed_step is None


async def test_filter_checkpoints_by_an_event_instance(store: EventStore) -> None:
    """An event instance as the filter matches the checkpoints whose event equals it (its
    class and fields); one equal in class only, or not an event at all, does not."""
    ckptr = WorkflowCheckpointer(workflow=Three(store=store))
    await ckptr.run()
    await ckptr.run()
    by_instance = ckptr.filter_checkpoints(output_event=Middle(content="foo"))
    assert [c.last_completed_step for c in by_instance] == ["start", "start"]
    assert by_instance == ckptr.filter_checkpoints(output_event=Middle)
    by_input = ckptr.filter_checkpoints(input_event=Later(content="foo bar"))
    assert [c.last_completed_step for c in by_input] == ["finish", "finish"]
    assert ckptr.filter_checkpoints(output_event=Middle(content="other")) == []
    assert ckptr.filter_checkpoints(output_event_type=Later(content="foo bar")) != []
    with pytest.raises(TypeError, match="takes an Event class or an Event instance"):
        ckptr.filter_checkpoints(output_event="Middle")  # type: ignore[arg-type]
