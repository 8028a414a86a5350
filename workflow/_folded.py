"""What the fold builds: a run's state in JSON form, with events and values undecoded.

:class:`Folded` holds the queues, steps in progress, context, collect buffers, waiters and
stream of a run as the log's JSON says them; ``_fold`` applies records to it, ``_snapshot``
caches it, and ``_fold.to_run_state`` turns it into the typed :class:`RunState` readers see.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from eventstore import CodecError, LogCorruptedError, PickleDisabledError, StoredRecord

from . import _journal as J
from ._keylog import KeyLog

__all__ = [
    "CLASS_MOVE",
    "STATUS_OF_KIND",
    "Ev",
    "Failure",
    "Folded",
    "KeyLog",
    "MemoRec",
    "Prog",
    "WaitRec",
    "began_deprecated",
    "declare_deprecated",
    "drop_input",
    "not_damage",
    "payload_of",
    "rename_steps",
    "session_started",
]

# The status each kind of record leaves a run in; the other kinds leave it as it was. The
# fold's functions (``_fold.APPLY``) set it from here, and a log whose payloads cannot be
# read (encrypted, read without the key: ``_transfer``) has its status from its kinds alone.
STATUS_OF_KIND: Final[Mapping[str, str]] = {
    J.RUN_STARTED: "running",
    J.RUN_RESUMED: "running",
    J.RUN_FINISHED: "finished",
    J.RUN_FAILED: "failed",
    J.RUN_CANCELLED: "cancelled",
    J.RUN_TIMED_OUT: "timed_out",
    J.RUN_SUSPENDED: "waiting",
}


# A class renamed inside collect buffers, among the moves :func:`rename_steps` applies: this
# prefix and the old qualified name -> the new (no step name or buffer key starts so).
CLASS_MOVE: Final = "@"


@dataclass(slots=True)
class Ev:
    """An event as the log holds it: its id and codec dump."""

    id: int
    dump: Any
    seq: int = 0  # the record it came from: errors about it name this

    @property
    def type(self) -> str:
        d = self.dump
        # The class name without the version a tag may carry ("mod:Cls@2").
        return str(d.get("c", "")).partition("@")[0] if isinstance(d, dict) else ""


@dataclass(slots=True)
class Failure:
    """The latest failure of an event in progress, as its ``step_failed`` record says.

    ``retry_at`` is when the next attempt is due (None: at once, or not retried),
    ``elapsed`` the seconds since the first attempt began (None: a record written before
    it was recorded), ``failed_at`` when it failed (seconds since the epoch).
    """

    retry_at: float | None
    elapsed: float | None
    failed_at: float
    error: str  # the exception class's qualified name
    module: str
    message: str


@dataclass(slots=True)
class Prog:
    ev: Ev
    attempt: int = 0
    failures: int = 0
    conflicts: int = 0
    failure: Failure | None = None

    @property
    def crashes(self) -> int:
        """Attempts started that ended in neither a failure nor a conflict: the process died."""
        return self.attempt - self.failures - self.conflicts


@dataclass(slots=True)
class WaitRec:
    waiter_id: str
    step: str
    ev: Ev
    awaited: str
    requirements: Any
    deadline: float | None
    waiter_event: Any


@dataclass(slots=True)
class MemoRec:
    """A memoized call's recorded outcome, for the attempts at its input that follow.

    ``retried``: a retry policy re-ran the step since it was recorded, so only a call with
    ``reuse_on_retry=True`` reuses it.
    """

    digest: str
    result: Any  # the result's codec dump (None with an error)
    error: dict[str, str] | None
    attempt: int
    seq: int
    retried: bool = False


@dataclass(slots=True)
class Folded:
    """A run's state in JSON form, as the fold builds it."""

    run_id: str
    seq: int = 0
    first_seq: int | None = None
    status: str = "running"
    workflow: str = ""
    fingerprint: str = ""
    parent: tuple[str, int] | None = None
    result: Any = None  # the StopEvent's dump
    error: dict[str, Any] | None = None
    queues: dict[str, dict[int, Ev]] = field(default_factory=dict)
    in_progress: dict[str, dict[int, Prog]] = field(default_factory=dict)
    context: dict[str, KeyLog] = field(default_factory=dict)
    buffers: dict[str, dict[str, list[Ev]]] = field(default_factory=dict)
    waiters: dict[str, WaitRec] = field(default_factory=dict)
    answers: dict[str, Ev | None] = field(default_factory=dict)
    unclaimed: dict[int, Ev] = field(default_factory=dict)
    stream: list[Ev] = field(default_factory=list)
    # Event id -> how often each @catch_error handler took over along its lineage.
    recoveries: dict[int, dict[str, int]] = field(default_factory=dict)
    # Memoized calls of inputs not yet done: step -> event id -> key -> outcome.
    memos: dict[str, dict[int, dict[str, MemoRec]]] = field(default_factory=dict)
    # Where the run's latest session began (its run_started or run_resumed record), and the
    # seq of each unfinished input's first step_started (step -> event id -> seq): an input
    # first started before the session may have run older code (``ctx.patched``).
    session: int = 0
    started: dict[str, dict[int, int]] = field(default_factory=dict)
    # Patch id -> the seqs of the session starts at which the code declaring it deprecated
    # (``deprecated_patches``) began and stopped running the run, alternately: [declared,
    # not declared, declared, ...]; the first is the first session that declared it. An
    # input first started inside such a stretch was begun by code without the old branch.
    deprecated: dict[str, list[int]] = field(default_factory=dict)
    # The typed state model (and its version) the context's values are in, as the latest
    # session start that names one says (``"mod:MyState@2"``); None: none named.
    state: str | None = None
    next_id: int = 1
    exec_us: int = 0
    prev_ts: int | None = None
    paused: bool = False
    records: int = 0  # how many of the run's own records were folded in (a fork's: its own)
    # Collection streams (``workflow.collect``): each open one's [parent stream, the
    # fan-out step that opened it]; the stream of each member event (by id); the members
    # held at collect steps (step -> id -> event); the "stream|step" pairs released.
    streams: dict[str, list[Any]] = field(default_factory=dict)
    members: dict[int, str] = field(default_factory=dict)
    held: dict[str, dict[int, Ev]] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)

    def events(self, *, stream: bool = True) -> Iterator[Ev]:
        """Every event the state holds: queued, in progress, waiting, buffered, unclaimed,
        answers and (unless ``stream`` is False) the stream, whose ids are those of the
        streaming attempts' input events, not their own."""
        for q in self.queues.values():
            yield from q.values()
        for ps in self.in_progress.values():
            for p in ps.values():
                yield p.ev
        for w in self.waiters.values():
            yield w.ev
        for d in self.buffers.values():
            for es in d.values():
                yield from es
        yield from self.unclaimed.values()
        for a in self.answers.values():
            if a is not None:
                yield a
        if stream:
            yield from self.stream

    def only_waiters(self) -> bool:
        """Nothing queued or running, and someone waits: the run's clock is stopped."""
        return (
            bool(self.waiters)
            and not any(self.queues.values())
            and not any(self.in_progress.values())
        )


