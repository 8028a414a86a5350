"""Creates new stores and is killed doing it: the subprocess side of the creation crash test.

Run as ``python tests/crash/creator.py DIR TRIALS SEED`` with the repo root on PYTHONPATH.
It first times a few whole creations (each in a forked child, as below) and prints
``CALIBRATED SECONDS``. Then, per trial ``n``, it forks a child that opens a new store at
``DIR/store-n.db`` (``EventStore(path)``, the first start of a service) and kills it with
SIGKILL after a delay drawn uniformly across the time a creation takes, so that the kills
land at random moments of the creation. In every fourth trial a second child opens the same
new file at the same moment and is left alone: it must succeed while the other one dies.
Each trial prints ``TRIAL n killed`` (the kill came before the child was done) or ``TRIAL n
exited=STATUS`` (it was done first: 0 when it opened the store) and, with a racer,
`` racer=STATUS`` (the racer's exit status).
Forking keeps a trial at a few milliseconds: the children do not import anything again.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import sys
import time

from eventstore import EventStore

CALIBRATION_RUNS = 7


def say(line: str) -> None:
    """Prints one line of the report and flushes it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def create(path: str, durability: str) -> int:
    """In a forked child: opens (creates) the store, then exits without closing it."""
    try:
        EventStore(path, durability=durability)  # type: ignore[arg-type]
    except BaseException as exc:
        os.write(2, f"{path}: {type(exc).__name__}: {exc}\n".encode())
        os._exit(1)
    os._exit(0)


def spawn(path: str, durability: str) -> int:
    """Forks a child that creates the store at ``path``; returns its pid."""
    pid = os.fork()
    if pid == 0:
        create(path, durability)
    return pid


def calibrate(root: str) -> float:
    """The median time, fork to exit, of a whole creation."""
    times = []
    for i in range(CALIBRATION_RUNS):
        t0 = time.perf_counter()
        _, status = os.waitpid(spawn(os.path.join(root, f"calibrate-{i}.db"), "normal"), 0)
        times.append(time.perf_counter() - t0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"calibration creation {i} failed")
    return statistics.median(times)


def main() -> None:
    """Runs the trials described in the module docstring."""
    root, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    took = calibrate(root)
    say(f"CALIBRATED {took:.6f}")
    for n in range(trials):
        path = os.path.join(root, f"store-{n}.db")
        durability = rng.choice(["normal", "full"])
        victim = spawn(path, durability)
        racer = spawn(path, durability) if n % 4 == 3 else None
        time.sleep(rng.uniform(0, took * 1.25))
        done, status = os.waitpid(victim, os.WNOHANG)
        if done:
            line = f"TRIAL {n} exited={os.waitstatus_to_exitcode(status)}"
        else:
            os.kill(victim, signal.SIGKILL)
            os.waitpid(victim, 0)
            line = f"TRIAL {n} killed"
        if racer is not None:
            _, status = os.waitpid(racer, 0)
            line += f" racer={os.waitstatus_to_exitcode(status)}"
        say(line)


if __name__ == "__main__":
    main()
