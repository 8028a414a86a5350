"""The journal's output is a promise: one representative run's records stay byte-identical.

``GoldenFlow`` runs through every record kind the journal writes but ``memoized`` (a
fan-out to a step that fails once and is retried, a fan-in with ``collect_events``, a durable
wait answered after a suspend, a stream, context sets, patches and deletes, a conflict, a
failed run resumed with operator updates, a cancel, a timeout, a finish) and is forked;
``MemoGolden`` then records memoized calls in a run of its own. Their rows (kind, step and
the payload text, grouped by commit) must equal ``tests/fixtures/golden_run.json``, whose
first two runs were written by the code before payloads were typed. Only what no two runs
share is normalised: tracebacks (paths and line numbers), wait deadlines, the elapsed time
of a timeout, a failed attempt or a memoized call, and when a retry is due.

A change that means to change what is written (a new record kind, a new field) regenerates
the fixture with ``python -m tests.test_journal`` and shows the difference in review: only
additions are allowed, since the fold reads every payload shape ever written.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any, Final

import pytest
from pydantic import TypeAdapter

from eventstore import Commit, EventStore, NewRun, Record
from workflow import (
    Context,
    Event,
    HumanResponseEvent,
    InputRequiredEvent,
    MemoizedError,
    StartEvent,
    StopEvent,
    Workflow,
    step,
)
from workflow import _journal as J
from workflow._fold import APPLY, fold
from workflow._read import commits, run_info, start_state
from workflow._snapshot import dump_folded
from workflow.retry_policy import retry_policy, stop_after_attempt, wait_fixed

# Runs as rows: label -> commits -> [kind, step, payload text].
Rows = dict[str, list[list[list[Any]]]]

FIXTURE: Final = Path(__file__).resolve().parent / "fixtures" / "golden_run.json"
RUN_ID: Final = "golden"
LINKED_ID: Final = "linked"  # a run started from the golden run's context (since issue 14)
BOUND: Final = 30.0  # seconds a session may take before the test fails instead of hanging
# The parts of a folded state that come from the records' times.
_CLOCK: Final = frozenset({"exec_us", "prev_ts"})
# Values no two runs share, replaced where they stand so the rest stays byte for byte.
_VOLATILE: Final = (
    (re.compile(r'"traceback":"(?:[^"\\]|\\.)*"'), '"traceback":"<traceback>"'),
    (re.compile(r'"deadline":-?[0-9][0-9.eE+-]*'), '"deadline":0'),
    (re.compile(r'"elapsed":-?[0-9][0-9.eE+-]*'), '"elapsed":0'),
    (re.compile(r'"retry_at":-?[0-9][0-9.eE+-]*'), '"retry_at":0'),
    (re.compile(r'"by":"(?:[^"\\]|\\.)*:[0-9]+"'), '"by":"<host>:<pid>"'),
)


class Job(Event):
    """One unit of the fan-out."""

    n: int


class Done(Event):
    """A finished unit, collected by ``gather``."""

    n: int


class Report(Event):
    """What the fan-in made of the units."""

    total: int


class Approved(Event):
    """The human's answer, passed on."""

    by: str


class Bump(Event):
    """Writes ``count`` while ``tally`` holds a stale read of it."""


class Checked(Event):
    """The count is settled: publish."""


class Slow(Event):
    """Work that waits for ``release`` (cancelled, then timed out, then let through)."""


class Note(Event):
    """A progress note written to the stream."""

    text: str


class Stray(Event):
    """An external event no step takes: parked as unclaimed."""


