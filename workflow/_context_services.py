"""What a ``Context`` asks of the modules above it, in one object its workflow hands it.

``Context`` sits below its lifecycle (``_lifecycle``, ``_context_dict``, ``_context_run``)
and child runs (``_children``): those read the context, so it may not import them. Every
workflow carries :data:`CONTEXT_SERVICES` as ``__context_services__``
(:class:`~workflow._context.ContextServices`), through which its contexts reach them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

from ._children import run_child
from ._context_dict import context_dict, restore_into
from ._context_run import send_idle
from ._errors import ContextStateError
from ._handler import HandlerOwner, WorkflowHandler
from ._lifecycle import Idle, run_is_live

if TYPE_CHECKING:
    from ._attempt import Attempt
    from ._context import Context, RunHost
    from ._events import Event
    from ._runner import Executor
    from .context.serializers import BaseSerializer

__all__ = ["CONTEXT_SERVICES", "LifecycleServices"]


class LifecycleServices:
    """The context lifecycle's functions, as :class:`~workflow._context.ContextServices`."""

    def idle(self, ctx: Context[Any]) -> Idle:
        """A new idle state for ``ctx`` (unbound, or bound to a run that ended)."""
        return Idle(ctx)

    def restore_into(self, ctx: Context[Any], data: Any, serializer: BaseSerializer | None) -> None:
        """``Context.from_dict``: points ``ctx`` where ``data`` says."""
        restore_into(ctx, data, serializer)

    def context_dict(
        self, ctx: Context[Any], serializer: BaseSerializer | None, state: bool
    ) -> dict[str, Any]:
        """``ctx.to_dict()``."""
        return context_dict(ctx, serializer, state)

    def run_is_live(self, ctx: Context[Any]) -> bool:
        """Whether the context's run is being executed, in this process or another."""
        return run_is_live(ctx)

    def send_idle(self, ctx: Context[Any], event: Event) -> None:
        """``ctx.send_event`` on a context whose run no executor here runs."""
        send_idle(ctx, event)

    async def run_child(self, host: RunHost | None, att: Attempt, flow: Any, kwargs: Any) -> Any:
        """``ctx.run_workflow(flow, **kwargs)`` in attempt ``att`` of ``host``'s run."""
        return await run_child(host, att, flow, kwargs)

    def running_steps(self, ctx: Context[Any]) -> list[str]:
        """``await ctx.running_steps()``: the steps running now in the context's run."""
        link = ctx.__context_link__
        _executor(ctx, "running_steps()")
        host = link.live()
        return [] if host is None else cast("Executor", host).steps.active_steps()

    def handler(self, ctx: Context[Any], call: str) -> WorkflowHandler:
        """A handler of the run this process executes (or executed) for ``ctx``."""
        executor = _executor(ctx, call)
        owner = cast("HandlerOwner", ctx.__context_link__.workflow)
        return WorkflowHandler(owner, executor.run_id, executor.done, executor)


def _executor(ctx: Context[Any], call: str) -> Executor:
    link = ctx.__context_link__
    if link.host is None:
        if link.run_id is None:
            msg = f"{call} requires a running workflow: call wf.run(ctx=ctx) first"
        else:
            msg = (
                f"{call} needs the run executed here: run {link.run_id!r} of this context"
                " is not (continue it with wf.run(ctx=ctx))"
            )
        raise ContextStateError(msg)
    return cast("Executor", link.host)


CONTEXT_SERVICES: Final = LifecycleServices()
