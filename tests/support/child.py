"""A child process a test starts and is sure to be rid of, whatever the test does."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

__all__ = ["child"]

# What ``subprocess.Popen`` takes for a stream: PIPE, DEVNULL, STDOUT, a descriptor or a file.
_Stream = int | IO[Any] | None


@contextlib.contextmanager
def child(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdout: _Stream = None,
    stderr: _Stream = None,
) -> Iterator[subprocess.Popen[str]]:
    """Starts ``args`` (text mode) and yields the process; on the way out, also when the
    test fails, kills it if it is still alive, reaps it and closes its pipes, so no process
    is left running and no pipe leaks (a ResourceWarning is an error in this suite)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
