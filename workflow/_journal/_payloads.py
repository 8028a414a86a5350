"""The log's format: each record kind and the type of its payload, as readers read them.

Every reader (the fold, the read side, ``verify``, the command line) reads a payload through
its kind's type here; the builders (``_builders``) write them. A field added after a kind
was first written is ``NotRequired``: records written before lack it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, NotRequired, final

from typing_extensions import TypedDict  # pydantic's JSON schema needs it before Python 3.12

__all__ = [
    "COLLECTED",
    "DEQUEUED",
    "ENQUEUED",
    "KINDS",
    "MEMOIZED",
    "PAYLOADS",
    "RUN_CANCELLED",
    "RUN_FAILED",
    "RUN_FINISHED",
    "RUN_RESUMED",
    "RUN_STARTED",
    "RUN_SUSPENDED",
    "RUN_TIMED_OUT",
    "SRC_EXTERNAL",
    "SRC_OPERATOR",
    "SRC_START",
    "SRC_WAITER",
    "STATE_DELETED",
    "STATE_SET",
    "STEP_CONFLICTED",
    "STEP_FAILED",
    "STEP_FINISHED",
    "STEP_STARTED",
    "STREAMED",
    "WAITING",
    "WAIT_RESOLVED",
    "Collected",
    "Dequeued",
    "Dump",
    "Enqueued",
    "EventRef",
    "MemoError",
    "Memoized",
    "OfAttempt",
    "ParentRef",
    "Release",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunResumed",
    "RunStarted",
    "RunSuspended",
    "RunTimedOut",
    "Source",
    "StateDeleted",
    "StatePatch",
    "StateSet",
    "StateValue",
    "StepConflicted",
    "StepFailed",
    "StepFinished",
    "StepShape",
    "StepStarted",
    "Streamed",
    "WaitResolved",
    "Waiting",
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
MEMOIZED: Final = "memoized"
RUN_FINISHED: Final = "run_finished"
RUN_FAILED: Final = "run_failed"
RUN_CANCELLED: Final = "run_cancelled"
RUN_RESUMED: Final = "run_resumed"
RUN_TIMED_OUT: Final = "run_timed_out"
RUN_SUSPENDED: Final = "run_suspended"

# Where an enqueued event came from: a step attempt ([event id, attempt]) or one of these.
Source = Literal["start", "external", "operator", "waiter", "stream"] | list[int]
SRC_START: Final = "start"
SRC_EXTERNAL: Final = "external"
SRC_OPERATOR: Final = "operator"
SRC_WAITER: Final = "waiter"

# ------------------------------------------------------------------ the payloads

# A codec dump: JSON-native data, tagged values as {"$t": ..., ...}; never decoded here.
Dump = Any


class StepShape(TypedDict):
    """A step as ``run_started`` records the graph: the classes it accepts and returns."""

    accepts: list[str]
    returns: list[str]


class EventRef(TypedDict):
    """An event and its id within the run."""

    id: int
    event: Dump


class ParentRef(TypedDict):
    """The run and seq a fork starts from."""

    run_id: str
    seq: int


class RunStarted(TypedDict):
    """A run (or a fork, which names its parent) begins; ``start`` is None for a fork."""

    workflow: str
    fingerprint: str
    graph: NotRequired[dict[str, StepShape] | None]  # since verify (1ca66be)
    start: EventRef | None
    parent: ParentRef | None
    # The run whose context this run started from (a chat turn, an imported context dict):
    # a link only; the fold starts this run from its own records. Since issue 14.
    previous: NotRequired[ParentRef]
    # A fork's moves of work under steps renamed since its parent's seq, as a resume
    # records them (``RunResumed``). Since issue 21.
    renamed: NotRequired[dict[str, str]]
    buffers: NotRequired[dict[str, str]]
    classes: NotRequired[dict[str, str]]
    # The typed state model the code writes the context in, with its version ("mod:S@2";
    # version 1 has no suffix): records after it are in that version. Since issue 21.
    state: NotRequired[str]
    # The patches the session's code declares deprecated (``Workflow.deprecated_patches``),
    # sorted; absent when none: inputs it begins never take their old branches. Since
    # issue 21 (deprecate_patch lets them through).
    deprecated_patches: NotRequired[list[str]]


class Enqueued(TypedDict):
    """An event put on the record's step's queue (no step: taken in, parked as unclaimed).

    ``recoveries`` (only on the ``StepFailedEvent`` a ``@catch_error`` handler is given)
    counts, by handler, how often handlers took over along the event's lineage; events
    made from it inherit the counts through ``src``.
    """

    id: int
    event: Dump
    src: Source
    recoveries: NotRequired[dict[str, int]]  # since @catch_error (issue 16)
    # A member of a collection stream (``workflow.collect``): its id, and ``held`` when
    # put at a collect step (held there until the stream's release, never run alone).
    stream: NotRequired[str]
    held: NotRequired[bool]
    # A collect step's release: the stream, the held event ids it takes, whether the
    # stream closes with it.
    release: NotRequired[Release]


class Dequeued(TypedDict):
    """The step's worker ``worker`` took event ``id``."""

    id: int
    worker: int


