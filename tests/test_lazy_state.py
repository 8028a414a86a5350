"""A RunState decodes lazily: each context value, queue, step's events in progress and stream
event when it is first read, so a state costs what its reader looks at. A value the log holds
damaged (here: tagged with a type no codec knows) lets ``state_at`` answer, and raises
LogCorruptedError naming it and its record's seq when it is read.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from eventstore import EventStore, LogCorruptedError, default_codec
from tests.test_bad_input import Parcel, Shipping, failed_run, plant
from workflow import RunState
from workflow._state import LazyDict, LazyList

BAD = {"$t": "no-such-tag"}  # a value no codec decodes


def payload(**fields: object) -> str:
    return json.dumps(fields)


def good(label: str) -> object:
    return default_codec.dump(Parcel(label=label))


@pytest.fixture
def spoiled(tmp_path: Path) -> tuple[RunState, dict[str, int]]:
    """A failed Shipping run with a good and a damaged item planted in each part."""
    import asyncio

    db = tmp_path / "lazy.db"
    asyncio.run(failed_run(db))
    seqs = {
        "good key": plant(db, "r1", "state_set", None, payload(key="good", value=7)),
        "bad key": plant(db, "r1", "state_set", None, payload(key="bad", value=BAD)),
        "good queue": plant(db, "r1", "enqueued", "start", payload(id=80, event=good("a"))),
        "bad queue": plant(db, "r1", "enqueued", "pack", payload(id=90, event=BAD)),
        "bad step": plant(db, "r1", "enqueued", "ship", payload(id=91, event=BAD)),
        "good stream": plant(db, "r1", "streamed", None, payload(id=92, attempt=1, event=7)),
        "bad stream": plant(db, "r1", "streamed", None, payload(id=93, attempt=1, event=BAD)),
    }
    plant(db, "r1", "dequeued", "ship", payload(id=91, worker=0))  # in progress beside Packed
    state = Shipping(store=EventStore(db)).state_at("r1")  # reads nothing damaged yet
    return state, seqs


def test_context_values_decode_when_read(spoiled: tuple[RunState, dict[str, int]]) -> None:
    """Keys list without decoding; a good value reads; the damaged one names key and seq."""
    state, seqs = spoiled
    assert list(state.context) == ["good", "bad"]
    assert "bad" in state.context
    assert len(state.context) == 2
    assert state.context["good"] == 7
    with pytest.raises(LogCorruptedError, match=rf"seq {seqs['bad key']}\b.*context key 'bad'"):
        state.context["bad"]
    with pytest.raises(LogCorruptedError) as info:
        dict(state.context)
    assert info.value.seq == seqs["bad key"]


def test_queues_decode_when_read(spoiled: tuple[RunState, dict[str, int]]) -> None:
    """A step's queue is decoded when read: another step's damage does not touch it."""
    state, seqs = spoiled
    assert set(state.queues) == {"start", "pack"}
    assert state.queues["start"] == [Parcel(label="a")]
    with pytest.raises(LogCorruptedError, match=rf"seq {seqs['bad queue']}\b.*event 90"):
        state.queues["pack"]


def test_events_in_progress_decode_when_read(spoiled: tuple[RunState, dict[str, int]]) -> None:
    """The events a step has in progress are decoded when that step's entry is read."""
    state, seqs = spoiled
    assert list(state.in_progress) == ["ship"]
    with pytest.raises(LogCorruptedError, match=rf"seq {seqs['bad step']}\b.*event 91"):
        state.in_progress["ship"]


def test_stream_events_decode_when_read(spoiled: tuple[RunState, dict[str, int]]) -> None:
    """Each stream event is decoded when read; its length costs nothing."""
    state, seqs = spoiled
    assert len(state.stream) == 2
    first: object = state.stream[0]  # a bare value streamed, as the log may hold
    assert first == 7
    with pytest.raises(LogCorruptedError, match=rf"seq {seqs['bad stream']}\b.*event 93"):
        state.stream[-1]


def test_lazy_containers_behave_as_dict_and_list() -> None:
    """They compare equal to dicts and lists, copy and pickle as them, and decode once."""
    calls: list[str] = []

    def load(key: str, raw: int) -> int:
        calls.append(key)
        return raw * 10

    d = LazyDict({"a": 1, "b": 2}, load)
    assert d == {"a": 10, "b": 20}
    assert {"a": 10, "b": 20}.__eq__(d) is NotImplemented  # so dict == d asks d
    assert d["a"] == 10
    assert calls == ["a", "b"]  # each decoded once
    d["c"] = 5
    del d["b"]
    assert list(d) == ["a", "c"]
    assert copy.deepcopy(d) == {"a": 10, "c": 5}
    shallow: object = copy.copy(d)
    assert type(shallow) is dict
    assert pickle.loads(pickle.dumps(d)) == {"a": 10, "c": 5}
    assert repr(d) == "{'a': 10, 'c': 5}"

    items = LazyList([1, 2, 3], lambda raw: raw + 1)
    assert items == [2, 3, 4]
    assert [2, 3, 4].__eq__(items) is NotImplemented  # so list == items asks items
    assert items[-1] == 4
    assert items[1:] == [3, 4]
    with pytest.raises(IndexError):
        items[3]
    deep: object = copy.deepcopy(items)
    assert type(deep) is list
    assert pickle.loads(pickle.dumps(items)) == [2, 3, 4]
    assert items != "234"
