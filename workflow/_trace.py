"""A run as OpenTelemetry spans, rebuilt from its log after the fact (``workflow trace``).

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
spans go to a collector through OpenTelemetry's SDK (:func:`export_otlp`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Final

from eventstore import EventStore, StoredRecord

from . import _journal as J
from ._fold import payload_of
from ._ownership import probe_owners
from ._read import commits, fold_run, run_info, shown_status

__all__ = [
    "ExportError",
    "Link",
    "Span",
    "SpanEvent",
    "Trace",
    "chrome_json",
    "export_otlp",
    "otlp_json",
    "run_trace",
]

SCOPE: Final = "durable-workflows"
_ENDS_RUN: Final = frozenset({J.RUN_FINISHED, J.RUN_FAILED, J.RUN_CANCELLED, J.RUN_TIMED_OUT})
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


def _span_id(run_id: str, n: int) -> str:
    digest = hashlib.sha256(f"span:{run_id}:{n}".encode()).hexdigest()[:16]
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

    def begin_execution(self, ts: int, resumed: J.RunResumed | None) -> None:
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
        x = self.execution
        if x is None:
            return
        lost = [a for a in self.attempts.values() if a.parent_id == x.span_id]
        for a in lost:
            self.close_attempt(a, self.last_ts, "lost", DIED)
        if died or lost:
            x.error = "the process died (after its last record)"
        x.end_us = max(x.start_us, self.last_ts)
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

    def record(self, r: StoredRecord, p: Any) -> None:
        k, step, ts = r.kind, r.step or "", r.ts
        if k == J.RUN_STARTED:
            self.begin_execution(ts, None)
        elif k == J.RUN_RESUMED:
            resumed: J.RunResumed = p
            self.begin_execution(ts, resumed)
        elif k == J.STEP_STARTED:
            started: J.StepStarted = p
            key = (step, started["id"])
            running = self.attempts.get(key)
            if running is not None:  # a new attempt while one is open: that process died
                self.close_attempt(running, ts, "lost", DIED)
            x = self.execution_for(ts)
            attrs: Attrs = {
                "workflow.step": step,
                "workflow.event_id": started["id"],
                "workflow.attempt": started["attempt"],
                "workflow.seq": r.seq,
            }
            self.attempts[key] = self.new(f"step {step}", x, ts, attrs, f"step {step}")
        elif k in (J.STEP_FINISHED, J.STEP_FAILED, J.STEP_CONFLICTED, J.WAITING):
            ended: J.StepFinished = p
            span = self.attempts.get((step, ended["id"]))
            if span is not None:
                self.end_attempt(span, k, p, ts)
            if k == J.WAITING:
                waiting: J.Waiting = p
                attrs = {
                    "workflow.step": step,
                    "workflow.waiter": waiting["waiter"],
                    "workflow.awaited": waiting["awaited"],
                    "workflow.seq": r.seq,
                }
                if waiting.get("deadline") is not None:
                    attrs["workflow.deadline"] = float(waiting["deadline"] or 0)
                awaited = waiting["awaited"].rpartition(":")[2]
                self.waits[waiting["waiter"]] = self.new(
                    f"wait {awaited}", self.root, ts, attrs, "waits"
                )
        elif k == J.WAIT_RESOLVED:
            resolved: J.WaitResolved = p
            wait = self.waits.pop(resolved["waiter"], None)
            if wait is not None:
                wait.end_us = max(wait.start_us, ts)
                answered = resolved.get("id") is not None
                wait.attributes["workflow.outcome"] = "answered" if answered else "timed out"
        if k in _ENDS_RUN or k == J.RUN_SUSPENDED:
            for a in list(self.attempts.values()):
                self.close_attempt(a, ts, "cancelled")
        self.last_ts = max(self.last_ts, ts)

    def end_attempt(self, span: Span, kind: str, p: Any, ts: int) -> None:
        if kind == J.STEP_FINISHED:
            finished: J.StepFinished = p
            span.attributes["workflow.emitted"] = ",".join(map(str, finished["emitted"]))
            self.close_attempt(span, ts, "ok")
        elif kind == J.STEP_FAILED:
            failed: J.StepFailed = p
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
        elif kind == J.STEP_CONFLICTED:
            conflicted: J.StepConflicted = p
            self.close_attempt(span, ts, "conflict")
            span.attributes["workflow.stale_keys"] = ",".join(conflicted.get("keys") or ())
        else:
            self.close_attempt(span, ts, "wait")

    def commit(self, batch: list[StoredRecord]) -> None:
        last = batch[-1]
        x = self.execution_for(last.ts)
        kinds = list(dict.fromkeys(r.kind for r in batch))
        attrs: Attrs = {"workflow.seq": last.seq, "workflow.records": len(batch)}
        attrs["workflow.kinds"] = ",".join(kinds)
        if batch[0].step:
            attrs["workflow.step"] = batch[0].step
        x.events.append(SpanEvent("commit", last.ts, attrs))


def run_trace(store: EventStore, run_id: str) -> Trace:
    """The run's spans as its log tells them (see the module's docstring).

    :raises RunNotFoundError: no such run.
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
    b = _Builder(run_id, root)
    if upto:
        for batch in commits(store.records(run_id, upto=upto)):
            for r in batch:
                b.record(r, payload_of(r))
            b.commit(batch)
    status = shown_status(store, fold_run(store, run_id, upto or None), probe_owners(store), None)
    root.attributes["workflow.status"] = status
    for wait in b.waits.values():
        wait.end_us = max(wait.start_us, b.last_ts)
        wait.attributes["workflow.outcome"] = "open"
    for a in list(b.attempts.values()):
        if status == "interrupted":
            b.close_attempt(a, b.last_ts, "lost", DIED + " (nothing was recorded after it)")
        else:
            b.close_attempt(a, b.last_ts, "open")
    b.end_execution(died=status == "interrupted")
    root.end_us = max(root.start_us, b.last_ts)
    if status == "failed":
        root.error = "the run failed"
    return Trace(run_id, trace_id_of(run_id), workflow, b.spans)


