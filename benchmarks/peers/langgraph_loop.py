"""LangGraph + SqliteSaver, the loop workload: prints one JSON line (runs in the peers venv).

``python langgraph_loop.py CHANNEL MODE N DB``; CHANNEL is ``full`` (``items`` a plain
list channel: every checkpoint stores the whole list) or ``delta`` (``DeltaChannel``,
beta: checkpoints store the appended items). Every run uses ``durability="sync"``: each
step's checkpoint is written before the next step starts. MODE:

* ``run``: the loop from the start (``BENCH_CRASH_AT=K`` kills the process at step K);
  prints ``seconds`` (``invoke``) and ``bytes`` (db + wal, connection closed).
* ``resume``: ``invoke(None, config)`` after a crash, to the end; prints ``seconds``.
* ``restore``: in this fresh process, ``get_state(config)`` (latest), then ``get_state``
  with the ``checkpoint_id`` of the middle checkpoint; prints ``latest_s``, ``middle_s``.
"""

# No ``from __future__ import annotations``: LangGraph evaluates the state's annotations.
import time

_START = time.perf_counter()

import argparse  # noqa: E402 - the clock above starts before the imports it measures
import json  # noqa: E402
import os  # noqa: E402
import sqlite3  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Annotated, Any, TypedDict  # noqa: E402

from langgraph.channels import DeltaChannel  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

ITEM = "x" * 100
THREAD = "bench"
CRASH_AT = int(os.environ.get("BENCH_CRASH_AT", "-1"))


def extend(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    """DeltaChannel's reducer: all writes of a batch appended (batching-invariant)."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class FullState(TypedDict):
    """The whole list is the channel's value: each checkpoint stores all of it."""

    items: list[str]
    i: int
    n: int


class DeltaState(TypedDict):
    """``items`` is a DeltaChannel (beta): checkpoints store the writes, snapshots now and then."""

    items: Annotated[list[str], DeltaChannel(extend)]
    i: int
    n: int


def full_node(s: FullState) -> dict[str, Any]:
    """One step: a new list with the item appended (channels hold values, not mutations)."""
    if s["i"] == CRASH_AT:
        os._exit(9)
    return {"items": [*s["items"], ITEM], "i": s["i"] + 1}


def delta_node(s: DeltaState) -> dict[str, Any]:
    """One step: writes the one new item; the reducer appends it."""
    if s["i"] == CRASH_AT:
        os._exit(9)
    return {"items": [ITEM], "i": s["i"] + 1}


def build(channel: str) -> Any:
    """The one-node graph looping on itself until ``i == n``."""
    graph: Any = StateGraph(DeltaState if channel == "delta" else FullState)
    graph.add_node("loop", delta_node if channel == "delta" else full_node)
    graph.add_edge(START, "loop")
    graph.add_conditional_edges("loop", lambda s: END if s["i"] >= s["n"] else "loop")
    return graph


def db_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("channel", choices=["full", "delta"])
    parser.add_argument("mode", choices=["run", "resume", "restore"])
    parser.add_argument("n", type=int)
    parser.add_argument("db")
    args = parser.parse_args()
    n = args.n
    conn = sqlite3.connect(args.db, check_same_thread=False)
    app = build(args.channel).compile(checkpointer=SqliteSaver(conn))
    config: Any = {"configurable": {"thread_id": THREAD}, "recursion_limit": n + 10}
    out: dict[str, Any] = {}
    start = time.perf_counter()
    out["import_s"] = start - _START
    if args.mode == "restore":
        # Untimed: the middle checkpoint's id (ids sort by time), found with plain SQL.
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_id",
                (THREAD,),
            )
        ]
        start = time.perf_counter()
        latest = app.get_state({"configurable": {"thread_id": THREAD}})
        mid = time.perf_counter()
        middle = app.get_state(
            {"configurable": {"thread_id": THREAD, "checkpoint_id": ids[len(ids) // 2]}}
        )
        end = time.perf_counter()
        assert len(latest.values["items"]) == n, len(latest.values["items"])
        assert 0 < len(middle.values["items"]) < n
        out.update(latest_s=mid - start, middle_s=end - mid, checkpoints=len(ids))
    else:
        inputs = None
        if args.mode == "run":
            inputs = {"i": 0, "n": n} if args.channel == "delta" else {"items": [], "i": 0, "n": n}
        result = app.invoke(inputs, config, durability="sync")
        out["seconds"] = time.perf_counter() - start
        assert len(result["items"]) == n, len(result["items"])
    conn.close()
    out["bytes"] = db_bytes(args.db)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
