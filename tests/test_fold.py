"""The fold is the truth: live state equals state_at at every commit, and the cache agrees."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from eventstore import EventStore, LogCorruptedError, StoredRecord
from tests.flows import Asker
from tests.test_engine import Appender, Counter, FanOut, Flaky, Linear, Typed
from workflow import HumanResponseEvent, Workflow
from workflow._fold import Folded, fold
from workflow._read import commits, fold_run
from workflow._snapshot import dump_folded, load_folded


def capture(wf: Workflow) -> dict[int, dict[str, Any]]:
    """Records the executor's live context after every commit that changed state."""
    seen: dict[int, dict[str, Any]] = {}

    def hook(executor: Any, seq: int) -> None:
        seen[seq] = copy.deepcopy(executor.committed)

    wf.__workflow_parts__.commit_hook = hook
    return seen


async def run_case(name: str, db: EventStore) -> tuple[Workflow, str, dict[int, dict[str, Any]]]:
    wf: Workflow
    if name == "linear":
        wf = Linear(store=db)
        live = capture(wf)
        h = wf.run(topic="t")
    elif name == "fan":
        wf = FanOut(store=db)
        live = capture(wf)
        h = wf.run(n=5)
    elif name == "conflicts":
        wf = Counter(store=db, timeout=60)
        live = capture(wf)
        h = wf.run(n=100)
    elif name == "retries":
        wf = Flaky(store=db)
        live = capture(wf)
        h = wf.run()
    elif name == "typed":
        wf = Typed(store=db)
        live = capture(wf)
        h = wf.run(name="ada")
    elif name == "loop":
        wf = Appender(store=db)
        wf.n = 900  # enough to rewrite values and cache state
        live = capture(wf)
        h = wf.run()
    else:
        wf = Asker(store=db)
        live = capture(wf)
        h = wf.run()
        await h.wait_until_waiting(5)
        await h.send_event(HumanResponseEvent(response="x"))
    await h
    return wf, h.run_id, live


CASES = ["linear", "fan", "conflicts", "retries", "typed", "loop", "wait"]


def sample(seqs: list[int], n: int = 60) -> list[int]:
    """At most ``n`` seqs spread over the run, always with the first and the last."""
    if len(seqs) <= n:
        return seqs
    step = len(seqs) / (n - 1)
    return sorted({seqs[int(i * step)] for i in range(n - 1)} | {seqs[-1]})


@pytest.mark.parametrize("name", CASES)
async def test_live_state_equals_state_at_every_commit(name: str, store: EventStore) -> None:
    """The live context after each commit equals state_at(seq) of the log."""
    wf, run_id, live = await run_case(name, store)
    assert live
    for seq in sample(sorted(live)):
        context = live[seq]
        assert wf.state_at(run_id, seq).context == context, f"seq {seq}"


@pytest.mark.parametrize("name", CASES)
async def test_cached_state_equals_pure_fold_at_every_seq(name: str, store: EventStore) -> None:
    """Reading through the cached state gives exactly the pure fold, at every commit."""
    wf, run_id, _ = await run_case(name, store)
    store = wf.store
    for seq in sample([c[-1].seq for c in commits(store.records(run_id))]):
        fast = fold_run(store, run_id, seq, cached=True)
        pure = fold_run(store, run_id, seq, cached=False)
        assert dump_folded(fast) == dump_folded(pure), f"seq {seq}"
    assert dump_folded(fold_run(store, run_id)) == dump_folded(
        fold_run(store, run_id, cached=False)
    )


async def test_long_runs_are_cached(store: EventStore) -> None:
    """A long run leaves a cached state, and the latest read starts from it."""
    wf, run_id, _ = await run_case("loop", store)
    snap = wf.store.snapshot(run_id)
    assert snap is not None
    assert snap[0] == wf.store.last_seq(run_id)
    assert wf.state_at(run_id).context["items"] == ["x" * 100] * 900


