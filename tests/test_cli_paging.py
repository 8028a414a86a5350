"""The command line on long runs: ``history`` pages (--from, --limit), ``state --at`` and
``diff`` read from the nearest snapshot, and each says exactly what the whole log says."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore
from tests.test_cli import invoke, ok
from tests.test_fold import run_case
from tests.test_snapshots import chat
from workflow._compare import changes_between
from workflow._read import fold_run


def history(db: Path, run: str, *args: str | int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(ok("history", db, run, "--json", *args))
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """One store with runs of many shapes (fan-out, retries, typed events, a wait, a fork)
    and a long chat run with many snapshots."""
    db = tmp_path_factory.mktemp("paging") / "runs.db"

    async def go() -> dict[str, str]:
        store = EventStore(db)
        out = {}
        for name in ("fan", "retries", "typed", "asker", "conflicts"):
            _, run_id, _ = await run_case(name, store)
            out[name] = run_id
        wf, out["chat"] = await chat(store, 600)
        fork = wf.run_from(wf.checkpoints(out["chat"])[250])
        await fork
        out["fork"] = fork.run_id
        await store.flush()
        store.close()
        return out

    return db, asyncio.run(go())


@pytest.mark.parametrize("name", ["fan", "retries", "typed", "asker", "conflicts", "fork"])
def test_history_from_any_seq_is_the_tail_of_the_whole(
    runs: tuple[Path, dict[str, str]], name: str
) -> None:
    """history --from X gives exactly the whole history's records from X on, event types
    included (those of events enqueued before X come from the state at X)."""
    db, ids = runs
    run = ids[name]
    whole = history(db, run)
    seqs = [r["seq"] for r in whole]
    for x in seqs[1 :: max(1, len(seqs) // 40)]:
        assert history(db, run, "--from", x) == [r for r in whole if r["seq"] >= x], x


def test_history_pages_through_a_long_run(runs: tuple[Path, dict[str, str]]) -> None:
    """--limit N shows N lines and names the next page's --from on stderr; the pages
    together are the whole history, as JSON and as text."""
    db, ids = runs
    run = ids["chat"]
    whole = history(db, run)
    text = ok("history", db, run, "--full").splitlines()
    pages: list[dict[str, Any]] = []
    lines: list[str] = []
    start: int | None = 1
    while start is not None:
        result = invoke("history", db, run, "--json", "--from", start, "--limit", 250)
        assert result.exit_code == 0, result.stderr
        page = json.loads(result.stdout)
        assert len(page) <= 250
        pages += page
        shown = ok("history", db, run, "--full", "--from", start, "--limit", 250).splitlines()
        assert shown[:2] == text[:2]  # the same header
        lines += shown[2:]
        found = re.search(r"more: --from (\d+)", result.stderr)
        start = int(found.group(1)) if found else None
        if start is not None:
            assert start == page[-1]["seq"] + 1
    assert pages == whole
    assert lines == text[2:]


def test_history_limit_counts_what_the_filters_keep(runs: tuple[Path, dict[str, str]]) -> None:
    """--limit applies to the lines shown, after --kind and --step."""
    db, ids = runs
    page = history(db, ids["chat"], "--kind", "state_set", "--limit", 5)
    assert [r["kind"] for r in page] == ["state_set"] * 5
    result = invoke("history", db, ids["chat"], "--limit", "0")
    assert result.exit_code == 2
    assert "--limit" in result.stderr


def test_state_and_diff_at_any_seq_equal_the_pure_fold(runs: tuple[Path, dict[str, str]]) -> None:
    """state --at X reads from the nearest snapshot and shows what the whole log's fold
    gives; diff A B too."""
    db, ids = runs
    run = ids["chat"]
    with EventStore(db, readonly=True) as store:
        ends = sorted({r.commit_seq for r in store.records(run)})
        for x in ends[:: len(ends) // 12]:
            shown = json.loads(ok("state", db, run, "--at", x, "--json"))
            pure = fold_run(store, run, x, cached=False)
            assert shown["seq"] == pure.seq
            assert shown["context"] == {k: v.dump for k, v in pure.context.items()}
        a, b = ends[100], ends[103]
        diff = json.loads(ok("diff", db, run, a, b, "--json"))
        assert diff == changes_between(store, run, a, b).to_json()
        turns = diff["context"]["changed"]["turns"]
        assert turns["new"] > turns["old"]


def test_state_past_the_end_names_the_runs_last_seq(runs: tuple[Path, dict[str, str]]) -> None:
    """state --at past the store's head says where the run itself ends, not only the
    store's head (another run's records came after it); a seq between the two is the run's
    latest state."""
    db, ids = runs
    with EventStore(db, readonly=True) as store:
        info = store.get_run(ids["fan"])
        head = store.head()
    assert info is not None
    assert info.last_seq is not None
    assert info.last_seq < head
    result = invoke("state", db, ids["fan"], "--at", head + 5)
    assert result.exit_code != 0
    said = " ".join(result.stderr.split())
    assert f"seq {head + 5} is past the end of the log: run {ids['fan']!r} ends at seq" in said
    assert f"ends at seq {info.last_seq} (the store's last seq is {head})" in said
    shown = json.loads(ok("state", db, ids["fan"], "--at", head, "--json"))
    assert shown["seq"] == info.last_seq
