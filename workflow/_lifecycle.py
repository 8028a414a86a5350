"""A ``Context``'s life between runs: LlamaIndex's ``Context(wf)``, ``run(ctx=)``,
``to_dict`` / ``from_dict``, made durable.

A context names a run. Unbound (``Context(wf)``) until its first ``run(ctx=ctx)``, it is then
bound to the run it started, and rebound each time a run starts from it. While its run is
executed here it is live (writes are operator commits); otherwise it is idle: it reads its
run's state at its point (the run's end, or the seq of the dict it was restored from), and
its writes stay on it until they open its next run (:class:`Idle`).

``run(ctx=ctx)`` (:func:`run_with_context`) with a start event or start fields starts a new
run from the context's state, *linked* to the run it came from (``run_started.previous``),
whose first commit writes that state: each chat turn is a run that folds on its own.
Without them it continues the run (a resume: the failed step of a failed run, with a fresh
retry budget), or forks it where the context points if the run went on past that, or,
after the run finished, starts a linked run with the default start event.

``to_dict`` (:func:`context_dict`) names the run and seq and carries the folded state in
the codec's typed JSON; ``from_dict`` (:func:`restore_into`) binds to that run when the
workflow's store has it, and otherwise imports the state as a new run when the context next
runs (:func:`_import_records`), so a dict written by one process restores in another.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from eventstore import CodecError, EncodeError, Record

from . import _journal as J
from ._changes import Encoded, encode_updates
from ._errors import ContextSerdeError, ContextStateError, WorkflowRuntimeError
from ._fold import Ev, Folded, KeyLog, Prog, WaitRec
from ._handler import WorkflowHandler
from ._read import fold_run
from ._recover import same_name
from ._state import TERMINAL
from ._waits import Delivery
from .context.serializers import BaseSerializer, JsonSerializer, PickleSerializer

if TYPE_CHECKING:
    from eventstore import Codec

    from ._context import Context
    from ._events import Event, StartEvent
    from ._runner import Executor
    from ._workflow import Workflow

__all__ = ["FORMAT", "Idle", "context_dict", "restore_into", "run_is_live", "run_with_context"]

# What a context dict says it is; "version" goes up with any change of its shape.
FORMAT: Final = "durable-workflows.context"
VERSION: Final = 1


class Idle:
    """What an idle context's ``store`` reads and writes: its run's state at the context's
    point, with the writes made on it since, which open its next run.

    It stands where the executor stands for a live context (``ContextStore._x``): reads
    outside an attempt use ``committed``, writes ``operator_update``.
    """

    def __init__(self, ctx: Context[Any]) -> None:
        self._ctx = ctx
        self._committed: dict[str, Any] | None = None
        self.pending: dict[str, Encoded] = {}
        self.deleted: set[str] = set()
        self.seq: int | None = None  # restored at this seq of its run (None: the run's end)
        self.imported: Folded | None = None  # a dict's state this store has no run of
        self.origin: tuple[str, int] | None = None  # where the imported state came from

    @property
    def codec(self) -> Codec:
        return self._ctx._wf._codec

    @property
    def committed(self) -> dict[str, Any]:
        """The context's values as its next run will start with them (read lazily)."""
        if self._committed is None:
            base = _base_values(self._ctx)
            for k in self.deleted:
                base.pop(k, None)
            for k, e in self.pending.items():
                base[k] = e.value
            self._committed = base
        return self._committed

    async def operator_update(
        self, updates: Mapping[str, Any], deletes: list[str] | None = None
    ) -> int:
        """Keeps writes for the next run (encoded now: what the log cannot hold is refused)."""
        encoded = encode_updates(self.codec, updates)
        committed = self.committed
        for k, e in encoded.items():
            self.pending[k] = e
            self.deleted.discard(k)
            committed[k] = e.value
        for k in deletes or ():
            self.pending.pop(k, None)
            self.deleted.add(k)
            committed.pop(k, None)
        return 0


