"""The run page's context as the workflow shows it: upcast to today's typed state model.

The page folds the context in the browser from the log's keys, so a run no newer code has
resumed yet (its context in an older version of the state model) would show the old field
names there, while ``workflow state --workflow``, ``diff`` and ``wf.state_at`` upcast it
(``_state_versions``). A server that knows the workflow sends, with each window, the
upcast context after each commit that changes it (:func:`upcast_contexts`), and the page
shows that instead of its own fold's; the ``/state`` route upcasts as ``workflow state``
does (:func:`shown_state`). The log's records and the page's fold stay as they are.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from eventstore import CodecError, EventStore

from .. import _journal as J
from .._fold import Folded, fold
from .._names import same_name
from .._read import commits, fold_run, run_info, start_state
from .._state_versions import state_tag, upcast_shown, upcast_values
from .._workflow import Workflow
from ..cli._inspect import Viewer
from ..cli._timeline import TEXT

__all__ = ["shown_state", "upcast_contexts"]

# What changes the context or the version it is in: the page's upcast context is sent again
# only after a commit holding one of these.
_CHANGING: Final = frozenset({J.STATE_SET, J.STATE_DELETED, J.RUN_STARTED, J.RUN_RESUMED})


def _ours(wf: Workflow | None, s: Folded) -> bool:
    """Whether ``s`` is a run of ``wf`` (with a typed state model): another workflow's run
    in the same store is shown as its log has it."""
    if wf is None or wf.__workflow_parts__.state_type is None:
        return False
    return not s.workflow or same_name(s.workflow, type(wf))


def _texts(wf: Workflow, s: Folded, view: Viewer) -> dict[str, str] | None:
    """The context's texts upcast to ``wf``'s state model; None when it is in that version
    already, holds nothing, or cannot be upcast (the page then shows the keys as stored)."""
    codec = wf.__workflow_parts__.codec
    try:
        values = upcast_values(s, codec, wf.__workflow_parts__.state_type)
        if values is None or not any(k[:1] != "\x00" for k in s.context):
            return None  # nothing to upcast (nothing recorded: the fold's empty context)
        return {k: view.show(codec.dump(v, name=k), TEXT) for k, v in values.items()}
    except CodecError:
        return None


def upcast_contexts(
    store: EventStore, run_id: str, data: dict[str, Any], wf: Workflow | None, view: Viewer
) -> list[list[Any]] | None:
    """For the page of ``data`` (a window of ``timeline_data``): ``[commit index, texts or
    None]`` at each commit after which the upcast context differs from the one before
    (index -1: the window's base), in order; None when no state of the window is in an
    older version (or ``wf`` is not the run's workflow)."""
    if wf is None or wf.__workflow_parts__.state_type is None:
        return None
    start = data["window"]["after"]
    seqs = data["commits"]["seq"]
    info = run_info(store, run_id)
    if (start or info.parent_run_id is None) and _in_current_version(store, run_id, wf):
        return None  # what a run of today's code costs: a read of its sessions' first records
    state = fold_run(store, run_id, start) if start else start_state(store, info)
    if not _ours(wf, state):
        return None
    out: list[list[Any]] = []
    shown = _texts(wf, state, view)
    if shown is not None:
        out.append([-1, shown])
    if seqs:
        for ci, commit in enumerate(commits(store.records(run_id, after=start, upto=seqs[-1]))):
            fold(state, commit)
            if ci == 0 and not _ours(wf, state):
                return None  # its first record names another workflow
            if not any(r.kind in _CHANGING for r in commit):
                continue
            now = _texts(wf, state, view)
            if now != shown:
                out.append([ci, now])
                shown = now
    return out or None


def _in_current_version(store: EventStore, run_id: str, wf: Workflow) -> bool:
    """Whether every session of the run (its ``run_started`` and ``run_resumed`` records)
    wrote the context in ``wf``'s state model version: then nothing of it is upcast."""
    now = state_tag(wf.__workflow_parts__.state_type)
    rows = store.query(
        "SELECT payload FROM records WHERE run_id = ? AND kind IN (?, ?)",
        (run_id, J.RUN_STARTED, J.RUN_RESUMED),
    )
    try:
        return all(orjson.loads(p).get("state") == now for (p,) in rows)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return False  # sealed or odd payloads: the fold says


def shown_state(wf: Workflow | None, s: Folded) -> Folded:
    """``s`` as ``workflow state --workflow`` shows it: its context upcast when it is a run
    of ``wf`` in an older state model version (unchanged if it cannot be upcast)."""
    if wf is None or not _ours(wf, s):
        return s
    try:
        return upcast_shown(s, wf.__workflow_parts__.codec, wf.__workflow_parts__.state_type)
    except CodecError:
        return s
