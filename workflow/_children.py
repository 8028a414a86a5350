"""Child runs: ``await ctx.run_workflow(OtherFlow, **start_kwargs)`` inside a step.

The child is a run of its own in the parent's store, with an id made from the parent's run
id, the step, its input event and the call's order in the attempt
(``parent/step/event/n``), so a re-run of the parent's step finds the same child: it
re-attaches to it (resumes it, or gets its stored result) instead of starting another. The
child's result is recorded in the parent as a memoized call (key ``run_workflow:Class``), so
a re-run after the child finished does not even open it. Cancelling the parent while it
awaits the child cancels the child.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any, cast

from ._attempt import Attempt
from ._errors import WorkflowRuntimeError
from ._facade_protocol import is_workflow

if TYPE_CHECKING:
    from ._facade_protocol import Facade

__all__ = ["child_run_id", "parent_of", "run_child", "tree_order"]

# Each parent workflow's instances of its children's classes, made once.
_instances: weakref.WeakKeyDictionary[Facade, dict[type, Facade]] = weakref.WeakKeyDictionary()


def child_run_id(parent_run_id: str, step: str, event_id: int, n: int) -> str:
    """The id of the ``n``-th child run started by ``step``'s input ``event_id``."""
    return f"{parent_run_id}/{step}/{event_id}/{n}"


def parent_of(run_id: str, known: Container[str]) -> str | None:
    """The run that started ``run_id`` as a child (its id says so), if it is ``known``."""
    parts = run_id.rsplit("/", 3)
    if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit() and parts[0] in known:
        return parts[0]
    return None


def tree_order(run_ids: Sequence[str]) -> list[tuple[str, int]]:
    """``run_ids`` with each child run right after its parent: (run id, depth)."""
    known = set(run_ids)
    children: dict[str, list[str]] = {}
    roots = []
    for r in run_ids:
        parent = parent_of(r, known)
        if parent is None:
            roots.append(r)
        else:
            children.setdefault(parent, []).append(r)
    out: list[tuple[str, int]] = []
    stack = [(r, 0) for r in reversed(roots)]
    while stack:
        r, depth = stack.pop()
        out.append((r, depth))
        stack.extend((c, depth + 1) for c in reversed(children.get(r, ())))
    return out


def _child_workflow(parent: Facade, flow: Any) -> Facade:
    """The workflow a child run of ``flow`` (a workflow class or instance) runs with: the
    instance, or one instance of the class per parent (in the parent's store)."""
    if not isinstance(flow, type) and is_workflow(flow):
        if flow.store is not parent.store:
            msg = (
                f"ctx.run_workflow({type(flow).__name__} instance): a child run is kept in"
                " the parent's store; make the instance with store=parent.store, or pass"
                " the class"
            )
            raise WorkflowRuntimeError(msg)
        return cast("Facade", flow)
    if not (isinstance(flow, type) and is_workflow(flow)):
        msg = f"ctx.run_workflow() takes a Workflow class or instance, not {flow!r}"
        raise WorkflowRuntimeError(msg)
    made = _instances.setdefault(parent, {})
    wf = made.get(flow)
    if wf is None:
        wf = made[flow] = cast(
            "Facade", flow(store=parent.store, timeout=parent.__workflow_parts__.timeout)
        )
    return wf


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Marks a child's outcome as seen (it is in the child's own log)."""
    if not task.cancelled():
        task.exception()


async def run_child(host: Any, att: Attempt, flow: Any, start_kwargs: dict[str, Any]) -> Any:
    """Starts (or re-attaches to) a child run and returns its result (module docstring)."""
    from ._memo import call_memoized

    child = _child_workflow(host.config.instance, flow)
    att.child_calls += 1
    child_id = child_run_id(host.run_id, att.step, att.event_id, att.child_calls)

    async def run_to_end(**kwargs: Any) -> Any:
        handler = child.run(run_id=child_id, **kwargs)  # an existing id is resumed
        # Shielded: the parent's cancellation must not cancel the child's own future. Once
        # the parent is cancelled nobody awaits the child's outcome (asyncio.shield drops
        # its own callback then): it is retrieved here, so asyncio does not report it.
        waited = asyncio.ensure_future(handler)
        waited.add_done_callback(_retrieve)
        # The parent's clock stands while it awaits the child (the child has its own).
        host.children_awaited += 1
        host.update_clock()
        try:
            return await asyncio.shield(waited)
        except asyncio.CancelledError:
            # With the parent's cancel, the child is cancelled too; otherwise (the parent
            # failed, timed out or was left) it goes on, and a re-run re-attaches to it.
            # Cancelled here (its fold says so) or from another process (``_takeover``).
            if host.folded.status == "cancelled" or host.status == "cancelled":
                reason = f"its parent run {host.run_id!r} was cancelled"
                await asyncio.shield(handler.cancel_run(reason=reason, via="parent"))
            raise
        finally:
            host.children_awaited -= 1
            host.update_clock()

    run_to_end.__qualname__ = type(child).__qualname__
    return await call_memoized(
        att, f"run_workflow:{type(child).__qualname__}", run_to_end, (), start_kwargs
    )
