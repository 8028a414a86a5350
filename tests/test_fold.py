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

    wf._commit_hook = hook
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
    ],
)
def test_fold_refuses_bad_records_naming_the_seq(record: StoredRecord, match: str) -> None:
    """A malformed or unknown record stops the fold with an error naming its seq."""
    with pytest.raises(LogCorruptedError, match=match):
        fold(Folded("r"), [record])
