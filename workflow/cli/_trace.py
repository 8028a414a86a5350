"""``workflow trace``: a run's attempts, waits and commits as OpenTelemetry spans."""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import click
import orjson

from .._trace import OTEL_MISSING, ExportError, chrome_json, export_otlp, otlp_json, run_trace
from ._app import cli
from ._inspect import open_store

__all__ = ["trace"]

# How long the exporter tries a collector (its retries included) before the command fails.
EXPORT_TIMEOUT_S: Final = 5.0


def _traces_url(url: str) -> str:
    """The collector's OTLP/HTTP traces endpoint: a bare ``http://host:4318`` gets the
    standard path ``/v1/traces``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        msg = f"--otlp takes a collector's http(s) URL (http://localhost:4318), not {url!r}"
        raise click.BadParameter(msg)
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/v1/traces"


@cli.command()
@click.argument("db")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the trace to this file (default: print it).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["otlp", "chrome"]),
    default="otlp",
    show_default=True,
    help="otlp: OTLP-JSON, which Jaeger opens; chrome: trace events, which Perfetto opens.",
)
@click.option(
    "--otlp",
    "collector",
    metavar="URL",
    help="Send the spans to an OTLP/HTTP collector instead (needs the otel extra).",
)
def trace(db: str, run: str, output: str | None, fmt: str, collector: str | None) -> None:
    """Export RUN as OpenTelemetry spans rebuilt from the log: the run, each execution
    (each resume linked to the one before), step attempts, waits, and commits as events.

    Works on crashed runs too: an attempt the process died in ends as "lost".
    """
    if collector is not None and output is not None:
        msg = "give either -o FILE or --otlp URL, not both"
        raise click.UsageError(msg)
    endpoint = None if collector is None else _traces_url(collector)
    store = open_store(db)
    spans = run_trace(store, run)
    if endpoint is not None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise click.ClickException(OTEL_MISSING) from None
        try:
            export_otlp(spans, OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S))
        except ExportError as exc:
            msg = f"{endpoint}: {exc}; is a collector listening there?"
            raise click.ClickException(msg) from None
        click.echo(f"sent {len(spans.spans)} spans of run {run} to {endpoint}")
        return
    data = otlp_json(spans) if fmt == "otlp" else chrome_json(spans)
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    if output is None:
        click.echo(text)
        return
    Path(output).write_text(text + "\n", encoding="utf-8")
    click.echo(f"wrote {output} ({len(spans.spans)} spans, {fmt})")
