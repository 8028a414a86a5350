"""The builders: one function a record kind, the only way the engine writes a record.

Each builds its kind's payload type (``_payloads``) and encodes it as the record's JSON text.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import orjson

from eventstore import Codec, Record

from ._payloads import (
    COLLECTED,
    DEQUEUED,
    ENQUEUED,
    MEMOIZED,
    RUN_CANCELLED,
    RUN_FAILED,
    RUN_FINISHED,
    RUN_RESUMED,
    RUN_STARTED,
    RUN_SUSPENDED,
    RUN_TIMED_OUT,
    STATE_DELETED,
    STATE_SET,
    STEP_CONFLICTED,
    STEP_FAILED,
    STEP_FINISHED,
    STEP_STARTED,
    STREAMED,
    WAIT_RESOLVED,
    WAITING,
    Collected,
    Dequeued,
    Dump,
    Enqueued,
    EventRef,
    MemoError,
    Memoized,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunResumed,
    RunStarted,
    RunSuspended,
    RunTimedOut,
    Source,
    StateDeleted,
    StatePatch,
    StateValue,
    StepConflicted,
    StepFailed,
    StepFinished,
    StepShape,
    StepStarted,
    Streamed,
    Waiting,
    WaitResolved,
)

__all__ = [
    "collected",
    "dequeued",
    "enqueued",
    "enqueued_recovery",
    "enqueued_release",
    "memoized",
    "run_cancelled",
    "run_failed",
    "run_finished",
    "run_resumed",
    "run_started",
    "run_suspended",
    "run_timed_out",
    "state_deleted",
    "state_set_patch",
    "state_set_value",
    "step_conflicted",
    "step_failed",
    "step_finished",
    "step_started",
    "streamed",
    "wait_resolved",
    "waiting",
]


def _rec(kind: str, step: str | None, payload: Mapping[str, object]) -> Record:
    return Record(kind, step, orjson.dumps(payload).decode())


def _text(s: str) -> str:
    """Text for a record as JSON can hold it: a lone surrogate is written as its escape."""
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _message(error: BaseException) -> str:
    """An error's message for a record: a failure is recorded whatever its text holds."""
    try:
        return _text(str(error))
    except Exception as exc:  # its __str__ is the user's code
        return f"<unprintable {type(error).__qualname__}: str() raised {exc!r}>"


def run_started(
    workflow: str,
    fingerprint: str,
    start_id: int,
    start_event: Any,
    parent: tuple[str, int] | None,
    codec: Codec,
    graph: dict[str, StepShape] | None = None,
    previous: tuple[str, int] | None = None,
    renamed: dict[str, str] | None = None,
    *,
    state: str | None = None,
    deprecated: Iterable[str] = (),
) -> Record:
    """The first record of a run (or of a fork, which names its parent and seq).

    It carries the step graph, so that ``verify`` can say how today's steps differ.
    ``start_event`` may be given already encoded (an ``orjson.Fragment``). ``previous``
    names the run and seq whose context a new run started from (written only then).
    ``renamed``: a fork's moves of work under renamed steps, as ``run_resumed``'s;
    ``state``: the typed state model's tag, and ``deprecated`` the patch ids the code
    declares deprecated, as ``run_resumed``'s.
    """
    payload: RunStarted = {
        "workflow": workflow,
        "fingerprint": fingerprint,
        "graph": graph,
        "start": {
            "id": start_id,
            "event": start_event
            if isinstance(start_event, orjson.Fragment)
            else codec.dump(start_event),
        }
        if start_event is not None
        else None,
        "parent": {"run_id": parent[0], "seq": parent[1]} if parent else None,
    }
    if previous is not None:
        payload["previous"] = {"run_id": previous[0], "seq": previous[1]}
    _moves(payload, renamed)
    if state is not None:
        payload["state"] = state
    if deprecated:
        payload["deprecated_patches"] = sorted(deprecated)
    return _rec(RUN_STARTED, None, payload)


def enqueued(
    step: str | None,
    event_id: int,
    event_dump: Dump,
    src: Source,
    stream: str | None = None,
    held: bool = False,
) -> Record:
    """An event put on a step's queue (``step`` None: taken in, but no step takes it);
    ``stream``: the collection stream it is a member of, ``held`` at a collect step."""
    payload: Enqueued = {"id": event_id, "event": event_dump, "src": src}
    if stream is not None:
        payload["stream"] = stream
        if held:
            payload["held"] = True
    return _rec(ENQUEUED, step, payload)


