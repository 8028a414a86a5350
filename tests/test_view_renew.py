"""A large list's view is made over for the next attempt instead of copied (issue 17).

:func:`workflow._diff.renew` reuses the view of the attempt before when nothing else holds
it, putting back only what it changed and checking every item is the committed list's.
These tests pin down when it may (nothing holds the old view) and when it must not (the
user kept the view, the attempt still holds its tracker, the list was rewritten), and that
a renewed view shows exactly the committed list and records only the next change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventstore import default_codec
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
from workflow._changes import BY_SET, encode_tracked
from workflow._diff import SPARE_MIN, TrackedList, Tracker, apply, renew, spare

N = SPARE_MIN * 2


def _committed() -> dict[str, Any]:
    return {"k": [{"i": i} for i in range(N)]}  # mutable items: a view wraps those it reads


def _step(store: dict[str, Any], spares: dict[str, Tracker], mutate: Any) -> Tracker:
    """One attempt: a view of the committed list (renewed if it can be), mutated, its
    patch applied to the committed list (in place where it can be, as the executor does)."""
    committed = store["k"]
    tracker = ("k" in spares and renew(spares, "k", committed)) or Tracker(committed)
    if spare(tracker):
        spares["k"] = tracker
    mutate(tracker.view)
    change = encode_tracked(default_codec, "k", tracker, BY_SET, "k")
    if change is not None:
        store["k"] = change.full if change.ops is None else apply(committed, change.ops)
    return tracker


def _same_objects(view: list[Any], committed: list[Any]) -> bool:
    items = list(list.__iter__(view))
    if len(items) != len(committed):
        return False
    return all(a is b for a, b in zip(items, committed, strict=True))


def test_a_view_nothing_holds_is_renewed_and_shows_the_committed_list() -> None:
    store, spares = _committed(), dict[str, Tracker]()
    _step(store, spares, lambda v: v.append({"new": 1}))
    tracker = renew(spares, "k", store["k"])
    assert tracker is not None  # made over, not copied
    assert _same_objects(tracker.view, store["k"])
    assert tracker.ops() == []
    tracker.view.append("x")
    assert tracker.ops() == [("append", (), "x")]


def test_what_a_view_changed_is_put_back_from_the_committed_list() -> None:
    store, spares = _committed(), dict[str, Tracker]()

    def edits(v: list[Any]) -> None:
        v[3]["i"] = "changed inside"  # a wrapped item
        v[5] = "assigned"
        v.pop()  # truncated below its committed length
        v.append("appended")

    _step(store, spares, edits)
    assert store["k"][3] == {"i": "changed inside"}
    assert store["k"][5] == "assigned"
    assert store["k"][-1] == "appended"
    assert len(store["k"]) == N
    tracker = renew(spares, "k", store["k"])
    assert tracker is not None
    assert type(tracker.view) is TrackedList
    assert _same_objects(tracker.view, store["k"])
    tracker.view[3]["i"] = "again"  # the renewed view wraps afresh: committed is untouched
    assert store["k"][3] == {"i": "changed inside"}
    assert tracker.ops() == [("set", (3, "i"), "again")]


def test_a_view_the_user_kept_is_never_renewed() -> None:
    store, spares = _committed(), dict[str, Tracker]()
    kept = _step(store, spares, lambda v: v.append("mine")).view
    shown = list(list.__iter__(kept))
    assert renew(spares, "k", store["k"]) is None
    tracker = _step(store, spares, lambda v: v.append("next"))
    assert tracker.view is not kept
    assert list(list.__iter__(kept)) == shown  # the kept view still shows what it showed
    assert store["k"][-2:] == ["mine", "next"]


def test_a_tracker_its_attempt_still_holds_is_never_renewed() -> None:
    store, spares = _committed(), dict[str, Tracker]()
    live = _step(store, spares, lambda v: None)  # its attempt is still running
    assert renew(spares, "k", store["k"]) is None
    other = _step(store, spares, lambda v: v.append("other"))
    assert other is not live
    assert other.view is not live.view
    assert len(live.view) == N  # the live attempt's view shows what it read


def test_a_list_changed_in_place_under_the_spare_is_checked_item_by_item() -> None:
    store, spares = _committed(), dict[str, Tracker]()
    _step(store, spares, lambda v: None)
    store["k"][7] = "another commit's"  # a change the spare view never saw
    assert renew(spares, "k", store["k"]) is None
    tracker = _step(store, spares, lambda v: None)
    assert tracker.view[7] == "another commit's"
    assert _same_objects(tracker.view, store["k"])


def test_a_rewritten_view_is_not_renewed() -> None:
    store, spares = _committed(), dict[str, Tracker]()
    _step(store, spares, lambda v: v.sort(key=lambda x: -x["i"]))
    # A rewrite replaces the committed list whole: the spare is a view of the old one.
    assert store["k"][0] == {"i": N - 1}
    assert renew(spares, "k", store["k"]) is None
    tracker = _step(store, spares, lambda v: None)
    assert _same_objects(tracker.view, store["k"])


def test_on_the_owners_word_a_list_is_renewed_without_comparing_its_items() -> None:
    """With the ops base took vouched for, what they touched is put back and no item is
    compared: an index changed in place by ops from elsewhere shows base's new item."""
    store, spares = _committed(), dict[str, Tracker]()
    _step(store, spares, lambda v: None)
    ops: list[Any] = [("set", (7,), "elsewhere"), ("set", (9, "i"), -9), ("append", (), "end")]
    apply(store["k"], ops)
    tracker = renew(spares, "k", store["k"], (ops, False))
    assert tracker is not None
    assert _same_objects(tracker.view, store["k"])
    assert tracker.view[7] == "elsewhere"
    assert tracker.view[-1] == "end"