# ------------------------------------------------------------------ OTLP-JSON


def _value(v: str | int | float | bool) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # int64 goes as a string in OTLP-JSON
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": v}


def _attrs(attrs: Attrs) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attrs.items()]


def _ns(us: int) -> str:
    return str(us * 1000)


def otlp_json(trace: Trace) -> dict[str, Any]:
    """The trace in OTLP-JSON (``ExportTraceServiceRequest``): ids in hex, times as strings
    of nanoseconds, every span INTERNAL. Jaeger's UI opens a file of it."""
    spans = []
    for s in trace.spans:
        span: dict[str, Any] = {
            "traceId": trace.trace_id,
            "spanId": s.span_id,
            "name": s.name,
            "kind": 1,  # SPAN_KIND_INTERNAL
            "startTimeUnixNano": _ns(s.start_us),
            "endTimeUnixNano": _ns(s.end_us),
            "attributes": _attrs(s.attributes),
            "events": [
                {"timeUnixNano": _ns(e.time_us), "name": e.name, "attributes": _attrs(e.attributes)}
                for e in s.events
            ],
            "links": [
                {"traceId": ln.trace_id, "spanId": ln.span_id, "attributes": _attrs(ln.attributes)}
                for ln in s.links
            ],
            "status": {"code": 2, "message": s.error} if s.error else {"code": 1},
        }
        if s.parent_id is not None:
            span["parentSpanId"] = s.parent_id
        spans.append(span)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs({"service.name": trace.service})},
                "scopeSpans": [{"scope": {"name": SCOPE}, "spans": spans}],
            }
        ]
    }


# ------------------------------------------------------------------ Chrome trace events