# ---------------------------------------------------------------------- where a context points


def _ran_here(ctx: Context[Any]) -> Executor | None:
    """The executor that ran the context's run here, if the run is where it left it (its
    state is then in memory: no read of the store)."""
    x = ctx._x
    if x is None or ctx._idle.seq is not None or ctx._idle.imported is not None:
        return None
    if ctx._live() is None and ctx._wf._store.last_seq(x.run_id) != x._folded.seq:
        return None  # another process went on with the run since
    return x


def _point(ctx: Context[Any]) -> Folded:
    """The folded state (JSON form) at the context's point, without its idle writes."""
    idle = ctx._idle
    if idle.imported is not None:
        return idle.imported
    x = _ran_here(ctx)
    if x is not None:
        return x._folded  # the state this process ran it to (read, never changed here)
    if ctx._run is None:
        return Folded("")
    return fold_run(ctx._wf._store, ctx._run, idle.seq)


def _base_values(ctx: Context[Any]) -> dict[str, Any]:
    x = _ran_here(ctx)
    if x is not None:
        return dict(x.committed)
    load = ctx._wf._codec.load
    return {k: load(copy.deepcopy(e.dump)) for k, e in _point(ctx).context.items()}


def _state_dumps(ctx: Context[Any], f: Folded) -> dict[str, Any]:
    """The context's values in the codec's JSON form, with its idle writes."""
    idle = ctx._idle
    out = {k: e.dump for k, e in f.context.items()}
    if ctx._live() is None:
        for k in idle.deleted:
            out.pop(k, None)
        for k, e in idle.pending.items():
            out[k] = orjson.loads(e.text)
    return out


def run_is_live(ctx: Context[Any]) -> bool:
    """Whether the context's run is being executed, in this process or another."""
    if ctx._live() is not None:
        return True
    run = ctx._run
    if run is None or ctx._idle.imported is not None:
        return False
    from ._workflow import _live

    wf = ctx._wf
    if (id(wf._store), run) in _live:
        return True
    info = wf._store.get_run(run)
    if info is None or (info.status or "running") in TERMINAL:
        return False
    return wf._owners.is_owned(info.rid, run)


# ---------------------------------------------------------------------- to_dict / from_dict


def _kind(serializer: BaseSerializer | None) -> str:
    if serializer is None:
        return JsonSerializer.kind
    if isinstance(serializer, JsonSerializer):
        return serializer.kind
    cls = type(serializer)
    return f"{cls.__module__}:{cls.__qualname__}"


def context_dict(
    ctx: Context[Any], serializer: BaseSerializer | None, include_state: bool
) -> dict[str, Any]:
    """``ctx.to_dict()``: the run and seq the context points at, and the state there."""
    wf = ctx._wf
    f = _point(ctx)
    kind = _kind(serializer)
    run = _run_json(f)
    state: dict[str, Any] | None = None
    if include_state:
        state = _state_dumps(ctx, f)
    if wf._codec.allow_pickle and not isinstance(serializer, PickleSerializer):
        # Only a workflow that opted in stores pickles; only PickleSerializer writes them.
        # A serializer of the user's writes the values its own way; events stay JSON.
        custom = serializer is not None and not isinstance(serializer, JsonSerializer)
        where = (None if custom else _pickled(state or {})) or _pickled(run)
        if where is not None:
            msg = (
                f"cannot write this context with {type(serializer or JsonSerializer()).__name__}:"
                f" {where} is stored as a pickle (Workflow(allow_pickle=True)); write it with"
                " to_dict(serializer=PickleSerializer())"
            )
            raise ContextSerdeError(msg)
    if state is not None and serializer is not None and not isinstance(serializer, JsonSerializer):
        load = wf._codec.load
        state = {k: serializer.serialize(load(copy.deepcopy(d))) for k, d in state.items()}
    idle = ctx._idle
    imported = idle.imported is not None
    return {
        "format": FORMAT,
        "version": VERSION,
        "workflow": wf._name,
        "run_id": (idle.origin[0] if idle.origin else None) if imported else ctx._run,
        "seq": (idle.origin[1] if idle.origin else None) if imported else (f.seq or None),
        "status": f.status,
        # LlamaIndex's meaning: the run was under way, not ended by itself (a cancelled or
        # timed-out run was stopped mid-way: a run from this dict goes on with it).
        "is_running": (ctx._run is not None or imported) and f.status not in ("finished", "failed"),
        "live": run_is_live(ctx),  # executed now, here or in another process
        "serializer": kind,
        # False: written with include_state=False, so a missing 'state' is not damage.
        "include_state": include_state,
        "state": state,
        "pending": sorted(idle.pending) if ctx._live() is None else [],
        "deleted": sorted(idle.deleted) if ctx._live() is None else [],
        "run": run,
    }


