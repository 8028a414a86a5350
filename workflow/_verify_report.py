"""What ``workflow verify`` reports: each problem found, and the report of a whole check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Problem", "VerifyReport"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing in a recorded run that today's code would not reproduce or read."""

    run_id: str
    seq: int | None
    step: str | None
    kind: str  # decode, route, patch, output, graph, divergence
    message: str
    # A divergence, side by side (JSON-native): what the log recorded and what today's
    # code did, each with the record kind, the step, the input event's type and the events
    # emitted (``type`` and ``fields``), or the context key and value written.
    expected: dict[str, Any] | None = None
    actual: dict[str, Any] | None = None

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "run"
        step = f" step {self.step!r}" if self.step else ""
        text = f"{self.run_id} {where}{step}: [{self.kind}] {self.message}"
        if self.expected is not None or self.actual is not None:
            text += f"\n    recorded: {_side(self.expected)}\n    now:      {_side(self.actual)}"
        return text


def _side(side: dict[str, Any] | None) -> str:
    """One side of a divergence as a line: ``step_finished, step 'x', input A -> B(...)``."""
    if side is None:
        return "-"
    parts = [str(side.get("record", "?"))]
    if side.get("step"):
        parts.append(f"step {side['step']!r}")
    if side.get("input"):
        parts.append(f"input {side['input']}")
    if "raised" in side:
        parts.append(f"raised {side['raised']}")
    if "emitted" in side:
        shown = [f"{e['type']}({_short(e['fields'])})" for e in side["emitted"]]
        parts.append("emitted " + (", ".join(shown) or "nothing"))
    if "key" in side:
        value = "not written" if "value" not in side else _short(side["value"])
        parts.append(f"{side['key']!r} = {value}")
    return ", ".join(parts)


def _short(value: Any, limit: int = 200) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` found: ``ok`` when no problem was found in any run."""

    runs: list[str] = field(default_factory=list)
    records: int = 0
    attempts_reexecuted: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_divergence(self) -> Problem | None:
        """The earliest divergence re-execution found (by run, then seq), or None."""
        return next((p for p in self.problems if p.kind == "divergence"), None)
