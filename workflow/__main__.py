"""``python -m workflow``: inspect, debug and continue runs in an event store."""

from __future__ import annotations

from workflow.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
