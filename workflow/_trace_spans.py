"""A run's spans, rebuilt from its log after the fact (``workflow trace``).

The log already holds what a tracer would have recorded, with the times its commits were
written, so a trace needs no instrumentation and covers runs that crashed: a run is one
trace. Its root span is the run; each process that executed it (the first, then one per
resume) is an *execution* span under it, each resume linked to the execution before it
(span links: a resume continues, it is not a child); under each execution, a span per step
attempt (ok, failed with its traceback, a conflict, a wait, or lost when the process died
during it) and each commit as an event; a wait for an event is a span under the run, as it
may outlast the process that began it. A fork's root span links to its parent run's.

Ids are derived from the run's id, so the same run gives the same trace every time and a
fork's link finds its parent's trace. Two encodings of the same spans: OTLP-JSON (the
OpenTelemetry protocol's JSON, which Jaeger's UI opens: "JSON File"), and the Chrome
trace-event JSON (which Perfetto and chrome://tracing open). With the ``otel`` extra, the
spans go to a collector through OpenTelemetry's SDK; those are :mod:`._trace_export`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

from eventstore import EventStore, StoredRecord
from eventstore._encryption import encrypted_error

from . import _journal as journal
from ._fold import payload_of
from ._ownership import probe_owners
from ._read import commits, fold_run, run_info, shown_status

__all__ = [
    "DIED",
    "SCOPE",
    "Attrs",
    "Link",
    "Span",
    "SpanEvent",
    "Trace",
    "run_trace",
    "trace_id_of",
]

SCOPE: Final = "durable-workflows"
_ENDS_RUN: Final = frozenset(
    {journal.RUN_FINISHED, journal.RUN_FAILED, journal.RUN_CANCELLED, journal.RUN_TIMED_OUT}
)
DIED: Final = "the process died during this attempt"

Attrs = dict[str, str | int | float | bool]


@dataclass(slots=True)
class SpanEvent:
    """Something that happened at one instant of a span: a commit, an exception."""

    name: str
    time_us: int
    attributes: Attrs = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Link:
    """A span this one continues (a resume its previous execution, a fork its parent)."""

    trace_id: str
    span_id: str
    attributes: Attrs


@dataclass(slots=True)
class Span:
    """One span: ids as lowercase hex (32 and 16 digits), times in microseconds (UTC)."""

    name: str
    span_id: str
    parent_id: str | None
    start_us: int
    end_us: int
    attributes: Attrs = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    error: str | None = None  # the status: None is OK (or unset while open), else ERROR
    lane: str = "run"  # where a timeline draws it (Chrome trace-event's thread)


@dataclass(slots=True)
class Trace:
    """A run's spans, the root first, then in the order they began."""

    run_id: str
    trace_id: str
    service: str  # the workflow's name: the resource's service.name
    spans: list[Span]


def trace_id_of(run_id: str) -> str:
    """The trace id of a run (stable: derived from the run's id)."""
    return hashlib.sha256(f"trace:{run_id}".encode()).hexdigest()[:32]


def _span_id(run_id: str, index: int) -> str:
    digest = hashlib.sha256(f"span:{run_id}:{index}".encode()).hexdigest()[:16]
    return digest if digest != "0" * 16 else "1" * 16  # all zeros is an invalid span id


