"""What kind of store a location names, without importing any backend's driver.

Opening a file store, or only importing the package, then costs nothing of psycopg's import
(about a fifth of ``import workflow``): :mod:`._postgres` is imported when a PostgreSQL
store is opened.
"""

from __future__ import annotations

__all__ = ["is_url"]


def is_url(target: str) -> bool:
    """Whether a store location names a PostgreSQL database."""
    return target.startswith(("postgresql://", "postgres://"))
