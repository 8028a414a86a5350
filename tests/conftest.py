"""Shared fixtures and the Hypothesis profiles (chosen by HYPOTHESIS_PROFILE)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from eventstore import EventStore

settings.register_profile(
    "ci",
    max_examples=40,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """An empty store: in memory, or in a file under tmp_path."""
    es = EventStore() if request.param == "memory" else EventStore(tmp_path / "log.db")
    try:
        yield es
    finally:
        es.close()
