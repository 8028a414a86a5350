"""``python -m benchmarks NAME|all [--quick] [--repeat K] [--out-dir DIR] [--cap S]``.

To add a benchmark, write a module with ``main(quick, repeat, out_dir) -> dict`` and add one
line to :data:`BENCHMARKS`. A benchmark whose runs may take too long today also takes
``cap_s``: ``--cap`` seconds after which a run is stopped and reported as skipped.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# name -> module; imported only when run, so one broken benchmark never blocks the others.
BENCHMARKS: dict[str, str] = {
    "append": "benchmarks.append",
    "read": "benchmarks.read",
    "loop": "benchmarks.loop",
    "chain": "benchmarks.chain",
    "peers": "benchmarks.peers",
    "backends": "benchmarks.backends",
    "state": "benchmarks.state",
    "restore": "benchmarks.restore",
}

Main = Callable[..., dict[str, Any]]


def load(name: str) -> Main:
    """The ``main`` function of the registered benchmark ``name``."""
    main: Main = importlib.import_module(BENCHMARKS[name]).main
    return main


def run(argv: Sequence[str] | None = None) -> None:
    """Parses the command line and runs the chosen benchmarks one after the other."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement (5)")
    parser.add_argument("--out-dir", type=Path, default=None, help="where NAME.json goes")
    parser.add_argument(
        "--cap",
        type=float,
        default=None,
        metavar="S",
        help="seconds one run may take before it is reported as skipped (state: 120)",
    )
    args = parser.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (2 if args.quick else 5)
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    for name in names:
        print(f"== {name}")
        main = load(name)
        options: dict[str, Any] = {}
        if args.cap is not None and "cap_s" in inspect.signature(main).parameters:
            options["cap_s"] = args.cap
        main(quick=args.quick, repeat=repeat, out_dir=args.out_dir, **options)


if __name__ == "__main__":
    run()
