"""PostgreSQL connections of a store: its URL read as libpq reads one, and connecting.

``postgresql://user@host/db?schema=name`` keeps the store's tables in ``name``;
``reply_spin_us=N`` bounds how long the event loop busy-waits for a commit's reply before
it sleeps (:mod:`._loop_writer`; 0 never does). Those two parameters are ours; the rest of
the URL goes to libpq. The tables themselves are
:mod:`._pg_schema`'s; the backend that uses these connections is :mod:`._postgres`'s.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from ._errors import StoreURLError
from ._location import is_url

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pg_errors = None  # type: ignore[assignment]

READ_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.DatabaseError,) if psycopg is not None else ()
)
# A read that fails with one of these met a lost connection or an unreachable server.
UNAVAILABLE_ERRORS: Final[tuple[type[BaseException], ...]] = (
    (psycopg.OperationalError, psycopg.InterfaceError) if psycopg is not None else ()
)
CONNECT_TIMEOUT_S: Final = "10"  # seconds, unless the URL says connect_timeout=
# Microseconds the event loop keeps polling for a commit's reply, unless the URL says
# reply_spin_us=: the loop benchmark's replies come 150-250 us after the call is sent.
REPLY_SPIN_US: Final = 500
_MAX_SPIN_US: Final = 100_000
_OURS: Final = frozenset({"schema", "reply_spin_us"})
_IDENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

__all__ = [
    "READ_ERRORS",
    "UNAVAILABLE_ERRORS",
    "connect",
    "is_url",
    "pg_errors",
    "psycopg",
    "reply_spin_s",
    "require",
    "split",
    "where",
]


# A "%" that does not start an escape: libpq refuses it, and unquote() would keep it.
_BAD_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decoded(text: str, part: str) -> str:
    """One part of a URL percent-decoded once, as libpq does (``+`` is a plus sign).

    :raises StoreURLError: a ``%`` that starts no escape; the message names the part only,
        never its text (it may be a password).
    """
    if _BAD_ESCAPE.search(text):
        msg = (
            f"the PostgreSQL URL's {part} has a '%' that starts no percent-escape;"
            " write a literal '%' as %25"
        )
        raise StoreURLError(msg)
    return unquote(text)


def _params(url: str) -> tuple[dict[str, str], str]:
    """A store URL's libpq connection parameters, and the store's schema (ours).

    User and password are what precedes the last ``@`` (so an ``@`` in a password needs no
    escape); hosts may be a list (``h1:5432,[::1]:5433``); query parameters pass to libpq
    by name except ours (``schema``, ``reply_spin_us``: :func:`reply_spin_s` reads it).
    """
    parts = urlsplit(url)
    params: dict[str, str] = {}
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if user:
            params["user"] = _decoded(user, "user name")
        if colon:
            params["password"] = _decoded(password, "password")
    hosts: list[str] = []
    ports: list[str] = []
    for item in hostinfo.split(",") if hostinfo else []:
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        hosts.append(_decoded(host, "host"))
        ports.append(port)
    if any(hosts):
        params["host"] = ",".join(hosts)
    if any(ports):
        params["port"] = ",".join(ports)
    if len(parts.path) > 1:
        params["dbname"] = _decoded(parts.path[1:], "database name")
    schema = "public"
    ours: set[str] = set()
    for item in parts.query.split("&") if parts.query else []:
        raw_key, _, raw_value = item.partition("=")
        key = _decoded(raw_key, "query")
        value = _decoded(raw_value, f"{key!r} parameter")
        if key in _OURS:
            if key in ours:  # which one was meant? (libpq would take the last)
                msg = f"the URL gives ?{key}= more than once"
                raise StoreURLError(msg)
            ours.add(key)
        if key == "schema":
            schema = value
        elif key and key not in _OURS:
            params[key] = value
    if not _IDENT.match(schema):
        msg = (
            f"the URL's ?schema= parameter must be a plain identifier (a letter or _, then"
            f" letters, digits or _, at most 63 in all), not {schema!r}"
        )
        raise StoreURLError(msg)
    # libpq waits as long as TCP does (minutes) for a host that does not answer: say so sooner.
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return params, schema


def reply_spin_s(url: str) -> float:
    """How long (seconds) a writer on the event loop busy-waits for a reply: the URL's
    ``reply_spin_us``, else :data:`REPLY_SPIN_US`.

    :raises StoreURLError: not a whole number of microseconds from 0 to 100000 (and
        any problem :func:`split` finds in the URL).
    """
    _params(url)
    query = urlsplit(url).query
    spin = str(REPLY_SPIN_US)
    for item in query.split("&") if query else []:
        raw_key, _, raw_value = item.partition("=")
        if _decoded(raw_key, "query") == "reply_spin_us":
            spin = _decoded(raw_value, "'reply_spin_us' parameter")
    if not (spin.isascii() and spin.isdigit()) or int(spin) > _MAX_SPIN_US:
        msg = (
            "the URL's ?reply_spin_us= parameter must be a whole number of microseconds"
            f" from 0 to {_MAX_SPIN_US}, not {spin!r}"
        )
        raise StoreURLError(msg)
    return int(spin) / 1e6


def _quoted(value: str) -> str:
    """A value as a libpq connection string writes it: in quotes, ``'`` and ``\\`` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def split(url: str) -> tuple[str, str]:
    """The libpq connection string a store URL stands for, and the store's schema."""
    params, schema = _params(url)
    return " ".join(f"{k}={_quoted(v)}" for k, v in params.items()), schema


def require() -> None:
    if psycopg is None:
        msg = "PostgreSQL stores need psycopg: pip install 'durable-workflows[postgres]'"
        raise ImportError(msg)


def _session(schema: str, *, readonly: bool, durability: str) -> list[str]:
    """What a new connection sets first: the store's schema first on the search path, and
    the commit's durability. ``durability="normal"`` is ``synchronous_commit = off``: a
    commit is acknowledged before its WAL reaches the disk, so a crash of the server (or of
    its machine) may lose the last commits, never half of one, as SQLite's ``normal`` may on
    a power loss; ``"full"`` waits for the flush (``on``), as SQLite's ``FULL`` syncs."""
    statements = [f'SET search_path TO "{schema}"']
    if readonly:
        statements.append("SET default_transaction_read_only = on")
    statements.append(f"SET synchronous_commit = {'on' if durability == 'full' else 'off'}")
    return statements


def connect(target: str, *, readonly: bool, durability: str = "normal") -> Any:
    """One autocommit connection with the store's schema first on the search path."""
    require()
    url, schema = split(target)
    conn = psycopg.connect(url, autocommit=True)
    for statement in _session(schema, readonly=readonly, durability=durability):
        conn.execute(statement)
    return conn


def where(target: str) -> str:
    """The store's place for messages: host, database and schema, never a password."""
    params, schema = _params(target)
    return f"{params.get('host') or 'localhost'}/{params.get('dbname', '')} schema {schema}"