class _Builder:
    """Follows a run's records, commit by commit, and opens and closes its spans."""

    def __init__(self, run_id: str, root: Span) -> None:
        self.run_id = run_id
        self.root = root
        self.spans: list[Span] = [root]
        self.execution: Span | None = None
        self.executions = 0
        self.attempts: dict[tuple[str, int], Span] = {}
        self.waits: dict[str, Span] = {}
        self.last_ts = root.start_us

    def new(self, name: str, parent: Span, start: int, attrs: Attrs, lane: str) -> Span:
        span = Span(name, _span_id(self.run_id, len(self.spans)), parent.span_id, start, start)
        span.attributes.update(attrs)
        span.lane = lane
        self.spans.append(span)
        return span

    def begin_execution(self, ts: int, resumed: journal.RunResumed | None) -> None:
        previous = self.execution
        # A run resumed from "running" was left by a process that died: nothing ended it.
        self.end_execution(died=resumed is not None and resumed["previous"] == "running")
        self.executions += 1
        attrs: Attrs = {"workflow.execution": self.executions}
        if resumed is not None:
            attrs["workflow.epoch"] = resumed["epoch"]
            attrs["workflow.previous_status"] = resumed["previous"]
        name = "execute" if resumed is None else "resume"
        span = self.new(name, self.root, ts, attrs, "executions")
        if previous is not None:
            link: Attrs = {"workflow.link": "resumes"}
            span.links.append(Link(self.root_trace, previous.span_id, link))
        self.execution = span

    @property
    def root_trace(self) -> str:
        return trace_id_of(self.run_id)

    def end_execution(self, *, died: bool) -> None:
        """Ends the execution span at its last record; attempts still open died with it."""
        execution = self.execution
        if execution is None:
            return
        lost = [a for a in self.attempts.values() if a.parent_id == execution.span_id]
        for attempt in lost:
            self.close_attempt(attempt, self.last_ts, "lost", DIED)
        if died or lost:
            execution.error = "the process died (after its last record)"
        execution.end_us = max(execution.start_us, self.last_ts)
        self.execution = None

    def close_attempt(self, span: Span, ts: int, outcome: str, error: str | None = None) -> None:
        key = (str(span.attributes["workflow.step"]), int(span.attributes["workflow.event_id"]))
        self.attempts.pop(key, None)
        span.end_us = max(span.start_us, ts)
        span.attributes["workflow.outcome"] = outcome
        if error is not None and outcome in ("failed", "lost"):
            span.error = error

    def execution_for(self, ts: int) -> Span:
        if self.execution is None:  # a log that begins without run_started (never written)
            self.begin_execution(ts, None)
        assert self.execution is not None
        return self.execution

    def record(self, record: StoredRecord, payload: Any) -> None:
        """Opens or closes the spans that one record begins or ends."""
        kind, step, ts = record.kind, record.step or "", record.ts
        if kind == journal.RUN_STARTED:
            self.begin_execution(ts, None)
        elif kind == journal.RUN_RESUMED:
            resumed: journal.RunResumed = payload
            self.begin_execution(ts, resumed)
        elif kind == journal.STEP_STARTED:
            started: journal.StepStarted = payload
            key = (step, started["id"])
            running = self.attempts.get(key)
            if running is not None:  # a new attempt while one is open: that process died
                self.close_attempt(running, ts, "lost", DIED)
            execution = self.execution_for(ts)
            attrs: Attrs = {
                "workflow.step": step,
                "workflow.event_id": started["id"],
                "workflow.attempt": started["attempt"],
                "workflow.seq": record.seq,
            }
            self.attempts[key] = self.new(f"step {step}", execution, ts, attrs, f"step {step}")
        elif kind in (
            journal.STEP_FINISHED,
            journal.STEP_FAILED,
            journal.STEP_CONFLICTED,
            journal.WAITING,
        ):
            ended: journal.StepFinished = payload
            span = self.attempts.get((step, ended["id"]))
            if span is not None:
                self.end_attempt(span, kind, payload, ts)
            if kind == journal.WAITING:
                waiting: journal.Waiting = payload
                attrs = {
                    "workflow.step": step,
                    "workflow.waiter": waiting["waiter"],
                    "workflow.awaited": waiting["awaited"],
                    "workflow.seq": record.seq,
                }
                if waiting.get("deadline") is not None:
                    attrs["workflow.deadline"] = float(waiting["deadline"] or 0)
                awaited = waiting["awaited"].rpartition(":")[2]
                self.waits[waiting["waiter"]] = self.new(
                    f"wait {awaited}", self.root, ts, attrs, "waits"
                )
        elif kind == journal.WAIT_RESOLVED:
            resolved: journal.WaitResolved = payload
            wait = self.waits.pop(resolved["waiter"], None)
            if wait is not None:
                wait.end_us = max(wait.start_us, ts)
                answered = resolved.get("id") is not None
                wait.attributes["workflow.outcome"] = "answered" if answered else "timed out"
        if kind in _ENDS_RUN or kind == journal.RUN_SUSPENDED:
            for attempt in list(self.attempts.values()):
                self.close_attempt(attempt, ts, "cancelled")
        self.last_ts = max(self.last_ts, ts)

    def end_attempt(self, span: Span, kind: str, payload: Any, ts: int) -> None:
        if kind == journal.STEP_FINISHED:
            finished: journal.StepFinished = payload
            span.attributes["workflow.emitted"] = ",".join(map(str, finished["emitted"]))
            self.close_attempt(span, ts, "ok")
        elif kind == journal.STEP_FAILED:
            failed: journal.StepFailed = payload
            message = f"{failed.get('error')}: {failed.get('message')}"
            self.close_attempt(span, ts, "failed", message)
            span.attributes["workflow.retry"] = bool(failed.get("retry"))
            exc: Attrs = {
                "exception.type": str(failed.get("error")),
                "exception.message": str(failed.get("message")),
            }
            if failed.get("traceback"):
                exc["exception.stacktrace"] = str(failed["traceback"])
            span.events.append(SpanEvent("exception", ts, exc))
        elif kind == journal.STEP_CONFLICTED:
            conflicted: journal.StepConflicted = payload
            self.close_attempt(span, ts, "conflict")
            span.attributes["workflow.stale_keys"] = ",".join(conflicted.get("keys") or ())
        else:
            self.close_attempt(span, ts, "wait")

    def commit(self, batch: list[StoredRecord]) -> None:
        last = batch[-1]
        execution = self.execution_for(last.ts)
        kinds = list(dict.fromkeys(record.kind for record in batch))
        attrs: Attrs = {"workflow.seq": last.seq, "workflow.records": len(batch)}
        attrs["workflow.kinds"] = ",".join(kinds)
        if batch[0].step:
            attrs["workflow.step"] = batch[0].step
        execution.events.append(SpanEvent("commit", last.ts, attrs))


