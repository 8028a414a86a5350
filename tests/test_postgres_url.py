"""PostgreSQL store URLs: each part percent-decoded once, the way libpq reads a URL.

The unit tests need no server: they read the connection string a URL becomes back through
libpq's own parser (psycopg's ``conninfo_to_dict``). The last test connects over TCP, with
the password, to a PostgreSQL cluster of its own that checks passwords (SCRAM).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from eventstore import EventStore, StoreUnavailableError
from eventstore._postgres import _split, _where
from workflow import StartEvent, StopEvent, Workflow, step

from .support.hosts import PG_USER, pg_bindir

# A password with every character a URL reserves or libpq could misread.
PASSWORD = "p+w@r/d%25 x:y?z&q='\\"


def parsed(url: str) -> tuple[dict[str, str], str]:
    conninfo, schema = _split(url)
    return {k: str(v) for k, v in conninfo_to_dict(conninfo).items()}, schema


def test_reserved_characters_in_user_and_password_are_decoded_once() -> None:
    """`+` stays a plus; `%2B`, `%40`, `%2F`, `%25`, `%20` are `+ @ / % space`."""
    url = (
        f"postgresql://{quote('dw+user@x', safe='')}:{quote(PASSWORD, safe='')}@127.0.0.1:5432/test"
    )
    params, schema = parsed(url)
    assert params == {
        "user": "dw+user@x",
        "password": PASSWORD,
        "host": "127.0.0.1",
        "port": "5432",
        "dbname": "test",
        "connect_timeout": "10",
    }
    assert schema == "public"
    plain, _ = parsed("postgresql://dw:a+b@127.0.0.1/test")
    assert plain["password"] == "a+b"


def test_an_unencoded_at_sign_in_the_password_is_the_password_s() -> None:
    """The last `@` ends the user info, so `p@ss` need not be encoded."""
    params, _ = parsed("postgresql://dw:p@ss@127.0.0.1/test")
    assert (params["user"], params["password"], params["host"]) == ("dw", "p@ss", "127.0.0.1")


def test_query_parameters_keep_their_value_and_schema_is_ours() -> None:
    """Query values are percent-decoded (a `+` is a plus, as libpq reads it); `schema` is
    taken out; hosts, ports and sockets pass through; a connection attempt gives up after
    10 s unless the URL says otherwise."""
    params, schema = parsed(
        "postgresql://dw@h1:5432,[::1]:5433/my%20db?schema=s1"
        "&options=-c%20statement_timeout%3D5000&application_name=a+b&password=x%2By%20z"
    )
    assert schema == "s1"
    assert params == {
        "user": "dw",
        "host": "h1,::1",
        "port": "5432,5433",
        "dbname": "my db",
        "options": "-c statement_timeout=5000",
        "application_name": "a+b",
        "password": "x+y z",
        "connect_timeout": "10",
    }
    sock, _ = parsed(
        "postgresql://postgres@/postgres?host=/tmp/pg%20dir&schema=t&connect_timeout=3"
    )
    assert sock == {
        "user": "postgres",
        "host": "/tmp/pg dir",
        "dbname": "postgres",
        "connect_timeout": "3",
    }


def test_a_bad_percent_escape_is_refused_without_showing_the_password() -> None:
    """`%` must be written `%25`: a `%` that starts no escape is named, the password not."""
    with pytest.raises(ValueError, match="password") as err:
        _split("postgresql://dw:100%off@127.0.0.1/test")
    assert "100%off" not in str(err.value)
    assert "%25" in str(err.value)


def test_where_names_host_database_and_schema_only() -> None:
    """What error messages say of a store: never its password."""
    where = _where(f"postgresql://dw:{quote(PASSWORD, safe='')}@127.0.0.1:5432/test?schema=s2")
    assert where == "127.0.0.1/test schema s2"


# ---------------------------------------------------------------------------- a real password


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def password_cluster() -> Iterator[tuple[Path, int]]:
    """A throwaway cluster that checks passwords on TCP (SCRAM) and trusts its socket."""
    bindir = pg_bindir()
    folder = Path(tempfile.mkdtemp(prefix="dw-pgpw-"))
    data = folder / "data"
    as_pg = ["setpriv", f"--reuid={PG_USER}", f"--regid={PG_USER}", "--init-groups"]
    shutil.chown(folder, PG_USER, PG_USER)
    subprocess.run(
        [
            *as_pg,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    (data / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    port = _free_port()
    argv = [
        str(bindir / "postgres"),
        "-D",
        str(data),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        f"port={port}",
        "-c",
        f"unix_socket_directories={folder}",
        "-c",
        "fsync=off",
    ]
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen([*as_pg, *argv], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(
                    host=str(folder), port=port, user="postgres", dbname="postgres"
                ).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield folder, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


class Hello(Workflow):
    @step
    async def hello(self, ev: StartEvent) -> StopEvent:
        return StopEvent(result="hello")


@pytest.mark.postgres
async def test_a_password_with_reserved_characters_connects() -> None:
    """A role whose password holds `+ @ / %` (and more) connects over TCP with the password
    percent-encoded in the URL, runs a workflow there; a wrong password is refused."""
    with password_cluster() as (folder, port):
        with psycopg.connect(
            host=str(folder), port=port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(
                psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    psycopg.sql.Identifier("dw+user"), psycopg.sql.Literal(PASSWORD)
                )
            )
            conn.execute('CREATE DATABASE dw OWNER "dw+user"')
        base = f"postgresql://{quote('dw+user', safe='')}:{{}}@127.0.0.1:{port}/dw?schema=pw"
        with EventStore(base.format(quote(PASSWORD, safe=""))) as store:
            assert await Hello(store=store).run() == "hello"
        with pytest.raises(StoreUnavailableError, match="password authentication failed"):
            EventStore(base.format("wrong"))
