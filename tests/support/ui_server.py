"""A real ``workflow serve`` in a subprocess, for the web UI's HTTP and browser tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.flows import Asker

ROOT = Path(__file__).resolve().parent.parent.parent


@contextlib.contextmanager
def server(
    db: Path | str, *args: str, cwd: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Starts ``workflow serve DB --port 0 ARGS`` (in ``cwd``) and yields its process and
    base URL; stops it after (if it is still running)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "workflow", "serve", str(db), "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
        assert m, line + proc.stderr.read()
        yield proc, m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@contextlib.contextmanager
def serving(db: Path | str, *args: str, cwd: Path = ROOT) -> Iterator[str]:
    """Starts ``workflow serve DB --port 0 ARGS`` (in ``cwd``) and yields its base URL; stops
    it after."""
    with server(db, *args, cwd=cwd) as (_, base):
        yield base


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET; error statuses are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def post(url: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    """(status, decoded JSON answer) of a POST of ``body`` as JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(check: Any, what: str, timeout: float = 60) -> Any:
    """Polls ``check()`` until it returns something truthy (a run reaching a status)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def status_of(base: str, run_id: str) -> str:
    """The run's status as the UI's state endpoint gives it."""
    code, _, body = get(f"{base}/runs/{run_id}/state")
    assert code == 200, body
    return str(json.loads(body)["status"])


def waiting_asker(db: Path, run_id: str) -> None:
    """An Asker run left waiting for its answer (suspended: no process runs it)."""

    async def go() -> None:
        wf = Asker(store=db, timeout=None)
        h = wf.run(run_id=run_id)
        await h.wait_until_waiting(30)
        await h.suspend()
        with pytest.raises(Exception, match="suspend"):
            await h
        wf.store.close()

    asyncio.run(go())
