"""Workers: processes (on one machine or many) that pick up any run that needs work.

A worker claims runs of its workflow that no live executor owns (new runs from
``wf.submit``, runs whose executor died, waiting runs whose answer arrived) and resumes
them; ownership (kernel locks on SQLite, leases on PostgreSQL) makes sure one worker
runs a run at a time, and epochs fence a worker that lost a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING, Final

from ._errors import DeprecatedPatchError, RunAbandonedError, RunLostError, WorkflowError
from ._handler import executor_of
from ._recover import has_work
from ._state import TERMINAL

if TYPE_CHECKING:
    from ._handler import WorkflowHandler
    from ._workflow import Workflow

__all__ = ["Worker"]

POLL_S: Final = 0.2
_log: Final = logging.getLogger("workflow")


class Worker:
    """Claims and executes runs of ``workflow`` until stopped.

    :param concurrency: how many runs it executes at once.
    :param poll_interval: seconds between looks for work when it has none to do; it also
        looks each time one of its runs ends, and (on PostgreSQL) when an answer is posted.

    A run this worker loses to another executor (its lease lapsed while the host was cut
    off or stalled; the epoch fence refuses what it still commits) is logged as a warning
    on the ``workflow`` logger, counted in :attr:`lost`, and not in :attr:`completed`.
    """

    def __init__(self, workflow: Workflow, *, concurrency: int = 4, poll_interval: float = POLL_S):
        self.workflow = workflow
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.completed = 0
        self.lost = 0
        self._active: dict[str, WorkflowHandler] = {}
        # Runs this code refused (ctx.deprecate_patch): left for a worker of code that keeps
        # the patch; claiming them again would only count starts toward the recovery limit.
        self._refused: set[str] = set()
        self._stopping = False
        self._nudge: asyncio.Event | None = None

    def stop(self) -> None:
        """Asks the worker to stop: it takes no new run and leaves running ones unfinished."""
        self._stopping = True
        if self._nudge is not None:
            self._nudge.set()

    def _candidates(self) -> list[str]:
        """Runs to take: read in a thread, so the event loop goes on meanwhile (each read is
        a round trip to a PostgreSQL server)."""
        wf = self.workflow
        out = []
        for r in wf.runs(all_workflows=False):
            if r.run_id in self._active or r.run_id in self._refused or r.copied_upto is not None:
                continue  # an exported ancestor (its log ends at its fork) never runs here
            if r.status in ("interrupted", "submitted"):
                out.append(r.run_id)
            elif (
                r.status == "waiting"
                and has_work(wf, r)
                and not wf.__workflow_parts__.owners.is_owned(r.run_id, wf.store.run(r.run_id).rid)
            ):
                out.append(r.run_id)  # an answer arrived (or a deadline passed), nobody runs it
        return out

    async def _finish(self, run_id: str, handler: WorkflowHandler) -> None:
        executor = executor_of(handler)
        try:
            await handler
        except RunAbandonedError:
            return
        except DeprecatedPatchError as exc:
            self._refused.add(run_id)
            _log.warning("worker: %s; this worker leaves it alone from now on", exc)
            return
        except RunLostError as exc:
            self.lost += 1
            _log.warning("worker: %s; the other executor goes on with it", exc)
            return
        except Exception:  # the run failed: recorded in its log, nothing for the worker to do
            pass
        finally:
            # A slot is free: look for more work now, not at the next poll (a backlog of
            # submitted runs is worked through at the speed of the runs, not of polling).
            # Only after a run whose end its log records: one that stopped without (lost,
            # left, or failing before its steps, which a look now would take up again at
            # once) is looked at again at the poll's pace.
            ended = executor is None or executor.folded.status in TERMINAL
            if self._nudge is not None and not self._stopping and ended:
                self._nudge.set()
            self._active.pop(run_id, None)
        self.completed += 1

    async def run(self, *, handle_signals: bool = False) -> int:
        """Works until :meth:`stop` (or SIGTERM/SIGINT with ``handle_signals``).

        On stopping, runs in progress are abandoned cleanly (their leases or locks are
        released at once) so that another worker re-runs their unfinished steps. Returns
        how many runs this worker saw end.
        """
        loop = asyncio.get_running_loop()
        nudge = self._nudge = asyncio.Event()

        # An answer posted for a waiting run (any host, on PostgreSQL) wakes the worker.
        def posted(run_id: str) -> None:
            if not self._stopping:
                loop.call_soon_threadsafe(nudge.set)

        self.workflow.store.on_post(posted)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                free = self.concurrency - len(self._active)
                found = await asyncio.to_thread(self._candidates) if free > 0 else []
                for run_id in found[:free]:
                    if self._stopping:
                        break
                    try:
                        handler = self.workflow.resume(run_id)
                    except WorkflowError:
                        continue  # another worker took it first, or it cannot continue
                    if handler.is_done():
                        continue
                    self._active[run_id] = handler
                    task = loop.create_task(self._finish(run_id, handler))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await nudge.wait()
                nudge.clear()
        finally:
            for handler in list(self._active.values()):
                executor = executor_of(handler)
                if executor is not None:
                    executor.abandon()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        return self.completed
