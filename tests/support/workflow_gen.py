"""Deterministic workflows as data: Hypothesis strategies for plans, and plans made real.

A :class:`Plan` describes a workflow: a ``begin`` step (``StartEvent``), a pipeline of
stages -- :class:`Chain` (one step), :class:`Loop` (a step that sends itself an event until a
counter in the context says stop) and :class:`FanOut` (a step that sends ``width`` events
with ``ctx.send_event``, a worker step with ``num_workers``, and a step that gathers them
with ``ctx.collect_events``) -- and an ``end`` step (``StopEvent``). Every step runs a list
of ops against the context (plain get/set, ``edit_state``, a ledger of what ran, patches
of a growing list, deletes, stream writes) and may fail on chosen attempts.

:func:`build` renders a plan as the source of a module (event classes with real
annotations and a ``Generated`` workflow whose steps call :class:`Runtime`), writes it to a
temporary directory and imports it under a name derived from its source, so a subprocess
can import the very same classes (:func:`module_file`). :func:`expected` runs the same ops
on a dict, sequentially: the outcome every run, resume and fork of the plan must reach.

Why the outcome is deterministic although workers run concurrently: ops of concurrent
steps (work, gather) commute (counter increments, per-input ledger entries), and only
steps that run alone (begin, chain, loop, split, end) read values into the events they
emit or overwrite, append to or delete keys. A failure is decided from the attempt number
the engine gives (kept across resumes and forks): a transient ``Fail(upto)`` always
leaves a retry to spare, and ``Fail(ALWAYS)`` fails every attempt, so whether a run fails
and in which step is known from the plan.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import hashlib
import importlib.util
import shutil
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Final, Protocol

from hypothesis import strategies as st

from workflow import Context, Event, StopEvent, Workflow
from workflow._context import current_attempt

__all__ = [
    "ALWAYS",
    "LEDGER",
    "Add",
    "Chain",
    "Drop",
    "Edit",
    "Expected",
    "Fail",
    "FanOut",
    "Loop",
    "Mark",
    "Plan",
    "PlannedFailure",
    "Push",
    "Put",
    "Read",
    "Runtime",
    "StepPlan",
    "Stream",
    "Yield",
    "build",
    "expected",
    "load_module",
    "mix",
    "module_file",
    "plans",
    "replace_step",
    "source",
    "stages",
    "step_plans",
]

ALWAYS: Final = 99  # Fail(ALWAYS) fails every attempt
MOD: Final = 10_007  # values stay small
LEDGER: Final = "ledger"  # context key: "step@path" -> how often that input's effects landed
COUNTERS: Final = ("a", "b")  # int-valued keys: Add, Edit, Read, Put, Drop
LIST_KEY: Final = "l"  # a list that sequential steps append to (patches)


class _Brief:
    """A dataclass repr that leaves out fields at their default: shrunk plans read well."""

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
                continue
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints falsifying examples with this (the IPython protocol).
        printer.text(repr(self))


# ----------------------------------------------------------------------------- ops


@dataclass(frozen=True, repr=False)
class Add(_Brief):
    """``x = get(key, 0); [sleep(0)]; set(key, x + 1)``: a plain read-modify-write."""

    key: str
    gap: bool = False  # yield between the read and the write: concurrent workers conflict


@dataclass(frozen=True, repr=False)
class Edit(_Brief):
    """The same increment inside ``async with ctx.store.edit_state()``."""

    key: str


@dataclass(frozen=True, repr=False)
class Mark(_Brief):
    """``ledger["step@path"] += 1`` in one shared dict: evidence of exactly-once effects."""

    gap: bool = False


@dataclass(frozen=True, repr=False)
class Read(_Brief):
    """``v += get(key, 0)``: the value carried on depends on the context (sequential only)."""

    key: str


@dataclass(frozen=True, repr=False)
class Put(_Brief):
    """``set(key, v)`` (sequential only)."""

    key: str


@dataclass(frozen=True, repr=False)
class Push(_Brief):
    """``get(key, []).append(v)`` then ``set``: a growing list written as patches."""

    key: str = LIST_KEY


@dataclass(frozen=True, repr=False)
class Drop(_Brief):
    """``ctx.store.delete(key)`` (sequential only)."""

    key: str


@dataclass(frozen=True, repr=False)
class Stream(_Brief):
    """``ctx.write_event_to_stream(Note(step, path, v))``."""


@dataclass(frozen=True, repr=False)
class Yield(_Brief):
    """``await asyncio.sleep(0)``: lets concurrent attempts interleave."""


@dataclass(frozen=True, repr=False)
class Fail(_Brief):
    """Raises :class:`PlannedFailure` on attempts ``1..upto`` (every attempt for ALWAYS)."""

    upto: int = ALWAYS


Op = Add | Edit | Mark | Read | Put | Push | Drop | Stream | Yield | Fail


class PlannedFailure(Exception):
    """What a :class:`Fail` op raises; the message names the step only (not the input)."""


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True, repr=False)
class StepPlan(_Brief):
    """One step: its ops in order, its workers and its retry budget (None: no policy)."""

    ops: tuple[Op, ...] = ()
    workers: int = 1
    retries: int | None = None  # retry_policy(wait=wait_none(), stop=stop_after_attempt(retries))


@dataclass(frozen=True, repr=False)
class Chain(_Brief):
    """One step: ``E[i] -> E[i+1]``."""

    body: StepPlan = StepPlan()


@dataclass(frozen=True, repr=False)
class Loop(_Brief):
    """A step taking ``E[i] | L[i]`` that returns ``L[i]`` until it ran ``times`` times."""

    times: int = 2
    body: StepPlan = StepPlan()


@dataclass(frozen=True, repr=False)
class FanOut(_Brief):
    """``split`` sends ``width`` events, ``work`` handles each, ``gather`` collects them."""

    width: int = 2
    split: StepPlan = StepPlan()
    work: StepPlan = StepPlan()
    gather: StepPlan = StepPlan()


Stage = Chain | Loop | FanOut


@dataclass(frozen=True, repr=False)
class Plan(_Brief):
    """A whole workflow: ``begin``, the stages in order, ``end``; ``seed`` starts the value."""

    stages: tuple[Stage, ...] = ()
    begin: StepPlan = StepPlan()
    end: StepPlan = StepPlan()
    seed: int = 0

    def steps(self) -> dict[str, StepPlan]:
        """Every step of the plan by name, in pipeline order."""
        out = {"begin": self.begin}
        for i, stage in enumerate(self.stages):
            if isinstance(stage, Chain):
                out[f"s{i}_chain"] = stage.body
            elif isinstance(stage, Loop):
                out[f"s{i}_loop"] = stage.body
            else:
                out[f"s{i}_split"] = stage.split
                out[f"s{i}_work"] = stage.work
                out[f"s{i}_gather"] = stage.gather
        out["end"] = self.end
        return out

    def failing_step(self) -> str | None:
        """The step where a run of this plan fails (the first that always fails), if any."""
        for name, sp in self.steps().items():
            if any(isinstance(op, Fail) and op.upto >= ALWAYS for op in sp.ops):
                return name
        return None


# ----------------------------------------------------------------------------- strategies


def _ops(*, sequential: bool, retries: int | None) -> st.SearchStrategy[tuple[Op, ...]]:
    keys = st.sampled_from(COUNTERS)
    # Workers race best when they yield between a read and its write (conflicts follow).
    gaps = st.booleans() if sequential else st.sampled_from([True, False])
    ops: list[st.SearchStrategy[Op]] = [
        st.builds(Mark, gap=gaps),
        st.builds(Add, key=keys, gap=gaps),
        st.just(Stream()),
        st.builds(Edit, key=keys),
        st.just(Yield()),
    ]
    if sequential:
        ops += [
            st.builds(Read, key=keys),
            st.builds(Put, key=keys),
            st.just(Push()),
            st.builds(Drop, key=keys),
        ]
    if retries is not None:
        # A transient failure always leaves a retry to spare: the run goes on.
        ops.append(st.builds(Fail, upto=st.integers(1, retries - 1)))
    return st.lists(st.one_of(ops), max_size=4).map(tuple)


@st.composite
def step_plans(draw: st.DrawFn, *, sequential: bool = True, max_workers: int = 4) -> StepPlan:
    """A step's plan; ``sequential=False`` draws only ops that commute (for workers)."""
    retries = draw(st.none() | st.integers(2, 3))
    ops = draw(_ops(sequential=sequential, retries=retries))
    if sequential:
        workers = draw(st.integers(1, max_workers))
    else:
        # Concurrent steps lean to several workers, and always leave a mark in the ledger
        # (one key that every worker reads and writes: exactly-once under conflicts).
        workers = draw(st.sampled_from([max_workers, 1, *range(2, max_workers)]))
        if not any(isinstance(op, Mark) for op in ops):
            ops = (Mark(gap=draw(st.sampled_from([True, False]))), *ops)
    return StepPlan(ops=ops, workers=workers, retries=retries)