def _serde(msg: str) -> ContextSerdeError:
    return ContextSerdeError(f"cannot restore this context dict: {msg}")


def _same_workflow(recorded: str, wf: Workflow) -> bool:
    # A script's class is recorded as __main__:X, the same class imported as app:X.
    return same_name(recorded, type(wf))


def restore_into(ctx: Context[Any], data: Any, serializer: BaseSerializer | None) -> None:
    """``Context.from_dict``: points ``ctx`` where ``data`` says, or keeps its state to import.

    Everything is checked here, so a damaged dict fails at ``from_dict``, not at the run.
    """
    wf = ctx._wf
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        msg = (
            f"it is not a durable-workflows context dict (its format is {got!r});"
            " a dict from LlamaIndex's own Context.to_dict() cannot be restored here"
        )
        raise _serde(msg)
    if data.get("version") != VERSION:
        msg = f"it has version {data.get('version')!r}; this library reads {VERSION}"
        raise _serde(msg)
    name = data.get("workflow")
    if not isinstance(name, str) or not _same_workflow(name, wf):
        msg = f"it is a context of workflow {name!r}, not of {wf._name!r}"
        raise _serde(msg)
    kind = data.get("serializer")
    if kind not in (JsonSerializer.kind, PICKLE) and _kind(serializer) != kind:
        msg = (
            f"its values were written by the serializer {kind!r}; pass"
            " serializer= an instance of it to from_dict"
        )
        raise _serde(msg)
    raw = data.get("run")
    if not isinstance(serializer, PickleSerializer):
        where = _pickled(data.get("state") or {}) or _pickled(raw)
        if where is not None:
            msg = f"{where} is a pickle: restore it with serializer=PickleSerializer()"
            raise _serde(msg)
    if not isinstance(raw, dict):
        msg = "it has no run state ('run')"
        raise _serde(msg)
    try:
        f = _run_from_json(raw)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"its run state is damaged: {exc!r}"
        raise _serde(msg) from None
    if "state" not in data and data.get("include_state") is not False:
        msg = (
            "it has no 'state' key and does not say it was written without state"
            " (to_dict(include_state=False) writes 'include_state': false and 'state': null)"
        )
        raise _serde(msg)
    state = data.get("state")
    if state is not None and not isinstance(state, dict):
        msg = f"its 'state' is a {type(state).__name__}, not a dict"
        raise _serde(msg)
    dumps = _state_from(wf, state or {}, kind, serializer)
    for key, dump in dumps.items():
        f.context[key] = KeyLog(dump, len(orjson.dumps(dump)))
    _check_decodes(f, wf._codec)  # every event and value decodes here, or the dict is refused
    idle = ctx._idle
    pending = [k for k in data.get("pending") or () if k in dumps]
    idle.deleted = {k for k in data.get("deleted") or () if isinstance(k, str)}
    run_id, seq = data.get("run_id"), data.get("seq")
    if run_id is None:  # a context that never ran: its values open its first run
        idle.pending = _encoded(wf, {k: dumps[k] for k in dumps})
        return
    if not isinstance(run_id, str) or not isinstance(seq, int):
        msg = "its 'run_id' and 'seq' are not a run id and a seq"
        raise _serde(msg)
    info = wf._store.get_run(run_id)
    here = (
        info is not None
        and _same_workflow(str(info.meta.get("workflow", "")), wf)
        and info.first_seq is not None
        and info.last_seq is not None
        and info.first_seq <= seq <= info.last_seq
    )
    if here:
        ctx._run = run_id
        idle.seq = seq
        idle.pending = _encoded(wf, {k: dumps[k] for k in pending})
        return
    # Not in this store: imported as a new run when the context next runs.
    f.run_id = ""
    idle.imported = f
    idle.origin = (run_id, seq)
    idle.deleted = set()


