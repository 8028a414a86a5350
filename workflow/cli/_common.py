"""What every command shares: one-line errors, importing the user's workflow, progress, JSON."""

from __future__ import annotations

import importlib
import json
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import click
import orjson

from eventstore import EventStore, EventStoreError, StoredRecord

from .._errors import WorkflowError
from .._read import Wrap
from .._workflow import Workflow
from ._inspect import Viewer, is_url, open_store
from ._keys import cli_codec

__all__ = [
    "PROGRESS_MIN",
    "CliGroup",
    "allow_pickle_option",
    "check_store_to_write",
    "emit_json",
    "import_object",
    "json_option",
    "load_workflow",
    "loads_exact",
    "progress",
    "traceback_option",
    "workflow_option",
]

F = TypeVar("F", bound=Callable[..., Any])


def loads_exact(text: str | bytes) -> Any:
    """JSON a user typed (``--data``, ``--set``, an action's body), read exactly: an integer
    of any size stays that integer (orjson reads one beyond 64 bits as a float, which the
    log would then keep), and what no float holds (``1e400``, ``NaN``) is refused.

    :raises ValueError: the text is not JSON, or holds such a number (the message says).
    """
    return json.loads(text, parse_float=_finite, parse_constant=_no_constant)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        msg = f"the number {text} is beyond what a float holds"
        raise ValueError(msg)
    return value


def _no_constant(text: str) -> float:
    msg = f"{text} is not JSON"
    raise ValueError(msg)


# Below this many records a read is quick enough that a bar would only flicker.
PROGRESS_MIN: Final = 20_000
# Errors that mean "your input is wrong or the store is unwell", never a bug of ours: they
# are shown as one line. Anything else is shown as one line too, with how to see more.
_EXPECTED: Final = (EventStoreError, WorkflowError, sqlite3.Error, OSError)
# Click 8.2+ raises this for a bare `workflow`: the help is the answer, not an error line.
_NO_ARGS: Final[Any] = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)


class CliGroup(click.Group):
    """A command group whose failures are one line on stderr and a non-zero exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Runs the command line; exits with its code unless ``standalone_mode`` is off."""
        code = 0
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            # With standalone_mode off, click returns the exit code of --help and ctx.exit().
            code = rv if isinstance(rv, int) else 0
        except _NO_ARGS as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
            code = exc.exit_code
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            _fail(exc.format_message().replace("\n", " ") + hint)
            code = exc.exit_code
        except click.ClickException as exc:
            _fail(exc.format_message().replace("\n", " "))
            code = exc.exit_code
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except (click.Abort, KeyboardInterrupt):
            _fail("interrupted")
            code = 130
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, and keep Python's final flush
            # of stdout from failing again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            code = 1
        except _EXPECTED as exc:
            _fail(str(exc) or type(exc).__name__)
            code = 1
        except Exception as exc:
            if os.environ.get("WORKFLOW_DEBUG"):
                raise
            _fail(f"{type(exc).__name__}: {exc} (set WORKFLOW_DEBUG=1 to see the traceback)")
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code


def json_option(f: F) -> F:
    """``--json``: machine-readable output on stdout."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def workflow_option(f: F) -> F:
    """``--workflow module:Class``: decode values with the user's classes (imports them),
    with ``--allow-pickle``."""
    return allow_pickle_option(
        click.option(
            "--workflow",
            "workflow_spec",
            metavar="MODULE:CLASS",
            help="Import this Workflow class to show typed values (default: raw, no import).",
        )(f)
    )


_ALLOW_PICKLE = "workflow.allow_pickle"


def _set_allow_pickle(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_ALLOW_PICKLE] = True


def allow_pickle_option(f: F) -> F:
    """``--allow-pickle``: the workflow named by ``--workflow`` decodes the pickles of a log
    written with ``Workflow(allow_pickle=True)`` (refused without it, with an error that
    names this flag)."""
    return click.option(
        "--allow-pickle",
        is_flag=True,
        expose_value=False,
        callback=_set_allow_pickle,
        help="Decode values stored as pickles (Workflow(allow_pickle=True)) with --workflow."
        " Only for a log you trust: unpickling runs code.",
    )(f)


def traceback_option(f: F) -> F:
    """``--traceback``: also show the stored traceback of each failed attempt."""
    return click.option(
        "--traceback",
        "show_tb",
        is_flag=True,
        help="Also show the stored traceback of each failed attempt.",
    )(f)


def emit_json(data: Any) -> None:
    """Prints JSON (indented, keys in order) on stdout."""
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def import_object(spec: str, option: str) -> Any:
    """Imports ``module:Name`` (``Name`` may be dotted) the way ``python -m`` would find it.

    :raises click.BadParameter: the spec is malformed, or importing it failed.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        msg = f"{spec!r} is not MODULE:NAME (for example myapp.flows:ReportFlow)"
        raise click.BadParameter(msg, param_hint=option)
    # An installed `workflow` script does not put the working directory on sys.path the way
    # `python -m workflow` does; users expect their module beside them to import either way.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything while it is imported
        msg = f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.partition(".")[0]:
            # Most often run from another folder than the one holding the module.
            msg += f" (looked for in the current folder, {cwd}, and on PYTHONPATH)"
        raise click.BadParameter(msg, param_hint=option) from None
    except SystemExit as exc:  # a script's own command line, run because it was imported
        msg = (
            f"cannot import {module_name!r}: it exits while it is imported"
            f" (sys.exit({exc.code!r})); put its script code under"
            ' `if __name__ == "__main__":`'
        )
        raise click.BadParameter(msg, param_hint=option) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            msg = f"module {module_name!r} has no attribute {attr!r}"
            raise click.BadParameter(msg, param_hint=option) from None
    return obj


