"""Recovery at startup: what ``Workflow.recover()`` did with each pending run, and why.

A service's first act is to continue the runs a dead process left behind. Each pending run
gets a :class:`Recovery` saying what happened to it, and each is logged on the ``workflow``
logger, so that a startup can report what it resumed and what needs a person.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from eventstore import LogCorruptedError, UnknownClassError

from ._errors import RunOwnedError, WorkflowChangedError
from ._fold import payload_of
from ._handler import executor_of
from ._names import same_name
from ._read import waits_of

if TYPE_CHECKING:
    from ._facade_protocol import Facade
    from ._handler import WorkflowHandler
    from ._journal import RunStarted
    from ._read import RunSummary
    from ._verify import Problem

__all__ = [
    "Recoveries",
    "Recovery",
    "RecoveryOutcome",
    "is_run_of",
    "recover",
    "same_name",
]

# What recover() did with a run: see Recovery.
RecoveryOutcome = Literal[
    "resumed", "waiting", "owned", "stranded", "incompatible", "recovery_limit", "failed"
]

# The problems of a static verify that keep recover(compatible_only=True) from resuming a
# run: what it holds no longer decodes, or its pending work no longer routes or would be
# refused by a deprecated patch the workflow declares (``_patch_check``). Graph and
# output differences concern work already done and are only reported by verify.
BLOCKING: Final = frozenset({"decode", "route", "patch"})

_log: Final = logging.getLogger("workflow")


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`Workflow.recover` did with one pending run.

    ``outcome`` is one of:

    - ``"resumed"``: the run continues in this process; await ``handler`` for its result.
    - ``"waiting"``: the run has nothing to do but wait for an event that nobody has sent
      yet (its inbox is empty, no wait's deadline has passed); it was left as it is, not
      claimed, and nothing of it ran again. Send the event (``wf.send``), then resume it,
      or recover again, or let a worker take it.
    - ``"owned"``: another live executor (another process) took the run after it was
      listed as pending; it was left to it. ``error`` is the :class:`RunOwnedError`.
    - ``"stranded"``: the log holds work or classes this code cannot take: queued or
      in-progress events for steps that no longer exist or no longer accept them
      (:class:`WorkflowChangedError` lists them), or a class that does not resolve
      (:class:`~eventstore.UnknownClassError` names it). Nothing was changed; run code
      that fits, or resume with ``allow_stranded=True``.
    - ``"incompatible"``: with ``compatible_only=True``, a static verify of the run
      (:func:`workflow._verify.verify`, nothing executed) found that something it holds no
      longer decodes, that pending work no longer routes, or that started work would be
      refused by a patch the workflow declares in ``deprecated_patches``; it was not resumed
      and nothing of it ran. ``problems`` lists what verify found, ``error`` is the
      :class:`WorkflowChangedError` that says it in one message.
    - ``"recovery_limit"``: an input was started ``max_recovery_attempts`` times without
      ever ending (it probably kills the process); the run is now recorded as failed.
      ``error`` is the :class:`RecoveryLimitError` that awaiting ``handler`` raises.
    - ``"failed"``: resuming raised anything else (a damaged record, an I/O error);
      ``error`` says what. Nothing was changed.
    """

    run_id: str
    outcome: RecoveryOutcome
    handler: WorkflowHandler | None = None
    error: BaseException | None = None
    waiting_for: tuple[str, ...] = ()  # ``waiting``: the awaited classes' qualified names
    problems: tuple[Problem, ...] = ()  # ``incompatible``: what the static verify found


def is_run_of(wf: Facade, run: RunSummary) -> bool:
    """Whether ``run`` is a run of ``wf``'s workflow: its class's module and qualified name.

    A script's run records its module as ``__main__``: such a run of the same qualified name
    is ``wf``'s when the steps its first record lists share a step with ``wf`` (a log too old
    to list them counts as ``wf``'s), so another module's same-named workflow does not take
    it; a class of this process's ``__main__`` owns the runs recorded under the module names
    its file imports as. Another module's class of the same name is another workflow.
    """
    parts = wf.__workflow_parts__
    if not same_name(run.workflow, type(wf)):
        return False
    if not run.workflow.startswith("__main__:") or parts.name.startswith("__main__:"):
        return True
    known = parts.script_runs.get(run.run_id)
    if known is None:
        known = parts.script_runs[run.run_id] = _shares_a_step(wf, run)
    return known


def _shares_a_step(wf: Facade, run: RunSummary) -> bool:
    """Whether the steps a run's first record lists meet ``wf``'s (True when it lists none)."""
    if run.first_seq is None:
        return True
    try:
        first = next(iter(wf.store.records(run.run_id, upto=run.first_seq)), None)
        started: RunStarted | None = None if first is None else payload_of(first)
    except LogCorruptedError:
        return True  # resuming it reports the damage
    graph = started.get("graph") if isinstance(started, dict) else None
    if not isinstance(graph, dict) or not graph:
        return True
    return not graph.keys().isdisjoint(wf.__workflow_parts__.graph.steps)


