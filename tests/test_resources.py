"""Resources: ``Annotated[T, Resource(factory)]`` and ``ResourceConfig`` given to steps.

LlamaIndex's behaviour (caching per workflow object, factories that take resources, JSON
configurations); what is ours is that resources never enter the log and a resume builds
them again, with the workflow object that resumes.
"""

# No ``from __future__ import annotations``: the steps' annotations name factories and files
# local to each test, evaluated where the step is defined (as LlamaIndex users write them).

import json
import threading
from itertools import count
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from workflow import (
    Context,
    Event,
    StartEvent,
    StopEvent,
    Workflow,
    WorkflowValidationError,
    step,
)
from workflow import _journal as J
from workflow._verify import verify
from workflow.resource import Resource, ResourceConfig, ResourceManager
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed


class Client:
    """Something a log cannot hold: a lock, like a connection or a file handle has."""

    made = count(1)

    def __init__(self) -> None:
        self.n = next(Client.made)
        self.lock = threading.Lock()
        self.calls = 0

    def call(self) -> int:
        self.calls += 1
        return self.n


def make_client() -> Client:
    return Client()


async def make_client_async() -> Client:
    return Client()


class Middle(Event):
    pass


class Settings(BaseModel):
    model: str
    temperature: float = 0.0


# ---------------------------------------------------------------------- injection


@pytest.mark.parametrize("factory", [make_client, make_client_async])
async def test_a_step_is_given_what_its_factory_builds(factory: Any) -> None:
    class Flow(Workflow):
        @step
        async def only(
            self, ev: StartEvent, client: Annotated[Client, Resource(factory)]
        ) -> StopEvent:
            return StopEvent(result=type(client).__name__)

    assert await Flow().run() == "Client"


async def test_a_cached_resource_is_one_per_workflow_object() -> None:
    class Flow(Workflow):
        @step
        async def first(
            self, ev: StartEvent, client: Annotated[Client, Resource(make_client)]
        ) -> Middle:
            client.call()
            return Middle()

        @step
        async def second(
            self, ev: Middle, client: Annotated[Client, Resource(make_client)]
        ) -> StopEvent:
            client.call()
            return StopEvent(result=(client.n, client.calls))

    wf = Flow()
    n, calls = await wf.run()
    assert calls == 2  # both steps had the same client
    assert await wf.run() == (n, 4)  # and so does the next run of the same object
    other, calls = await Flow().run()  # another object builds its own
    assert calls == 2
    assert other != n


async def test_an_uncached_resource_is_built_for_each_attempt() -> None:
    seen: list[int] = []

    class Flow(Workflow):
        @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(3)))
        async def flaky(
            self,
            ctx: Context,
            ev: StartEvent,
            client: Annotated[Client, Resource(make_client, cache=False)],
        ) -> StopEvent:
            seen.append(client.n)
            if ctx.retry_info().retry_number < 2:
                raise ConnectionError("try again")
            return StopEvent(result="ok")

    assert await Flow().run() == "ok"
    assert len(set(seen)) == 3


async def test_factories_take_resources_and_an_attempt_builds_each_once() -> None:
    def pair(
        a: Annotated[Client, Resource(make_client, cache=False)],
        b: Annotated[Client, Resource(make_client, cache=False)],
    ) -> tuple[int, int]:
        return (a.n, b.n)

    class Flow(Workflow):
        @step
        async def only(
            self,
            ev: StartEvent,
            both: Annotated[tuple[int, int], Resource(pair, cache=False)],
            one: Annotated[Client, Resource(make_client, cache=False)],
        ) -> StopEvent:
            return StopEvent(result=[*both, one.n])

    a, b, one = await Flow().run()
    assert a == b == one  # one value of an uncached resource within one attempt


# Quoted: each names the other, so the annotations are read when the resource is built.
def chicken(x: "Annotated[int, Resource(egg)]") -> int:
    return x


def egg(x: "Annotated[int, Resource(chicken)]") -> int:
    return x


async def test_a_circular_dependency_fails_the_attempt_naming_the_cycle() -> None:
    class Flow(Workflow):
        @step
        async def only(self, ev: StartEvent, v: Annotated[int, Resource(chicken)]) -> StopEvent:
            return StopEvent(result=v)

    with pytest.raises(
        ValueError, match="Circular resource dependency detected: chicken -> egg -> chicken"
    ):
        await Flow().run()


async def test_a_factory_that_raises_is_the_attempts_failure_and_is_retried() -> None:
    calls = count(1)

    def moody() -> str:
        if next(calls) == 1:
            raise ConnectionError("not yet")
        return "ready"

    class Flow(Workflow):
        @step(retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(2)))
        async def only(
            self, ev: StartEvent, v: Annotated[str, Resource(moody, cache=False)]
        ) -> StopEvent:
            return StopEvent(result=v)

    wf = Flow()
    assert await wf.run(run_id="m") == "ready"
    [failed] = [r for r in wf.store.records("m") if r.kind == J.STEP_FAILED]
    assert json.loads(failed.payload)["message"] == "not yet"


async def test_a_manager_given_to_the_workflow_supplies_cached_values() -> None:
    manager = ResourceManager()
    fake = Client()
    await manager.set(Resource(make_client).name, fake)

    class Flow(Workflow):
        @step
        async def only(
            self, ev: StartEvent, client: Annotated[Client, Resource(make_client)]
        ) -> StopEvent:
            return StopEvent(result=client is fake)

    assert await Flow(resource_manager=manager).run() is True
    assert manager.get_all() == {"make_client": fake}


