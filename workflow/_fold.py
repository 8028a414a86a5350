"""The fold: records -> the state of a run. Pure: no I/O, no clock, no randomness.

``fold(state, records)`` applies records in order to a :class:`Folded` state (``_folded``),
which keeps events and context values in their JSON form and decodes nothing;
:func:`to_run_state` (``_run_state_view``) turns it into a typed :class:`RunState` at the
end, which decodes only what is read.

One function a record kind, each reading its kind's payload type (``_journal``) in every
shape the log has written; ``_snapshot`` caches a folded state in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, NoReturn

import orjson

from eventstore import LogCorruptedError, StoredRecord
from eventstore._encryption import encrypted_error

from . import _journal as J
from ._buffers import class_qualname, collect_key, taken
from ._folded import (
    STATUS_OF_KIND,
    Ev,
    Failure,
    Folded,
    MemoRec,
    Prog,
    WaitRec,
    drop_input,
    payload_of,
    rename_steps,
    session_started,
)
from ._keylog import KeyLog
from ._run_state_view import is_terminal, result_of, to_run_state

__all__ = [
    "APPLY",
    "DEFER_BYTES",
    "FOLD_VERSION",
    "Ev",
    "Failure",
    "Folded",
    "KeyLog",
    "MemoRec",
    "Prog",
    "WaitRec",
    "fold",
    "is_terminal",
    "payload_of",
    "rename_steps",
    "result_of",
    "to_run_state",
]


# The version of what the fold makes of the log. A snapshot stores the version that folded
# it and is trusted only by this one: raise it whenever a change here would fold some log
# differently, so that the snapshots written before are ignored.
# 2: steps in progress keep their latest failure (durable retries) and events their
# lineage's @catch_error recovery counts. 3: the session's start and each input's first
# start (``ctx.patched``), and the typed state model's version. 4: the sessions whose code
# declared each patch deprecated (a snapshot of version 3 may lack the ones a newer
# process's session start declared). 5: a collect take with the ids of the events it took
# takes those (a fold of version 4 took the first of each class, which is not what the live
# buffer took when the commits of its puts came out of order).
FOLD_VERSION: Final = 5


def _run_started(s: Folded, r: StoredRecord, p: J.RunStarted) -> None:
    # A fork starts from its parent's state, but not from its parent's ending.
    s.status = STATUS_OF_KIND[J.RUN_STARTED]
    s.result = None
    s.error = None
    s.workflow = p.get("workflow", "")
    s.fingerprint = p.get("fingerprint", "")
    parent = p.get("parent")
    if parent:
        s.parent = (parent["run_id"], parent["seq"])
    start = p.get("start")
    if start:
        s.next_id = max(s.next_id, start["id"] + 1)
    session_started(s, r.seq, p)


def _enqueued(s: Folded, r: StoredRecord, p: J.Enqueued) -> None:
    eid = p["id"]
    ev = Ev(eid, p["event"], r.seq)
    after = eid + 1
    if after > s.next_id:  # max(next_id, after), without the call: every event comes here
        s.next_id = after
    step = r.step
    if step is None:
        s.unclaimed[eid] = ev
    elif "stream" in p or "release" in p:
        _stream_member(s, step, ev, p)
    else:
        queue = s.queues.get(step)
        if queue is None:
            s.queues[step] = {eid: ev}
        else:
            queue[eid] = ev
    if s.recoveries or "recoveries" in p:  # only runs where a handler took over pay
        _recoveries(s, ev, p)


def _stream_member(s: Folded, step: str, ev: Ev, p: J.Enqueued) -> None:
    """An event of a collection stream: held at a collect step, or queued; a release
    takes the held events it names out (``_streams``)."""
    sid = p.get("stream")
    if sid is not None:
        s.members[ev.id] = sid
    release = p.get("release")
    if release is not None:
        held = s.held.get(step)
        if held is not None:
            for i in release["ids"]:
                held.pop(i, None)
        rsid = release["stream"]
        if release["closes"]:
            s.streams.pop(rsid, None)
            s.released = {k for k in s.released if k.rpartition("|")[0] != rsid}
        else:
            s.released.add(f"{rsid}|{step}")
    if p.get("held"):
        s.held.setdefault(step, {})[ev.id] = ev
        return
    s.queues.setdefault(step, {})[ev.id] = ev


def _recoveries(s: Folded, ev: Ev, p: J.Enqueued) -> None:
    """An event's @catch_error counts: its payload's, or else its lineage's."""
    counts = p.get("recoveries")
    if counts is not None:
        s.recoveries[ev.id] = counts
    elif s.recoveries:
        src = p["src"]
        if type(src) is list:
            inherited = s.recoveries.get(src[0])
            if inherited is not None:
                s.recoveries[ev.id] = inherited


