"""What changed in a run between two seqs: events, step attempts, context keys, status.

``workflow diff`` shows it; it needs no user code (events and values stay codec dumps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from eventstore import EventStore, StoredRecord

from . import _journal as J
from ._errors import WorkflowRuntimeError
from ._fold import Folded, fold
from ._read import Wrap, check_seq, commits, fold_run, records_upto

__all__ = ["Change", "changes_between"]


_STEP_KINDS: Final = frozenset(
    {J.STEP_STARTED, J.STEP_FINISHED, J.STEP_FAILED, J.STEP_CONFLICTED, J.WAITING}
)


@dataclass(slots=True)
class Change:
    """What happened between two seqs of a run, as JSON-native lists."""

    run_id: str
    start: int  # the commit the first state ends at
    end: int
    status: tuple[str, str]
    enqueued: list[dict[str, Any]] = field(default_factory=list)
    consumed: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    added: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)
    result: Any = None

    def to_json(self) -> dict[str, Any]:
        """The change as JSON-native data; values stay codec dumps."""
        return {
            "run_id": self.run_id,
            "from": self.start,
            "to": self.end,
            "status": list(self.status),
            "enqueued": self.enqueued,
            "consumed": self.consumed,
            "steps": self.steps,
            "context": {
                "added": self.added,
                "changed": {k: {"old": o, "new": n} for k, (o, n) in self.changed.items()},
                "removed": self.removed,
            },
            "result": self.result,
        }


def _context_bytes(s: Folded) -> dict[str, bytes]:
    # Encoded text, not Python ==: 1 == 1.0 == True, but they are different values. It is
    # also a copy, which matters because folding on patches values in place.
    return {k: orjson.dumps(v.dump) for k, v in s.context.items()}


def changes_between(
    store: EventStore,
    run_id: str,
    a: int,
    b: int,
    wrap: Wrap | None = None,
    shown: Callable[[Folded], Folded] | None = None,
) -> Change:
    """What changed in the run from its state at ``a`` to its state at ``b``.

    ``wrap`` sees the records read (a progress bar); ``shown`` gives each side's state as
    it is compared (the context upcast to the workflow's state model, ``upcast_shown``).

    :raises RunNotFoundError: no such run.
    :raises CheckpointNotFoundError: ``a`` is before the run's first record.
    :raises WorkflowRuntimeError: ``a`` is after ``b``, or ``b`` past the end of the log.
    """
    if a > b:
        msg = f"diff needs A <= B, got A={a} and B={b}; swap them"
        raise WorkflowRuntimeError(msg)
    check_seq(store, run_id, b)
    check_seq(store, run_id, a)
    state = fold_run(store, run_id, a, wrap=wrap)
    before = _context_bytes(state if shown is None else shown(state))
    old_status = state.status
    start = state.seq
    events: dict[int, Any] = {}
    for q in state.queues.values():
        events.update((i, e.dump) for i, e in q.items())
    for ps in state.in_progress.values():
        events.update((i, p.ev.dump) for i, p in ps.items())
    out = Change(run_id, start, start, (old_status, old_status))
    rest = records_upto(store, run_id, b, after=start)
    for commit in commits(rest if wrap is None else wrap(rest)):
        fold(state, commit)
        for r in commit:
            p = r.data()
            _note(out, r, p, events)
    out.end = state.seq
    out.status = (old_status, state.status)
    after = {k: v.dump for k, v in (state if shown is None else shown(state)).context.items()}
    for k, v in after.items():
        if k not in before:
            out.added[k] = v
        elif orjson.dumps(v) != before[k]:
            out.changed[k] = (orjson.loads(before[k]), v)
    for k, old in before.items():
        if k not in after:
            out.removed[k] = orjson.loads(old)
    out.result = state.result if state.result is not None and old_status != "finished" else None
    return out


def _note(out: Change, r: StoredRecord, p: Any, events: dict[int, Any]) -> None:
    k = r.kind
    if k == J.ENQUEUED:
        enqueued: J.Enqueued = p
        events[enqueued["id"]] = enqueued["event"]
        out.enqueued.append(
            {"seq": r.seq, "step": r.step, "event_id": enqueued["id"], "event": enqueued["event"]}
        )
    elif k == J.DEQUEUED:
        dequeued: J.Dequeued = p
        ev_id = dequeued["id"]
        out.consumed.append(
            {"seq": r.seq, "step": r.step, "event_id": ev_id, "event": events.get(ev_id)}
        )
    elif k in _STEP_KINDS:
        attempted: J.OfAttempt = p
        entry: dict[str, Any] = {
            "seq": r.seq,
            "step": r.step,
            "event_id": attempted.get("id"),
            "attempt": attempted.get("attempt"),
            "outcome": k.removeprefix("step_"),
        }
        if k == J.STEP_FINISHED:
            finished: J.StepFinished = p
            entry["emitted"] = finished.get("emitted", [])
        elif k == J.STEP_FAILED:
            failed: J.StepFailed = p
            entry["error"] = f"{failed.get('error')}: {failed.get('message')}"
            entry["retry"] = failed.get("retry")
        elif k == J.STEP_CONFLICTED:
            conflicted: J.StepConflicted = p
            entry["keys"] = conflicted.get("keys")
        elif k == J.WAITING:
            waiting: J.Waiting = p
            entry["awaited"] = waiting.get("awaited")
        out.steps.append(entry)
