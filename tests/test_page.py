"""The timeline page's fold, its own JavaScript run in node, held to the journal's payload types.

The page computes a run's state at any seq in the browser by replaying the columns the
timeline embeds (``FOLD_SCRIPT`` of ``workflow/cli/_page.py``). Here that script runs alone in
node over the golden run of ``tests/test_journal.py`` (every record kind), its fork and its
oldest payload shapes, and must give the Python fold's state after every commit; its table of
kinds must be the journal's, and every field of every payload type must reach the page
unless the page says it has no use for it (``_timeline.UNSHOWN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from eventstore import EventStore
from tests.test_joins import HalfSubclass
from tests.test_journal import (
    Rows,
    golden_rows,
    load_rows,
    older_shapes,
    payload_schema,
    schema_fields,
)
from tests.test_journal import run_golden as write_golden_run
from workflow import _journal as J
from workflow._fold import Folded, fold
from workflow._read import commits, run_info, start_state
from workflow.cli._inspect import Viewer
from workflow.cli._page import FOLD_SCRIPT
from workflow.cli._render import short_class
from workflow.cli._timeline import TEXT, UNSHOWN, timeline_data
from workflow.cli._timeline_build import Builder
from workflow.errors import WorkflowTimeoutError

# Runs in `make test-node`, which installs Node.js when the machine lacks it.
pytestmark = pytest.mark.node

# Runs FOLD_SCRIPT on the data given on stdin, strict as in the page, and prints its table of
# kinds and, after each commit, everything its state holds.
HARNESS: Final = (
    '"use strict";\n(function () {\n'
    'const D = JSON.parse(require("fs").readFileSync(0, "utf8"));\n'
    + FOLD_SCRIPT
    + r"""
const states = [], st = baseState();
const obj = (m, f) => Object.fromEntries([...m].map(([k, v]) => [k, f(v)]));
for (let ci = 0; ci < N; ci++) {
  const [a, b] = range(ci);
  for (let i = a; i < b; i++) apply(st, i);
  states.push({
    seq: C.seq[ci], status: st.status, result: st.result, error: st.error,
    q: obj([...st.q].filter(([, ids]) => ids.length), ids => ids.slice()),
    p: obj([...st.p].filter(([, m]) => m.size), m => [...m].map(([id, e]) => [id, e.a, e.f, e.c])),
    ctx: obj(st.ctx, v => v),
    w: obj(st.w, e => [e.s, e.id, e.aw]),
    u: st.u.slice(),
    b: obj(st.b, m => obj(m, ids => ids.slice())),
  });
}
process.stdout.write(JSON.stringify({kinds: Object.keys(APPLY), states: states}));
})();
"""
)


def node() -> str:
    """The node executable: the page's script runs in it; its absence fails the test."""
    path = shutil.which("node") or shutil.which("nodejs")
    if path is None:
        pytest.fail("node is not installed (Debian: apt-get install nodejs)")
    return path


