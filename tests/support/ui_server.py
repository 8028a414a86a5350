"""A real ``workflow serve`` in a subprocess, for the web UI's HTTP and browser tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import selectors
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.flows import Asker

ROOT = Path(__file__).resolve().parent.parent.parent


# The longest a server may take to start or stop: only a broken one ever reaches it.
BOUND_S = 60.0


@contextlib.contextmanager
def server(
    db: Path | str, *args: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Starts ``workflow serve DB ARGS --port 0`` (in ``cwd``, with ``env`` or this
    process's environment) and yields its process and base URL; stops it after (if it is
    still running). ``--port 0`` comes last, so it wins over a port in ARGS (a README's)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "workflow", "serve", str(db), *args, "--port", "0"],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        # A hang guard: the server says where it listens within seconds, or it is broken.
        # (A selector, not select(): a long suite's descriptors go past select's 1024.)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            assert sel.select(BOUND_S), f"workflow serve said nothing in {BOUND_S:g} s"
        line = proc.stderr.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
        assert m, line + proc.stderr.read()
        yield proc, m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@contextlib.contextmanager
def serving(
    db: Path | str, *args: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Starts ``workflow serve DB ARGS --port 0`` (in ``cwd``, with ``env`` or this
    process's environment) and yields its base URL; stops it after."""
    with server(db, *args, cwd=cwd, env=env) as (_, base):
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
