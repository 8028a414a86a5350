"""``workflow trace``: a run's log as OpenTelemetry spans, crashed runs and resumes included.

The JSON outputs are checked for their structure (OTLP-JSON as Jaeger reads it, Chrome
trace events as Perfetto reads them); the OTLP export goes through the SDK's in-memory
exporter (the otel extra is part of the dev install).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from eventstore import EventStore
from tests.flows import Asker, ReportFlow
from tests.test_timeline import always_dies, crashed_then_resumed
from workflow import HumanResponseEvent
from workflow._trace import DIED, Trace, chrome_json, export_otlp, otlp_json, run_trace
from workflow.cli import _trace as cli_trace
from workflow.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def _trace(db: Path, run_id: str) -> Trace:
    store = EventStore(db, readonly=True)
    try:
        return run_trace(store, run_id)
    finally:
        store.close()


def _named(trace: Trace, prefix: str) -> list[Any]:
    return [s for s in trace.spans if s.name.startswith(prefix)]


def _otlp_spans(data: dict[str, Any]) -> list[dict[str, Any]]:
    (resource,) = data["resourceSpans"]
    (scope,) = resource["scopeSpans"]
    spans: list[dict[str, Any]] = scope["spans"]
    return spans


def _attr(span: dict[str, Any], key: str) -> Any:
    for a in span["attributes"]:
        if a["key"] == key:
            return next(iter(a["value"].values()))
    raise KeyError(key)


def test_a_crashed_and_resumed_run_is_two_linked_executions(tmp_path: Path) -> None:
    """The first process died mid-step: its execution ends in error, the resume is a second
    execution whose link names the first, and every attempt sits under its execution."""
    db = tmp_path / "t.db"
    run_id = crashed_then_resumed(db)
    trace = _trace(db, run_id)
    root = trace.spans[0]
    assert root.parent_id is None
    assert root.attributes["workflow.status"] == "finished"
    first, resumed = _named(trace, "execute") + _named(trace, "resume")
    assert first.error is not None
    assert "died" in first.error
    assert resumed.error is None
    assert resumed.attributes["workflow.previous_status"] == "running"
    assert [(ln.trace_id, ln.span_id) for ln in resumed.links] == [(trace.trace_id, first.span_id)]
    steps = {s.name: s for s in _named(trace, "step ")}
    assert steps["step start"].parent_id == first.span_id
    assert steps["step process"].parent_id == first.span_id
    assert steps["step finish"].parent_id == resumed.span_id
    assert all(s.attributes["workflow.outcome"] == "ok" for s in steps.values())
    for span in trace.spans[1:]:
        assert root.start_us <= span.start_us <= span.end_us <= root.end_us
    commits = [e for x in (first, resumed) for e in x.events if e.name == "commit"]
    seqs = [int(e.attributes["workflow.seq"]) for e in commits]
    assert seqs == sorted(seqs)
    assert seqs[-1] == EventStore(db, readonly=True).run(run_id).last_seq


def test_a_run_that_kept_dying_has_an_execution_per_process(tmp_path: Path) -> None:
    """Three processes died running it (then the recovery limit failed it): each one an
    execution in error, chained by links."""
    db = tmp_path / "t.db"
    run_id = always_dies(db)
    trace = _trace(db, run_id)
    executions = _named(trace, "execute") + _named(trace, "resume")
    assert len(executions) >= 3
    for before, after in itertools.pairwise(executions):
        assert [ln.span_id for ln in after.links] == [before.span_id]
    assert all(x.error for x in executions[:3])


def test_an_attempt_the_process_died_in_is_lost(tmp_path: Path) -> None:
    """Killed (SIGKILL) during a step: the attempt ends as lost, in error, at the last record."""
    db = tmp_path / "t.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.flows", "sleeper", str(db), "run", "slow"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 30
        started = False
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
            if not db.exists():
                continue
            with contextlib.suppress(Exception):
                store = EventStore(db, readonly=True)
                try:
                    started = any(True for _ in store.records("slow", kinds=["step_started"]))
                finally:
                    store.close()
        assert started, "the step's start never reached the log"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    trace = _trace(db, "slow")
    assert trace.spans[0].attributes["workflow.status"] == "interrupted"
    (attempt,) = _named(trace, "step start")
    assert attempt.attributes["workflow.outcome"] == "lost"
    assert attempt.error is not None
    assert attempt.error.startswith(DIED)
    (execution,) = _named(trace, "execute")
    assert execution.error is not None


async def test_a_failed_attempt_carries_its_exception_and_a_wait_its_answer(
    tmp_path: Path,
) -> None:
    db = tmp_path / "t.db"
    wf = ReportFlow(store=db)
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    trace = run_trace(wf.store, h.run_id)
    (failed,) = _named(trace, "step finish")
    assert failed.attributes["workflow.outcome"] == "failed"
    assert failed.error is not None
    assert "var is not set" in failed.error
    (exc,) = [e for e in failed.events if e.name == "exception"]
    assert exc.attributes["exception.type"].endswith("ValueError")
    assert "raise ValueError" in str(exc.attributes["exception.stacktrace"])
    assert trace.spans[0].error == "the run failed"

    asker = Asker(store=tmp_path / "a.db")
    ah = asker.run(run_id="asks")
    await ah.wait_until_waiting()
    await ah.suspend()
    with contextlib.suppress(Exception):
        await ah
    open_wait = _named(run_trace(asker.store, "asks"), "wait ")
    assert [w.attributes["workflow.outcome"] for w in open_wait] == ["open"]
    asker.send("asks", HumanResponseEvent(response="Ada"))
    assert await asker.resume("asks") == "hello Ada"
    trace = run_trace(asker.store, "asks")
    (wait,) = _named(trace, "wait HumanResponseEvent")
    assert wait.parent_id == trace.spans[0].span_id  # a wait outlives its process
    assert wait.attributes["workflow.outcome"] == "answered"
    assert wait.end_us > wait.start_us
    resumed = _named(trace, "resume")
    assert resumed
    assert resumed[0].attributes["workflow.previous_status"] == "waiting"
    assert resumed[0].links
    assert not any(x.error for x in _named(trace, "execute") + resumed)


async def test_a_fork_links_to_its_parent_run(tmp_path: Path) -> None:
    wf = ReportFlow(store=tmp_path / "t.db")
    h = wf.run()
    with pytest.raises(ValueError, match="var"):
        await h
    parent = run_trace(wf.store, h.run_id)
    fork = wf.run_from((h.run_id, wf.store.run(h.run_id).last_seq or 0), updates={"var": 1})
    await fork
    trace = run_trace(wf.store, fork.run_id)
    (link,) = trace.spans[0].links
    assert (link.trace_id, link.span_id) == (parent.trace_id, parent.spans[0].span_id)
    assert trace.trace_id != parent.trace_id
    assert run_trace(wf.store, fork.run_id) == trace  # the same log gives the same trace


def test_otlp_json_is_what_jaeger_reads(tmp_path: Path) -> None:
    """OTLP-JSON: hex ids of the right length, times as strings of nanoseconds, parents that
    exist, typed attributes, the resume's link, status codes."""
    db = tmp_path / "t.db"
    run_id = crashed_then_resumed(db)
    result = CliRunner().invoke(cli, ["trace", str(db), run_id, "-o", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert _attr(data["resourceSpans"][0]["resource"], "service.name").endswith("DiesOnce")
    spans = _otlp_spans(data)
    ids = {s["spanId"] for s in spans}
    assert len(ids) == len(spans)
    trace_ids = {s["traceId"] for s in spans}
    assert len(trace_ids) == 1
    assert all(len(t) == 32 and int(t, 16) for t in trace_ids)
    for s in spans:
        assert len(s["spanId"]) == 16
        assert s.get("parentSpanId", next(iter(ids))) in ids
        assert int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
        assert s["kind"] == 1
        assert s["status"]["code"] in (1, 2)
    (resume,) = [s for s in spans if s["name"] == "resume"]
    (execute,) = [s for s in spans if s["name"] == "execute"]
    assert resume["links"][0]["spanId"] == execute["spanId"]
    assert execute["status"]["code"] == 2
    assert _attr(resume, "workflow.execution") == "2"  # int64 as a string
    printed = CliRunner().invoke(cli, ["trace", str(db), run_id])
    assert json.loads(printed.output) == data


def test_chrome_trace_events_are_what_perfetto_reads(tmp_path: Path) -> None:
    """Chrome trace events: complete events with microsecond times from the run's start, a
    named thread per lane, instant events for commits, a flow arrow per resume."""
    db = tmp_path / "t.db"
    run_id = crashed_then_resumed(db)
    out = tmp_path / "t.chrome.json"
    result = CliRunner().invoke(
        cli, ["trace", str(db), run_id, "--format", "chrome", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    events = data["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"run", "executions", "step start", "step finish"} <= set(threads.values())
    complete = [e for e in events if e["ph"] == "X"]
    assert complete[0]["name"] == "run DiesOnce"
    assert complete[0]["ts"] == 0
    for e in complete:
        assert e["tid"] in threads
        assert e["ts"] >= 0
        assert e["dur"] >= 1
    assert any(e["ph"] == "i" and e["name"] == "commit" for e in events)
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 1
    assert starts[0]["id"] == ends[0]["id"]
    assert starts[0]["ts"] <= ends[0]["ts"]
    assert chrome_json(_trace(db, run_id)) == data


def test_the_otlp_export_goes_through_the_sdk_with_the_logs_ids(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    run_id = crashed_then_resumed(db)
    trace = _trace(db, run_id)
    exporter = InMemorySpanExporter()
    export_otlp(trace, exporter)
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == [s.name for s in trace.spans]
    by_name = {s.name: s for s in finished}
    as_json = {s["name"]: s for s in _otlp_spans(otlp_json(trace))}
    for span in finished:
        ctx = span.get_span_context()
        assert ctx is not None
        assert f"{ctx.trace_id:032x}" == trace.trace_id
        assert f"{ctx.span_id:016x}" == as_json[span.name]["spanId"]
        assert span.start_time == int(as_json[span.name]["startTimeUnixNano"])
        assert span.end_time == int(as_json[span.name]["endTimeUnixNano"])
        if span.parent is not None:
            assert f"{span.parent.span_id:016x}" == as_json[span.name]["parentSpanId"]
    resume, execute = by_name["resume"], by_name["execute"]
    assert [ln.context.span_id for ln in resume.links] == [execute.get_span_context().span_id]  # type: ignore[union-attr]
    assert execute.status.status_code is StatusCode.ERROR
    assert by_name["step finish"].status.status_code is StatusCode.OK
    assert finished[0].resource.attributes["service.name"] == trace.service
    assert any(e.name == "commit" for e in resume.events)


def test_without_the_otel_extra_the_error_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> str:
        wf = ReportFlow(store=tmp_path / "t.db")
        h = wf.run()
        with pytest.raises(ValueError, match="var"):
            await h
        wf.store.close()
        return h.run_id

    run_id = asyncio.run(go())
    for name in [m for m in sys.modules if m.startswith("opentelemetry")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    trace = _trace(tmp_path / "t.db", run_id)
    with pytest.raises(ImportError, match=r"durable-workflows\[otel\]"):
        export_otlp(trace, object())
    result = CliRunner().invoke(
        cli, ["trace", str(tmp_path / "t.db"), run_id, "--otlp", "http://127.0.0.1:4318"]
    )
    assert result.exit_code == 1
    assert "pip install 'durable-workflows[otel]'" in result.output


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    EventStore(db).close()
    runner = CliRunner()
    missing = runner.invoke(cli, ["trace", str(db), "nope"])
    assert missing.exit_code == 1
    assert "nope" in missing.output
    bad_url = runner.invoke(cli, ["trace", str(db), "nope", "--otlp", "localhost:4318"])
    assert bad_url.exit_code == 2
    assert "http(s) URL" in bad_url.output
    both = runner.invoke(cli, ["trace", str(db), "x", "-o", "f.json", "--otlp", "http://h:4318"])
    assert both.exit_code == 2
    assert "not both" in both.output


class _Collector(http.server.BaseHTTPRequestHandler):
    """A collector's OTLP/HTTP traces endpoint that keeps what it is sent."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


def test_otlp_reaches_a_collector_and_an_unreachable_one_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--otlp URL` posts the spans (protobuf, to /v1/traces when the URL has no path); a
    port nobody listens on fails the command with the endpoint named."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    db = tmp_path / "t.db"
    run_id = crashed_then_resumed(db)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        result = CliRunner().invoke(cli, ["trace", str(db), run_id, "--otlp", url])
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0, result.output
    assert f"to {url}/v1/traces" in result.output
    request = ExportTraceServiceRequest()
    request.ParseFromString(b"".join(_Collector.bodies))
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    expected = _trace(db, run_id)
    assert sorted(s.name for s in spans) == sorted(s.name for s in expected.spans)
    assert {s.trace_id.hex() for s in spans} == {expected.trace_id}

    # The exporter retries an unreachable collector with backoff for up to the command's
    # timeout (5 s): within 1 s, it gives up after the first backoff it draws.
    monkeypatch.setattr(cli_trace, "EXPORT_TIMEOUT_S", 1.0)
    with socket.socket() as sock:  # a port that was free a moment ago: nobody listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = CliRunner().invoke(cli, ["trace", str(db), run_id, "--otlp", f"http://127.0.0.1:{port}"])
    assert gone.exit_code == 1
    assert f"127.0.0.1:{port}/v1/traces" in gone.output
    assert "is a collector listening there?" in gone.output
