"""``Context.to_dict`` / ``Context.from_dict``: a context as a JSON-native dict and back.

``to_dict`` (:func:`context_dict`) names the run and seq and carries the folded state in the
codec's typed JSON; ``from_dict`` (:func:`restore_into`) binds to that run when the
workflow's store has it, and otherwise keeps the state to import as a new run when the
context next runs, so a dict written by one process restores in another.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Final

import orjson

from eventstore import CodecError, EncodeError

from ._changes import Encoded, encode_updates
from ._context import parts_of
from ._errors import ContextSerdeError
from ._fold import Ev, Folded, KeyLog, Prog, WaitRec
from ._lifecycle import point_of, run_is_live, same_workflow, state_dumps
from .context.serializers import BaseSerializer, JsonSerializer, PickleSerializer

if TYPE_CHECKING:
    from eventstore import Codec

    from ._context import Context

__all__ = ["FORMAT", "PICKLE", "VERSION", "context_dict", "restore_into"]

# What a context dict says it is; "version" goes up with any change of its shape.
FORMAT: Final = "durable-workflows.context"
VERSION: Final = 1


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
    link = ctx.__context_link__
    codec = parts_of(ctx).codec
    f = point_of(ctx)
    kind = _kind(serializer)
    run = _run_json(f)
    state: dict[str, Any] | None = None
    if include_state:
        state = state_dumps(ctx, f)
    if codec.allow_pickle and not isinstance(serializer, PickleSerializer):
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
        load = codec.load
        state = {k: serializer.serialize(load(copy.deepcopy(d))) for k, d in state.items()}
    idle = link.idle
    imported = idle.imported is not None
    idle_writes = link.live() is None
    return {
        "format": FORMAT,
        "version": VERSION,
        "workflow": parts_of(ctx).name,
        "run_id": (idle.origin[0] if idle.origin else None) if imported else link.run_id,
        "seq": (idle.origin[1] if idle.origin else None) if imported else (f.seq or None),
        "status": f.status,
        # LlamaIndex's meaning: the run was under way, not ended by itself (a cancelled or
        # timed-out run was stopped mid-way: a run from this dict goes on with it).
        "is_running": (link.run_id is not None or imported)
        and f.status not in ("finished", "failed"),
        "live": run_is_live(ctx),  # executed now, here or in another process
        "serializer": kind,
        # False: written with include_state=False, so a missing 'state' is not damage.
        "include_state": include_state,
        "state": state,
        "pending": sorted(idle.pending) if idle_writes else [],
        "deleted": sorted(idle.deleted) if idle_writes else [],
        "run": run,
    }


def _serde(msg: str) -> ContextSerdeError:
    return ContextSerdeError(f"cannot restore this context dict: {msg}")


def restore_into(ctx: Context[Any], data: Any, serializer: BaseSerializer | None) -> None:
    """``Context.from_dict``: points ``ctx`` where ``data`` says, or keeps its state to import.

    Everything is checked here, so a damaged dict fails at ``from_dict``, not at the run.
    """
    wf = ctx.__context_link__.workflow
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
    other = not isinstance(name, str) or not same_workflow(name, wf)
    if (
        other
        and (not isinstance(name, str) or data.get("run_id") is not None)
        and (data.get("status") != "finished")
    ):
        msg = (
            f"it is a context of workflow {name!r}, not of {parts_of(ctx).name!r}, and its run"
            f" is {data.get('status')!r}: only the state of a finished run (or of a context"
            " that never ran) carries over to another workflow; work in flight is its own"
            " workflow's steps'"
        )
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
    dumps = _state_from(parts_of(ctx).codec, state or {}, kind, serializer)
    for key, dump in dumps.items():
        f.context[key] = KeyLog(dump, len(orjson.dumps(dump)))
    if not other:  # another workflow's run state is not taken, only its values
        _check_decodes(f, parts_of(ctx).codec)  # every event and value decodes here, or refused
    idle = ctx.__context_link__.idle
    pending = [k for k in data.get("pending") or () if k in dumps]
    idle.deleted = {k for k in data.get("deleted") or () if isinstance(k, str)}
    run_id, seq = data.get("run_id"), data.get("seq")
    if run_id is None or other:  # never ran, or another workflow's: its values open a run
        idle.pending = _encoded(parts_of(ctx).codec, {k: dumps[k] for k in dumps})
        return
    if not isinstance(run_id, str) or not isinstance(seq, int):
        msg = "its 'run_id' and 'seq' are not a run id and a seq"
        raise _serde(msg)
    info = parts_of(ctx).store.get_run(run_id)
    here = (
        info is not None
        and same_workflow(str(info.meta.get("workflow", "")), wf)
        and info.first_seq is not None
        and info.last_seq is not None
        and info.first_seq <= seq <= info.last_seq
    )
    if here:
        ctx.__context_link__.run_id = run_id
        idle.seq = seq
        idle.pending = _encoded(parts_of(ctx).codec, {k: dumps[k] for k in pending})
        return
    if raw.get("collections"):
        msg = (
            f"its run {run_id!r} was in the middle of a fan-out's stream (a list[E] collect"
            " step holds or awaits its events), which cannot be imported into another store:"
            " restore it with the workflow on the store that holds the run"
        )
        raise _serde(msg)
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
        **({"collections": True} if f.streams or f.held else {}),
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
    codec: Codec, state: dict[str, Any], kind: Any, serializer: BaseSerializer | None
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
        encoded = encode_updates(codec, values)
    except EncodeError as exc:
        msg = f"a value cannot be stored: {exc}"
        raise _serde(msg) from None
    return {k: orjson.loads(e.text) for k, e in encoded.items()}


def _encoded(codec: Codec, dumps: dict[str, Any]) -> dict[str, Encoded]:
    out = {}
    for k, d in dumps.items():
        text = orjson.dumps(d).decode()
        try:
            out[k] = Encoded(text, codec.decode(text))
        except CodecError as exc:
            msg = f"the value of {k!r} does not decode: {exc}"
            raise _serde(msg) from None
    return out