def _step_of(r: StoredRecord) -> str:
    if r.step is None:
        _no_step(r)
    return r.step


def _no_step(r: StoredRecord) -> NoReturn:
    msg = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} names no step"
    raise LogCorruptedError(msg, seq=r.seq)


# The functions of the kinds every step writes test ``r.step`` inline and build no default
# dicts: they run for most records of every run, and the executor folds each it writes.


def _dequeued(s: Folded, r: StoredRecord, p: J.Dequeued) -> None:
    step = r.step
    if step is None:
        _no_step(r)
    queue = s.queues.get(step)
    ev = None if queue is None else queue.pop(p["id"], None)
    if ev is None:
        msg = f"record seq {r.seq}: step {step!r} took event {p['id']}, which was not queued"
        raise LogCorruptedError(msg, seq=r.seq)
    progs = s.in_progress.get(step)
    if progs is None:
        s.in_progress[step] = {ev.id: Prog(ev)}
    else:
        progs[ev.id] = Prog(ev)


def _prog(
    s: Folded,
    r: StoredRecord,
    p: J.OfAttempt,
) -> Prog:
    step = r.step
    if step is None:
        _no_step(r)
    progs = s.in_progress.get(step)
    prog = None if progs is None else progs.get(p["id"])
    if prog is None:
        _not_in_progress(r, p)
    return prog


def _not_in_progress(r: StoredRecord, p: J.OfAttempt) -> NoReturn:
    msg = f"record seq {r.seq} ({r.kind}): event {p['id']} is not in progress at {r.step!r}"
    raise LogCorruptedError(msg, seq=r.seq)


def _step_started(s: Folded, r: StoredRecord, p: J.StepStarted) -> None:
    step = r.step
    if step is None:
        _no_step(r)
    eid = p["id"]
    progs = s.in_progress.get(step)
    prog = None if progs is None else progs.get(eid)
    if prog is None:
        _not_in_progress(r, p)
    prog.attempt = p["attempt"]
    firsts = s.started.get(step)
    if firsts is None:
        s.started[step] = {eid: r.seq}
    elif eid not in firsts:
        firsts[eid] = r.seq
    if prog.failure is not None:
        prog.failure.retry_at = None  # the retry began: a resume does not wait for it again


def _step_finished(s: Folded, r: StoredRecord, p: J.StepFinished) -> None:
    step = r.step
    if step is None:
        _no_step(r)
    eid = p["id"]
    progs = s.in_progress.get(step)
    if progs is None or progs.pop(eid, None) is None:
        _not_in_progress(r, p)
    if "answers" in p:
        for wid in p["answers"]:
            s.answers.pop(wid, None)
    if "opened" in p:  # a fan-out's list opened a collection stream
        s.streams[p["opened"]] = [s.members.get(eid), step]
    drop_input(s, step, eid)


def _step_failed(s: Folded, r: StoredRecord, p: J.StepFailed) -> None:
    prog = _prog(s, r, p)
    prog.failures += 1
    delay = p["delay"]
    retry_at = p.get("retry_at")
    if retry_at is None and p["retry"] and delay is not None:
        retry_at = r.ts / 1e6 + delay  # written before retry_at: the commit's time is close
    failed_at = retry_at - delay if retry_at is not None and delay is not None else r.ts / 1e6
    prog.failure = Failure(
        retry_at, p.get("elapsed"), failed_at, p["error"], p["module"], p["message"]
    )
    if p["retry"]:
        # The retry policy re-runs it: recorded calls are reused only when asked to be.
        for m in s.memos.get(_step_of(r), {}).get(p["id"], {}).values():
            m.retried = True


def _memoized(s: Folded, r: StoredRecord, p: J.Memoized) -> None:
    _prog(s, r, p)
    err = p["error"]
    s.memos.setdefault(_step_of(r), {}).setdefault(p["id"], {})[p["key"]] = MemoRec(
        p["digest"],
        p["result"],
        None if err is None else {"type": err["type"], "message": err["message"]},
        p["attempt"],
        r.seq,
    )


def _step_conflicted(s: Folded, r: StoredRecord, p: J.StepConflicted) -> None:
    _prog(s, r, p).conflicts += 1


