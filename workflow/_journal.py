"""The journal: the engine's changes as records. One function a record kind.

Payloads are small JSON objects; events and values go through the codec's ``dump``, so an
event reads as ``{"$t": "model", "c": "module:Class", "v": {...fields}}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import orjson

from eventstore import Codec, Record

__all__ = [
    "COLLECTED",
    "DEQUEUED",
    "ENQUEUED",
    "KINDS",
    "RUN_CANCELLED",
    "RUN_FAILED",
    "RUN_FINISHED",
    "RUN_RESUMED",
    "RUN_STARTED",
    "RUN_SUSPENDED",
    "RUN_TIMED_OUT",
    "STATE_DELETED",
    "STATE_SET",
    "STEP_CONFLICTED",
    "STEP_FAILED",
    "STEP_FINISHED",
    "STEP_STARTED",
    "STREAMED",
    "WAITING",
    "WAIT_RESOLVED",
]

RUN_STARTED: Final = "run_started"
ENQUEUED: Final = "enqueued"
DEQUEUED: Final = "dequeued"
STEP_STARTED: Final = "step_started"
STEP_FINISHED: Final = "step_finished"
STEP_FAILED: Final = "step_failed"
STEP_CONFLICTED: Final = "step_conflicted"
STATE_SET: Final = "state_set"
STATE_DELETED: Final = "state_deleted"
COLLECTED: Final = "collected"
WAITING: Final = "waiting"
WAIT_RESOLVED: Final = "wait_resolved"
STREAMED: Final = "streamed"
RUN_FINISHED: Final = "run_finished"
RUN_FAILED: Final = "run_failed"
RUN_CANCELLED: Final = "run_cancelled"
RUN_RESUMED: Final = "run_resumed"
RUN_TIMED_OUT: Final = "run_timed_out"
RUN_SUSPENDED: Final = "run_suspended"

KINDS: Final = frozenset(
    {
        RUN_STARTED,
        ENQUEUED,
        DEQUEUED,
        STEP_STARTED,
        STEP_FINISHED,
        STEP_FAILED,
        STEP_CONFLICTED,
        STATE_SET,
        STATE_DELETED,
        COLLECTED,
        WAITING,
        WAIT_RESOLVED,
        STREAMED,
        RUN_FINISHED,
        RUN_FAILED,
        RUN_CANCELLED,
        RUN_RESUMED,
        RUN_TIMED_OUT,
        RUN_SUSPENDED,
    }
)

# Where an enqueued event came from, besides a step attempt ([event id, attempt]).
SRC_START: Final = "start"
SRC_EXTERNAL: Final = "external"
SRC_OPERATOR: Final = "operator"
SRC_WAITER: Final = "waiter"


def _rec(kind: str, step: str | None, payload: dict[str, Any]) -> Record:
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
    graph: dict[str, Any] | None = None,
) -> Record:
    """The first record of a run (or of a fork, which names its parent and seq).

    It carries the step graph, so that ``verify`` can say how today's steps differ.
    ``start_event`` may be given already encoded (an ``orjson.Fragment``).
    """
    return _rec(
        RUN_STARTED,
        None,
        {
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
        },
    )


def enqueued(step: str | None, event_id: int, event_dump: Any, src: Any) -> Record:
    """An event put on a step's queue (``step`` None: taken in, but no step takes it)."""
    return _rec(ENQUEUED, step, {"id": event_id, "event": event_dump, "src": src})


def dequeued(step: str, event_id: int, worker: int) -> Record:
    return _rec(DEQUEUED, step, {"id": event_id, "worker": worker})


def step_started(step: str, event_id: int, attempt: int) -> Record:
    return _rec(STEP_STARTED, step, {"id": event_id, "attempt": attempt})


def step_finished(
    step: str,
    event_id: int,
    attempt: int,
    emitted: Sequence[int],
    base: int,
    answers: Sequence[str],
) -> Record:
    payload: dict[str, Any] = {
        "id": event_id,
        "attempt": attempt,
        "emitted": list(emitted),
        "base": base,
    }
    if answers:
        payload["answers"] = list(answers)
    return _rec(STEP_FINISHED, step, payload)


def step_failed(
    step: str,
    event_id: int,
    attempt: int,
    error: BaseException,
    traceback: str,
    retry: bool,
    delay: float | None,
) -> Record:
    return _rec(
        STEP_FAILED,
        step,
        {
            "id": event_id,
            "attempt": attempt,
            "error": _text(type(error).__qualname__),
            "module": _text(type(error).__module__),
            "message": _message(error),
            "traceback": _text(traceback),
            "retry": retry,
            "delay": delay,
        },
    )