PICKLE: Final = "pickle"


def _pickled(tree: Any, path: str = "") -> str | None:
    """Where a JSON tree holds a codec pickle (``{"$t": "pickle"}``), or None."""
    stack: list[tuple[Any, str]] = [(tree, path)]
    while stack:
        x, at = stack.pop()
        if isinstance(x, dict):
            if x.get("$t") == PICKLE:
                return f"the value at {at or 'the top'!r}"
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, f"{at}.{i}") for i, v in enumerate(x))
    return None


def _check_decodes(f: Folded, codec: Codec) -> None:
    """Decodes each event and value of a dict's state once, so that a damaged dict (or one
    naming a class this program lacks) is refused by ``from_dict``, naming what."""
    parts: list[tuple[str, Any]] = [(f"context key {k!r}", e.dump) for k, e in f.context.items()]
    for step, q in f.queues.items():
        parts += [(f"event {e.id} queued at {step!r}", e.dump) for e in q.values()]
    for step, progs in f.in_progress.items():
        parts += [(f"event {p.ev.id} in progress at {step!r}", p.ev.dump) for p in progs.values()]
    for w in f.waiters.values():
        parts += [(f"the input of wait {w.waiter_id!r}", w.ev.dump)]
        if w.waiter_event is not None:
            parts += [(f"the question of wait {w.waiter_id!r}", w.waiter_event)]
    for key, by in f.buffers.items():
        parts += [(f"event {e.id} in buffer {key!r}", e.dump) for es in by.values() for e in es]
    parts += [(f"unclaimed event {e.id}", e.dump) for e in f.unclaimed.values()]
    if f.result is not None:
        parts += [("the run's result", f.result)]
    for what, dump in parts:
        try:
            codec.load(copy.deepcopy(dump))
        except CodecError as exc:
            msg = f"{what} does not decode here: {exc}"
            raise _serde(msg) from None


def _evs(evs: Any) -> list[dict[str, Any]]:
    return [{"id": e.id, "event": e.dump} for e in evs]


def _run_json(f: Folded) -> dict[str, Any]:
    """The dict's ``run``: what a run needs to go on from the state ``f`` (events in the
    codec's JSON form), in a shape of this dict's own (not the snapshot cache's, which may
    change whenever the cache does: a dict is the user's data and must restore later)."""
    return {
        "status": f.status,
        "result": f.result,
        "error": f.error,
        "queues": {step: _evs(q.values()) for step, q in f.queues.items() if q},
        "in_progress": {
            step: [
                {"id": p.ev.id, "event": p.ev.dump, "attempt": p.attempt, "failures": p.failures}
                for p in progs.values()
            ]
            for step, progs in f.in_progress.items()
            if progs
        },
        "waiters": [
            {
                "waiter_id": w.waiter_id,
                "step": w.step,
                "id": w.ev.id,
                "event": w.ev.dump,
                "awaited": w.awaited,
                "requirements": w.requirements,
                "deadline": w.deadline,
                "waiter_event": w.waiter_event,
            }
            for w in f.waiters.values()
        ],
        "buffers": {key: {t: _evs(es) for t, es in by.items()} for key, by in f.buffers.items()},
        "unclaimed": _evs(f.unclaimed.values()),
        "next_id": f.next_id,
    }