def stages() -> st.SearchStrategy[Stage]:
    """One stage: a chain, a loop or (half the time) a fan-out; shrinks towards a chain."""
    fan_out = st.builds(
        FanOut,
        width=st.sampled_from([3, 1, 2, 4]),
        split=step_plans(),
        work=step_plans(sequential=False),
        gather=step_plans(sequential=False, max_workers=3),
    )
    return st.one_of(
        st.builds(Chain, body=step_plans()),
        st.builds(Loop, times=st.integers(1, 3), body=step_plans()),
        fan_out,
        fan_out,
    )


def replace_step(plan: Plan, name: str, sp: StepPlan) -> Plan:
    """The plan with step ``name`` replaced by ``sp``."""
    if name == "begin":
        return dataclasses.replace(plan, begin=sp)
    if name == "end":
        return dataclasses.replace(plan, end=sp)
    index, _, role = name[1:].partition("_")
    i = int(index)
    stage = plan.stages[i]
    field_name = {"chain": "body", "loop": "body"}.get(role, role)
    new = dataclasses.replace(stage, **{field_name: sp})  # type: ignore[arg-type]
    return dataclasses.replace(plan, stages=(*plan.stages[:i], new, *plan.stages[i + 1 :]))


@st.composite
def plans(draw: st.DrawFn, *, max_stages: int = 3, failures: bool = True) -> Plan:
    """Whole plans; about one in four has a step that always fails (none if not ``failures``)."""
    plan = Plan(
        stages=tuple(draw(st.lists(stages(), min_size=1, max_size=max_stages))),
        begin=draw(step_plans()),
        end=draw(step_plans()),
        seed=draw(st.integers(0, 100)),
    )
    if failures and draw(st.booleans()) and draw(st.booleans()):
        names = list(plan.steps())
        name = names[draw(st.integers(0, len(names) - 1))]
        sp = plan.steps()[name]
        at = draw(st.integers(0, len(sp.ops)))
        ops = (*sp.ops[:at], Fail(), *sp.ops[at:])
        plan = replace_step(plan, name, dataclasses.replace(sp, ops=ops))
    return plan


