"""Verify recorded runs against today's code, as Temporal's Replayer does, without a server.

By default nothing is executed (steps call LLMs and other services): every recorded event
and context value must decode with today's classes, queued and in-progress work must still
route to a step (and not be refused by a patch declared deprecated: ``_patch_check``) that
accepts it, recorded outputs must fit the steps' declared return types, and the step
graph's differences from the recorded one are listed. With ``reexecute=True`` recorded
attempts run again on their recorded input and context; each step's first divergence is listed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from eventstore import CodecError, EncodeError, StoredRecord, UnknownClassError, class_name

from . import _journal as J
from ._attempt import Attempt, current_attempt
from ._checkpoints import event_class
from ._collect_call import event_inputs
from ._commit import asked
from ._context import current_context
from ._diff import apply, materialize
from ._errors import WorkflowRuntimeError
from ._events import Event
from ._fold import Folded, MemoRec, fold
from ._patch_check import patch_problems, replay_memos
from ._read import commits, fold_run, run_info, start_state
from ._replay_host import ReplayHost, ReplayInputs, replay_inputs
from ._retry import RetryClock
from ._state_versions import upcast_values
from ._step_shapes import returned_events
from ._stranded import rename_hint
from ._verify_report import Problem, VerifyReport

if TYPE_CHECKING:
    from ._facade_protocol import Facade

__all__ = ["Problem", "VerifyReport", "verify"]


def _payload_values(r: StoredRecord) -> Iterable[tuple[str, J.Dump]]:
    """The events and values a record holds, each with what to call it in a problem."""
    k = r.kind
    if k == J.ENQUEUED or k == J.STREAMED:
        carrying: J.Enqueued | J.Streamed = r.data()
        yield "event", carrying.get("event")
    elif k == J.RUN_STARTED:
        started: J.RunStarted = r.data()
        start = started.get("start")
        if start:
            yield "start event", start.get("event")
    elif k == J.RUN_FINISHED:
        finished: J.RunFinished = r.data()
        yield "result", finished.get("result")
    elif k == J.STATE_SET:
        changed: J.StateSet = r.data()
        key = changed.get("key")
        if "value" in changed:
            yield f"context value {key!r}", changed["value"]
        else:
            for op in changed.get("patch") or ():
                if len(op) > 2:
                    yield f"a change of context key {key!r}", op[2]
    elif k == J.COLLECTED:
        collected: J.Collected = r.data()
        put = collected.get("put")
        if put:
            yield "collected event", put.get("event")
    elif k == J.WAITING:
        waiting: J.Waiting = r.data()
        if waiting.get("event") is not None:
            yield "waiter event", waiting["event"]
    elif k == J.WAIT_RESOLVED:
        resolved: J.WaitResolved = r.data()
        if resolved.get("event") is not None:
            yield "answer", resolved["event"]


def _as_named_now(wf: Facade, name: str) -> str:
    """A recorded class name as this program names the class (``__main__:X`` is ``app:X``)."""
    try:
        return class_name(wf.__workflow_parts__.codec.resolve(name))
    except UnknownClassError:
        return name


def _graph_problems(run_id: str, recorded: dict[str, Any] | None, wf: Facade) -> list[Problem]:
    parts = wf.__workflow_parts__
    if not recorded:
        return []
    # A step renamed since (Workflow.renamed) is the same step under its new name.
    recorded = {parts.renames.get(k, k): v for k, v in recorded.items()}
    now = parts.graph.describe()
    out = [
        Problem(run_id, None, name, "graph", "step removed since the run was recorded")
        for name in sorted(set(recorded) - set(now))
    ]
    out.extend(
        Problem(run_id, None, name, "graph", "step added since the run was recorded")
        for name in sorted(set(now) - set(recorded))
    )
    for name in sorted(set(now) & set(recorded)):
        for part in ("accepts", "returns"):
            before = sorted(map(partial(_as_named_now, wf), recorded[name].get(part, [])))
            after = now[name][part]
            if before != after:
                msg = f"{part} changed: {before} -> {after}"
                out.append(Problem(run_id, None, name, "graph", msg))
    return out


def verify(
    wf: Facade,
    run_ids: Iterable[str] | None = None,
    *,
    reexecute: bool = False,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Checks recorded runs against ``wf``'s current code; see the module's docstring.

    :param run_ids: the runs to check (all of this workflow's runs in the store if None).
    :param reexecute: run recorded attempts again and compare what they produce.
    :param progress: called with the number of records read since the last call.
    """
    parts = wf.__workflow_parts__
    store = wf.store
    report = VerifyReport()
    name = parts.name.split(":")[-1]  # also matches runs recorded under __main__
    ids = (
        list(run_ids)
        if run_ids is not None
        else [
            r.run_id for r in store.runs() if str(r.meta.get("workflow", "")).split(":")[-1] == name
        ]
    )
    load = parts.codec.load
    steps = parts.graph.steps
    for run_id in ids:
        run_info(store, run_id)
        report.runs.append(run_id)
        problems = report.problems
        emitted_by: dict[int, str] = {}
        for commit in commits(store.records(run_id)):
            head = commit[0]
            report.records += len(commit)
            if progress is not None:
                progress(len(commit))
            for r in commit:
                if r.kind == J.RUN_STARTED:
                    started: J.RunStarted = r.data()
                    problems.extend(_graph_problems(run_id, started.get("graph"), wf))
                for what, dump in _payload_values(r):
                    try:
                        value = load(dump)
                        if isinstance(value, Event):
                            type(value).model_validate(value._fields())
                    except Exception as exc:  # every failure is a finding
                        msg = f"the {what} no longer decodes: {exc}"
                        problems.append(Problem(run_id, r.seq, r.step, "decode", msg))
            if head.kind == J.STEP_FINISHED and head.step in steps:
                spec = steps[head.step]
                for r in commit[1:]:
                    if r.kind not in (J.ENQUEUED, J.RUN_FINISHED):
                        continue
                    emitting: J.Enqueued | J.RunFinished = r.data()
                    dump = emitting.get("event") if r.kind == J.ENQUEUED else emitting.get("result")
                    ev_id = emitting.get("id")
                    if ev_id in emitted_by:
                        continue  # the same event enqueued for several steps
                    emitted_by[ev_id] = head.step
                    emitted = event_class(dump) if isinstance(dump, dict) else None
                    try:
                        cls = type(load(dump))
                    except Exception:  # reported as a decode problem above
                        continue
                    if not any(issubclass(cls, t) for t in spec.returns):
                        msg = (
                            f"emitted {emitted}, which its return annotation no longer declares"
                            f" ({', '.join(t.__name__ for t in spec.returns) or 'None'})"
                        )
                        problems.append(Problem(run_id, r.seq, head.step, "output", msg))
        latest = fold_run(store, run_id)
        try:  # a resume, a fork or a next turn reads the context in today's state model
            upcast_values(latest, parts.codec, parts.state_type)
        except Exception as exc:  # every failure is a finding
            msg = f"the context (state model {latest.state or '?'}) no longer decodes: {exc}"
            problems.append(Problem(run_id, latest.seq, None, "decode", msg))
        for recorded_step, ev_dump, ev_id, what in _pending(latest):
            step = parts.renames.get(recorded_step, recorded_step)  # a resume moves its work
            if step not in steps:
                msg = f"{what} event {ev_id} is for step {step!r}, which no longer exists"
                msg += rename_hint(step, parts.codec, ev_dump, parts.graph, type(wf))
                problems.append(Problem(run_id, latest.seq, step, "route", msg))
                continue
            try:
                event = load(ev_dump)
            except Exception:  # reported as a decode problem above
                continue
            if not any(isinstance(event, t) for t in steps[step].accepted):
                msg = f"{what} event {ev_id} ({type(event).__name__}) no longer routes to it"
                problems.append(Problem(run_id, latest.seq, step, "route", msg))
        problems.extend(patch_problems(type(wf), run_id, latest, parts.renames))
        if reexecute:
            _reexecute(wf, run_id, report)
    return report