class StepStarted(TypedDict):
    """An attempt at event ``id`` begins."""

    id: int
    attempt: int


class StepFinished(TypedDict):
    """An attempt returned: the ids it emitted, the seq its reads were based on."""

    id: int
    attempt: int
    emitted: list[int]
    base: int
    answers: NotRequired[list[str]]  # the waits whose answers it used; only when there are
    opened: NotRequired[str]  # the collection stream its list opened (a fan-out's)


class Release(TypedDict):
    """What a collect step's release takes (``Enqueued.release``)."""

    stream: str
    ids: list[int]
    closes: bool


class StepFailed(TypedDict):
    """An attempt raised; ``retry`` with the ``delay`` before the next, else the run fails.

    ``retry_at`` (when the next attempt is due, seconds since the epoch; None without a
    retry) and ``elapsed`` (seconds since the first attempt at this event began, counted
    across processes) make the backoff durable: a resumed run waits until ``retry_at``.
    """

    id: int
    attempt: int
    error: str  # the exception class's qualified name
    module: str
    message: str
    traceback: str
    retry: bool
    delay: float | None
    retry_at: NotRequired[float | None]  # since durable retries (issue 16)
    elapsed: NotRequired[float]  # since durable retries (issue 16)


class StepConflicted(TypedDict):
    """An attempt's reads of ``keys`` went stale before it could commit: it runs again."""

    id: int
    attempt: int
    keys: list[str]


@final  # a record holds ``value`` or ``patch``, never both: ``"value" in p`` tells them apart
class StateValue(TypedDict):
    """A context key's whole new value."""

    key: str
    value: Dump


@final
class StatePatch(TypedDict):
    """A context key changed by a patch against its previous value (``_patch`` ops)."""

    key: str
    patch: list[Any]


# ``state_set`` has two shapes: a record holds either ``value`` or ``patch``.
StateSet = StateValue | StatePatch


class StateDeleted(TypedDict):
    """A context key was deleted."""

    key: str


class Collected(TypedDict):
    """A collect buffer changed: an event ``put`` in, or events taken out: ``takes`` of
    each class (name -> how many), or in records before ``takes`` one of each ``take``.

    Without ``v`` (records before it) ``buf`` is ``step:mod:A,mod:B`` and ``take`` names
    classes with their modules; with ``"v": 2`` they name no module (``_buffers``).
    """

    buf: str
    put: EventRef | None
    take: list[str] | None
    takes: NotRequired[dict[str, int]]
    # The events taken, as runs of ids ([first, last]; records since): the fold takes those.
    ids: NotRequired[list[list[int]]]
    v: NotRequired[Literal[2]]
    # The name a put is buffered under, when not its event's class ("*": a join of subclasses).
    slot: NotRequired[str]


class Waiting(TypedDict):
    """An attempt suspended in ``wait_for_event``; ``event`` is the question it streamed."""

    id: int
    attempt: int
    waiter: str
    awaited: str  # the awaited class's qualified name
    requirements: Dump
    deadline: float | None  # seconds since the epoch
    event: Dump | None


class WaitResolved(TypedDict):
    """A wait was answered by event ``id`` (or timed out: ``id`` and ``event`` None)."""

    waiter: str
    id: int | None
    event: Dump | None