# ----------------------------------------------------------------------------- running ops


class _Store(Protocol):
    async def get(self, path: str, default: Any = ...) -> Any: ...
    async def set(self, path: str, value: Any) -> None: ...
    async def delete(self, path: str) -> None: ...
    def edit_state(self) -> Any: ...


async def apply_ops(
    store: _Store,
    ops: tuple[Op, ...],
    *,
    step: str,
    v: int,
    path: str,
    attempt: int | None,
    stream: Callable[[str, str, int], None],
) -> int:
    """Runs a step's ops on a context store; returns the value it carries on.

    ``attempt`` None is the model: transient failures are skipped (a retry follows).
    """
    for op in ops:
        if isinstance(op, Add):
            x = await store.get(op.key, 0)
            if op.gap:
                await asyncio.sleep(0)
            await store.set(op.key, x + 1)
        elif isinstance(op, Edit):
            async with store.edit_state() as state:
                state[op.key] = state.get(op.key, 0) + 1
        elif isinstance(op, Mark):
            ledger = await store.get(LEDGER, {})
            if op.gap:
                await asyncio.sleep(0)
            entry = f"{step}@{path}"
            ledger[entry] = ledger.get(entry, 0) + 1
            await store.set(LEDGER, ledger)
        elif isinstance(op, Read):
            v = (v + await store.get(op.key, 0)) % MOD
        elif isinstance(op, Put):
            await store.set(op.key, v)
        elif isinstance(op, Push):
            items = await store.get(op.key, [])
            items.append(v)
            await store.set(op.key, items)
        elif isinstance(op, Drop):
            await store.delete(op.key)
        elif isinstance(op, Stream):
            stream(step, path, v)
        elif isinstance(op, Yield):
            await asyncio.sleep(0)
        elif op.upto >= ALWAYS or (attempt is not None and attempt <= op.upto):
            msg = f"planned failure in {step}"
            raise PlannedFailure(msg)
    return v


