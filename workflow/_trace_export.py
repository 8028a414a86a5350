"""A run's spans written out: OTLP-JSON, Chrome trace events, or through the SDK.

OTLP-JSON is the OpenTelemetry protocol's JSON (Jaeger's UI opens it: "JSON File"); Chrome
trace-event JSON is what Perfetto and chrome://tracing open; with the ``otel`` extra,
:func:`export_otlp` sends the spans to a collector through OpenTelemetry's SDK. The spans
themselves are built by :mod:`._trace_spans`.
"""

from __future__ import annotations

from typing import Any, Final

from ._trace_spans import SCOPE, Attrs, Trace

__all__ = ["OTEL_MISSING", "ExportError", "chrome_json", "export_otlp", "otlp_json"]


# ------------------------------------------------------------------ OTLP-JSON


def _value(value: str | int | float | bool) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 goes as a string in OTLP-JSON
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": value}


def _attrs(attrs: Attrs) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attrs.items()]


def _ns(us: int) -> str:
    return str(us * 1000)


def otlp_json(trace: Trace) -> dict[str, Any]:
    """The trace in OTLP-JSON (``ExportTraceServiceRequest``): ids in hex, times as strings
    of nanoseconds, every span INTERNAL. Jaeger'span UI opens a file of it."""
    spans = []
    for span in trace.spans:
        out: dict[str, Any] = {
            "traceId": trace.trace_id,
            "spanId": span.span_id,
            "name": span.name,
            "kind": 1,  # SPAN_KIND_INTERNAL
            "startTimeUnixNano": _ns(span.start_us),
            "endTimeUnixNano": _ns(span.end_us),
            "attributes": _attrs(span.attributes),
            "events": [
                {
                    "timeUnixNano": _ns(event.time_us),
                    "name": event.name,
                    "attributes": _attrs(event.attributes),
                }
                for event in span.events
            ],
            "links": [
                {
                    "traceId": link.trace_id,
                    "spanId": link.span_id,
                    "attributes": _attrs(link.attributes),
                }
                for link in span.links
            ],
            "status": {"code": 2, "message": span.error} if span.error else {"code": 1},
        }
        if span.parent_id is not None:
            out["parentSpanId"] = span.parent_id
        spans.append(out)
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
    the run'span start, a thread per lane; each link a flow arrow). Perfetto opens it."""
    t0 = trace.spans[0].start_us
    lanes: dict[str, int] = {}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": trace.service}}
    ]
    by_id = {span.span_id: span for span in trace.spans}
    for span in trace.spans:
        tid = lanes.get(span.lane)
        if tid is None:
            tid = lanes[span.lane] = len(lanes)
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": 1,
                    "tid": tid,
                    "args": {"name": span.lane},
                }
            )
        args: dict[str, Any] = dict(span.attributes)
        args["span_id"] = span.span_id
        if span.error:
            args["error"] = span.error
        events.append(
            {
                "ph": "X",
                "name": span.name,
                "cat": span.lane,
                "pid": 1,
                "tid": tid,
                "ts": span.start_us - t0,
                "dur": max(1, span.end_us - span.start_us),
                "args": args,
            }
        )
        events.extend(
            {
                "ph": "i",
                "s": "t",
                "name": event.name,
                "pid": 1,
                "tid": tid,
                "ts": event.time_us - t0,
                "args": dict(event.attributes),
            }
            for event in span.events
        )
    for span in trace.spans:
        for i, link in enumerate(span.links):
            source = by_id.get(link.span_id) if link.trace_id == trace.trace_id else None
            if source is None:
                continue  # another run'span span (a fork'span parent) is not in this file
            flow = f"{span.span_id}-{i}"
            common = {"name": str(link.attributes.get("workflow.link", "link")), "cat": "link"}
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
                    "tid": lanes[span.lane],
                    "ts": span.start_us - t0,
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
        for part in trace.spans:
            ids.span_id = int(part.span_id, 16)
            parent = None
            if part.parent_id is not None:
                parent_span = otel_trace.NonRecordingSpan(
                    context_of(trace.trace_id, part.parent_id)
                )
                parent = otel_trace.set_span_in_context(parent_span)
            links = [
                OtelLink(context_of(link.trace_id, link.span_id), dict(link.attributes))
                for link in part.links
            ]
            span = tracer.start_span(
                part.name,
                context=parent,
                attributes=dict(part.attributes),
                links=links,
                start_time=part.start_us * 1000,
            )
            for event in part.events:
                span.add_event(event.name, dict(event.attributes), timestamp=event.time_us * 1000)
            span.set_status(
                Status(StatusCode.ERROR, part.error) if part.error else Status(StatusCode.OK)
            )
            span.end(end_time=part.end_us * 1000)
        result = exporter.export(collected.spans)
    finally:
        provider.shutdown()
        exporter.shutdown()
    if result is not SpanExportResult.SUCCESS:
        msg = f"the exporter did not take the {len(collected.spans)} spans ({result.name})"
        raise ExportError(msg)