async def test_fork_cache_equals_pure_fold(store: EventStore) -> None:
    """A fork's cached state equals the pure fold of its parent and its own records."""
    wf, run_id, _ = await run_case("loop", store)
    middle = wf.checkpoints(run_id)[len(wf.checkpoints(run_id)) // 2]
    fork = wf.run_from(middle)
    assert await fork == 900
    assert dump_folded(fold_run(wf.store, fork.run_id)) == dump_folded(
        fold_run(wf.store, fork.run_id, cached=False)
    )


def test_folded_json_round_trip() -> None:
    """The cached form of a folded state loads back equal."""
    s = Folded("r")
    s.seq, s.next_id, s.status = 7, 3, "waiting"
    assert dump_folded(load_folded(dump_folded(s))) == dump_folded(s)


def _rec(seq: int, kind: str, payload: str, step: str | None = None) -> StoredRecord:
    return StoredRecord(seq, "r", kind, step, payload, seq, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "match"),
    [
        pytest.param(_rec(1, "mystery", "{}"), "seq 1.*unknown kind 'mystery'", id="unknown-kind"),
        pytest.param(_rec(1, "enqueued", "{not json"), "seq 1.*malformed payload", id="bad-json"),
        pytest.param(_rec(1, "enqueued", '{"x": 1}', "s"), "seq 1.*malformed", id="missing-field"),
        pytest.param(_rec(1, "dequeued", '{"id": 5}', "s"), "seq 1.*not queued", id="not-queued"),
        pytest.param(_rec(1, "dequeued", '{"id": 5}'), "seq 1.*names no step", id="deq-no-step"),
        pytest.param(
            _rec(1, "step_started", '{"id": 5, "attempt": 1}', "s"),
            "seq 1 \\(step_started\\): event 5 is not in progress at 's'",
            id="start-not-in-progress",
        ),
        pytest.param(
            _rec(1, "step_finished", '{"id": 5, "attempt": 1, "emitted": [], "base": 0}', "s"),
            "seq 1 \\(step_finished\\): event 5 is not in progress at 's'",
            id="finish-not-in-progress",
        ),
        pytest.param(
            _rec(1, "step_finished", '{"id": 5, "attempt": 1, "emitted": [], "base": 0}'),
            "seq 1 \\(step_finished\\).*names no step",
            id="finish-no-step",
        ),
        pytest.param(
            _rec(1, "step_started", '{"attempt": 1}'),
            "seq 1 \\(step_started\\).*names no step",
            id="start-no-step-before-its-id",
        ),
    ],
)
def test_fold_refuses_bad_records_naming_the_seq(record: StoredRecord, match: str) -> None:
    """A malformed or unknown record stops the fold with an error naming its seq."""
    with pytest.raises(LogCorruptedError, match=match):
        fold(Folded("r"), [record])


def _fold_log(*records: tuple[str, str | None, dict[str, Any]]) -> Folded:
    """The fold of a log of (kind, step, payload), one record a commit, seqs from 1."""
    import json

    return fold(
        Folded("r"), [_rec(i, k, json.dumps(p), s) for i, (k, s, p) in enumerate(records, 1)]
    )


def test_the_fold_keeps_each_inputs_first_start_and_the_sessions() -> None:
    """An input's first start survives its later attempts and waits; a resume begins a
    session; a finished input leaves no start behind; the cached form keeps them."""
    ev = {"c": "m:E", "v": {}}
    s = _fold_log(
        ("run_started", None, {"workflow": "w", "fingerprint": "f", "start": None, "parent": None}),
        ("enqueued", "a", {"id": 1, "event": ev, "src": "start"}),
        ("enqueued", "b", {"id": 2, "event": ev, "src": "start"}),
        ("dequeued", "a", {"id": 1, "worker": 0}),
        ("step_started", "a", {"id": 1, "attempt": 1}),
        ("run_resumed", None, {"epoch": 2, "previous": "interrupted", "state": "m:S@2"}),
        ("step_started", "a", {"id": 1, "attempt": 2}),
        ("dequeued", "b", {"id": 2, "worker": 0}),
        ("step_started", "b", {"id": 2, "attempt": 1}),
        ("step_finished", "b", {"id": 2, "attempt": 1, "emitted": [], "base": 0}),
    )
    assert (s.session, s.started, s.state) == (6, {"a": {1: 5}}, "m:S@2")
    assert dump_folded(load_folded(dump_folded(s))) == dump_folded(s)


