"""chain (issue 3): N distinct trivial steps in sequence, each with its own event class.

Where ``loop`` measures one step repeated with growing state, ``chain`` measures the cost of
a step itself in a large graph: step ``i`` takes ``Link{i}`` and returns ``Link{i+1}``
(step 0 takes the ``StartEvent``, the last returns a ``StopEvent``), so routing,
registration and fingerprinting deal with N steps and N event classes. The classes are
made with ``type()`` (real classes in the annotations, as ``@step`` reads them), once per N
and process; fresh processes rebuild identical ones, so their logged names resolve.

N = 1000 and 3000 (quick: 50) on the three stores, measured as ``loop`` is (no state).
No goal of its own: the table shows how time and bytes per step change from 1000 to 3000.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any

from workflow import Event, StartEvent, StopEvent, Workflow, step

from ._runs import StoreKind, bench, linear

NAME = "chain"
SIZES = ((1000, 3000), (50,))  # (full run, quick run)


def _link_step(
    index: int, takes: type[Event], makes: Callable[[], Event], returns: type[Event]
) -> Callable[..., Awaitable[Event]]:
    async def link(self: Workflow, ev: Event) -> Event:
        return makes()

    link.__name__ = f"step_{index}"
    link.__qualname__ = f"Chain.step_{index}"  # a method's name: @step reads it as one
    link.__annotations__ = {"ev": takes, "return": returns}
    return step(link)


@cache
def workflow_class(n: int) -> type[Workflow]:
    """A workflow class of N steps in sequence, each with distinct in and out events."""
    links: list[type[Event]] = [
        type(f"Chain{n}Link{i}", (Event,), {"__module__": __name__}) for i in range(1, n)
    ]
    namespace: dict[str, Any] = {"__module__": __name__}
    for i in range(n):
        takes = StartEvent if i == 0 else links[i - 1]
        if i == n - 1:
            namespace[f"step_{i}"] = _link_step(i, takes, lambda: StopEvent(result=n), StopEvent)
        else:
            out = links[i]
            namespace[f"step_{i}"] = _link_step(i, takes, out, out)
    return type(f"Chain{n}", (Workflow,), namespace)


def _goal(
    n: int,
    kind: StoreKind,
    entry: dict[str, Any],
    entries: dict[tuple[int, StoreKind], dict[str, Any]],
) -> tuple[str, bool, str] | None:
    ratios = linear(n, kind, entries)
    if ratios is None:
        return None
    t, b = ratios
    text = f"time {t:.2f}x" + ("" if b is None else f", bytes {b:.2f}x")
    return text, True, "report only: per-step time and bytes against the smallest N"


def main(quick: bool = False, repeat: int = 5, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Runs the chain at each size on each store, prints the table, writes ``chain.json``."""
    return bench(
        NAME,
        "chain: N distinct steps in sequence",
        sizes=SIZES[1 if quick else 0],
        quick=quick,
        repeat=repeat,
        out_dir=out_dir,
        goal=_goal,
        goal_header="per step vs smallest N",
    )