def page_fold(data: dict[str, Any], where: Path) -> dict[str, Any]:
    """What the page's own fold makes of timeline data: its kinds, the state after each commit."""
    script = where / "page_fold.js"
    script.write_text(HARNESS, encoding="utf-8")
    proc = subprocess.run(
        [node(), str(script)],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def as_the_page_holds_it(s: Folded, view: Viewer) -> dict[str, Any]:
    """A state of the Python fold, in the form the page's fold keeps its state."""
    return {
        "seq": s.seq,
        "status": s.status,
        "result": None if s.result is None else view.show(s.result, TEXT),
        "error": None if s.error is None else f"{s.error['error']}: {s.error['message']}",
        "q": {k: list(q) for k, q in s.queues.items() if q},
        "p": {
            k: [[p.ev.id, p.attempt, p.failures, p.conflicts] for p in ps.values()]
            for k, ps in s.in_progress.items()
            if ps
        },
        "ctx": {k: view.show(v.dump, TEXT) for k, v in s.context.items()},
        "w": {wid: [w.step, w.ev.id, short_class(w.awaited)] for wid, w in s.waiters.items()},
        "u": list(s.unclaimed),
        "b": {b: {t: [e.id for e in es] for t, es in d.items()} for b, d in s.buffers.items()},
    }


def python_fold(store: EventStore, run_id: str, view: Viewer) -> list[dict[str, Any]]:
    """The Python fold's state after each commit of the run, as the page holds its own."""
    state = start_state(store, run_info(store, run_id))
    out = []
    for commit in commits(store.records(run_id)):
        fold(state, commit)
        out.append(as_the_page_holds_it(state, view))
    return out


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Rows:
    """The golden run's and its fork's rows, as this code writes them."""
    db = tmp_path_factory.mktemp("golden") / "golden.db"
    write_golden_run(db)
    return golden_rows(db)


def test_the_page_folds_every_kind_of_the_journal(golden: Rows, tmp_path: Path) -> None:
    """The page's table of kinds is the payload schema's: each kind has its entry, no other."""
    db = tmp_path / "t.db"
    load_rows(db, golden)
    with EventStore(db, readonly=True) as store:
        got = page_fold(timeline_data(store, "golden"), tmp_path)
    assert sorted(got["kinds"]) == sorted(payload_schema())


@pytest.mark.parametrize("shapes", ["current", "older"])
@pytest.mark.parametrize("run", ["golden", "fork"])
def test_the_page_fold_equals_the_python_fold(
    golden: Rows, shapes: str, run: str, tmp_path: Path
) -> None:
    """After every commit of every kind (in every payload shape), the page's fold holds what
    the Python fold holds: status, result, error, queues, attempts, context, waits, buffers."""
    db = tmp_path / "t.db"
    load_rows(db, golden if shapes == "current" else older_shapes(golden))
    view = Viewer()
    with EventStore(db, readonly=True) as store:
        got = page_fold(timeline_data(store, run, view), tmp_path)
        want = python_fold(store, run, view)
    assert len(got["states"]) == len(want)
    for g, w in zip(got["states"], want, strict=True):
        assert g == w, f"after the commit ending at seq {w['seq']}"


class Reads(dict[str, Any]):
    """A payload that notes which of its fields are read (all of them when shown whole)."""

    def __init__(self, data: dict[str, Any], seen: set[str]) -> None:
        super().__init__(data)
        self.seen = seen

    def __getitem__(self, key: str) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def __repr__(self) -> str:
        self.seen.update(self)
        return super().__repr__()


def test_every_payload_field_reaches_the_page(golden: Rows, tmp_path: Path) -> None:
    """Each field of each kind's payload type is read for the page (its arguments or its
    text), unless the page declares it has no use for it; what it declares exists."""
    schema = payload_schema()
    seen: dict[str, set[str]] = {kind: set() for kind in schema}
    for shapes, runs in (("current", golden), ("older", older_shapes(golden))):
        db = tmp_path / f"{shapes}.db"
        load_rows(db, runs)
        with EventStore(db, readonly=True) as store:
            for run_id in runs:
                b = Builder(Viewer())
                for ci, commit in enumerate(commits(store.records(run_id))):
                    for r in commit:
                        b.record(r, Reads(r.data(), seen[r.kind]), ci, 0)
    assert set(UNSHOWN) <= set(J.KINDS)
    for kind, kind_schema in schema.items():
        fields, _ = schema_fields(kind_schema)
        unshown = UNSHOWN.get(kind, frozenset())
        assert unshown <= fields, f"{kind}: UNSHOWN names {sorted(unshown - fields)}"
        assert not seen[kind] & unshown, f"{kind}: {sorted(seen[kind] & unshown)} are shown"
        missing = fields - seen[kind] - unshown
        assert not missing, f"{kind}: the page gets nothing of {sorted(missing)}"


def test_the_page_folds_a_join_of_subclasses_by_the_slot_each_filled(tmp_path: Path) -> None:
    """A put's ``slot`` (a join with ``accept_event_subclasses=True``): the page keeps the
    event in the buffer the Python fold keeps it in, after every commit."""
    db = tmp_path / "j.db"

    async def record() -> None:
        wf = HalfSubclass(store=db, timeout=0.3)
        with contextlib.suppress(WorkflowTimeoutError):
            await wf.run(run_id="j")
        wf.store.close()

    asyncio.run(record())
    view = Viewer()
    with EventStore(db, readonly=True) as store:
        got = page_fold(timeline_data(store, "j", view), tmp_path)
        want = python_fold(store, "j", view)
    (buffer,) = want[-1]["b"].values()
    assert list(buffer) == ["*"]  # the HeaderChild, waiting unassigned
    assert got["states"] == want