class GoldenFlow(Workflow):
    """Every record kind, in an order that does not depend on timing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, types=[Stray], **kwargs)
        self.tries: dict[int, int] = {}
        self.bumped = asyncio.Event()
        self.release = asyncio.Event()
        self.slow_started = asyncio.Event()

    @step
    async def start(self, ctx: Context, ev: StartEvent) -> Job | None:
        await ctx.store.set("items", [ev.first])
        await ctx.store.set("scratch", {"a": 1, "b": [1, 2]})
        await ctx.store.set("tmp", "gone soon")
        ctx.write_event_to_stream(Note(text="started"))
        for n in range(3):
            ctx.send_event(Job(n=n))
        return None

    @step(num_workers=1, retry_policy=retry_policy(wait=wait_fixed(0), stop=stop_after_attempt(3)))
    async def work(self, ctx: Context, ev: Job) -> Done:
        self.tries[ev.n] = self.tries.get(ev.n, 0) + 1
        items = await ctx.store.get("items")
        items.append(ev.n * 10)
        await ctx.store.set("items", items)
        if ev.n == 1 and self.tries[ev.n] == 1:
            ctx.write_event_to_stream(Note(text="flaky"))
            raise ValueError("flaky unit 1")
        return Done(n=ev.n)

    @step(num_workers=1)
    async def gather(self, ctx: Context, ev: Done) -> Report | None:
        got = ctx.collect_events(ev, [Done] * 3)
        if got is None:
            return None
        scratch = await ctx.store.get("scratch")
        scratch["b"].append(3)
        scratch["c"] = "new"
        await ctx.store.set("scratch", scratch)
        await ctx.store.delete("tmp")
        return Report(total=sum(e.n for e in got))

    @step
    async def review(self, ctx: Context, ev: Report) -> Approved | Bump:
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=InputRequiredEvent(prefix=f"total {ev.total}?")
        )
        ctx.send_event(Bump())
        return Approved(by=answer.response)

    @step
    async def bump(self, ctx: Context, ev: Bump) -> None:
        await ctx.store.set("count", 1)
        self.bumped.set()

    @step
    async def tally(self, ctx: Context, ev: Approved) -> Checked:
        count = await ctx.store.get("count", default=0)
        if not self.bumped.is_set():
            await self.bumped.wait()  # bump commits first: this attempt's read is stale
        await ctx.store.set("count", count + 10)
        return Checked()

    @step
    async def publish(self, ctx: Context, ev: Checked) -> Slow:
        if not await ctx.store.get("approved", default=False):
            raise RuntimeError("not approved yet")
        return Slow()

    @step
    async def slow(self, ctx: Context, ev: Slow) -> StopEvent:
        self.slow_started.set()
        await self.release.wait()
        ctx.write_event_to_stream(Note(text="released"))
        return StopEvent(result={"count": await ctx.store.get("count")})


async def lookup(n: int) -> dict[str, int]:
    """A call worth recording."""
    return {"n": n, "square": n * n}


async def refuse() -> None:
    """A call that raises, recorded with cache_errors=True."""
    raise LookupError("not found")


class MemoGolden(Workflow):
    """A memoized call's result and a memoized call's error (run after the fork)."""

    @step
    async def call(self, ctx: Context, ev: StartEvent) -> StopEvent:
        got = await ctx.memo("lookup", lookup, ev.first)
        try:
            await ctx.memo(None, refuse, cache_errors=True)
        except MemoizedError as exc:
            got["error"] = exc.type_name
        return StopEvent(result=got)


MEMO_RUN_ID: Final = "golden-memo"


async def _bounded(aw: Any) -> Any:
    return await asyncio.wait_for(aw, BOUND)


async def _expect_error(handler: Any, error: type[BaseException]) -> None:
    try:
        await _bounded(handler)
    except error:
        return
    msg = f"the session was to end in {error.__name__}"
    raise AssertionError(msg)


def run_golden(db: Path) -> None:
    """Runs the golden run (``golden``) through its sessions, then forks it."""
    from workflow import RunSuspendedError, WorkflowCancelledError, WorkflowTimeoutError

    async def sessions() -> None:
        # 1: fan-out with a retried failure, fan-in, a wait; suspended while it waits.
        wf = GoldenFlow(store=db, timeout=None)
        handler = wf.run(run_id=RUN_ID, first=7)
        await handler.wait_until_waiting(BOUND)
        await handler.suspend()
        await _expect_error(handler, RunSuspendedError)
        # 2: answered while nobody runs it, with a stray event; a conflict; then it fails.
        wf = GoldenFlow(store=db, timeout=None)
        wf.send(RUN_ID, Stray())
        wf.send(RUN_ID, HumanResponseEvent(response="Ada"))
        await _expect_error(wf.resume(RUN_ID), RuntimeError)
        # 3: resumed with the missing key; cancelled while a step waits.
        wf = GoldenFlow(store=db, timeout=None)
        handler = wf.resume(RUN_ID, updates={"approved": True})
        await _bounded(wf.slow_started.wait())
        await handler.cancel_run()
        await _expect_error(handler, WorkflowCancelledError)
        # 4: resumed once cancelled; times out in the step that waits.
        wf = GoldenFlow(store=db, timeout=1.0)
        await _expect_error(wf.resume(RUN_ID, cancelled=True), WorkflowTimeoutError)
        # 5: resumed with a fresh budget; finishes.
        wf = GoldenFlow(store=db, timeout=None)
        wf.release.set()
        finished = wf.resume(RUN_ID)
        assert await _bounded(finished) == {"count": 11}
        # A fork from where the run had failed, with the update that fixes it.
        failed = [c.seq for c in wf.checkpoints(RUN_ID) if c.kind == J.RUN_FAILED]
        fork = GoldenFlow(store=db, timeout=None)
        fork.release.set()
        assert await _bounded(fork.run_from((RUN_ID, failed[0]), {"approved": True})) == {
            "count": 11
        }
        # A run from the finished run's context with start fields (a chat turn): a new run
        # linked to it, whose first commit writes its context; suspended at its wait.
        turn = GoldenFlow(store=db, timeout=None)
        handler = turn.run(ctx=finished.ctx, run_id=LINKED_ID, first=8)
        await handler.wait_until_waiting(BOUND)
        await handler.suspend()
        await _expect_error(handler, RunSuspendedError)
        fork.store.close()
        # Memoized calls, in a run of their own so that the runs above stay as they were.
        memo = MemoGolden(store=db, timeout=None)
        assert await _bounded(memo.run(run_id=MEMO_RUN_ID, first=3)) == {
            "n": 3,
            "square": 9,
            "error": "LookupError",
        }
        memo.store.close()

    asyncio.run(sessions())


def normalised(payload: str) -> str:
    """A payload's text with the values no two runs share replaced, the rest untouched."""
    for pattern, replacement in _VOLATILE:
        payload = pattern.sub(replacement, payload)
    return payload