def test_ops_that_move_items_are_not_vouched_for() -> None:
    """Ops that delete an item or rewrite the list make the renewal compare every item."""
    cases: list[list[Any]] = [[("del", (3,))], [("replace", (), [])]]
    for ops in cases:
        store, spares = _committed(), dict[str, Tracker]()
        _step(store, spares, lambda v: None)
        store["k"] = committed = apply(store["k"], ops)
        tracker = renew(spares, "k", committed, (ops, False))
        if tracker is not None:
            assert _same_objects(tracker.view, committed)


def test_the_views_own_patch_is_put_back_without_comparing() -> None:
    """The view's own patch, vouched for, is put back as what it touched."""
    store, spares = _committed(), dict[str, Tracker]()
    tracker = _tracker_of(store, spares)
    tracker.view[2]["i"] = "inside"
    tracker.view[4] = "set"
    tracker.view.append("end")
    change = encode_tracked(default_codec, "k", tracker, BY_SET, "k")
    assert change is not None
    assert change.ops is not None
    apply(store["k"], change.ops)
    del tracker
    renewed = renew(spares, "k", store["k"], (change.ops, True))
    assert renewed is not None
    assert _same_objects(renewed.view, store["k"])


def _tracker_of(store: dict[str, Any], spares: dict[str, Tracker]) -> Tracker:
    tracker = Tracker(store["k"])
    spares["k"] = tracker
    return tracker


class Again(Event):
    i: int


class Grow(Workflow):
    """Appends one item a step to a list of N; keeps the view once, at step KEEP."""

    kept: list[Any]

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i = ev.i if isinstance(ev, Again) else 0
        items = await ctx.store.get("items", default=None)
        if items is None:
            await ctx.store.set("items", [f"item {j}" for j in range(N)])
            return Again(i=1)
        items.append(f"step {i}")
        if i == 5:
            type(self).kept.append(items)  # the user keeps it: later steps must not touch it
        await ctx.store.set("items", items)
        return Again(i=i + 1) if i < 12 else StopEvent(result=len(items))


async def test_a_run_renews_its_views_and_folds_to_the_live_value(tmp_path: Path) -> None:
    Grow.kept = []
    wf = Grow(store=str(tmp_path / "grow.db"), timeout=None)
    handler = wf.run()
    assert await handler == N + 12
    expected = [f"item {j}" for j in range(N)] + [f"step {i}" for i in range(1, 13)]
    assert await handler.ctx.store.get("items") == expected
    assert wf.state_at(handler.run_id).context["items"] == expected
    (kept,) = Grow.kept
    assert list(kept) == expected[: N + 5]  # as it was when set at step 5
    wf.store.close()


def test_the_state_alone_benchmark_measures_every_update_as_a_patch() -> None:
    """``python -m benchmarks.state_alone`` times each update through renewed views; each
    of its updates must stay a patch (its child raises otherwise)."""
    from benchmarks import state_alone

    for name in state_alone.UPDATES:
        out = state_alone.child(name, 2 * SPARE_MIN)
        assert out["us"] > 0
