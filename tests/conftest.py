"""Shared fixtures and the Hypothesis profiles (chosen by HYPOTHESIS_PROFILE)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

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


def ci_examples(max_examples: int) -> settings:
    """The settings of one of the costliest properties: ``max_examples`` examples under the
    ``ci`` profile (``make test``, kept within its time), the loaded profile's own count
    under any other (``dev``, ``thorough``)."""
    if settings.get_current_profile_name() != "ci":
        return settings()
    return settings(max_examples=max_examples)


# The local PostgreSQL service (make test checks it runs; .ci/run starts it if needed).
POSTGRES_URL = os.environ.get("DW_TEST_POSTGRES", "postgresql://postgres@127.0.0.1/test")


# The backends a store of a suite runs on: PostgreSQL's runs need the service (the marker).
BACKENDS: Final = ("sqlite", pytest.param("postgres", marks=pytest.mark.postgres))


@contextlib.contextmanager
def postgres_location() -> Iterator[str]:
    """The URL of a PostgreSQL schema of its own, dropped afterwards."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    try:
        yield f"{POSTGRES_URL}?schema={schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def new_location(backend: str, folder: Path, name: str = "store.db") -> Iterator[str]:
    """Where a new store of ``backend`` goes: a file in ``folder``, or a PostgreSQL schema."""
    if backend != "postgres":
        yield str(folder / name)
        return
    with postgres_location() as url:
        yield url


@contextlib.contextmanager
def postgres_store(**kwargs: object) -> Iterator[EventStore]:
    """A store in a PostgreSQL schema of its own, dropped afterwards."""
    with postgres_location() as url:
        es = EventStore(url, **kwargs)  # type: ignore[arg-type]
        try:
            yield es
        finally:
            es.close()


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a new store goes (a file under tmp_path, or a PostgreSQL schema): for tests
    that open it by location, in this process or another."""
    with new_location(request.param, tmp_path) as where:
        yield where


@pytest.fixture(params=["memory", *BACKENDS])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """An empty store: in memory, in a file under tmp_path, or in PostgreSQL."""
    if request.param == "postgres":
        with postgres_store() as es:
            yield es
        return
    es = EventStore() if request.param == "memory" else EventStore(tmp_path / "log.db")
    try:
        yield es
    finally:
        es.close()