def _pending(s: Folded) -> Iterable[tuple[str, Any, int, str]]:
    for step, q in s.queues.items():
        for e in q.values():
            yield step, e.dump, e.id, "queued"
    for step, progs in s.in_progress.items():
        for p in progs.values():
            yield step, p.ev.dump, p.ev.id, "in-progress"
    for w in s.waiters.values():
        yield w.step, w.ev.dump, w.ev.id, "waiting"


def _reexecute(wf: Facade, run_id: str, report: VerifyReport) -> None:
    """Runs each recorded successful attempt again and compares what it emits and writes."""
    parts = wf.__workflow_parts__
    store = wf.store
    load = parts.codec.load
    dump = parts.codec.dump
    state = start_state(store, run_info(store, run_id))
    diverged: set[str] = set()
    for commit in commits(store.records(run_id)):
        head = commit[0]
        if (
            head.kind == J.STEP_FINISHED
            and head.step in parts.graph.steps
            and head.step not in diverged
        ):
            finished: J.StepFinished = head.data()
            prog = state.in_progress.get(head.step, {}).get(finished["id"])
            if prog is not None:
                context = {k: load(copy.deepcopy(v.dump)) for k, v in state.context.items()}
                # A context of an older state model version: the attempt runs on it upcast,
                # as a resume gives it, and is compared with the recorded writes upcast.
                now = upcast_values(state, parts.codec, parts.state_type)
                writes = None if now is None else _upcast_writes(wf, state, commit, now)
                if now is not None:  # the engine's own keys ("\x00...") are kept as they are
                    context = {**{k: v for k, v in context.items() if k[:1] == "\x00"}, **now}
                # The attempt sees the retries the log recorded before it (ctx.retry_info()).
                clock = RetryClock.resume(prog.failures, prog.failure)
                clock.retry_at = None
                event = load(prog.ev.dump)
                memos = replay_memos(state, head.step)
                # Nothing recorded before it: no upcaster ran on the empty context, so the
                # fields an upcaster fills in (not this attempt's) may be left unwritten.
                first = now == {}
                inputs = replay_inputs(state, head.step, commit, load)
                problem = _replay_one(
                    wf,
                    run_id,
                    head,
                    commit,
                    event,
                    context,
                    dump,
                    clock,
                    memos,
                    writes,
                    first,
                    inputs,
                )
                report.attempts_reexecuted += 1
                if problem is not None:
                    report.problems.append(problem)
                    diverged.add(head.step)
        fold(state, commit)