def _int(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        msg = f"{what} is {x!r}, not an integer"
        raise TypeError(msg)
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        msg = f"{what} is {x!r}, not a string"
        raise TypeError(msg)
    return x


def _ev_of(d: Any, what: str) -> Ev:
    if not isinstance(d, dict):
        msg = f"{what} is {d!r}, not an event entry"
        raise TypeError(msg)
    return Ev(_int(d["id"], f"the id of {what}"), d["event"])


def _run_from_json(d: Any) -> Folded:
    """The state :func:`_run_json` wrote, checked entry by entry.

    :raises KeyError, TypeError, ValueError: it is not that shape.
    """
    if not isinstance(d, dict):
        msg = f"it is a {type(d).__name__}, not a dict"
        raise TypeError(msg)
    f = Folded("")
    f.status = _str(d["status"], "its status")
    f.result = d["result"]
    f.error = d["error"]
    for step, q in dict(d["queues"]).items():
        f.queues[_str(step, "a step")] = {
            e.id: e for e in (_ev_of(x, f"an event queued at {step!r}") for x in q)
        }
    for step, progs in dict(d["in_progress"]).items():
        entries = {}
        for x in progs:
            ev = _ev_of(x, f"an event in progress at {step!r}")
            entries[ev.id] = Prog(
                ev, _int(x["attempt"], "attempt"), _int(x["failures"], "failures")
            )
        f.in_progress[_str(step, "a step")] = entries
    for w in d["waiters"]:
        ev = _ev_of(w, "a waiter's input")
        wid = _str(w["waiter_id"], "a waiter id")
        deadline = w["deadline"]
        if deadline is not None and not isinstance(deadline, int | float):
            msg = f"the deadline of wait {wid!r} is {deadline!r}"
            raise TypeError(msg)
        f.waiters[wid] = WaitRec(
            wid,
            _str(w["step"], "a waiter's step"),
            ev,
            _str(w["awaited"], "an awaited class"),
            w["requirements"],
            deadline,
            w["waiter_event"],
        )
    for key, by in dict(d["buffers"]).items():
        if ":" not in _str(key, "a buffer"):
            msg = f"the buffer {key!r} names no step"
            raise ValueError(msg)
        f.buffers[key] = {
            _str(t, "a class name"): [_ev_of(x, f"an event in buffer {key!r}") for x in es]
            for t, es in dict(by).items()
        }
    f.unclaimed = {e.id: e for e in (_ev_of(x, "an unclaimed event") for x in d["unclaimed"])}
    f.next_id = _int(d["next_id"], "next_id")
    return f


def _state_from(
    wf: Workflow, state: dict[str, Any], kind: Any, serializer: BaseSerializer | None
) -> dict[str, Any]:
    """The dict's values as the codec's JSON form (what the log holds)."""
    if kind in (JsonSerializer.kind, PICKLE):
        return {str(k): v for k, v in state.items()}
    assert serializer is not None
    values: dict[str, Any] = {}
    for k, text in state.items():
        if not isinstance(text, str):
            msg = f"the value of {k!r} is not the text of a serializer"
            raise _serde(msg)
        try:
            values[k] = serializer.deserialize(text)
        except Exception as exc:  # the user's serializer raises what it raises
            msg = f"the value of {k!r} does not deserialize: {exc!r}"
            raise _serde(msg) from None
    try:
        encoded = encode_updates(wf._codec, values)
    except EncodeError as exc:
        msg = f"a value cannot be stored: {exc}"
        raise _serde(msg) from None
    return {k: orjson.loads(e.text) for k, e in encoded.items()}


def _encoded(wf: Workflow, dumps: dict[str, Any]) -> dict[str, Encoded]:
    out = {}
    for k, d in dumps.items():
        text = orjson.dumps(d).decode()
        try:
            out[k] = Encoded(text, wf._codec.decode(text))
        except CodecError as exc:
            msg = f"the value of {k!r} does not decode: {exc}"
            raise _serde(msg) from None
    return out


# ---------------------------------------------------------------------- run(ctx=ctx)


def send_idle(ctx: Context[Any], event: Event) -> None:
    """``ctx.send_event`` on an idle context: recorded for its run, which takes it in when
    it runs again; a context with no run to take it is an error."""
    run = ctx._run
    if run is None or ctx._idle.imported is not None:
        msg = "send_event() needs a run: call wf.run(ctx=ctx) first"
        raise ContextStateError(msg)
    ctx._wf.send(run, event)


def run_with_context(
    wf: Workflow,
    ctx: Context[Any],
    start_event: StartEvent | None,
    fields: dict[str, Any],
    run_id: str | None,
) -> WorkflowHandler:
    """``wf.run(ctx=ctx, ...)``: what runs next from the context (see the module's text)."""
    from ._context import Context

    if not isinstance(ctx, Context):
        msg = f"run(ctx=...) takes a Context, not {type(ctx).__name__}"
        raise WorkflowRuntimeError(msg)
    if ctx._wf is not wf and not _same_workflow(ctx._wf._name, wf):
        msg = f"this context belongs to workflow {ctx._wf._name!r}, not {wf._name!r}"
        raise WorkflowRuntimeError(msg)
    if run_is_live(ctx):
        msg = (
            f"the run {ctx._run!r} of this context is already running; await its handler"
            " (or cancel it) before starting another run from the context"
        )
        raise ContextStateError(msg)
    starting = start_event is not None or bool(fields)
    idle = ctx._idle
    updates = dict(idle.pending)
    deletes = sorted(idle.deleted)
    imported, origin = idle.imported, idle.origin
    if imported is None and ctx._run is not None and wf._store.get_run(ctx._run) is None:
        # A context of another instance of this workflow, on another store: its run's
        # state there is imported here, as a dict of it would be.
        imported = copy.deepcopy(_point(ctx))
        origin = (ctx._run, imported.seq)
    handler: WorkflowHandler
    if imported is not None:
        if starting or imported.status == "finished":
            # As for a finished run of this store: a new run linked to it (a next turn).
            start = wf._start_event(start_event, fields)
            handler = _run_linked(wf, _state_dumps(ctx, imported), start, origin, run_id)
        else:
            handler = _run_imported(wf, imported, origin, updates, run_id)
    elif ctx._run is None:
        start = wf._start_event(start_event, fields)
        handler = _run_linked(wf, _state_dumps(ctx, Folded("")), start, None, run_id)
    else:
        run = ctx._run
        info = wf._run_info(run)
        end = info.last_seq or 0
        at = end if idle.seq is None else idle.seq
        if starting or (at == end and info.status == "finished"):
            start = wf._start_event(start_event, fields)
            handler = _run_linked(wf, _state_dumps(ctx, _point(ctx)), start, (run, at), run_id)
        else:
            if at < end:
                handler = wf._run_from((run, at), updates, deletes)
            else:
                handler = wf._resume(run, updates, cancelled=True, deletes=deletes)
    x = handler._executor
    if x is None:  # a finished run's stored result (resume of a run that ended meanwhile)
        return handler
    ctx._bind(x)
    return handler


def _context_records(dumps: dict[str, Any]) -> list[Record]:
    return [J.state_set_value(None, k, orjson.Fragment(orjson.dumps(d))) for k, d in dumps.items()]


def _new_executor(wf: Workflow, run_id: str | None) -> tuple[Executor, WorkflowHandler]:
    from ._runner import Executor

    run_id = run_id or uuid.uuid4().hex
    if wf._store.get_run(run_id) is not None:
        msg = f"run {run_id!r} already exists; a run from a context starts a new run"
        raise WorkflowRuntimeError(msg)
    x = Executor(wf, run_id, 0, 1, None)
    return x, WorkflowHandler(wf, run_id, x.done, x)


def _run_linked(
    wf: Workflow,
    dumps: dict[str, Any],
    start_event: StartEvent,
    previous: tuple[str, int] | None,
    run_id: str | None,
) -> WorkflowHandler:
    """A new run whose first commit writes ``dumps`` as its context, linked to ``previous``."""
    records = wf._start_records(start_event, _context_records(dumps), previous)
    targets = wf._graph.route(type(start_event))
    x, handler = _new_executor(wf, run_id)
    x.next_id = 2

    async def begin() -> None:
        await wf._slot(x)  # a new run: num_concurrent_runs counts it
        await x.append(records, create=wf._new_run())
        x.rid = wf._store.run(x.run_id).rid
        wf._own(x)
        x._load(copy.deepcopy(x._folded))  # its context, from the commit just folded
        x.ready.set()
        for t in targets:
            x.deliver(t, Delivery(1, start_event))
        x.start_taking()
        x.start_tasks()

    x._spawn(begin())
    return handler


def _import_records(wf: Workflow, f: Folded, origin: tuple[str, int] | None) -> list[Record]:
    """The first commit of a run whose state is ``f`` (a dict from another store).

    Queued and in-progress events are queued again, waits wait again, collect buffers and
    events no step took are kept; what is left out is the history (the stream, answers to
    waits whose step had not run again yet: that step asks again).
    """
    records = [
        wf._run_started(0, None, origin),
        *_context_records({k: e.dump for k, e in f.context.items()}),
    ]
    op: J.Source = J.SRC_OPERATOR
    for step, queue in f.queues.items():
        records.extend(J.enqueued(step, ev.id, ev.dump, op) for ev in queue.values())
    for step, progs in f.in_progress.items():
        records.extend(J.enqueued(step, p.ev.id, p.ev.dump, op) for p in progs.values())
    records.extend(J.enqueued(None, ev.id, ev.dump, op) for ev in f.unclaimed.values())
    for key, by_type in f.buffers.items():
        step, buf = key.split(":", 1)
        for evs in by_type.values():
            records.extend(
                J.collected(step, buf, {"id": ev.id, "event": ev.dump}, None) for ev in evs
            )
    for w in f.waiters.values():
        records += [
            J.enqueued(w.step, w.ev.id, w.ev.dump, op),
            J.dequeued(w.step, w.ev.id, 0),
            J.waiting(
                w.step,
                w.ev.id,
                0,
                w.waiter_id,
                w.awaited,
                w.requirements,
                w.deadline,
                w.waiter_event,
            ),
        ]
    return records


def _run_imported(
    wf: Workflow,
    f: Folded,
    origin: tuple[str, int] | None,
    updates: dict[str, Any],
    run_id: str | None,
) -> WorkflowHandler:
    """A new run that goes on from an imported state: its queued work runs, waits wait."""
    wf._check_stranded(origin[0] if origin else "(imported)", f, False)
    if not (any(f.queues.values()) or any(f.in_progress.values()) or f.waiters):
        # Nothing would ever run: refuse loudly rather than start a run that idles.
        msg = (
            f"this context's run (status {f.status!r}) has no work left to continue;"
            " pass start fields to run(ctx=...) to start a new run from its state"
        )
        raise WorkflowRuntimeError(msg)
    records = _import_records(wf, f, origin)
    x, handler = _new_executor(wf, run_id)
    x._reasks = None  # its waits' questions are asked again, as on a resume

    async def begin() -> None:
        await wf._slot(x)
        await x.append(records, create=wf._new_run())
        x.rid = wf._store.run(x.run_id).rid
        wf._own(x)
        x._load(copy.deepcopy(x._folded))
        x.ready.set()
        await wf._continue(x, copy.deepcopy(x._folded), updates, resumed=False)

    x._spawn(begin())
    return handler