def _unresolved(exc: BaseException) -> bool:
    """Whether a class the log names does not resolve, whatever error carries that."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, UnknownClassError):
            return True
        seen = seen.__cause__
    return False


class Recoveries(list[Recovery]):
    """What :meth:`Workflow.recover` did with each pending run: a list of
    :class:`Recovery`, which ``await`` gives back as it is.

    The runs are resumed by the call itself, so ``wf.recover()`` and
    ``await wf.recover()`` do the same, once.
    """

    def __await__(self) -> Generator[Any, None, Recoveries]:
        return self._itself().__await__()

    async def _itself(self) -> Recoveries:
        return self


def has_work(wf: Facade, run: RunSummary) -> bool:
    """Whether a pending run needs an executor: it is interrupted, or it waits and an event
    is in its inbox or one of its waits' deadlines has passed. A run that only waits for an
    event nobody sent would be claimed, and the code before its wait run, for nothing."""
    if run.status != "waiting":
        return True
    if wf.store.inbox(run.run_id):
        return True
    info = wf.store.get_run(run.run_id)
    if info is None:
        return True  # let the resume say what happened to it
    now = time.time()
    return any(deadline is not None and deadline <= now for _, deadline in waits_of(wf.store, info))


def _recover_one(wf: Facade, run_id: str) -> Recovery:
    try:
        handler = wf.resume(run_id)
    except RunOwnedError as exc:  # another executor took it since it was listed
        return Recovery(run_id, "owned", error=exc)
    except WorkflowChangedError as exc:
        return Recovery(run_id, "stranded", error=exc)
    except Exception as exc:
        if _unresolved(exc):
            return Recovery(run_id, "stranded", error=exc)
        return Recovery(run_id, "failed", error=exc)
    executor = executor_of(handler)
    if executor is not None:
        # The resume ends such a run itself (once it holds it); say so now.
        limit = executor.recovery_limit()
        if limit is not None:
            return Recovery(run_id, "recovery_limit", handler, limit)
    return Recovery(run_id, "resumed", handler)


def _log_one(r: Recovery) -> None:
    if r.outcome == "resumed":
        _log.info("recover: run %s resumed", r.run_id)
    elif r.outcome == "waiting":
        _log.info(
            "recover: run %s left waiting for %s", r.run_id, ", ".join(r.waiting_for) or "an event"
        )
    elif r.outcome == "owned":
        _log.info("recover: run %s left to its live owner: %s", r.run_id, r.error)
    elif r.outcome == "stranded":
        _log.warning("recover: run %s not resumed, stranded: %s", r.run_id, _text(r.error))
    elif r.outcome == "incompatible":
        _log.warning("recover: run %s not resumed, incompatible: %s", r.run_id, _text(r.error))
    elif r.outcome == "recovery_limit":
        _log.error("recover: run %s failed: %s", r.run_id, _text(r.error))
    else:
        # Not an error of the run's code or of a changed workflow: keep the traceback.
        _log.error("recover: run %s not resumed: %s", r.run_id, _text(r.error), exc_info=r.error)


def _text(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"


def _incompatible(wf: Facade, run_id: str) -> Recovery | None:
    """The ``incompatible`` outcome of a run that a static verify finds blocking problems
    in (None: it fits this code); nothing of the run is executed."""
    from ._verify import verify

    try:
        report = verify(wf, [run_id])
    except Exception as exc:  # a damaged log: the resume says what, as without the check
        _log.debug("recover: verify of %s raised %r", run_id, exc)
        return None
    problems = tuple(p for p in report.problems if p.kind in BLOCKING)
    if not problems:
        return None
    lines = [f"{p.kind} at seq {p.seq}: {p.message}" for p in problems]
    error = WorkflowChangedError(run_id, lines)
    return Recovery(run_id, "incompatible", error=error, problems=problems)


def recover(wf: Facade, *, compatible_only: bool = False) -> Recoveries:
    """Resumes every pending run of ``wf``; one :class:`Recovery` per run, each logged.

    With ``compatible_only`` a run is resumed only when a static verify (nothing executed)
    finds nothing it holds that no longer decodes and no pending work that no longer
    routes; the others are ``incompatible``, with the problems, and left as they are.
    """
    done = Recoveries()
    listed = {r.run_id: r for r in wf.runs(all_workflows=False)}
    for run_id in wf.pending_runs():
        run = listed.get(run_id)
        if run is None or has_work(wf, run):
            r = (_incompatible(wf, run_id) if compatible_only else None) or _recover_one(wf, run_id)
        else:
            r = Recovery(run_id, "waiting", waiting_for=run.waiting_for)
        _log_one(r)
        done.append(r)
    if done:
        counts: dict[str, int] = {}
        for r in done:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
        _log.info(
            "recover: %d pending run(s) of %s: %s", len(done), wf.__workflow_parts__.name, summary
        )
    return done