def enqueued_release(
    step: str,
    event_id: int,
    event_dump: Dump,
    stream: str,
    parent: str | None,
    ids: Sequence[int],
    closes: bool,
) -> Record:
    """The release of what collect step ``step`` held of ``stream`` (the held ``ids``):
    the event that runs it, a member of the ``parent`` stream if any; ``closes``: the
    stream is done with it."""
    payload: Enqueued = {
        "id": event_id,
        "event": event_dump,
        "src": "stream",
        "release": {"stream": stream, "ids": list(ids), "closes": closes},
    }
    if parent is not None:
        payload["stream"] = parent
    return _rec(ENQUEUED, step, payload)


def enqueued_recovery(
    step: str, event_id: int, event_dump: Dump, src: Source, recoveries: dict[str, int]
) -> Record:
    """A ``StepFailedEvent`` put on a ``@catch_error`` handler's queue, with the lineage's
    recovery counts (this recovery included)."""
    payload: Enqueued = {"id": event_id, "event": event_dump, "src": src, "recoveries": recoveries}
    return _rec(ENQUEUED, step, payload)


def dequeued(step: str, event_id: int, worker: int) -> Record:
    payload: Dequeued = {"id": event_id, "worker": worker}
    return _rec(DEQUEUED, step, payload)


def step_started(step: str, event_id: int, attempt: int) -> Record:
    payload: StepStarted = {"id": event_id, "attempt": attempt}
    return _rec(STEP_STARTED, step, payload)


def step_finished(
    step: str,
    event_id: int,
    attempt: int,
    emitted: Sequence[int],
    base: int,
    answers: Sequence[str],
    opened: str | None = None,
) -> Record:
    payload: StepFinished = {
        "id": event_id,
        "attempt": attempt,
        "emitted": list(emitted),
        "base": base,
    }
    if answers:
        payload["answers"] = list(answers)
    if opened is not None:
        payload["opened"] = opened
    return _rec(STEP_FINISHED, step, payload)


def step_failed(
    step: str,
    event_id: int,
    attempt: int,
    error: BaseException,
    traceback: str,
    retry: bool,
    delay: float | None,
    retry_at: float | None,
    elapsed: float,
) -> Record:
    payload: StepFailed = {
        "id": event_id,
        "attempt": attempt,
        "error": _text(type(error).__qualname__),
        "module": _text(type(error).__module__),
        "message": _message(error),
        "traceback": _text(traceback),
        "retry": retry,
        "delay": delay,
        "retry_at": retry_at,
        "elapsed": elapsed,
    }
    return _rec(STEP_FAILED, step, payload)


def step_conflicted(step: str, event_id: int, attempt: int, keys: Sequence[str]) -> Record:
    payload: StepConflicted = {"id": event_id, "attempt": attempt, "keys": list(keys)}
    return _rec(STEP_CONFLICTED, step, payload)


def state_set_value(step: str | None, key: str, value_dump: Dump) -> Record:
    payload: StateValue = {"key": key, "value": value_dump}
    return _rec(STATE_SET, step, payload)


def state_set_patch(step: str | None, key: str, ops_json: list[Any] | orjson.Fragment) -> Record:
    # A Fragment is the patch already encoded: the record holds the list it encodes.
    payload: StatePatch = {"key": key, "patch": cast("list[Any]", ops_json)}
    return _rec(STATE_SET, step, payload)


def state_deleted(step: str | None, key: str) -> Record:
    payload: StateDeleted = {"key": key}
    return _rec(STATE_DELETED, step, payload)


def collected(
    step: str,
    buffer: str,
    put: EventRef | None,
    take: Sequence[str] | None,
    ids: Sequence[int] | None = None,
    slot: str | None = None,
) -> Record:
    """A collect buffer changed: an event put in, or one event of each type taken out.

    ``buffer`` is the buffer's id within its step (``_buffers.buffer_key``); ``take`` names
    the classes by their qualified names without module, one name per event taken, and
    the record counts them (``takes``: name -> how many), so a take of K events of one
    class is a few bytes, not K names. ``ids`` are the events taken, as runs of
    consecutive ids (``[first, last]``: a fan-in's K results are mostly one run): the fold
    takes those, as the live buffer did, whatever order the puts' commits came in.
    ``"v": 2`` tells these apart from the records written before, whose ids and names
    carried modules (``collect_key``). ``slot``: the name a put is buffered under when it
    is not its event's class (``"*"``: an input of a join with
    ``accept_event_subclasses=True``, unassigned until a full set is in); absent, the
    event's class.
    """
    payload: Collected = {"buf": buffer, "put": put, "take": None, "v": 2}
    if slot is not None:
        payload["slot"] = slot
    if take:
        payload["takes"] = dict(Counter(take))
        if ids is not None:
            payload["ids"] = id_runs(ids)
    return _rec(COLLECTED, step, payload)


