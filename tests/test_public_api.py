"""The packages' __all__ lists exactly their public names."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import eventstore
import workflow


@pytest.mark.parametrize("module", [eventstore, workflow], ids=lambda m: m.__name__)
def test_all_is_sorted_and_complete(module: ModuleType) -> None:
    """__all__ is sorted and names every public attribute the package exports."""
    names = module.__all__
    assert names == sorted(names)
    # Submodules (workflow.testing, workflow.cli) are not names the package exports.
    public = {
        n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))
    }
    assert set(names) == public


def test_design_names_are_exported() -> None:
    """The names DESIGN.md promises users are importable from the packages."""
    from eventstore import EventStore  # noqa: F401
    from workflow import (  # noqa: F401
        Checkpoint,
        Context,
        Event,
        HumanResponseEvent,
        InputRequiredEvent,
        RunState,
        StartEvent,
        StopEvent,
        Workflow,
        step,
    )


def test_recovery_is_a_frozen_public_type() -> None:
    """workflow exports Recovery, recover()'s per-run report, and it cannot be changed."""
    import dataclasses

    from workflow import Recovery

    assert "Recovery" in workflow.__all__
    r = Recovery("run-1", "resumed")
    assert (r.run_id, r.outcome, r.handler, r.error) == ("run-1", "resumed", None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.outcome = "failed"  # type: ignore[misc]