def golden_rows(db: Path) -> Rows:
    """The golden run's and its fork's commits, each a list of [kind, step, payload text]."""
    with EventStore(db, readonly=True) as store:
        runs = {info.run_id: info for info in store.runs()}
        fork = [i.run_id for i in runs.values() if i.parent_run_id == RUN_ID]
        assert len(fork) == 1, runs
        return {
            label: [
                [[r.kind, r.step, normalised(r.payload)] for r in commit]
                for commit in commits(store.records(run_id))
            ]
            for label, run_id in (
                (RUN_ID, RUN_ID),
                ("fork", fork[0]),
                (LINKED_ID, LINKED_ID),
                ("memo", MEMO_RUN_ID),
            )
        }


def dump_fixture(rows: Rows, written_by: str) -> str:
    """The fixture's text: a row per line, so that a change shows as the rows it changes."""
    lines = ["{", f'  "written_by": {json.dumps(written_by)},', '  "runs": {']
    for i, (label, run_commits) in enumerate(rows.items()):
        lines.append(f"    {json.dumps(label)}: [")
        for j, commit in enumerate(run_commits):
            lines.append("      [")
            lines.extend(
                f"        {json.dumps(row)}{',' if k < len(commit) - 1 else ''}"
                for k, row in enumerate(commit)
            )
            lines.append("      ]" + ("," if j < len(run_commits) - 1 else ""))
        lines.append("    ]" + ("," if i < len(rows) - 1 else ""))
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def load_rows(db: Path, runs: Rows) -> dict[str, str]:
    """Writes runs given as rows into a new store at ``db``, in order, so their seqs are the
    seqs they were written at; a run whose first record names a parent is its fork. Returns
    the run id of each label (the label itself)."""
    with EventStore(db) as store:
        for label, run_commits in runs.items():
            first: J.RunStarted = json.loads(run_commits[0][0][2])
            parent = first.get("parent")
            for i, commit in enumerate(run_commits):
                create = None
                if i == 0:
                    create = NewRun(
                        meta={"workflow": first["workflow"]},
                        parent_run_id=parent["run_id"] if parent else None,
                        parent_seq=parent["seq"] if parent else None,
                        status="running",
                    )
                records = [Record(kind, step, text) for kind, step, text in commit]
                store.append_sync(Commit(label, records, epoch=1, create=create))
    return {label: label for label in runs}


def older_shapes(runs: Rows) -> Rows:
    """The rows as the earliest code that wrote each kind would have written them: no step
    graph in ``run_started`` (before ``verify``), ``collected`` buffers and classes
    named with their modules, without ``"v"`` (before module-free buffer ids),
    ``step_failed`` without ``retry_at`` and ``elapsed`` (before durable retries), and
    ``run_cancelled`` empty (before it said who cancelled, how and why)."""
    module = GoldenFlow.__module__
    legacy_buf = {"gather": "gather:" + ",".join([f"{module}:Done"] * 3)}
    out: Rows = {}
    for label, run_commits in runs.items():
        out[label] = []
        for commit in run_commits:
            rows = []
            for kind, step_name, text in commit:
                p = json.loads(text)
                if kind == J.RUN_STARTED:
                    del p["graph"]
                elif kind == J.STEP_FAILED:
                    del p["retry_at"], p["elapsed"]
                elif kind == J.RUN_CANCELLED:
                    p = {}
                elif kind == J.COLLECTED:
                    del p["v"]
                    p["buf"] = legacy_buf[step_name]
                    takes = p.pop("takes", None)  # before it, one name per event taken
                    if takes:
                        p["take"] = [f"{module}:{n}" for n, k in takes.items() for _ in range(k)]
                rows.append([kind, step_name, json.dumps(p, separators=(",", ":"))])
            out[label].append(rows)
    return out