def _state_set(s: Folded, r: StoredRecord, p: J.StateSet) -> None:
    key = p["key"]
    if "value" in p:
        s.context[key] = KeyLog(p["value"], len(r.payload), 0, r.seq, r.seq)
        return
    entry = s.context.get(key)
    if entry is None:
        msg = f"record seq {r.seq}: a patch of context key {key!r}, which has no value"
        raise LogCorruptedError(msg, seq=r.seq)
    entry.patched(p["patch"], r.seq, len(r.payload))


def _state_deleted(s: Folded, r: StoredRecord, p: J.StateDeleted) -> None:
    s.context.pop(p["key"], None)


def _collected(s: Folded, r: StoredRecord, p: J.Collected) -> None:
    # Buffers and the events in them go by names without modules, in every payload shape:
    # a class is the same class under __main__ and under the module name it is imported as.
    key = collect_key(_step_of(r), p)
    buf = s.buffers.setdefault(key, {})
    put = p.get("put")
    if put is not None:
        ev = Ev(put["id"], put["event"], r.seq)
        buf.setdefault(p.get("slot") or class_qualname(ev.type), []).append(ev)
    ids = p.get("ids")
    if ids is not None:
        _take_ids(buf, taken(p), ids, r)
    else:  # records before ids: the first of each class, as the live buffer held them
        for t, count in taken(p):
            events = buf.get(t)
            if events:
                del events[:count]
                if not events:
                    del buf[t]
    if not buf:
        del s.buffers[key]


def _take_ids(
    buf: dict[str, list[Ev]], takes: list[tuple[str, int]], ids: list[list[int]], r: StoredRecord
) -> None:
    """Takes the events ``ids`` (runs of ids) out of a buffer, ``takes`` (class -> how
    many) of them."""
    # As many ids as the counts say, checked before any run is expanded (a damaged record
    # naming a run of a billion ids is refused, not expanded).
    if sum(last - first + 1 for first, last in ids) != sum(n for _, n in takes) or any(
        type(first) is not int or type(last) is not int or first > last for first, last in ids
    ):
        msg = f"record seq {r.seq}: a take whose ids {ids!r:.80} do not fit its counts"
        raise LogCorruptedError(msg, seq=r.seq)
    wanted = {i for first, last in ids for i in range(first, last + 1)}
    # An id the buffer does not hold was put by an attempt whose commit came after this
    # take's (two attempts that each took what the other put, committed as they came):
    # what it holds of the take is taken, and the run stays readable.
    for t, _ in takes:
        events = buf.get(t)
        if not events:
            continue
        kept = [e for e in events if e.id not in wanted]
        if kept:
            buf[t] = kept
        else:
            del buf[t]


def _waiting(s: Folded, r: StoredRecord, p: J.Waiting) -> None:
    step = _step_of(r)
    prog = _prog(s, r, p)
    del s.in_progress[step][p["id"]]
    s.waiters[p["waiter"]] = WaitRec(
        p["waiter"], step, prog.ev, p["awaited"], p["requirements"], p["deadline"], p["event"]
    )


def _wait_resolved(s: Folded, r: StoredRecord, p: J.WaitResolved) -> None:
    s.waiters.pop(p["waiter"], None)
    answer_id = p.get("id")
    if answer_id is None:
        s.answers[p["waiter"]] = None
        return
    s.unclaimed.pop(answer_id, None)
    s.answers[p["waiter"]] = Ev(answer_id, p["event"], r.seq)


def _streamed(s: Folded, r: StoredRecord, p: J.Streamed) -> None:
    s.stream.append(Ev(p["id"], p["event"], r.seq))


def _run_finished(s: Folded, r: StoredRecord, p: J.RunFinished) -> None:
    s.status = STATUS_OF_KIND[J.RUN_FINISHED]
    s.result = p["result"]
    s.in_progress.clear()
    s.memos.clear()
    s.started.clear()


def _run_failed(s: Folded, r: StoredRecord, p: J.RunFailed) -> None:
    s.status = STATUS_OF_KIND[J.RUN_FAILED]
    s.error = {"step": r.step, "error": p.get("error"), "message": p.get("message")}


def _status(kind: str) -> Callable[[Folded, StoredRecord, Any], None]:
    def apply(s: Folded, r: StoredRecord, p: Any) -> None:
        s.status = STATUS_OF_KIND[kind]

    return apply


