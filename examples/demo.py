"""The main demo: an event store on a file, appended to, read back, shown with sqlite-utils."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import sqlite_utils

from eventstore import Commit, EventStore, NewRun, Record, default_codec


async def main(path: Path) -> None:
    with EventStore(path) as store:
        await store.append(
            Commit("demo-run", [Record("run_started", None, '{"topic": "x"}')], create=NewRun())
        )
        payload = default_codec.encode(
            {"items": (1, 2), "when": __import__("datetime").date.today()}
        )
        await asyncio.gather(
            *(
                store.append(Commit("demo-run", [Record("enqueued", f"step{i}", payload)]))
                for i in range(3)
            )
        )
        for r in store.records("demo-run"):
            print(
                f"seq={r.seq:<3} commit={r.commit_seq:<3} {r.kind:<12} {r.step!s:<6} {r.payload}"
            )
        print("decoded:", default_codec.decode(payload))
    db = sqlite_utils.Database(path)
    print("tables:", ", ".join(db.table_names()), "| views:", ", ".join(db.view_names()))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp) / "demo.db"))
