"""The web UI's routes: the run list, a run's timeline page, their live streams, the actions.

Pages read through a store opened read-only, so the UI is safe beside the processes that
write it; the store's own change counter (the last seq) drives the live updates, polled
by each open stream, so nothing is added to the append path.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - what a plain install says
    _msg = "the web UI needs the ui extra: pip install 'durable-workflows[ui]'"
    raise ImportError(_msg) from exc

from eventstore import EncryptedPayloadError, EventStore, PayloadCodecError

from .._errors import WorkflowError
from .._ownership import probe_owners
from .._read import check_seq, fold_run, run_info, run_summaries, shown_status
from .._workflow import Workflow
from ..cli._common import loads_exact
from ..cli._filters import RunFilter, parse_since, parse_statuses
from ..cli._inspect import Viewer, failed_attempts, state_json
from ..cli._timeline import WINDOW, render_page, timeline_data
from ._actions import ActionError, Actions
from ._html import error_page, run_extras, runs_page, runs_table, sealed_page
from ._live import held_params, patch_since
from ._upcast import shown_state, upcast_contexts

__all__ = ["POLL_S", "create_app"]

# How often an open stream looks at the store for new commits (a cheap indexed read).
POLL_S: Final = 0.25
# A comment line this often keeps proxies and the browser from closing an idle stream.
PING_S: Final = 15.0


class _BadInput(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _filter(q: dict[str, str]) -> RunFilter:
    try:
        return RunFilter(
            statuses=parse_statuses(q["status"]) if q.get("status") else None,
            workflow=q.get("workflow") or None,
            since_us=parse_since(q["since"]) if q.get("since") else None,
            parent=q.get("parent") or None,
        )
    except ValueError as exc:
        raise _BadInput(400, str(exc)) from None


def _seq_param(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise _BadInput(400, f"seq must be a whole number, not {text!r}") from None


def _only_params(request: Request, accepted: tuple[str, ...]) -> None:
    """Refuses a query parameter the route does not take (a misspelt ``?at=`` would
    otherwise be ignored silently, and the answer be for another seq than meant)."""
    unknown = sorted(set(request.query_params) - set(accepted))
    if unknown:
        takes = ", ".join(f"?{a}=" for a in accepted) or "none"
        names = ", ".join(repr(u) for u in unknown)
        msg = f"unknown query parameter {names} for {request.url.path}; it takes {takes}"
        raise _BadInput(400, msg)


class UI:
    """What the routes share: the read-only store, how to show values, the actions, and
    the workflow when the server was given one (its state model upcasts old contexts)."""

    def __init__(
        self,
        store: EventStore,
        where: str,
        view: Viewer,
        actions: Actions | None,
        workflow: Workflow | None = None,
    ):
        self.store = store
        self.where = where
        self.view = view
        self.actions = actions
        self.workflow = workflow if workflow is not None or actions is None else actions.wf
        # Set when the server is asked to stop: open streams end, so that a graceful
        # shutdown (SIGTERM, Ctrl-C) need not wait for browsers that never hang up.
        self.stopping = threading.Event()

    def _run(self, run_id: str) -> None:
        try:
            run_info(self.store, run_id)
        except WorkflowError as exc:
            raise _BadInput(404, str(exc)) from None

    # ------------------------------------------------------------------ the run list

    def _listing(self, request: Request) -> tuple[dict[str, str], list[Any], list[Any]]:
        q = {k: v.strip() for k, v in request.query_params.items()}
        keep = _filter(q)
        every = run_summaries(self.store, probe_owners(self.store))
        return q, every, keep.apply(every)

    def runs(self, request: Request) -> Response:
        q, every, shown = self._listing(request)
        mode = "read-only" if self.actions is None else self.actions.who
        return HTMLResponse(runs_page(self.where, every, shown, q, self.store.head(), mode))

    def runs_table(self, request: Request) -> Response:
        _, every, shown = self._listing(request)
        forks: dict[str, int] = {}
        for s in every:
            if s.parent_run_id:
                forks[s.parent_run_id] = forks.get(s.parent_run_id, 0) + 1
        return HTMLResponse(runs_table(shown, forks))

    # ------------------------------------------------------------------ one run

    def _data(self, run_id: str, q: Any, around: int | None = None) -> dict[str, Any]:
        """The timeline data of the window the query names (``after``, ``before``,
        ``around``, ``limit``; the run's last window by default)."""
        self._run(run_id)
        limit = _seq_param(q.get("limit"))
        try:
            data = timeline_data(
                self.store,
                run_id,
                self.view,
                after=_seq_param(q.get("after")),
                before=_seq_param(q.get("before")),
                around=around if around is not None else _seq_param(q.get("around")),
                limit=WINDOW if limit is None else limit,
            )
        except ValueError as exc:
            raise _BadInput(400, str(exc)) from None
        data["link"] = "/runs/{}"
        # The context as the workflow shows it, where it is in an older state model version.
        uctx = upcast_contexts(self.store, run_id, data, self.workflow, self.view)
        if uctx is not None:
            data["uctx"] = uctx
        return data

    def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        seq = _seq_param(request.query_params.get("seq"))
        if seq is not None:
            self._run(run_id)
            try:
                check_seq(self.store, run_id, seq)
            except WorkflowError as exc:
                raise _BadInput(400, str(exc)) from None
        try:
            data = self._data(run_id, request.query_params, around=seq)
        except EncryptedPayloadError as exc:  # served without the key: what the log says
            records = list(self.store.records(run_id))
            return HTMLResponse(sealed_page(self.where, run_id, exc.key_id, records))
        if seq is not None:
            data["seq"] = seq
        bar, script = run_extras(None if self.actions is None else self.actions.who)
        return HTMLResponse(render_page(data, bar, script))

    def run_data(self, request: Request) -> Response:
        """The run's timeline data (the window the query names); a live page that says what
        it holds (``nrec`` and the rest of :data:`~._live.HELD`) gets only what it lacks
        (:func:`~._live.patch_since`)."""
        try:
            held = held_params(request.query_params)
        except ValueError as exc:
            raise _BadInput(400, str(exc)) from None
        data = self._data(request.path_params["run_id"], request.query_params)
        body = data if held is None else patch_since(data, held)
        return Response(orjson.dumps(body), 200, media_type="application/json")

    def run_state(self, request: Request) -> Response:
        """The state at ``?seq=`` (the latest without one) as ``workflow state --json``."""
        _only_params(request, ("seq",))
        run_id = request.path_params["run_id"]
        seq = _seq_param(request.query_params.get("seq"))
        self._run(run_id)
        try:
            check_seq(self.store, run_id, seq)
        except WorkflowError as exc:
            raise _BadInput(400, str(exc)) from None
        s = fold_run(self.store, run_id, seq)
        status = shown_status(self.store, s, probe_owners(self.store), seq)
        s = shown_state(self.workflow, s)  # upcast, as `workflow state --workflow` shows it
        body = state_json(s, status, len(self.store.inbox(run_id)), failed_attempts(self.store, s))
        return Response(orjson.dumps(body), 200, media_type="application/json")

    # ------------------------------------------------------------------ live streams

    async def _stream(self, request: Request, look: Any, sent: Any, event: str) -> Response:
        async def lines() -> AsyncIterator[bytes]:
            last = sent
            quiet = 0.0
            yield b"retry: 1000\n\n"
            while not self.stopping.is_set():
                now = look()
                if now is not None and now[0] != last:
                    last = now[0]
                    quiet = 0.0
                    yield f"event: {event}\ndata: {orjson.dumps(now[1]).decode()}\n\n".encode()
                elif quiet >= PING_S:
                    quiet = 0.0
                    yield b": ping\n\n"
                if await request.is_disconnected():
                    return
                await asyncio.sleep(POLL_S)
                quiet += POLL_S

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)

    async def run_events(self, request: Request) -> Response:
        """``commit`` events (last seq, status) each time the run's log grows or its status
        changes; the first one at once when the page's data is already behind."""
        run_id = request.path_params["run_id"]
        self._run(run_id)
        after = _seq_param(request.query_params.get("after")) or 0

        def look() -> tuple[Any, dict[str, Any]] | None:
            info = self.store.get_run(run_id)
            if info is None:
                return None
            key = (info.last_seq or 0, info.status)
            return key, {"last_seq": info.last_seq or 0, "status": info.status or "running"}

        first = look()
        sent = first[0] if first is not None and first[0][0] == after else None
        return await self._stream(request, look, sent, "commit")

    async def events(self, request: Request) -> Response:
        """``head`` events each time anything is written to the store (the run list)."""
        head = _seq_param(request.query_params.get("head")) or 0

        def look() -> tuple[int, dict[str, int]]:
            h = self.store.head()
            return h, {"head": h}

        return await self._stream(request, look, head, "head")

    # ------------------------------------------------------------------ actions

    async def act(self, request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["action"]
        if self.actions is None:
            msg = (
                "this server is read-only: start `workflow serve` with --allow-actions"
                " --workflow MODULE:CLASS to resume, fork, send events and cancel"
            )
            return JSONResponse({"ok": False, "message": msg}, 403)
        # A JSON body cannot be posted across origins without the browser asking first, so
        # another site open in the same browser cannot act through this server.
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            msg = "actions take a JSON body (Content-Type: application/json)"
            return JSONResponse({"ok": False, "message": msg}, 415)
        try:
            body = loads_exact(await request.body() or b"{}")
        except ValueError as exc:
            return JSONResponse({"ok": False, "message": f"the body is not JSON: {exc}"}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"ok": False, "message": "the body must be a JSON object"}, 400)
        a = self.actions
        try:
            if name == "cancel":
                done = await a.cancel(run_id)
            elif name == "resume":
                done = await a.resume(run_id)
            elif name == "fork":
                done = await a.fork(run_id, body.get("seq"), body.get("updates", {}))
            elif name == "send":
                done = await a.send(run_id, body.get("event"), body.get("data", {}))
            else:
                msg = f"no action {name!r}: use resume, fork, send or cancel"
                return JSONResponse({"ok": False, "message": msg}, 404)
        except ActionError as exc:
            return JSONResponse({"ok": False, "message": str(exc)}, exc.status)
        out: dict[str, Any] = {"ok": True, "message": done.message, "run_id": done.run_id}
        if done.run_id and done.run_id != run_id:
            out["href"] = f"/runs/{done.run_id}"
        return JSONResponse(out)