def run_trace(store: EventStore, run_id: str) -> Trace:
    """The run's spans as its log tells them (see the module's docstring).

    :raises RunNotFoundError: no such run.
    :raises EncryptedPayloadError: the store was opened without the key of the run's
        encrypted payloads (the error names the key id).
    """
    info = run_info(store, run_id)
    workflow = str(info.meta.get("workflow", "")) or "workflow"
    upto = info.last_seq or 0  # as of now: a run that grows meanwhile is read consistently
    root = Span(f"run {workflow.rpartition(':')[2]}", _span_id(run_id, 0), None, info.created, 0)
    root.attributes.update({"workflow.run_id": run_id, "workflow.name": workflow})
    if info.parent_run_id is not None:
        root.attributes["workflow.parent_run_id"] = info.parent_run_id
        root.attributes["workflow.parent_seq"] = int(info.parent_seq or 0)
        fork: Attrs = {"workflow.link": "forked from", "workflow.parent_seq": info.parent_seq or 0}
        parent_root = _span_id(info.parent_run_id, 0)
        root.links.append(Link(trace_id_of(info.parent_run_id), parent_root, fork))
    builder = _Builder(run_id, root)
    if upto:
        for batch in commits(store.records(run_id, upto=upto)):
            for record in batch:
                if (sealed := encrypted_error(record)) is not None:  # read without the key
                    raise sealed
                builder.record(record, payload_of(record))
            builder.commit(batch)
    status = shown_status(store, fold_run(store, run_id, upto or None), probe_owners(store), None)
    root.attributes["workflow.status"] = status
    for wait in builder.waits.values():
        wait.end_us = max(wait.start_us, builder.last_ts)
        wait.attributes["workflow.outcome"] = "open"
    for attempt in list(builder.attempts.values()):
        if status == "interrupted":
            died = DIED + " (nothing was recorded after it)"
            builder.close_attempt(attempt, builder.last_ts, "lost", died)
        else:
            builder.close_attempt(attempt, builder.last_ts, "open")
    builder.end_execution(died=status == "interrupted")
    root.end_us = max(root.start_us, builder.last_ts)
    if status == "failed":
        root.error = "the run failed"
    return Trace(run_id, trace_id_of(run_id), workflow, builder.spans)