def chrome_json(trace: Trace) -> dict[str, Any]:
    """The trace as Chrome trace events (``X`` complete events, times in microseconds from
    the run's start, a thread per lane; each link a flow arrow). Perfetto opens it."""
    t0 = trace.spans[0].start_us
    lanes: dict[str, int] = {}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": trace.service}}
    ]
    by_id = {s.span_id: s for s in trace.spans}
    for s in trace.spans:
        tid = lanes.get(s.lane)
        if tid is None:
            tid = lanes[s.lane] = len(lanes)
            events.append(
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": s.lane}}
            )
        args: dict[str, Any] = dict(s.attributes)
        args["span_id"] = s.span_id
        if s.error:
            args["error"] = s.error
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": s.lane,
                "pid": 1,
                "tid": tid,
                "ts": s.start_us - t0,
                "dur": max(1, s.end_us - s.start_us),
                "args": args,
            }
        )
        events.extend(
            {
                "ph": "i",
                "s": "t",
                "name": e.name,
                "pid": 1,
                "tid": tid,
                "ts": e.time_us - t0,
                "args": dict(e.attributes),
            }
            for e in s.events
        )
    for s in trace.spans:
        for n, ln in enumerate(s.links):
            source = by_id.get(ln.span_id) if ln.trace_id == trace.trace_id else None
            if source is None:
                continue  # another run's span (a fork's parent) is not in this file
            flow = f"{s.span_id}-{n}"
            common = {"name": str(ln.attributes.get("workflow.link", "link")), "cat": "link"}
            events.append(
                {
                    **common,
                    "ph": "s",
                    "id": flow,
                    "pid": 1,
                    "tid": lanes[source.lane],
                    "ts": source.end_us - t0,
                }
            )
            events.append(
                {
                    **common,
                    "ph": "f",
                    "bp": "e",
                    "id": flow,
                    "pid": 1,
                    "tid": lanes[s.lane],
                    "ts": s.start_us - t0,
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_id": trace.run_id}}


# ------------------------------------------------------------------ the SDK (otel extra)

OTEL_MISSING: Final = (
    "exporting to a collector needs OpenTelemetry's SDK and OTLP exporter:"
    " pip install 'durable-workflows[otel]'"
)


class ExportError(Exception):
    """The exporter (a collector behind it) refused the spans or could not be reached."""


def export_otlp(trace: Trace, exporter: Any) -> None:
    """Sends the trace's spans through OpenTelemetry's SDK to ``exporter`` (a
    ``SpanExporter``: the OTLP one for a collector, an in-memory one in tests), with the
    trace's own ids and times.

    :raises ImportError: the ``otel`` extra is not installed (the message says so).
    :raises ExportError: the exporter did not take the spans (a collector unreachable).
    """
    try:
        from opentelemetry import trace as otel_trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.sdk.trace.id_generator import IdGenerator
        from opentelemetry.trace import Link as OtelLink
        from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
    except ImportError as exc:
        raise ImportError(OTEL_MISSING) from exc

    class _Ids(IdGenerator):
        """Hands the SDK the ids the log derived, one span at a time."""

        span_id = 0

        def generate_span_id(self) -> int:
            return self.span_id

        def generate_trace_id(self) -> int:
            return int(trace.trace_id, 16)

    class _Collect(SpanProcessor):
        """Keeps the ended spans, to hand the exporter in one call whose result is seen."""

        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.spans.append(span)

    ids = _Ids()
    collected = _Collect()
    provider = TracerProvider(
        resource=Resource.create({"service.name": trace.service}), id_generator=ids
    )
    provider.add_span_processor(collected)
    tracer = provider.get_tracer(SCOPE)
    sampled = TraceFlags(TraceFlags.SAMPLED)

    def context_of(trace_id: str, span_id: str) -> SpanContext:
        return SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=sampled
        )

    try:
        for s in trace.spans:
            ids.span_id = int(s.span_id, 16)
            parent = None
            if s.parent_id is not None:
                parent_span = otel_trace.NonRecordingSpan(context_of(trace.trace_id, s.parent_id))
                parent = otel_trace.set_span_in_context(parent_span)
            links = [
                OtelLink(context_of(ln.trace_id, ln.span_id), dict(ln.attributes)) for ln in s.links
            ]
            span = tracer.start_span(
                s.name,
                context=parent,
                attributes=dict(s.attributes),
                links=links,
                start_time=s.start_us * 1000,
            )
            for e in s.events:
                span.add_event(e.name, dict(e.attributes), timestamp=e.time_us * 1000)
            span.set_status(Status(StatusCode.ERROR, s.error) if s.error else Status(StatusCode.OK))
            span.end(end_time=s.end_us * 1000)
        result = exporter.export(collected.spans)
    finally:
        provider.shutdown()
        exporter.shutdown()
    if result is not SpanExportResult.SUCCESS:
        msg = f"the exporter did not take the {len(collected.spans)} spans ({result.name})"
        raise ExportError(msg)