def _replay_one(
    wf: Facade,
    run_id: str,
    head: StoredRecord,
    commit: list[StoredRecord],
    event: Event,
    context: dict[str, Any],
    dump: Callable[[Any], Any],
    clock: RetryClock,
    memos: dict[int, dict[str, MemoRec]],
    upcast_writes: dict[str, Any] | None = None,
    first_writer: bool = False,
    inputs: ReplayInputs | None = None,
) -> Problem | None:
    parts = wf.__workflow_parts__
    step = head.step or ""
    spec = parts.graph.steps[step]
    replay = ReplayHost(wf, context, memos, inputs)
    finished: J.StepFinished = head.data()
    att = Attempt(step, finished["id"], finished["attempt"], event, host=replay)
    att.retry = clock
    kwargs: dict[str, Any] = {}
    if spec.ctx_param is not None:
        kwargs[spec.ctx_param] = replay.ctx

    async def call() -> Any:
        token = current_attempt.set(att)
        ctx_token = current_context.set(replay.ctx)  # Context.get_step_context(), as in a run
        try:
            # Its input (a join's, from its buffer as the log held it; a collect step's list)
            inputs = event_inputs(replay, att, spec)
            if inputs is None:
                return None
            kwargs.update(inputs)
            if spec.resources:  # built by this workflow object, as a resume would
                kwargs.update(await parts.resources.inject(spec.resources))
            args = (wf,) if spec.bound else ()
            if spec.is_async:
                return await spec.func(*args, **kwargs)
            return spec.func(*args, **kwargs)  # a plain def: checked here, on this thread
        finally:
            current_context.reset(ctx_token)
            current_attempt.reset(token)

    side = {"record": head.kind, "step": step, "input": type(event).__name__}
    try:
        result = _run_isolated(call())
    except BaseException as exc:  # a raise where the record says it returned
        want = _emitted_dumps(commit)
        return Problem(
            run_id,
            head.seq,
            step,
            "divergence",
            f"raised {exc!r}, recorded a return",
            {**side, "emitted": _events(want)},
            {**side, "record": J.STEP_FAILED, "raised": repr(exc)},
        )
    try:
        result, spread = returned_events(spec, result)
    except WorkflowRuntimeError as exc:  # a list today's code returns where it may not
        return Problem(run_id, head.seq, step, "divergence", str(exc), side, side)
    att.sent.extend((ev, None) for ev in spread)
    emitted = [e for e, target in att.sent if not asked(e, target, parts.graph.route)]
    if result is not None and not asked(result, None, parts.graph.route):
        emitted.append(result)
    got_events = [dump(e) for e in emitted]
    # Recorded events of an older version are compared as today's code reads them: upcast.
    want_events = [_as_now(wf, d) for d in _emitted_dumps(commit)]
    if sorted(map(repr, got_events)) != sorted(map(repr, want_events)):
        msg = f"emitted {_names(got_events)}, recorded {_names(want_events)}"
        return Problem(
            run_id,
            head.seq,
            step,
            "divergence",
            msg,
            {**side, "emitted": _events(want_events)},
            {**side, "emitted": _events(got_events)},
        )
    for seq, key, want in _recorded_writes(wf, head, commit, context, upcast_writes):
        w = att.writes.get(key)
        recorded = {**side, "record": J.STATE_SET, "key": key, "value": want}
        if w is None:
            if first_writer:
                continue  # a field the upcaster fills in from nothing the attempt wrote
            now = {**side, "record": J.STATE_SET, "key": key}
            return Problem(run_id, seq, step, "divergence", f"did not write {key!r}", recorded, now)
        new = w.tracker.view if w.tracker is not None else w.value
        got = dump(materialize(new))
        if got != want:
            msg = f"wrote {key!r} = {got!r}, recorded {want!r}"
            now = {**side, "record": J.STATE_SET, "key": key, "value": got}
            return Problem(run_id, seq, step, "divergence", msg[:300], recorded, now)
    return None