def without_clock(folded: dict[str, Any]) -> dict[str, Any]:
    """A folded state without what comes from the records' times: the execution clock, and
    the times of a step's latest failure (older records give them from the commit time)."""
    out = {k: v for k, v in folded.items() if k not in _CLOCK}
    out["in_progress"] = {
        step_name: [[*e[:6], None if e[6] is None else e[6][3:]] for e in entries]
        for step_name, entries in out["in_progress"].items()
    }
    return out


def payload_schema() -> dict[str, dict[str, Any]]:
    """Each record kind's payload as a JSON schema, made from the journal's payload types."""
    return {kind: TypeAdapter(t).json_schema() for kind, t in J.PAYLOADS.items()}


def schema_fields(schema: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The fields a payload schema allows and those every shape of it has (of a union: those
    of any variant, and those all variants require)."""
    defs = schema.get("$defs", {})
    variants = [
        defs[v["$ref"].rsplit("/", 1)[1]] if "$ref" in v else v
        for v in schema.get("anyOf", [schema])
    ]
    allowed = set().union(*(v.get("properties", {}) for v in variants))
    required = set.intersection(*(set(v.get("required", ())) for v in variants))
    return allowed, required


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Rows:
    """The golden run's rows as this code writes them."""
    db = tmp_path_factory.mktemp("golden") / "golden.db"
    run_golden(db)
    return golden_rows(db)


def test_golden_run_rows_are_byte_identical(golden: Rows) -> None:
    """The golden run's records (kind, step, payload text, commits) equal the fixture's."""
    got = golden
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))["runs"]
    assert list(got) == list(want)
    for label in want:
        assert len(got[label]) == len(want[label]), label
        for i, (g, w) in enumerate(zip(got[label], want[label], strict=True)):
            assert g == w, f"{label} commit {i}"


def test_golden_run_has_every_record_kind() -> None:
    """The fixture holds every record kind the journal writes, so none escapes the check."""
    runs = json.loads(FIXTURE.read_text(encoding="utf-8"))["runs"]
    kinds = {row[0] for commits_ in runs.values() for commit in commits_ for row in commit}
    assert kinds == set(J.KINDS)


@pytest.mark.parametrize("shapes", ["current", "older"])
def test_every_payload_fits_its_kinds_type(golden: Rows, shapes: str) -> None:
    """Each payload, in every shape written, has its type's fields (no other) and values."""
    runs = golden if shapes == "current" else older_shapes(golden)
    schema = payload_schema()
    for run_commits in runs.values():
        for commit in run_commits:
            for kind, _, text in commit:
                allowed, required = schema_fields(schema[kind])
                keys = set(json.loads(text))
                assert keys <= allowed, f"{kind}: {sorted(keys - allowed)} not in its type"
                assert required <= keys, f"{kind}: {sorted(required - keys)} missing"
                TypeAdapter(J.PAYLOADS[kind]).validate_json(text, strict=True)


def test_the_fold_has_a_function_for_every_kind() -> None:
    """Every record kind of the journal has its function in the fold, and no other kind."""
    assert set(APPLY) == set(J.KINDS)


def test_the_fold_reads_every_payload_shape(golden: Rows, tmp_path: Path) -> None:
    """Records in the oldest shapes fold to the same state, commit by commit, as today's."""
    states = []
    for shapes, runs in (("current", golden), ("older", older_shapes(golden))):
        db = tmp_path / f"{shapes}.db"
        load_rows(db, runs)
        with EventStore(db, readonly=True) as store:
            after = []
            for label in runs:
                state = start_state(store, run_info(store, label), cached=False)
                for commit in commits(store.records(label)):
                    fold(state, commit)
                    # All but the clock, which counts the time these stores were written at.
                    folded = json.loads(dump_folded(state))
                    after.append(without_clock(folded))
            states.append(after)
    assert states[0] == states[1]


if __name__ == "__main__":
    # Through the module's own name, so that the classes are recorded as pytest imports them.
    import subprocess
    import tempfile

    from tests import test_journal as this

    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "golden.db"
        this.run_golden(path)
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        note = sys.argv[1] if len(sys.argv) > 1 else f"durable-workflows at {head}"
        FIXTURE.write_text(this.dump_fixture(this.golden_rows(path), note), encoding="utf-8")
    print(f"wrote {FIXTURE}")  # noqa: T201
