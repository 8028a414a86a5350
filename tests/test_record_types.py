"""``Record`` and ``AppendResult`` build their slots in an ``__init__`` of their own (cheaper
per step): they must still be what the public API promised, frozen dataclasses."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from eventstore import AppendResult, Record, Seq


def test_record_is_a_frozen_dataclass_with_its_defaults() -> None:
    r = Record("state_set")
    assert (r.kind, r.step, r.payload) == ("state_set", None, "{}")
    assert Record("k", "s", '{"a":1}') == Record(kind="k", step="s", payload='{"a":1}')
    assert Record("k") != Record("k", "s")
    assert hash(Record("k", "s")) == hash(Record("k", "s"))
    assert dataclasses.is_dataclass(r)
    assert [f.name for f in dataclasses.fields(r)] == ["kind", "step", "payload"]
    assert dataclasses.replace(r, step="x") == Record("state_set", "x")
    assert dataclasses.asdict(r) == {"kind": "state_set", "step": None, "payload": "{}"}
    assert pickle.loads(pickle.dumps(r)) == r
    assert copy.deepcopy(r) == r
    assert repr(r) == "Record(kind='state_set', step=None, payload='{}')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.kind = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Record()  # type: ignore[call-arg]
    match r:
        case Record(kind, step):
            assert (kind, step) == ("state_set", None)


def test_append_result_is_a_frozen_dataclass_with_its_defaults() -> None:
    a = AppendResult(Seq(3), Seq(5))
    assert (a.first_seq, a.last_seq, a.ts) == (3, 5, 0)
    assert AppendResult(Seq(3), Seq(5), 7) == AppendResult(first_seq=Seq(3), last_seq=Seq(5), ts=7)
    assert hash(a) == hash(AppendResult(Seq(3), Seq(5)))
    assert dataclasses.replace(a, ts=9).ts == 9
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.ts = 1  # type: ignore[misc]


def test_an_attempt_built_by_its_written_out_init_has_every_field() -> None:
    """``Attempt.__init__`` is written out for speed: a field added to the class and not to
    it would be missing on every attempt (an AttributeError on the step's path)."""
    import dataclasses

    from workflow._attempt import Attempt
    from workflow.events import StartEvent

    att = Attempt("s", 1, 1, StartEvent())
    missing = [f.name for f in dataclasses.fields(Attempt) if not hasattr(att, f.name)]
    assert missing == []