def step_conflicted(step: str, event_id: int, attempt: int, keys: Sequence[str]) -> Record:
    return _rec(STEP_CONFLICTED, step, {"id": event_id, "attempt": attempt, "keys": list(keys)})


def state_set_value(step: str | None, key: str, value_dump: Any) -> Record:
    return _rec(STATE_SET, step, {"key": key, "value": value_dump})


def state_set_patch(step: str | None, key: str, ops_json: Any) -> Record:
    return _rec(STATE_SET, step, {"key": key, "patch": ops_json})


def state_deleted(step: str | None, key: str) -> Record:
    return _rec(STATE_DELETED, step, {"key": key})


def collected(step: str, buffer: str, put: Any | None, take: Sequence[str] | None) -> Record:
    """A collect buffer changed: an event put in, or one event of each type taken out.

    ``buffer`` is the buffer's id within its step (:func:`buffer_key`); ``take`` names the
    classes by their qualified names without module. ``"v": 2`` tells these apart from
    the records written before, whose ids and names carried modules (:func:`collect_key`).
    """
    payload = {"buf": buffer, "put": put, "take": list(take) if take else None, "v": 2}
    return _rec(COLLECTED, step, payload)


def class_qualname(name: str) -> str:
    """A class name as the log writes it (``module:Qual.Name``) without its module."""
    return name.rpartition(":")[2]


def default_buffer_id(step: str, qualnames: Sequence[str]) -> str:
    """The id of a collect buffer given no ``buffer_id=``: a digest of the step and the
    expected classes' qualified names, the same whatever module they were imported as."""
    text = step + "\n" + ",".join(qualnames)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def buffer_key(step: str, buffer: str) -> str:
    """Where the fold and the executor keep a step's buffer: ids are per step, as in LlamaIndex."""
    return f"{step}:{buffer}"


def collect_key(step: str, payload: dict[str, Any]) -> str:
    """The :func:`buffer_key` of the buffer a ``collected`` record changes, in every shape.

    Records before ``"v": 2`` named the buffer ``step:mod:A,mod:B`` (by full class names):
    the same buffer as the default id of those classes' qualified names.
    """
    buf = payload["buf"]
    if payload.get("v") is None:
        return legacy_buffer_key(buf)
    return buffer_key(step, buf)


def legacy_buffer_key(buf: str) -> str:
    """The :func:`buffer_key` of a buffer id written before ``"v": 2`` (``step:mod:A,...``)."""
    step, _, names = buf.partition(":")
    return buffer_key(step, default_buffer_id(step, [class_qualname(n) for n in names.split(",")]))


def waiting(
    step: str,
    event_id: int,
    attempt: int,
    waiter_id: str,
    awaited: str,
    requirements_dump: Any,
    deadline: float | None,
    waiter_event_dump: Any | None,
) -> Record:
    return _rec(
        WAITING,
        step,
        {
            "id": event_id,
            "attempt": attempt,
            "waiter": waiter_id,
            "awaited": awaited,
            "requirements": requirements_dump,
            "deadline": deadline,
            "event": waiter_event_dump,
        },
    )


def wait_resolved(
    step: str, waiter_id: str, answer_id: int | None, answer_dump: Any | None
) -> Record:
    """A wait was answered (or timed out, with no answer): its step runs again."""
    return _rec(WAIT_RESOLVED, step, {"waiter": waiter_id, "id": answer_id, "event": answer_dump})


def streamed(step: str | None, event_id: int, attempt: int, event_dump: Any) -> Record:
    return _rec(STREAMED, step, {"id": event_id, "attempt": attempt, "event": event_dump})


def run_finished(result_dump: Any, stop_id: int) -> Record:
    return _rec(RUN_FINISHED, None, {"result": result_dump, "id": stop_id})


def run_failed(step: str | None, error: BaseException | str, message: str = "") -> Record:
    name = error if isinstance(error, str) else type(error).__qualname__
    text = message if isinstance(error, str) else _message(error)
    return _rec(RUN_FAILED, step, {"error": _text(name), "message": _text(text)})


def run_status(kind: str, **payload: Any) -> Record:
    """A run-level status change (cancelled, resumed, timed out, suspended)."""
    return _rec(kind, None, payload)
