"""A ``Context``'s life between runs: LlamaIndex's ``Context(wf)``, ``run(ctx=)``,
``to_dict`` / ``from_dict``, made durable.

A context names a run. Unbound (``Context(wf)``) until its first ``run(ctx=ctx)``, it is then
bound to the run it started, and rebound each time a run starts from it. While its run is
executed here it is live (writes are operator commits); otherwise it is idle: it reads its
run's state at its point (the run's end, or the seq of the dict it was restored from), and
its writes stay on it until they open its next run (:class:`Idle`).

``run(ctx=ctx)`` (``run_with_context``) with a start event or start fields starts a new
run from the context's state, *linked* to the run it came from (``run_started.previous``),
whose first commit writes that state: each chat turn is a run that folds on its own.
Without them it continues the run (a resume: the failed step of a failed run, with a fresh
retry budget), or forks it where the context points if the run went on past that, or,
after the run finished, starts a linked run with the default start event.

``to_dict`` (``context_dict``) names the run and seq and carries the folded state in
the codec's typed JSON; ``from_dict`` (``restore_into``) binds to that run when the
workflow's store has it, and otherwise imports the state as a new run when the context next
runs, so a dict written by one process restores in another.

This module holds where a context points and its idle writes; ``to_dict`` / ``from_dict`` are
``workflow/_context_dict.py``, ``run(ctx=)`` is ``workflow/_context_run.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ._changes import Encoded, encode_updates
from ._context import parts_of
from ._fold import Folded
from ._live_runs import live_executor
from ._names import same_name
from ._read import fold_run
from ._state import TERMINAL
from ._state_versions import upcast_state

if TYPE_CHECKING:
    from eventstore import Codec

    from ._context import Context, RunHost

__all__ = [
    "Idle",
    "base_values",
    "point_of",
    "ran_here",
    "run_is_live",
    "same_workflow",
    "state_dumps",
]


class Idle:
    """What an idle context's ``store`` reads and writes: its run's state at the context's
    point, with the writes made on it since, which open its next run.

    It stands where the executor stands for a live context (``ContextStore.host``): reads
    outside an attempt use ``committed``, writes ``operator_update``.
    """

    def __init__(self, ctx: Context[Any]) -> None:
        self._ctx = ctx
        self._committed: dict[str, Any] | None = None
        self.pending: dict[str, Encoded] = {}
        self.deleted: set[str] = set()
        self.seq: int | None = None  # restored at this seq of its run (None: the run's end)
        self.imported: Folded | None = None  # a dict's state this store has no run of
        self.origin: tuple[str, int] | None = None  # where the imported state came from

    @property
    def codec(self) -> Codec:
        return parts_of(self._ctx).codec

    @property
    def committed(self) -> dict[str, Any]:
        """The context's values as its next run will start with them (read lazily)."""
        if self._committed is None:
            base = base_values(self._ctx)
            for k in self.deleted:
                base.pop(k, None)
            for k, e in self.pending.items():
                base[k] = e.value
            self._committed = base
        return self._committed

    @property
    def versions(self) -> dict[str, int]:
        """None: nothing but this context writes its values until its next run."""
        return {}

    async def operator_update(
        self,
        updates: Mapping[str, Any],
        deletes: list[str] | None = None,
        *,
        read: Mapping[str, int] | None = None,
    ) -> int:
        """Keeps writes for the next run (encoded now: what the log cannot hold is refused).

        ``read`` is not checked: nothing else writes an idle context's values.
        """
        encoded = encode_updates(self.codec, updates)
        committed = self.committed
        for k, e in encoded.items():
            self.pending[k] = e
            self.deleted.discard(k)
            committed[k] = e.value
        for k in deletes or ():
            self.pending.pop(k, None)
            self.deleted.add(k)
            committed.pop(k, None)
        return 0


# ---------------------------------------------------------------------- where a context points


def ran_here(ctx: Context[Any]) -> RunHost | None:
    """The executor that ran the context's run here, if the run is where it left it (its
    state is then in memory: no read of the store)."""
    link = ctx.__context_link__
    host = link.host
    if host is None or link.idle.seq is not None or link.idle.imported is not None:
        return None
    if link.live() is None and parts_of(ctx).store.last_seq(host.run_id) != host.folded.seq:
        return None  # another process went on with the run since
    return host


def point_of(ctx: Context[Any]) -> Folded:
    """The folded state (JSON form) at the context's point, without its idle writes."""
    link = ctx.__context_link__
    idle = link.idle
    if idle.imported is not None:
        return idle.imported
    host = ran_here(ctx)
    if host is not None:
        return host.folded  # the state this process ran it to (read, never changed here)
    if link.run_id is None:
        return Folded("")
    parts = parts_of(ctx)
    f = fold_run(parts.store, link.run_id, idle.seq)
    # A run of an older state model version: its values as this code's version has them.
    upcast_state(f, parts.codec, parts.state_type)
    return f


def base_values(ctx: Context[Any]) -> dict[str, Any]:
    host = ran_here(ctx)
    if host is not None:
        return dict(host.committed)
    load = parts_of(ctx).codec.load
    return {k: load(copy.deepcopy(e.dump)) for k, e in point_of(ctx).context.items()}


def state_dumps(ctx: Context[Any], f: Folded) -> dict[str, Any]:
    """The context's values in the codec's JSON form, with its idle writes."""
    idle = ctx.__context_link__.idle
    out = {k: e.dump for k, e in f.context.items()}
    if ctx.__context_link__.live() is None:
        for k in idle.deleted:
            out.pop(k, None)
        for k, e in idle.pending.items():
            out[k] = orjson.loads(e.text)
    return out


def run_is_live(ctx: Context[Any]) -> bool:
    """Whether the context's run is being executed, in this process or another."""
    link = ctx.__context_link__
    if link.live() is not None:
        return True
    run = link.run_id
    if run is None or link.idle.imported is not None:
        return False
    parts = parts_of(ctx)
    if live_executor(parts.store, run) is not None:
        return True
    info = parts.store.get_run(run)
    if info is None or (info.status or "running") in TERMINAL:
        return False
    return parts.owners.is_owned(run, info.rid)


def same_workflow(recorded: str, wf: object) -> bool:
    # A script's class is recorded as __main__:X, the same class imported as app:X.
    return same_name(recorded, type(wf))