def _errors(handler: Any) -> Any:
    """The route's answer, or a page (JSON for the data routes) saying what was wrong. A
    plain function runs in a worker thread: reading a long run must not hold up the streams
    (nor, with --execute, the runs this process executes)."""

    async def wrapped(request: Request) -> Response:
        try:
            if inspect.iscoroutinefunction(handler):
                response: Response = await handler(request)
            else:
                response = await run_in_threadpool(handler, request)
        except _BadInput as exc:
            if request.url.path.endswith(("/data", "/state", "/events")):
                return JSONResponse({"ok": False, "message": str(exc)}, exc.status)
            return HTMLResponse(error_page(exc.status, str(exc)), exc.status)
        except PayloadCodecError as exc:  # no key, or a wrong one: said, never garbage
            key_id = getattr(exc, "key_id", None)
            if request.url.path.endswith(("/data", "/state", "/events")):
                return JSONResponse({"ok": False, "message": str(exc), "key_id": key_id}, 409)
            return HTMLResponse(error_page(409, str(exc)), 409)
        return response

    return wrapped


def create_app(
    store: EventStore,
    where: str,
    view: Viewer | None = None,
    actions: Actions | None = None,
    workflow: Workflow | None = None,
) -> Starlette:
    """The web UI over ``store`` (opened read-only by the caller), named ``where`` on its
    pages; ``actions`` None makes it strictly read-only. ``workflow`` (by default the one
    of ``actions``) shows contexts of older state model versions upcast, as the command
    line does. Setting ``app.state.stopping`` (a :class:`threading.Event`) ends the open
    live streams, as a server about to stop does.
    """
    ui = UI(store, where, view or Viewer(), actions, workflow)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if actions is not None:
                actions.close()

    routes = [
        Route("/", _errors(ui.runs)),
        Route("/runs-table", _errors(ui.runs_table)),
        Route("/events", _errors(ui.events)),
        Route("/runs/{run_id}", _errors(ui.run_page)),
        Route("/runs/{run_id}/data", _errors(ui.run_data)),
        Route("/runs/{run_id}/state", _errors(ui.run_state)),
        Route("/runs/{run_id}/events", _errors(ui.run_events)),
        Route("/runs/{run_id}/{action}", _errors(ui.act), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.stopping = ui.stopping
    return app