def id_runs(ids: Sequence[int]) -> list[list[int]]:
    """Ids as sorted runs of consecutive ids, ``[first, last]`` each."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def waiting(
    step: str,
    event_id: int,
    attempt: int,
    waiter_id: str,
    awaited: str,
    requirements_dump: Dump,
    deadline: float | None,
    waiter_event_dump: Dump | None,
) -> Record:
    payload: Waiting = {
        "id": event_id,
        "attempt": attempt,
        "waiter": waiter_id,
        "awaited": awaited,
        "requirements": requirements_dump,
        "deadline": deadline,
        "event": waiter_event_dump,
    }
    return _rec(WAITING, step, payload)


def wait_resolved(
    step: str, waiter_id: str, answer_id: int | None, answer_dump: Dump | None
) -> Record:
    """A wait was answered (or timed out, with no answer): its step runs again."""
    payload: WaitResolved = {"waiter": waiter_id, "id": answer_id, "event": answer_dump}
    return _rec(WAIT_RESOLVED, step, payload)


def streamed(step: str | None, event_id: int, attempt: int, event_dump: Dump) -> Record:
    payload: Streamed = {"id": event_id, "attempt": attempt, "event": event_dump}
    return _rec(STREAMED, step, payload)


def memoized(
    step: str,
    event_id: int,
    attempt: int,
    key: str,
    name: str,
    digest: str,
    result: orjson.Fragment | None,
    error: BaseException | None,
    elapsed: float,
    size: int,
) -> Record:
    """A memoized call's outcome: its encoded ``result``, or the ``error`` it raised."""
    err: MemoError | None = None
    if error is not None:
        err = {"type": _text(type(error).__qualname__), "message": _message(error)}
    payload: Memoized = {
        "id": event_id,
        "attempt": attempt,
        "key": _text(key),
        "name": _text(name),
        "digest": digest,
        "result": result,
        "error": err,
        "elapsed": elapsed,
        "size": size,
    }
    return _rec(MEMOIZED, step, payload)


def run_finished(result_dump: Dump, stop_id: int) -> Record:
    payload: RunFinished = {"result": result_dump, "id": stop_id}
    return _rec(RUN_FINISHED, None, payload)


def run_failed(step: str | None, error: BaseException | str, message: str = "") -> Record:
    name = error if isinstance(error, str) else type(error).__qualname__
    text = message if isinstance(error, str) else _message(error)
    payload: RunFailed = {"error": _text(name), "message": _text(text)}
    return _rec(RUN_FAILED, step, payload)


def run_cancelled(via: str, reason: str | None = None) -> Record:
    """``via``: how the run was cancelled (``RunCancelled``); ``reason``: the operator's."""
    payload: RunCancelled = {"via": via, "by": f"{socket.gethostname()}:{os.getpid()}"}
    if reason:
        payload["reason"] = _text(reason)
    return _rec(RUN_CANCELLED, None, payload)


def run_resumed(
    epoch: int,
    previous: str,
    renamed: dict[str, str] | None = None,
    *,
    state: str | None = None,
    deprecated: Iterable[str] = (),
) -> Record:
    """A resume; ``renamed`` holds the moves of renamed steps (``_renames.moves_for``),
    ``state`` the typed state model's tag (``_state_versions.state_tag``), ``deprecated``
    the patch ids the code declares deprecated (``Workflow.deprecated_patches``; written
    only when there are some)."""
    payload: RunResumed = {"epoch": epoch, "previous": previous}
    _moves(payload, renamed)
    if state is not None:
        payload["state"] = state
    if deprecated:
        payload["deprecated_patches"] = sorted(deprecated)
    return _rec(RUN_RESUMED, None, payload)


def _moves(payload: RunResumed | RunStarted, renamed: dict[str, str] | None) -> None:
    """Writes renamed steps' moves: step names in ``renamed``, buffer keys (a colon, which
    no step name has) in ``buffers``, renamed classes (keys "@Old", ``_folded.CLASS_MOVE``)
    in ``classes`` by their old qualified name."""
    if not renamed:
        return
    classes = {k[1:]: v for k, v in renamed.items() if k.startswith("@")}
    steps = {k: v for k, v in renamed.items() if ":" not in k and not k.startswith("@")}
    buffers = {k: v for k, v in renamed.items() if ":" in k and not k.startswith("@")}
    if steps:
        payload["renamed"] = steps
    if buffers:
        payload["buffers"] = buffers
    if classes:
        payload["classes"] = classes


def run_timed_out(elapsed: float) -> Record:
    payload: RunTimedOut = {"elapsed": elapsed}
    return _rec(RUN_TIMED_OUT, None, payload)


def run_suspended() -> Record:
    payload: RunSuspended = {}
    return _rec(RUN_SUSPENDED, None, payload)
