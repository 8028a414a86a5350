"""A large dict's view is made over for the next attempt on the live context's word (issue 17).

A dict's entries cannot be compared at memory speed as a list's items are, so
:func:`workflow._diff.renew` renews a dict's view only when its owner vouches for what the
committed dict took since the view was made: nothing, the view's own patch (taken after its
last edit), or ops from elsewhere that an unedited view never saw. These tests pin down that
a renewed view shows exactly the committed dict (same objects, same order), and that a view
edited after its patch was taken, or kept by the user, is never renewed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventstore import default_codec
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step
from workflow._changes import BY_SET, encode_tracked, value_change
from workflow._diff import SPARE_MIN, TrackedDict, Tracker, apply, renew, spare

N = SPARE_MIN * 2


def _committed(mutable: bool = False) -> dict[str, Any]:
    return {"k": {f"e{i}": {"i": i} if mutable and i % 7 == 3 else i for i in range(N)}}


def _same_entries(view: dict[Any, Any], committed: dict[Any, Any]) -> bool:
    mine, theirs = list(dict.items(view)), list(committed.items())
    return len(mine) == len(theirs) and all(
        a is c and b is d for (a, b), (c, d) in zip(mine, theirs, strict=True)
    )


def _tracker(store: dict[str, Any], spares: dict[str, Tracker], since: Any) -> Tracker:
    committed = store["k"]
    tracker = ("k" in spares and renew(spares, "k", committed, since)) or Tracker(committed)
    if spare(tracker):
        spares["k"] = tracker
    return tracker


def _own_step(store: dict[str, Any], spares: dict[str, Tracker], since: Any, mutate: Any) -> Any:
    """One attempt setting its view: its patch applied to the committed dict in place."""
    tracker = _tracker(store, spares, since)
    mutate(tracker.view)
    change = encode_tracked(default_codec, "k", tracker, BY_SET, "k")
    assert change is not None
    assert change.ops is not None
    apply(store["k"], change.ops)
    return (change.ops, True)


def test_a_dict_view_is_spared() -> None:
    """A view of a dict of SPARE_MIN entries or more is kept for renewal."""
    assert spare(Tracker(_committed()["k"]))
    assert not spare(Tracker({"a": 1}))


def test_an_unchanged_dict_is_renewed_and_shows_the_committed_dict() -> None:
    """With nothing changed since, the spare is renewed as it is and records the next edit."""
    store, spares = _committed(), dict[str, Tracker]()
    first = _tracker(store, spares, None)
    del first
    tracker = renew(spares, "k", store["k"], ([], False))
    assert tracker is not None
    assert _same_entries(tracker.view, store["k"])
    assert tracker.ops() == []
    tracker.view["new"] = "x"
    assert tracker.ops() == [("set", ("new",), "x")]
    assert "new" not in store["k"]


def test_the_views_own_patch_is_put_back_in_the_committed_order() -> None:
    """Edits (set in place, added, deleted and set again at the end) are put back from the
    committed dict, so the renewed view holds its objects in its order."""
    store, spares = _committed(mutable=True), dict[str, Tracker]()

    def edits(v: dict[str, Any]) -> None:
        v["e3"]["i"] = "inside"  # a wrapped value changed inside
        v["e5"] = [5]
        v["added"] = {"a": 1}
        del v["e1"]
        v["e2"] = 2.0
        del v["e2"]
        v["e2"] = True  # deleted and set again: now at the end

    since = _own_step(store, spares, None, edits)
    tracker = renew(spares, "k", store["k"], since)
    assert tracker is not None
    assert _same_entries(tracker.view, store["k"])
    assert list(tracker.view)[-2:] == ["added", "e2"]
    assert type(tracker.view["e2"]) is bool
    tracker.view["e5"].append(6)  # wrapped afresh: committed is untouched
    assert store["k"]["e5"] == [5]
    assert tracker.ops() == [("append", ("e5",), 6)]


def test_a_view_of_atoms_that_gets_a_mutable_value_reads_it_wrapped() -> None:
    """A renewed view of atoms whose committed dict now holds a list hands it out wrapped,
    also to C code (``{**d}``), so mutating it changes nothing committed."""
    store, spares = _committed(), dict[str, Tracker]()
    since = _own_step(store, spares, None, lambda v: v.__setitem__("lst", [1]))
    tracker = renew(spares, "k", store["k"], since)
    assert tracker is not None
    copied = {**tracker.view}
    copied["lst"].append(2)
    assert store["k"]["lst"] == [1]


def test_a_view_edited_after_its_patch_was_taken_is_not_renewed() -> None:
    """An edit after ``set()`` (not written) leaves the view unlike the committed dict."""
    store, spares = _committed(), dict[str, Tracker]()

    def edits(v: dict[str, Any]) -> None:
        v["x"], v["y"] = 1, 2

    tracker = _tracker(store, spares, None)
    edits(tracker.view)
    change = encode_tracked(default_codec, "k", tracker, BY_SET, "k")
    assert change is not None
    assert change.ops is not None
    del tracker.view["x"]
    tracker.view["x"] = 1  # now after "y" in the view, before it in the committed dict
    apply(store["k"], change.ops)
    del tracker
    assert renew(spares, "k", store["k"], (change.ops, True)) is None
    fresh = _tracker(store, spares, None)
    assert _same_entries(fresh.view, store["k"])
    assert list(fresh.view)[-2:] == ["x", "y"]


def test_ops_from_elsewhere_renew_only_an_unedited_view() -> None:
    """A value derived from the view (``{**d, k: v}``) is what was written: its ops are put
    back into the unedited view; an edited one is copied afresh instead."""
    for edited in (False, True):
        store, spares = _committed(), dict[str, Tracker]()
        tracker = _tracker(store, spares, None)
        if edited:
            tracker.view["e0"] = "edited, not written"
        new = {**tracker.view, "k1": 1}
        del new["e4"]
        change, _ = value_change(default_codec, store, {}, "k", new, None, hint=tracker)
        assert change is not None
        assert change.ops is not None
        apply(store["k"], change.ops)
        del tracker
        renewed = renew(spares, "k", store["k"], (change.ops, False))
        assert (renewed is None) is edited
        view = _tracker(store, spares, None).view if renewed is None else renewed.view
        assert _same_entries(view, store["k"])
        assert "e4" not in view
        assert view["k1"] == 1


def test_without_the_owners_word_a_dict_view_is_not_renewed() -> None:
    """No word on what the committed dict took (``since`` None): never renewed."""
    store, spares = _committed(), dict[str, Tracker]()
    _tracker(store, spares, None)
    assert renew(spares, "k", store["k"], None) is None


def test_a_dict_view_the_user_kept_is_never_renewed() -> None:
    """A view the user holds is never made over, so it keeps showing what it showed."""
    store, spares = _committed(), dict[str, Tracker]()
    kept = _tracker(store, spares, None).view
    assert isinstance(kept, TrackedDict)
    assert renew(spares, "k", store["k"], ([], False)) is None


class Again(Event):
    i: int


class Grow(Workflow):
    """Adds an entry a step to a dict of N by each spelling; edits after ``set`` at step 4
    (not written) and keeps the view at step 6."""

    kept: list[Any]

    @step
    async def loop(self, ctx: Context, ev: StartEvent | Again) -> Again | StopEvent:
        i = ev.i if isinstance(ev, Again) else 0
        d = await ctx.store.get("d", default=None)
        if d is None:
            await ctx.store.set("d", {f"e{j}": j for j in range(N)})
            return Again(i=1)
        spelling = i % 4
        if spelling == 0:
            d[f"s{i}"] = i
            await ctx.store.set("d", d)
        elif spelling == 1:
            await ctx.store.set("d", {**d, f"s{i}": [i]})
        elif spelling == 2:
            await ctx.store.set("d", d | {f"s{i}": float(i)})
        else:
            await ctx.store.set("d", dict(d, **{f"s{i}": str(i)}))
        if i == 4:
            d["not written"] = True
        if i == 6:
            type(self).kept.append(d)
        return Again(i=i + 1) if i < 13 else StopEvent(result=len(d))


async def test_a_run_renews_its_dict_views_and_folds_to_the_live_value(tmp_path: Path) -> None:
    """Each spelling through renewed views: the live value, a fresh read and the fold agree."""
    Grow.kept = []
    wf = Grow(store=str(tmp_path / "grow.db"), timeout=None)
    handler = wf.run()
    await handler
    expected: dict[str, Any] = {f"e{j}": j for j in range(N)}
    for i in range(1, 14):
        expected[f"s{i}"] = [i, [i], float(i), str(i)][i % 4]
    got = await handler.ctx.store.get("d")
    assert got == expected
    assert list(got) == list(expected)
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
    assert wf.state_at(handler.run_id).context["d"] == expected
    (kept,) = Grow.kept
    assert "s7" not in kept
    assert "not written" not in kept
    wf.store.close()
