"""Cancel, then resume: a resume that waits, for a bounded time, until the executor a run
was cancelled from lets go of it.

``workflow cancel`` takes a run over and records ``run_cancelled`` at once, but the
executor that was running it (another process) lets go only once it notices (``_takeover``:
within a second), or, if a step blocks its event loop, at its next commit, which the store
refuses: when that step ends. A resume meanwhile is refused with
:class:`RunCancellingError`; :func:`resume_when_let_go` tries again until it succeeds or the
bound passes, then raises that error (saying what holds the run and how long it waited).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ._errors import RunCancellingError

if TYPE_CHECKING:
    from ._handler import WorkflowHandler

__all__ = ["CANCELLING_POLL_S", "CANCELLING_WAIT_S", "resume_when_let_go"]

# How long a resume of a run just cancelled waits by default for its old executor to let
# go, and how often it tries again meanwhile.
CANCELLING_WAIT_S: Final = 30.0
CANCELLING_POLL_S: Final = 0.1


async def resume_when_let_go(
    resume: Callable[[], WorkflowHandler],
    *,
    wait_s: float = CANCELLING_WAIT_S,
    on_wait: Callable[[RunCancellingError], Any] | None = None,
    poll_s: float = CANCELLING_POLL_S,
) -> WorkflowHandler:
    """Calls ``resume`` (a ``wf.resume(..., cancelled=True)``) until the run's old executor
    has let go, for at most ``wait_s`` seconds; ``on_wait`` is told once, before waiting.

    :raises RunCancellingError: the old executor still held the run after ``wait_s``
        seconds (the error names it and says it waited that long).
    """
    loop = asyncio.get_running_loop()
    began = loop.time()
    told = False
    while True:
        try:
            return resume()
        except RunCancellingError as exc:
            waited = loop.time() - began
            if waited >= wait_s:  # the error says the bound it waited for
                raise RunCancellingError(
                    exc.run_id, exc.detail, exc.lapses_at, waited=wait_s
                ) from None
            if not told and on_wait is not None:
                on_wait(exc)
            told = True
            await asyncio.sleep(min(poll_s, max(0.0, wait_s - waited)))