# ---------------------------------------------------------------------- never an event


async def test_a_resource_parameter_is_never_taken_for_an_event() -> None:
    def a_middle() -> Middle:
        return Middle()

    class Flow(Workflow):
        @step
        async def start(
            self, ev: StartEvent, extra: Annotated[Middle, Resource(a_middle)]
        ) -> StopEvent:
            return StopEvent(result=type(extra).__name__)

    wf = Flow()
    spec = wf._graph.steps["start"]
    assert spec.accepted == (StartEvent,)
    assert spec.event_param == "ev"
    assert [r.name for r in spec.resources] == ["extra"]
    assert wf._graph.route(Middle) == ()  # nobody takes Middle: it is no step's input
    assert await wf.run() == "Middle"


def test_a_step_with_only_a_resource_still_needs_an_event() -> None:
    """Refused where @step reads the signature, as LlamaIndex does."""
    with pytest.raises(WorkflowValidationError, match="has no event parameter"):

        class Flow(Workflow):
            @step
            async def only(self, client: Annotated[Client, Resource(make_client)]) -> StopEvent:
                return StopEvent()


# ---------------------------------------------------------------------- configuration


def _config(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


async def test_a_configuration_is_read_from_json_and_validated(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"llm": {"main": {"model": "m1", "temperature": 0.5}}})

    def describe(
        s: Annotated[Settings, ResourceConfig(config_file=cfg, path_selector="llm.main")],
    ) -> str:
        return f"{s.model}@{s.temperature}"

    class Flow(Workflow):
        @step
        async def only(
            self,
            ev: StartEvent,
            settings: Annotated[
                Settings, ResourceConfig(config_file=cfg, path_selector="llm.main")
            ],
            described: Annotated[str, Resource(describe)],
        ) -> StopEvent:
            return StopEvent(result=[settings.model, described])

    assert await Flow().run() == ["m1", "m1@0.5"]
    rc = ResourceConfig(config_file=cfg, path_selector="llm.main")
    assert rc.name == f"{cfg}.llm.main"
    assert rc.config_file == str(tmp_path.resolve() / "settings.json")  # noqa: ASYNC240
    assert rc.cache is True


@pytest.mark.parametrize(
    ("data", "selector", "match"),
    [
        ({"llm": {}}, "llm.main", "has no JSON object at 'llm.main'"),
        ({"llm": {"main": 3}}, "llm.main", "has no JSON object at 'llm.main'"),
        ({"llm": {"main": {"temperature": 1}}}, "llm.main", "validation error for Settings"),
        ([1, 2], None, "holds list, not a JSON object"),
    ],
)
def test_a_configuration_that_does_not_fit_is_refused_when_the_workflow_is_built(
    tmp_path: Path, data: Any, selector: str | None, match: str
) -> None:
    cfg = _config(tmp_path, data)

    class Flow(Workflow):
        @step
        async def only(
            self,
            ev: StartEvent,
            s: Annotated[Settings, ResourceConfig(config_file=cfg, path_selector=selector)],
        ) -> StopEvent:
            return StopEvent()

    with pytest.raises(
        WorkflowValidationError,
        match=f"step 'only', parameter 's' \\(ResourceConfig\\(.*settings.json.*\\)\\): .*{match}",
    ):
        Flow().validate()


def test_a_missing_or_foreign_configuration_file_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")

    class Flow(Workflow):
        @step
        async def only(
            self, ev: StartEvent, s: Annotated[Settings, ResourceConfig(config_file=missing)]
        ) -> StopEvent:
            return StopEvent()

    with pytest.raises(WorkflowValidationError, match=r"no such file: .*nope\.json"):
        Flow().validate()
    with pytest.raises(ValueError, match="JSON files only"):
        ResourceConfig(config_file="settings.yaml")


# ---------------------------------------------------------------------- durability


class Durable(Workflow):
    """Fails until told otherwise; reports which client each attempt was given."""

    fail = True

    @step
    async def only(
        self, ctx: Context, ev: StartEvent, client: Annotated[Client, Resource(make_client)]
    ) -> StopEvent:
        await ctx.store.set("client", client.n)
        if type(self).fail:
            raise ConnectionError(f"client {client.n} failed")
        return StopEvent(result=client.n)


async def test_resources_never_enter_the_log_and_a_resume_builds_its_own(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = Durable(store=db)
    with pytest.raises(ConnectionError) as failed:
        await first.run(run_id="d")
    built_first = first.__workflow_parts__.resources.get_all()["make_client"].n
    assert str(failed.value) == f"client {built_first} failed"

    Durable.fail = False
    try:
        again = Durable(store=db)
        result = await again.resume("d")
    finally:
        Durable.fail = True
    built_again = again.__workflow_parts__.resources.get_all()["make_client"].n
    assert result == built_again != built_first
    # The log holds the values the steps wrote, never the resource objects themselves.
    texts = [r.payload for r in again.store.records("d")]
    assert not any("Client" in t or "lock" in t for t in texts)


def greeting() -> str:
    return "hello"


class Greets(Workflow):
    @step
    async def only(
        self, ev: StartEvent, word: Annotated[str, Resource(greeting, cache=False)]
    ) -> StopEvent:
        return StopEvent(result=f"{word} {ev.name}")


async def test_verify_reexecutes_a_step_with_the_resources_of_the_verifying_workflow(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    assert await Greets(store=db).run(run_id="v", name="ada") == "hello ada"
    report = verify(Greets(store=db), ["v"], reexecute=True)
    assert report.attempts_reexecuted == 1
    assert report.problems == []
