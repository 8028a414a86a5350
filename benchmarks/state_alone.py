"""state_alone (issue 17): whether each update spelling's per-step cost is flat in N.

``python -m benchmarks.state_alone [--repeat R] [--no-full]`` prints two Markdown tables:

1. **the state part alone**: per spelling, in a fresh process, S steps of what a step's
   state costs besides the executor: a :class:`~workflow._diff.Tracker` of the committed
   value (what ``get`` makes), the change ``set`` makes of the user's update
   (``encode_tracked`` or ``value_change``, as :mod:`workflow._context` calls them) and
   its apply to the committed value. Process CPU time per step at N = 1,000 and 10,000
   items and what N = 10,000 adds; the user's own update (as
   ``benchmarks/peers/state_flows.py`` writes it) is timed apart and shown beside.
   Also a list decoded afresh and grown (nothing shared by identity, so the encoded forms
   are compared), a deep copy of a plain list changed in one place, and an agent's memory
   (N pydantic chat messages, two appended a step, as ``Context[AgentState]`` keeps them).
   The view is taken as ``ctx.store.get`` takes it: made from the step before's when
   nothing holds that any more (:func:`workflow._diff.renew`).
2. **ours, whole steps** (unless ``--no-full``): every spelling of
   ``benchmarks/peers/state_flows.py`` at N = 1,000 and 10,000 on a file store
   (``state_run.py``, durability normal), process CPU µs per step and its ratio: the
   executor's fixed cost included, CPU rather than wall time so that other jobs on a
   shared machine distort it least.

Medians of R repetitions (default 3), each a fresh process.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from . import _peers
from ._common import run_child
from .state import SPELLINGS

ITEM = "x" * 100
SIZES = (1000, 10_000)
STEPS = 300
GOAL_FLAT = 1.3

Update = Callable[[Any, int], Any]


def _plus(v: Any, i: int) -> Any:
    return v + [ITEM]  # noqa: RUF005 - the spelling under test


def _slice_plus(v: Any, i: int) -> Any:
    return v[:] + [ITEM]  # noqa: RUF005 - the spelling under test


def _list_copy(v: Any, i: int) -> Any:
    v = list(v)
    v.append(ITEM)
    return v


def _deepcopy(v: Any, i: int) -> Any:
    v = copy.deepcopy(v)
    v.append(ITEM)
    return v


def _append(v: Any, i: int) -> Any:
    v.append(ITEM)
    return v


def _setitem(v: Any, i: int) -> Any:
    v[f"k{i}"] = ITEM
    return v


def _rebuilt(v: Any, i: int) -> Any:
    return [*orjson.loads(orjson.dumps(list(v))), ITEM]  # new objects, equal to the old


def _two_messages(v: Any, i: int) -> Any:
    from .peers.state_flows import _turn

    v.extend(_turn(i))
    return v


def _plain_deepcopy_one(v: Any, i: int) -> Any:
    new = copy.deepcopy(list(v))
    new[len(new) // 2] = f"changed {i}"
    return new


UPDATES: dict[str, tuple[str, Update]] = {
    "append": ("list", _append),
    "plus": ("list", _plus),
    "star": ("list", lambda v, i: [*v, ITEM]),
    "slice_plus": ("list", _slice_plus),
    "list_copy": ("list", _list_copy),
    "deepcopy": ("list", _deepcopy),
    "dict_setitem": ("dict", _setitem),
    "dict_unpack": ("dict", lambda v, i: {**v, f"k{i}": ITEM}),
    "dict_or": ("dict", lambda v, i: v | {f"k{i}": ITEM}),
    "dict_call": ("dict", lambda v, i: dict(v, **{f"k{i}": ITEM})),
    "rebuilt": ("list", _rebuilt),
    "deepcopy_changed": ("list", _plain_deepcopy_one),
    "agent_messages": ("messages", _two_messages),
}
EXTRA = {
    "rebuilt": "a list decoded afresh, then `+ [x]` (nothing shared by identity)",
    "deepcopy_changed": "`copy.deepcopy(list(items))` with one item changed in the middle",
    "agent_messages": "N chat messages (pydantic), `state.messages` gets two a step",
}


def child(name: str, n: int) -> dict[str, Any]:
    """One measurement in this process: CPU µs per step of the state part of a step."""
    from eventstore import default_codec as codec
    from workflow._changes import BY_SET, encode_tracked, value_change
    from workflow._diff import Tracker, apply

    try:
        from workflow._diff import renew, spare
    except ImportError:  # a tree from before views were renewed: always a copy
        renew, spare = (lambda spares, key, base: None), (lambda tracker: False)

    shape, update = UPDATES[name]
    base: Any = [f"{ITEM}{i}" for i in range(n)]
    if shape == "dict":
        base = {f"k{i}": v for i, v in enumerate(base)}
    elif shape == "messages":
        base = []
        for i in range(n // 2):
            _two_messages(base, i)
    committed, versions = {"k": base}, {"k": 1}
    spares: dict[str, Any] = {}
    user = 0.0
    clock = time.process_time
    start = clock()
    for i in range(STEPS):
        tracker = renew(spares, "k", committed["k"]) or Tracker(committed["k"], codec=codec)
        if spare(tracker):
            spares["k"] = tracker
        t = clock()
        new = update(tracker.view, n + i)
        user += clock() - t
        if tracker.is_view(new):
            change = encode_tracked(codec, "k", tracker, BY_SET, "k")
        else:
            text = None
            if name in ("rebuilt", "deepcopy_changed"):  # set() encodes a value not derived
                text = codec.encode(new)
            change, _ = value_change(
                codec, committed, versions, "k", new, text, hint=tracker, size=n * 110
            )
        if change is None or change.ops is None:
            msg = f"{name}: the change is not a patch ({change})"
            raise AssertionError(msg)
        committed["k"] = apply(committed["k"], change.ops)
        del tracker, new, change
    total = clock() - start
    return {"us": (total - user) / STEPS * 1e6, "user_us": user / STEPS * 1e6}


def _alone(repeat: int) -> list[list[Any]]:
    rows = []
    a, b = SIZES
    for name in UPDATES:
        ours: dict[int, float] = {}
        user: dict[int, float] = {}
        for n in SIZES:
            outs = [
                run_child(["-m", "benchmarks.state_alone", "--child", name, str(n)])
                for _ in range(repeat)
            ]
            ours[n] = statistics.median(o["us"] for o in outs)
            user[n] = statistics.median(o["user_us"] for o in outs)
        code = SPELLINGS.get(name) or EXTRA[name]
        mine = [f"{ours[a]:.1f}", f"{ours[b]:.1f}", f"{ours[b] - ours[a]:+.1f}"]
        rows.append([name, code, *mine, f"{user[a]:.1f}", f"{user[b]:.1f}"])
    return rows


def _full(repeat: int) -> list[list[Any]]:
    script = _peers.script("state_run.py")
    workloads = [*SPELLINGS, "agent_edit_state", "agent_get_set_state", "agent_dicts"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="state-alone-") as tmp:
        for name in workloads:
            cpu: dict[int, float] = {}
            for n in SIZES:
                samples = []
                for r in range(repeat):
                    db = Path(tmp) / f"{name}-{n}-{r}.db"
                    out = run_child([script, "workflow", name, str(n), str(db)])
                    samples.append(out["cpu_s"] / n * 1e6)
                cpu[n] = statistics.median(samples)
            ratio = cpu[SIZES[1]] / cpu[SIZES[0]]
            rows.append([name, f"{cpu[SIZES[0]]:.0f}", f"{cpu[SIZES[1]]:.0f}", _verdict(ratio)])
    return rows


def _verdict(ratio: float) -> str:
    return f"{ratio:.2f}x {'(flat)' if ratio <= GOAL_FLAT else '(NOT flat)'}"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def line(cells: list[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join(
        [line(headers), "|" + "|".join("---" for _ in headers) + "|", *map(line, rows)]
    )


def main(argv: list[str]) -> None:
    """Parses the arguments; runs one child measurement or both tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_alone")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="the state part alone only")
    parser.add_argument("--child", nargs=2, metavar=("SPELLING", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import json

        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    a, b = SIZES
    print(
        f"## The state part of a step alone, CPU µs per step ({STEPS} steps, median of"
        f" {args.repeat} fresh processes; the user's own update timed apart)\n"
    )
    head = ["spelling", "code", f"ours N={a:,}", f"ours N={b:,}", "added"]
    head += [f"user's update N={a:,}", f"N={b:,}"]
    print(_table(head, _alone(args.repeat)))
    if not args.no_full:
        print(
            f"\n## Ours, whole steps on a file store, CPU µs per step (median of {args.repeat})\n"
        )
        print(
            _table(["workload", f"N={a:,}", f"N={b:,}", f"N={b:,} / N={a:,}"], _full(args.repeat))
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