def load_workflow(spec: str, store: EventStore | str, **kwargs: Any) -> Workflow:
    """Imports a Workflow class and builds it on ``store`` (``Class(store=..., **kwargs)``)."""
    cls = import_object(spec, "--workflow")
    codec = cli_codec()
    if isinstance(store, str) and codec is not None:
        # Workflow(store=path) would open it without the key file the command was given.
        check_store_to_write(store)
        store = EventStore(store, payload_codec=codec)
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.call_on_close(store.close)
    if not (isinstance(cls, type) and issubclass(cls, Workflow)):
        msg = f"{spec} is not a Workflow subclass"
        raise click.BadParameter(msg, param_hint="--workflow")
    try:
        wf = cls(store=store, **kwargs)
    except (WorkflowError, EventStoreError, OSError):
        raise  # the store's problem (or the run's), not the class's: said as it is
    except Exception as exc:
        msg = f"{spec}(store=...) failed: {type(exc).__name__}: {exc}"
        raise click.BadParameter(msg, param_hint="--workflow") from None
    # The command line's pickle opt-in, whatever the class's own default; a refused pickle
    # names the flag.
    ctx = click.get_current_context(silent=True)
    wf_codec = wf.__workflow_parts__.codec
    if ctx is not None and ctx.find_root().meta.get(_ALLOW_PICKLE):
        wf_codec.allow_pickle = True
    wf_codec.how_to_allow_pickle = "--allow-pickle"
    return wf


def check_store_to_write(db: str) -> None:
    """Refuses, before anything is written, a DB that a command would create or write a store
    at but cannot: a folder that does not exist, or a file or PostgreSQL schema that is not a
    store (left as it is). A missing or empty file, or a missing schema, is fine: the store is
    made there, as ``Workflow`` makes it.

    :raises click.ClickException: the folder is missing.
    :raises NotAStoreError: the file is not a store.
    """
    if is_url(db):  # a schema is made as a file is: opened for writing, checked or created
        open_store(db, readonly=False).close()
        return
    path = Path(db)
    if not path.parent.is_dir():
        msg = f"{db}: folder {path.parent} does not exist"
        raise click.ClickException(msg)
    if path.exists() and not (path.is_file() and path.stat().st_size == 0):
        open_store(db).close()


def reader(db: str, workflow_spec: str | None) -> tuple[EventStore, Viewer, Workflow | None]:
    """The store opened read-only, how to show values, and the workflow when one was named."""
    store = open_store(db)
    if workflow_spec is None:
        return store, Viewer(), None
    wf = load_workflow(workflow_spec, store)
    return store, Viewer(wf.__workflow_parts__.codec), wf


def _stderr_is_tty() -> bool:
    return bool(sys.stderr.isatty())


def progress(store: EventStore, run_id: str, label: str) -> Wrap | None:
    """A wrapper that shows a progress bar on stderr while a run's records are read, when
    stderr is a terminal and the run is large; None otherwise."""
    if not _stderr_is_tty():
        return None
    total = store.query("SELECT count(*) FROM records WHERE run_id = ?", (run_id,))[0][0]
    if total < PROGRESS_MIN:
        return None

    def wrap(it: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            done = 0
            for r in it:
                yield r
                done += 1
                if done % 1000 == 0:
                    bar.update(1000)
            bar.update(done % 1000)

    return wrap
