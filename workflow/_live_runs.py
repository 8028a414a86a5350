"""The runs this process executes now: one executor per (store, run), found by id.

A workflow looks here before it resumes a run (a run executed here is handed its live
handler), and ``send`` pokes the run's executor so the event is taken in at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventstore import EventStore

if TYPE_CHECKING:
    from ._ownership import LeaseOwners, Owners

__all__ = ["live_executor", "own", "register", "release"]

# (id of the store, run id) -> the executor running it in this process.
_live: dict[tuple[int, str], Any] = {}


def live_executor(store: EventStore, run_id: str) -> Any:
    """The executor running ``run_id`` of ``store`` in this process, or None."""
    return _live.get((id(store), run_id))


def register(store: EventStore, run_id: str, executor: Any) -> None:
    """``executor`` runs ``run_id`` of ``store`` from now on (its owner lock is held)."""
    _live[(id(store), run_id)] = executor


def own(
    store: EventStore, owners: Owners | LeaseOwners, run_id: str, rid: int, executor: Any
) -> None:
    """Takes the run's owner lock and registers ``executor`` as running it."""
    owners.acquire(run_id, rid)
    register(store, run_id, executor)


def release(
    store: EventStore, owners: Owners | LeaseOwners, run_id: str, rid: int, executor: Any
) -> None:
    """``executor`` stops running the run: unregistered, its owner lock released."""
    if _live.get((id(store), run_id)) is executor:
        del _live[(id(store), run_id)]
        owners.release(run_id, rid)