def _recorded_writes(
    wf: Facade,
    head: StoredRecord,
    commit: list[StoredRecord],
    context: dict[str, Any],
    upcast_writes: dict[str, Any] | None,
) -> Iterable[tuple[int, str, Any]]:
    """What the attempt's commit wrote, (seq, key, dump): its ``state_set`` records, or
    the keys its writes changed once upcast (:func:`_upcast_writes`), at its head's seq."""
    if upcast_writes is not None:
        for key, want in upcast_writes.items():
            yield head.seq, key, want
        return
    for r in commit[1:]:
        if r.kind != J.STATE_SET:
            continue
        p: J.StateSet = r.data()
        key = p["key"]
        if "value" in p:
            yield r.seq, key, p["value"]
        else:
            value = apply(copy.deepcopy(context[key]), _ops_from(p["patch"], wf))
            yield r.seq, key, wf.__workflow_parts__.codec.dump(value)


def _upcast_writes(
    wf: Facade, state: Folded, commit: list[StoredRecord], before: dict[str, Any]
) -> dict[str, Any]:
    """The keys ``commit`` changed in ``state``'s context (of an older state model version)
    as today's model has them: the context after it upcast, where it differs from
    ``before`` (the context before it, upcast), as dumps."""
    parts = wf.__workflow_parts__
    after = copy.deepcopy(state)
    fold(after, commit)
    codec = parts.codec
    now = upcast_values(after, codec, parts.state_type)
    if now is None:  # the commit is no longer of the old version: compared as it is
        now = {k: codec.load(v.dump) for k, v in after.context.items()}
    out: dict[str, Any] = {}
    for key, value in now.items():
        d = codec.dump(value)
        if key not in before or codec.dump(before[key]) != d:
            out[key] = d
    return out


def _run_isolated(coro: Any) -> Any:
    """Runs a step's coroutine on a loop of its own, also when called from async code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _ops_from(patch: Any, wf: Facade) -> list[Any]:
    from ._diff import ops_from_json

    return ops_from_json(patch, wf.__workflow_parts__.codec)


def _emitted_dumps(commit: list[StoredRecord]) -> list[Any]:
    """The dumps of the events an attempt's commit emitted, each once, in order."""
    out: list[Any] = []
    seen: set[int] = set()
    for r in commit[1:]:
        if r.kind == J.ENQUEUED:
            enqueued: J.Enqueued = r.data()
            ev_id, ev_dump = enqueued["id"], enqueued["event"]
        elif r.kind == J.RUN_FINISHED:
            stopped: J.RunFinished = r.data()
            ev_id, ev_dump = stopped["id"], stopped["result"]
        else:
            continue
        if ev_id not in seen:
            seen.add(ev_id)
            out.append(ev_dump)
    return out


def _as_now(wf: Facade, d: Any) -> Any:
    """A recorded dump as today's classes write it (an older version upcast), else as is."""
    codec = wf.__workflow_parts__.codec
    try:
        return codec.dump(codec.load(d))
    except (CodecError, EncodeError):
        return d


def _events(dumps: list[Any]) -> list[dict[str, Any]]:
    """Events' dumps as one side of a divergence shows them: class name and fields."""
    return [
        {"type": event_class(d).split(":")[-1], "fields": d.get("v") if isinstance(d, dict) else d}
        for d in dumps
    ]


def _names(dumps: list[Any]) -> list[str]:
    return [
        str(d.get("c", "?")).partition("@")[0].split(":")[-1] if isinstance(d, dict) else "?"
        for d in dumps
    ]
