"""Workflow(allow_pickle=True): the codec's pickle opt-in, from the workflow.

Values of types the codec does not store (a plain class) are refused by default with an
error that names the option; a workflow built with the option stores them as pickles and
reads them back in another Workflow object (another process would do the same).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from eventstore import EncodeError, LogCorruptedError, PickleDisabledError
from workflow import Context, Event, StartEvent, StopEvent, Workflow, step


class Point:
    """A plain class: neither a dataclass, attrs class, pydantic model nor Enum."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self) -> int:
        return hash((self.x, self.y))


class Placed(Event):
    pass


class Plot(Workflow):
    """Keeps a plain object in its context; its second step reads it back."""

    @step
    async def place(self, ctx: Context[Any], ev: StartEvent) -> Placed:
        await ctx.store.set("point", Point(ev.get("x"), 2))
        return Placed()

    @step
    async def show(self, ctx: Context[Any], ev: Placed) -> StopEvent:
        return StopEvent(result=await ctx.store.get("point"))


async def test_without_opt_in_the_error_names_the_option() -> None:
    """A plain object is refused at set() with an EncodeError that says how to opt in."""
    with pytest.raises(EncodeError, match=r"Workflow\(allow_pickle=True\)"):
        await Plot().run(x=1)


async def test_opt_in_round_trips_through_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With allow_pickle=True the value is stored (with one warning) and read back as an
    equal object by another workflow object that opted in; one that did not says how."""
    db = tmp_path / "p.db"
    with caplog.at_level(logging.WARNING, logger="eventstore.codec"):
        assert await Plot(store=db, allow_pickle=True).run(run_id="p", x=1) == Point(1, 2)
    assert any("pickle is enabled" in rec.getMessage() for rec in caplog.records)
    later = Plot(store=db, allow_pickle=True)
    assert later.state_at("p").context["point"] == Point(1, 2)
    placed = later.checkpoints("p", step="place")[-1]
    assert await later.run_from(placed) == Point(1, 2)  # the fork's `show` reads it back
    with pytest.raises(PickleDisabledError, match=r"use Workflow\(allow_pickle=True\)") as got:
        Plot(store=db).state_at("p").context["point"]
    assert not isinstance(got.value, LogCorruptedError)


async def test_a_pickled_log_without_the_opt_in_says_so_not_corrupted(tmp_path: Path) -> None:
    """Reading or resuming a log with pickles without the opt-in is a PickleDisabledError
    that says pickle is disabled and how to opt in, and names where the pickle is: the log
    is not damaged, so it is no LogCorruptedError."""
    db = tmp_path / "p.db"
    wf = Plot(store=db, allow_pickle=True)
    handler = wf.run(run_id="p", x=1)
    assert await handler == Point(1, 2)
    other = Plot(store=db)
    with pytest.raises(PickleDisabledError) as got:
        other.state_at("p").context["point"]
    assert "pickle is disabled" in str(got.value)
    assert "Workflow(allow_pickle=True)" in str(got.value)
    assert any("run 'p'" in note for note in getattr(got.value, "__notes__", []))
    assert not isinstance(got.value, LogCorruptedError)
    # A run whose log holds a pickle, resumed without the opt-in, is refused the same way.
    placed = Plot(store=db, allow_pickle=True).checkpoints("p", step="place")[-1]
    with pytest.raises(PickleDisabledError, match="pickle is disabled"):
        await other.run_from(placed)


def test_the_cli_decodes_pickles_only_with_allow_pickle(tmp_path: Path) -> None:
    """`workflow state --workflow` of a pickled log names --allow-pickle (not damage), and
    with --allow-pickle shows the value."""
    import asyncio

    from click.testing import CliRunner

    from workflow.cli import cli

    db = tmp_path / "p.db"

    async def first() -> Any:
        return await Plot(store=db, allow_pickle=True).run(run_id="p", x=1)

    assert asyncio.run(first()) == Point(1, 2)
    spec = f"{__name__}:Plot"
    refused = CliRunner().invoke(cli, ["state", str(db), "p", "--workflow", spec, "--json"])
    assert refused.exit_code != 0
    assert "pickle is disabled" in refused.output
    assert "--allow-pickle" in refused.output
    assert "LogCorrupted" not in refused.output
    text = CliRunner().invoke(cli, ["state", str(db), "p", "--workflow", spec])
    assert text.exit_code == 0, text.output
    assert "pass --allow-pickle" in text.output
    shown = CliRunner().invoke(
        cli, ["state", str(db), "p", "--workflow", spec, "--allow-pickle", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    assert "pickle is disabled" not in shown.output
    history = CliRunner().invoke(
        cli, ["history", str(db), "p", "--workflow", spec, "--allow-pickle"]
    )
    assert history.exit_code == 0, history.output
    assert "<pickle" not in history.output