def _run_resumed(s: Folded, r: StoredRecord, p: J.RunResumed) -> None:
    s.status = STATUS_OF_KIND[J.RUN_RESUMED]
    s.error = None
    if p.get("previous") == "timed_out":
        s.exec_us = 0  # resuming a timed-out run starts a fresh timeout budget
    session_started(s, r.seq, p)


# What each record kind does to the state: one entry per kind of ``_journal.PAYLOADS``.
APPLY: Final[dict[str, Callable[[Folded, StoredRecord, Any], None]]] = {
    J.RUN_STARTED: _run_started,
    J.ENQUEUED: _enqueued,
    J.DEQUEUED: _dequeued,
    J.STEP_STARTED: _step_started,
    J.STEP_FINISHED: _step_finished,
    J.STEP_FAILED: _step_failed,
    J.STEP_CONFLICTED: _step_conflicted,
    J.STATE_SET: _state_set,
    J.STATE_DELETED: _state_deleted,
    J.COLLECTED: _collected,
    J.WAITING: _waiting,
    J.WAIT_RESOLVED: _wait_resolved,
    J.STREAMED: _streamed,
    J.MEMOIZED: _memoized,
    J.RUN_FINISHED: _run_finished,
    J.RUN_FAILED: _run_failed,
    J.RUN_CANCELLED: _status(J.RUN_CANCELLED),
    J.RUN_TIMED_OUT: _status(J.RUN_TIMED_OUT),
    J.RUN_RESUMED: _run_resumed,
    J.RUN_SUSPENDED: _status(J.RUN_SUSPENDED),
}


def fold(
    state: Folded,
    records: Iterable[StoredRecord],
    *,
    defer: Callable[[Folded, StoredRecord], bool] | None = None,
) -> Folded:
    """Applies records, in seq order, to ``state`` and returns it.

    ``defer`` may fold a ``state_set`` record of ``DEFER_BYTES`` or more itself, without
    decoding it (it returns True when it did): the executor's copy of its own log keeps a
    large value it wrote whole as a reference to the log, as a snapshot would.

    :raises LogCorruptedError: a record is malformed, of an unknown kind, or contradicts
        the records before it; the message names its seq. The fold never skips a record.
    """
    # The loop every read and every commit goes through: what each record changes in
    # the state beyond its kind's function (the count, the clock) is kept in locals.
    apply = APPLY
    loads = orjson.loads
    starts = _SESSION_STARTS
    n = 0
    prev_ts, paused, exec_us = state.prev_ts, state.paused, state.exec_us
    first = state.first_seq is None
    try:
        for r in records:
            seq, run_id, kind, _, payload, commit_seq, ts = r
            fn = apply.get(kind)
            if fn is None:
                msg = f"record seq {seq} of run {run_id!r} has an unknown kind {kind!r}"
                raise LogCorruptedError(msg, seq=seq)
            start = kind in starts
            if start:  # a session's start may reset the clock (a timed-out run resumed)
                state.exec_us = exec_us
            try:
                if (
                    defer is None
                    or kind != J.STATE_SET
                    or len(payload) < DEFER_BYTES
                    or not defer(state, r)
                ):
                    fn(state, r, loads(payload))
            except orjson.JSONDecodeError as exc:
                msg = f"record seq {seq} ({kind}) of run {run_id!r} has a malformed payload: {exc}"
                raise LogCorruptedError(msg, seq=seq) from exc
            except LogCorruptedError:
                raise
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:
                if (sealed := encrypted_error(r)) is not None:  # read without the key
                    raise sealed from None
                msg = f"record seq {seq} ({kind}) of run {run_id!r} is malformed: {exc!r}"
                raise LogCorruptedError(msg, seq=seq) from exc
            n += 1
            if start:
                exec_us = state.exec_us
            elif prev_ts is not None and not paused and ts > prev_ts:
                # Execution time: from a session's first record to its last, without the
                # time the run spent with nothing to do but wait, nor between sessions.
                exec_us += ts - prev_ts
            prev_ts = ts
            if first:
                state.first_seq = seq
                first = False
            if seq == commit_seq:
                state.seq = seq
                paused = state.only_waiters() if state.waiters else False
    finally:
        state.records += n
        state.prev_ts, state.paused, state.exec_us = prev_ts, paused, exec_us
    return state


_SESSION_STARTS: Final = frozenset({J.RUN_STARTED, J.RUN_RESUMED})
# The payloads a fold's ``defer`` is offered (it may refuse them): a snapshot keeps a value
# written whole by reference to the log from ``_snapshot.REF_MIN_BYTES`` (16 KB) on.
DEFER_BYTES: Final = 16 * 1024
