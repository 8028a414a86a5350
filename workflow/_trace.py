"""A run as OpenTelemetry spans, rebuilt from its log after the fact (``workflow trace``).

The spans are built by :mod:`._trace_spans` (a run is one trace: the run, its executions,
its step attempts and waits) and written out by :mod:`._trace_export` (OTLP-JSON, Chrome
trace events, or a collector through OpenTelemetry's SDK); this module is where the CLI and
the tests import both from.
"""

from __future__ import annotations

from ._trace_export import OTEL_MISSING, ExportError, chrome_json, export_otlp, otlp_json
from ._trace_spans import DIED, SCOPE, Link, Span, SpanEvent, Trace, run_trace, trace_id_of

__all__ = [
    "DIED",
    "OTEL_MISSING",
    "SCOPE",
    "ExportError",
    "Link",
    "Span",
    "SpanEvent",
    "Trace",
    "chrome_json",
    "export_otlp",
    "otlp_json",
    "run_trace",
    "trace_id_of",
]