def payload_of(r: StoredRecord) -> Any:
    """A record's payload parsed, or :class:`LogCorruptedError` naming its seq."""
    try:
        return orjson.loads(r.payload)
    except orjson.JSONDecodeError as exc:
        msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} has a malformed payload: {exc}"
        raise LogCorruptedError(msg, seq=r.seq) from exc


def rename_steps(s: Folded, renamed: Mapping[str, str]) -> None:
    """Moves pending work (queued, in progress, waiting, with its inputs' memoized calls and
    first starts) from steps' old names to new ones, collect buffers from old keys to new
    ones (``renamed``'s entries with a colon, which no step name has: ``_renames``), and
    the events of renamed classes in them to the new names (entries of :data:`CLASS_MOVE`)."""
    for old, new in renamed.items():
        if old == new:
            continue
        if old.startswith(CLASS_MOVE):  # the events of a renamed class, in every buffer
            old = old[len(CLASS_MOVE) :]
            for d in s.buffers.values():
                es = d.pop(old, None)
                if es:
                    d.setdefault(new, []).extend(es)
            continue
        if ":" in old:
            buf = s.buffers.pop(old, None)
            if buf:
                into = s.buffers.setdefault(new, {})
                for t, es in buf.items():
                    into.setdefault(t, []).extend(es)
            continue
        for part in (s.queues, s.in_progress, s.memos, s.started):
            moved: Any = part.pop(old, None)
            if moved:
                part.setdefault(new, {}).update(moved)
        for w in s.waiters.values():
            if w.step == old:
                w.step = new