def test_the_fold_of_a_step_leaves_only_what_is_unfinished() -> None:
    """Each input's queue, progress and first start are kept until it finishes, the next id
    is past the largest id enqueued in any order (and an unclaimed one), and a step's
    emptied queue and progress stay as empty entries while its first starts go."""
    ev = {"c": "m:E", "v": {}}
    s = _fold_log(
        ("run_started", None, {"workflow": "w", "fingerprint": "f", "start": None, "parent": None}),
        ("enqueued", "a", {"id": 7, "event": ev, "src": "start"}),
        ("enqueued", "a", {"id": 3, "event": ev, "src": "start"}),
        ("enqueued", None, {"id": 9, "event": ev, "src": "send"}),
        ("dequeued", "a", {"id": 7, "worker": 0}),
        ("step_started", "a", {"id": 7, "attempt": 1}),
        ("step_finished", "a", {"id": 7, "attempt": 1, "emitted": [], "base": 0}),
        ("dequeued", "a", {"id": 3, "worker": 0}),
        ("step_started", "a", {"id": 3, "attempt": 1}),
        ("step_started", "a", {"id": 3, "attempt": 2}),
    )
    assert s.next_id == 10
    assert (s.queues, list(s.unclaimed)) == ({"a": {}}, [9])
    assert [(i, p.attempt) for i, p in s.in_progress["a"].items()] == [(3, 2)]
    assert s.started == {"a": {3: 9}}
    s = fold(
        s, [_rec(11, "step_finished", '{"id": 3, "attempt": 2, "emitted": [], "base": 0}', "a")]
    )
    assert (s.in_progress, s.started, s.seq, s.records) == ({"a": {}}, {}, 11, 11)


def test_renames_move_work_memos_starts_and_buffers() -> None:
    """A resume's renames move an old step's queue, memoized calls, first starts and
    collect buffers to the new names."""
    ev = {"c": "m:Left", "v": {}}
    s = _fold_log(
        ("run_started", None, {"workflow": "w", "fingerprint": "f", "start": None, "parent": None}),
        ("enqueued", "old", {"id": 1, "event": ev, "src": "start"}),
        ("dequeued", "old", {"id": 1, "worker": 0}),
        ("step_started", "old", {"id": 1, "attempt": 1}),
        ("collected", "old", {"buf": "k", "put": {"id": 1, "event": ev}, "take": None, "v": 2}),
        (
            "run_resumed",
            None,
            {
                "epoch": 2,
                "previous": "interrupted",
                "renamed": {"old": "new"},
                "buffers": {"old:k": "new:k2"},
            },
        ),
    )
    assert list(s.in_progress) == ["new"]
    assert s.started == {"new": {1: 4}}
    assert list(s.buffers) == ["new:k2"]
    assert [e.id for e in s.buffers["new:k2"]["Left"]] == [1]


def test_a_renamed_steps_default_buffer_id_is_found_again() -> None:
    """The digest id of a renamed step's buffer is recomputed under the new name, for the
    classes it was made of in their order; an id the code gave is kept."""
    from workflow._buffers import default_buffer_id
    from workflow._renames import Renames, moves_for

    old_id = default_buffer_id("gather", ["B", "A"])
    s = Folded("r")
    s.buffers = {f"gather:{old_id}": {"A": []}, "gather:mine": {"A": []}, "other:x": {"A": []}}
    moves = moves_for(s, Renames({"gather": "join"}, {"join": ["A", "B", "C"]}))
    assert moves == {
        f"gather:{old_id}": f"join:{default_buffer_id('join', ['B', 'A'])}",
        "gather:mine": "join:mine",
    }
