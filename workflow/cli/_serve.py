"""``workflow serve``: the live web UI over a store (the ``ui`` extra)."""

from __future__ import annotations

import socket
from typing import Any

import click

from ._app import cli
from ._common import allow_pickle_option, load_workflow, reader
from ._inspect import shown_location

__all__ = ["serve"]


def _stopping_server(base: Any) -> Any:
    """uvicorn's server that, asked to exit (SIGTERM, SIGINT), first ends the UI's live
    streams: a graceful shutdown waits for open connections, and a browser's event stream
    never closes by itself."""

    class StoppingServer(base):  # type: ignore[misc]
        stopping: Any = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stopping is not None:
                self.stopping.set()
            super().handle_exit(sig, frame)

    return StoppingServer


_NEEDS_EXTRA = "the web UI needs the ui extra: pip install 'durable-workflows[ui]'"


@cli.command()
@click.argument("db")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=8765, show_default=True, help="The port (0: any free one).")
@click.option(
    "--workflow",
    "workflow_spec",
    metavar="MODULE:CLASS",
    help="Import this Workflow class: typed values, and what --allow-actions acts with.",
)
@allow_pickle_option
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Offer resume, fork, send and cancel (needs --workflow); read-only without it.",
)
@click.option(
    "--execute",
    is_flag=True,
    help="Run resumed and forked runs in this process (default: leave them for workers).",
)
def serve(
    db: str,
    host: str,
    port: int,
    workflow_spec: str | None,
    allow_actions: bool,
    execute: bool,
) -> None:
    """Serve a live web UI of DB: the runs, and each run's timeline and state at any seq.

    The store is opened read-only unless --allow-actions (with --workflow) is given.
    """
    if allow_actions and workflow_spec is None:
        msg = "--allow-actions needs --workflow MODULE:CLASS (the workflow that acts)"
        raise click.UsageError(msg)
    if execute and not allow_actions:
        msg = "--execute needs --allow-actions"
        raise click.UsageError(msg)
    try:
        import uvicorn

        from ..ui import Actions, create_app
    except ImportError as exc:
        msg = f"{_NEEDS_EXTRA} ({exc})"
        raise click.ClickException(msg) from None
    _Server = _stopping_server(uvicorn.Server)
    store, view, wf = reader(db, workflow_spec)
    actions = None
    if allow_actions and workflow_spec is not None:
        actions = Actions(load_workflow(workflow_spec, db, timeout=None), execute=execute)
    where = shown_location(db)  # never show a password
    app = create_app(store, where, view, actions, wf)  # wf: old state versions upcast
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until the server accepts them
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        raise click.ClickException(msg) from None
    bound: Any = sock.getsockname()
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    mode = "read-only" if actions is None else actions.who
    click.echo(f"serving {where} at http://{shown}:{bound[1]}/ ({mode}); Ctrl-C stops", err=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    server = _Server(config)
    server.stopping = app.state.stopping
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        store.close()