def mix(v: int, salt: int) -> int:
    """What a step does to the value it passes on."""
    return (v * 31 + salt) % MOD


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


class Runtime:
    """The behaviour of a generated workflow's steps, read from its plan.

    ``pace`` (seconds) makes every step sleep first: a subprocess that is to be killed at a
    random moment sets it so that the kill lands in the middle of a run.
    """

    pace: ClassVar[float] = 0.0

    def __init__(self, plan: Plan, ns: dict[str, Any]) -> None:
        self.plan = plan
        self.ns = ns

    async def _run(self, ctx: Context[Any], name: str, sp: StepPlan, v: int, path: str) -> int:
        if self.pace:
            await asyncio.sleep(self.pace)
        att = current_attempt.get()
        note = self.ns["Note"]

        def stream(step: str, p: str, value: int) -> None:
            ctx.write_event_to_stream(note(step=step, path=p, v=value))

        return await apply_ops(
            ctx.store,
            sp.ops,
            step=name,
            v=v,
            path=path,
            attempt=1 if att is None else att.attempt,
            stream=stream,
        )

    def _ev(self, name: str, v: int, path: str) -> Event:
        return self.ns[name](v=v, path=path)  # type: ignore[no-any-return]

    async def begin(self, ctx: Context[Any], ev: Any) -> Event:
        v = await self._run(ctx, "begin", self.plan.begin, int(ev.get("seed", 0)), "s")
        return self._ev("E0", v, "s")

    async def chain(self, ctx: Context[Any], ev: Any, i: int) -> Event:
        stage = self.plan.stages[i]
        assert isinstance(stage, Chain)
        v = await self._run(ctx, f"s{i}_chain", stage.body, ev.v, ev.path)
        return self._ev(f"E{i + 1}", mix(v, i), f"{ev.path}/c")

    async def loop(self, ctx: Context[Any], ev: Any, i: int) -> Event:
        stage = self.plan.stages[i]
        assert isinstance(stage, Loop)
        v = await self._run(ctx, f"s{i}_loop", stage.body, ev.v, ev.path)
        n = await ctx.store.get(f"loop{i}", 0) + 1
        await ctx.store.set(f"loop{i}", n)
        if n < stage.times:
            return self._ev(f"L{i}", mix(v, n), f"{ev.path}/L{n}")
        return self._ev(f"E{i + 1}", mix(v, n), f"{ev.path}/x")

    async def split(self, ctx: Context[Any], ev: Any, i: int) -> None:
        stage = self.plan.stages[i]
        assert isinstance(stage, FanOut)
        v = await self._run(ctx, f"s{i}_split", stage.split, ev.v, ev.path)
        for j in range(stage.width):
            ctx.send_event(self._ev(f"W{i}", (v + j) % MOD, f"{ev.path}/{j}"))

    async def work(self, ctx: Context[Any], ev: Any, i: int) -> Event:
        stage = self.plan.stages[i]
        assert isinstance(stage, FanOut)
        v = await self._run(ctx, f"s{i}_work", stage.work, ev.v, ev.path)
        return self._ev(f"D{i}", mix(v, 1), ev.path)

    async def gather(self, ctx: Context[Any], ev: Any, i: int) -> Event | None:
        stage = self.plan.stages[i]
        assert isinstance(stage, FanOut)
        await self._run(ctx, f"s{i}_gather", stage.gather, ev.v, ev.path)
        got = ctx.collect_events(ev, [self.ns[f"D{i}"]] * stage.width)
        if got is None:
            return None
        total = sum(int(d.get("v")) for d in got) % MOD
        return self._ev(f"E{i + 1}", total, f"{_parent(ev.path)}/g")

    async def end(self, ctx: Context[Any], ev: Any) -> StopEvent:
        v = await self._run(ctx, "end", self.plan.end, ev.v, ev.path)
        return StopEvent(result={"v": v, "path": ev.path})


