"""Calling into a run's event loop from a synchronous step's worker thread.

A context's ``write_event_to_stream`` and ``collect_events`` change the executor's state,
which only its event loop may touch; a synchronous step runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

__all__ = ["on_loop"]

T = TypeVar("T")


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> T:
    """Runs ``fn`` on ``loop``: at once from there, else (a worker thread) by handing it to
    the loop and waiting for its outcome (an exception it raises is raised here)."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:
        return fn()
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()

    def call() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed back to the thread that asked
            fut.set_exception(exc)

    loop.call_soon_threadsafe(call)
    return fut.result()
