"""A child process for ``benchmarks restore``: one ``workflow`` command run in this fresh
process, timed from its call to its last line of output (the interpreter's start and the
imports are measured apart). Prints ``{"import_s": ..., "command_s": ...}`` as JSON.

Usage: ``python -m benchmarks._cli_child ARGS...`` (the command line's arguments).
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import contextlib  # noqa: E402 - the clock above starts before the imports it measures
import io  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

from workflow.cli import cli  # noqa: E402


def main(argv: list[str]) -> dict[str, float]:
    """Runs the command; its output goes nowhere (what a pipe to ``head`` costs aside)."""
    imported = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(argv, prog_name="workflow", standalone_mode=False)
    done = time.perf_counter()
    if not out.getvalue():
        msg = f"workflow {' '.join(argv)} printed nothing"
        raise SystemExit(msg)
    shown = len(out.getvalue())
    return {"import_s": imported - _START, "command_s": done - imported, "bytes": shown}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