def declare_deprecated(s: Folded, seq: int, ids: Iterable[str]) -> None:
    """A session starts at ``seq`` (a ``run_started`` or ``run_resumed`` record) with code
    that declares the patches ``ids`` deprecated: each one's stretch of declaring sessions
    begins here (unless one is running), and those of the patches it does not declare end
    here (the code of this session may take their old branches)."""
    now = set(ids)
    if not all(isinstance(pid, str) for pid in now):
        msg = f"its deprecated patches {sorted(map(repr, now))} are not all ids (str)"
        raise TypeError(msg)
    for pid, marks in s.deprecated.items():
        if len(marks) % 2 == 1 and pid not in now:
            marks.append(seq)
    for pid in now:
        marks = s.deprecated.setdefault(pid, [])
        if len(marks) % 2 == 0:
            marks.append(seq)


def began_deprecated(s: Folded, patch_id: str, step: str, event_id: int) -> bool:
    """Whether ``step``'s input ``event_id`` was begun by code that declared ``patch_id``
    deprecated: its first ``step_started`` falls in a session whose start record declared it
    (one not started durably yet: whether the latest session declared it)."""
    marks = s.deprecated.get(patch_id)
    if not marks:
        return False
    first = s.started.get(step, {}).get(event_id)
    declaring = bisect_right(marks, first) if first is not None else len(marks)
    return declaring % 2 == 1


def session_started(s: Folded, seq: int, p: J.RunResumed | J.RunStarted) -> None:
    """What a session's start (a run's, a fork's, a resume's, at ``seq``) says of the code
    running it: where the session begins, its typed state model (a fork keeps its parent's
    unless it names one), the patches it declares deprecated, and the moves of work under
    steps it renamed."""
    s.session = seq
    s.state = p.get("state", s.state)
    declare_deprecated(s, seq, p.get("deprecated_patches", ()))
    renamed, buffers, classes = p.get("renamed"), p.get("buffers"), p.get("classes")
    if renamed or buffers or classes:
        moved = {CLASS_MOVE + k: v for k, v in (classes or {}).items()}
        rename_steps(s, {**(renamed or {}), **(buffers or {}), **moved})


def drop_input(s: Folded, step: str, event_id: int) -> None:
    """An input is done: its memoized calls and first start are never asked for again."""
    # Unrolled (no tuple, no loop): every input that ends comes here.
    memos = s.memos.get(step)
    if memos is not None and memos.pop(event_id, None) is not None and not memos:
        del s.memos[step]
    started = s.started.get(step)
    if started is not None and started.pop(event_id, None) is not None and not started:
        del s.started[step]


def not_damage(exc: CodecError, where: str) -> None:
    """Re-raises a pickle refused for want of the opt-in as itself, noting ``where`` it is:
    the log is not damaged, so it is not reported as :class:`LogCorruptedError`."""
    if isinstance(exc, PickleDisabledError):
        exc.add_note(where)
        raise exc