class Streamed(TypedDict):
    """An event that attempt ``attempt`` at event ``id`` wrote to the stream."""

    id: int
    attempt: int
    event: Dump


class MemoError(TypedDict):
    """What a memoized call raised (recorded only with ``cache_errors=True``)."""

    type: str  # the exception class's qualified name
    message: str


class Memoized(TypedDict):
    """A memoized call of attempt ``attempt`` at event ``id`` returned (or raised).

    Committed on its own as soon as the call returns, kept whatever the attempt's outcome:
    a later attempt at the same input whose call has the same ``key`` and argument
    ``digest`` gets ``result`` (a codec dump) or ``error`` without calling again.
    """

    id: int
    attempt: int
    key: str
    name: str  # the called function's qualified name, for people reading the log
    digest: str  # of the encoded arguments
    result: Dump | None
    error: MemoError | None
    elapsed: float  # seconds the call took (its retries included)
    size: int  # bytes of the encoded result


class RunFinished(TypedDict):
    """The run finished with the stop event ``result`` (its id ``id``)."""

    result: Dump
    id: int


class RunFailed(TypedDict):
    """The run failed (the record's step, if a step failed it)."""

    error: str
    message: str


class RunCancelled(TypedDict):
    """The run was cancelled.

    ``via`` says how (``handler``: ``handler.cancel_run()``; ``workflow cancel``; ``ui``;
    ``parent``: with the run that awaited it as a child), ``by`` which process
    (``host:pid``), ``reason`` what the canceller gave. Records of earlier versions carry
    none of them.
    """

    via: NotRequired[str]
    by: NotRequired[str]
    reason: NotRequired[str]


class RunResumed(TypedDict):
    """An executor took the run over with ``epoch``; its status had been ``previous``.

    ``renamed`` (old step name -> new) moves the run's pending work of steps renamed since
    (``Workflow.renamed``) to their new names, for this fold and every later one, and
    ``buffers`` (old buffer key -> new) those steps' collect buffers (and the buffers
    holding classes renamed since), ``classes`` (old qualified class name -> new) the
    events of renamed classes in every collect buffer (since issue 21). ``state``: as
    ``RunStarted``'s; a resume by code of a newer version writes the context's upcast values
    in the same commit. ``deprecated_patches``: as ``RunStarted``'s.
    """

    epoch: int
    previous: str
    renamed: NotRequired[dict[str, str]]
    buffers: NotRequired[dict[str, str]]
    classes: NotRequired[dict[str, str]]
    state: NotRequired[str]
    deprecated_patches: NotRequired[list[str]]  # as ``RunStarted``'s


class RunTimedOut(TypedDict):
    """The run's execution time, ``elapsed`` seconds, ran out."""

    elapsed: float


class RunSuspended(TypedDict):
    """The caller left the run waiting (``handler.suspend()``)."""


# The payloads of the records of one attempt at an event: each has its ``id`` and ``attempt``.
OfAttempt = StepStarted | StepFinished | StepFailed | StepConflicted | Waiting | Memoized

# Each record kind and its payload's type: every kind the log holds, and the only list.
PAYLOADS: Final[Mapping[str, Any]] = {
    RUN_STARTED: RunStarted,
    ENQUEUED: Enqueued,
    DEQUEUED: Dequeued,
    STEP_STARTED: StepStarted,
    STEP_FINISHED: StepFinished,
    STEP_FAILED: StepFailed,
    STEP_CONFLICTED: StepConflicted,
    STATE_SET: StateSet,
    STATE_DELETED: StateDeleted,
    COLLECTED: Collected,
    WAITING: Waiting,
    WAIT_RESOLVED: WaitResolved,
    STREAMED: Streamed,
    MEMOIZED: Memoized,
    RUN_FINISHED: RunFinished,
    RUN_FAILED: RunFailed,
    RUN_CANCELLED: RunCancelled,
    RUN_RESUMED: RunResumed,
    RUN_TIMED_OUT: RunTimedOut,
    RUN_SUSPENDED: RunSuspended,
}

KINDS: Final = frozenset(PAYLOADS)