# ----------------------------------------------------------------------------- the model


@dataclass
class Expected:
    """What every run of a plan ends with: a result and context, or a failing step."""

    result: dict[str, Any] | None
    failure: str | None  # the step that fails the run
    context: dict[str, Any] = field(default_factory=dict)
    stream: frozenset[tuple[str, str, int]] = frozenset()


class _DictStore:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    async def get(self, path: str, default: Any = None) -> Any:
        return self.data.get(path, default)

    async def set(self, path: str, value: Any) -> None:
        self.data[path] = value

    async def delete(self, path: str) -> None:
        self.data.pop(path, None)

    @asynccontextmanager
    async def edit_state(self) -> AsyncIterator[dict[str, Any]]:
        yield self.data


async def _model(plan: Plan) -> Expected:
    store = _DictStore()
    notes: set[tuple[str, str, int]] = set()

    def stream(step: str, path: str, v: int) -> None:
        notes.add((step, path, v))

    async def run(name: str, sp: StepPlan, v: int, path: str) -> int:
        return await apply_ops(
            store, sp.ops, step=name, v=v, path=path, attempt=None, stream=stream
        )

    try:
        path = "s"
        v = await run("begin", plan.begin, plan.seed, path)
        for i, stage in enumerate(plan.stages):
            if isinstance(stage, Chain):
                v = mix(await run(f"s{i}_chain", stage.body, v, path), i)
                path += "/c"
            elif isinstance(stage, Loop):
                while True:
                    v = await run(f"s{i}_loop", stage.body, v, path)
                    n = store.data.get(f"loop{i}", 0) + 1
                    store.data[f"loop{i}"] = n
                    v = mix(v, n)
                    if n >= stage.times:
                        path += "/x"
                        break
                    path += f"/L{n}"
            else:
                v = await run(f"s{i}_split", stage.split, v, path)
                done = []
                for j in range(stage.width):
                    wpath = f"{path}/{j}"
                    done.append(
                        (mix(await run(f"s{i}_work", stage.work, (v + j) % MOD, wpath), 1), wpath)
                    )
                for dv, dpath in done:
                    await run(f"s{i}_gather", stage.gather, dv, dpath)
                v = sum(dv for dv, _ in done) % MOD
                path += "/g"
        v = await run("end", plan.end, v, path)
    except PlannedFailure as exc:
        return Expected(None, str(exc).rsplit(" ", 1)[-1])
    return Expected({"v": v, "path": path}, None, store.data, frozenset(notes))


def expected(plan: Plan) -> Expected:
    """The outcome of the plan computed without the engine (the ops run on a dict)."""
    # The model awaits nothing but sleep(0): it is driven by hand, inside a loop or not.
    coro = _model(plan)
    try:
        while True:
            coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- source

_NAMES = ("Add", "Chain", "Drop", "Edit", "Fail", "FanOut", "Loop", "Mark", "Plan")
_NAMES2 = ("Push", "Put", "Read", "StepPlan", "Stream", "Yield")


def _decorator(sp: StepPlan) -> str:
    if sp.retries is None:
        return f"@step(num_workers={sp.workers})"
    return (
        f"@step(num_workers={sp.workers}, retry_policy=retry_policy("
        f"wait=wait_none(), stop=stop_after_attempt({sp.retries})))"
    )


