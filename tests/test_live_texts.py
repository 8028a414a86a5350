"""A list's full write is its logged text grown by what was appended (issue 17).

When the patches of a list since its last full write weigh as much as that write, the
value is written whole again. :class:`workflow._live_context.LiveContext` makes that text
from the text the log holds and the items appended since (a join of strings), not by
encoding the value through the codec (a Python walk of every item: of every model, for an
agent's memory). It must be exactly the text ``Codec.encode`` writes; these tests check it
at every full write of random sequences of changes, and that the joined text was used.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from eventstore import default_codec
from workflow._changes import BY_SET, KeyChange, encode_tracked
from workflow._diff import Tracker
from workflow._live_context import LiveContext


class Msg(BaseModel):
    """A chat message, as an agent's memory holds them."""

    role: str
    content: str
    extras: dict[str, Any] = {}


_ITEMS = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=40),
    st.tuples(st.integers(), st.text(max_size=5)),
    st.frozensets(st.integers(), max_size=3),
    st.dates().map(lambda d: dt.datetime(d.year, d.month, d.day, 1, 2, 3)),
    st.builds(Msg, role=st.sampled_from(["user", "assistant"]), content=st.text(max_size=60)),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=8), max_size=3),
)
# append one, extend by some, set an item in place (not an append), or write the list whole.
_CHANGES = st.one_of(
    st.tuples(st.just("append"), _ITEMS),
    st.tuples(st.just("extend"), st.lists(_ITEMS, min_size=1, max_size=4)),
    st.tuples(st.just("set0"), _ITEMS),
    st.tuples(st.just("whole"), st.lists(_ITEMS, max_size=3)),
)


class _Run:
    """A live context of one list key, changed as a step's commits change it."""

    def __init__(self) -> None:
        self.live = LiveContext(default_codec)
        self.seq = 0
        self.joined = 0  # full writes whose text was joined, not encoded

    def commit(self, changes: list[KeyChange]) -> None:
        known = "k" in self.live.texts
        for rec, ch in zip(self.live.state_records("s", changes), changes, strict=True):
            if ch.ops is None:  # written whole: exactly what the codec writes
                assert ch.text == default_codec.encode(ch.full)
                assert rec.payload is not None
                self.joined += known and rec.kind == "state_set"
        self.seq += 1
        self.live.apply(changes, self.seq)

    def change(self, kind: str, arg: Any) -> None:
        committed = self.live.committed
        if kind == "whole":
            text = default_codec.encode(arg)
            self.commit([KeyChange("k", full=default_codec.decode(text), text=text)])
            return
        tracker = Tracker(committed["k"], codec=default_codec)
        view = tracker.view
        if kind == "append":
            view.append(arg)
        elif kind == "extend":
            view.extend(arg)
        elif view:
            view[0] = arg
        else:
            return
        change = encode_tracked(default_codec, "k", tracker, BY_SET, "k")
        if change is not None:
            self.commit([change])


@settings(max_examples=60, deadline=None)
@given(st.lists(_CHANGES, min_size=1, max_size=120))
def test_a_full_write_is_the_codec_text(changes: list[tuple[str, Any]]) -> None:
    run = _Run()
    run.change("whole", [])
    for kind, arg in changes:
        run.change(kind, arg)
    # The live value is the one the log's texts stand for.
    if "k" in run.live.texts:
        first, _ = run.live.texts["k"]
        assert first.startswith("[")


def test_a_growing_list_of_models_is_joined_and_exact() -> None:
    run = _Run()
    run.change("whole", [])
    for i in range(400):
        extras = {"turn": i, "tool_calls": [], "f": i / 3}
        pair = [Msg(role="user", content=f"q{i}"), Msg(role="a", content="x" * i, extras=extras)]
        run.change("extend", pair)
        if i % 97 == 0:
            run.change("set0", Msg(role="system", content=f"reset {i}"))  # not an append
    assert run.joined >= 3  # the fast path made those full writes (each checked exact)


def test_an_edit_that_is_no_append_forgets_the_text() -> None:
    run = _Run()
    run.change("whole", ["a" * 300])
    assert run.live.texts["k"] == (default_codec.encode(["a" * 300]), [])
    run.change("append", "b")
    assert run.live.texts["k"][1] == [b'"b"']  # the patch's bytes, decoded when joined
    run.change("set0", "c")
    assert "k" not in run.live.texts  # the next full write encodes the value
    run.change("whole", ["z"])
    assert run.live.texts["k"] == ('["z"]', [])


def test_a_deleted_key_forgets_its_text() -> None:
    """Deleting a key drops the pieces of its text (they would hold its memory)."""
    run = _Run()
    run.change("whole", ["a"])
    run.change("append", "b")
    run.seq += 1
    run.live.apply([KeyChange("k", deleted=True)], run.seq)
    assert "k" not in run.live.texts
