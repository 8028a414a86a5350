"""Which seq a look at a run, or a fork of it, at a given seq stands at.

Seqs are global and a commit counts whole: the state at seq S is the fold of every commit
of the run that begins at or before S, so it stands at the end of the commit holding S
(``workflow history``'s ``commit`` column). A fork records that end as its parent's seq.
"""

from __future__ import annotations

from eventstore import EventStore

from ._errors import CheckpointNotFoundError

__all__ = ["fork_said", "no_state_at"]


def no_state_at(store: EventStore, run_id: str, seq: int, first: int | None) -> Exception:
    """The error for a look at run ``run_id`` at ``seq``, before its first record (``first``):
    it names where the log begins and where its first commit ends."""
    end = None
    if first is not None:
        head = next(iter(store.records(run_id, upto=first)), None)
        end = None if head is None else head.commit_seq
    return CheckpointNotFoundError(run_id, seq, first, end)


def fork_said(run_id: str, asked: int, at: int, new_id: str) -> str:
    """What a fork of ``run_id`` asked at seq ``asked`` says: the seq its log records
    (``at``, the end of the commit holding ``asked``) and why they differ."""
    if at == asked:
        return f"forked run {run_id} at seq {at} as {new_id}"
    return (
        f"forked run {run_id} at seq {at} (the end of the commit holding seq {asked}: a commit"
        f" counts whole) as {new_id}"
    )