def _method(sp: StepPlan, name: str, accepts: str, returns: str, call: str) -> list[str]:
    return [
        f"    {_decorator(sp)}",
        f"    async def {name}(self, ctx: Context, ev: {accepts}) -> {returns}:",
        f"        return await RT.{call}",
        "",
    ]


def source(plan: Plan) -> str:
    """The Python source of the plan's workflow module (class ``Generated``)."""
    n = len(plan.stages)
    lines = [
        f'"""Generated by tests.support.workflow_gen from {plan!r}"""',
        "",
        "from workflow import Context, Event, StartEvent, StopEvent, Workflow, step",
        "from workflow.retry_policy import retry_policy, stop_after_attempt, wait_none",
        f"from tests.support.workflow_gen import Runtime, {', '.join(_NAMES)}",
        f"from tests.support.workflow_gen import {', '.join(_NAMES2)}",
        "",
        f"PLAN = {plan!r}",
        "",
        "",
        "class Note(Event):",
        "    step: str",
        "    path: str",
        "    v: int",
        "",
    ]
    classes = [f"E{i}" for i in range(n + 1)]
    for i, stage in enumerate(plan.stages):
        if isinstance(stage, Loop):
            classes.append(f"L{i}")
        elif isinstance(stage, FanOut):
            classes += [f"W{i}", f"D{i}"]
    for c in classes:
        lines += ["", f"class {c}(Event):", "    v: int", "    path: str", ""]
    lines += [
        "",
        "class Generated(Workflow):",
        "    def __init__(self, *args, **kwargs):",
        "        kwargs.setdefault('types', (Note,))",
        "        super().__init__(*args, **kwargs)",
        "",
    ]
    lines += _method(plan.begin, "begin", "StartEvent", "E0", "begin(ctx, ev)")
    for i, stage in enumerate(plan.stages):
        nxt = f"E{i + 1}"
        if isinstance(stage, Chain):
            lines += _method(stage.body, f"s{i}_chain", f"E{i}", nxt, f"chain(ctx, ev, {i})")
        elif isinstance(stage, Loop):
            lines += _method(
                stage.body, f"s{i}_loop", f"E{i} | L{i}", f"L{i} | {nxt}", f"loop(ctx, ev, {i})"
            )
        else:
            lines += _method(
                stage.split, f"s{i}_split", f"E{i}", f"W{i} | None", f"split(ctx, ev, {i})"
            )
            lines += _method(stage.work, f"s{i}_work", f"W{i}", f"D{i}", f"work(ctx, ev, {i})")
            lines += _method(
                stage.gather, f"s{i}_gather", f"D{i}", f"{nxt} | None", f"gather(ctx, ev, {i})"
            )
    lines += _method(plan.end, "end", f"E{n}", "StopEvent", "end(ctx, ev)")
    lines += ["", "RT = Runtime(PLAN, globals())", ""]
    return "\n".join(lines)


_lock = threading.Lock()
_dir: Path | None = None


def _gen_dir() -> Path:
    global _dir
    if _dir is None:
        _dir = Path(tempfile.mkdtemp(prefix="wfgen-"))
        atexit.register(shutil.rmtree, _dir, ignore_errors=True)
    return _dir


def module_file(plan: Plan) -> tuple[str, Path]:
    """The generated module's name and file (written on first use)."""
    text = source(plan)
    name = "wfgen_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    with _lock:
        path = _gen_dir() / f"{name}.py"
        if not path.exists():
            path.write_text(text)
    return name, path


def load_module(name: str, path: Path) -> ModuleType:
    """Imports a generated module from its file under its name (once per process)."""
    with _lock:
        found = sys.modules.get(name)
        if found is not None:
            return found
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


def build(plan: Plan) -> type[Workflow]:
    """The plan's workflow class (the same class for equal plans within a process)."""
    cls: type[Workflow] = load_module(*module_file(plan)).Generated
    return cls
