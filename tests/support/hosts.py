"""Hosts for the cross-host tests: network namespaces, veth links and a PostgreSQL of our own.

:class:`Network` makes a "db host" namespace holding a bridge (the switch) and one namespace
per worker host, each joined to the bridge by a veth pair. Every address lives on those
links, inside the namespaces (``10.219.0.0/24``): the machine's own interfaces, routes and
services are never touched. Cutting a host's link sets its switch port down, as if its
cable were pulled: its TCP connections stall, nothing reaches it, nothing leaves it.

:class:`Cluster` is a PostgreSQL cluster made by ``initdb`` in a temporary folder, run by the
``postgres`` system user (the server refuses root) inside the db host's namespace: it
listens on the bridge's address for the hosts and on a Unix socket in its folder for the
test itself (sockets in the file system cross network namespaces).

Names carry the creating process's id (``dwx<pid>-…``), so a later run removes what a
crashed run left behind (:func:`clean_leftovers`) without touching a run still going.
Everything here needs root, as ``ip netns`` does; CI runs as root.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg

PREFIX: Final = "dwx"
NET: Final = "10.219.0"
DB_ADDR: Final = f"{NET}.1"
PORT: Final = 5432
PG_USER: Final = "postgres"  # the system user that runs the server
_LEFTOVER: Final = re.compile(rf"^{PREFIX}(\d+)-")


def ip(*args: str) -> str:
    """Runs ``ip ARGS``; raises with ip's own message when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        msg = f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
        raise RuntimeError(msg)
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """Kills every process in the namespace, then deletes it (and the veths inside)."""
    with contextlib.suppress(RuntimeError):
        for pid in ip("netns", "pids", ns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if not ip("netns", "pids", ns).split():
                break
        except RuntimeError:
            break
        time.sleep(0.05)
    with contextlib.suppress(RuntimeError):
        ip("netns", "del", ns)


def clean_leftovers() -> list[str]:
    """Removes namespaces and cluster folders of earlier runs whose process is gone."""
    removed = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        m = _LEFTOVER.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_namespace(name)
            removed.append(name)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        m = _LEFTOVER.match(path.name)
        if m and not _alive(int(m.group(1))) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class Network:
    """A db host and worker hosts, each host on its own port of one switch (a bridge)."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.db = f"{self.tag}-db"
        self.hosts = list(hosts)
        self.addr = {h: f"{NET}.{11 + i}" for i, h in enumerate(self.hosts)}
        self._made: list[str] = []

    def ns(self, host: str) -> str:
        """The namespace of a worker host."""
        return f"{self.tag}-{host}"

    def port(self, host: str) -> str:
        """The switch port (in the db host) of a worker host's link."""
        return f"p-{host}"

    def up(self) -> None:
        """Makes the namespaces, the switch and the links, and checks each host can reach
        the db host."""
        ip("netns", "add", self.db)
        self._made.append(self.db)
        ip("-n", self.db, "link", "set", "lo", "up")
        ip("-n", self.db, "link", "add", "br0", "type", "bridge")
        ip("-n", self.db, "addr", "add", f"{DB_ADDR}/24", "dev", "br0")
        ip("-n", self.db, "link", "set", "br0", "up")
        for host in self.hosts:
            ns = self.ns(host)
            ip("netns", "add", ns)
            self._made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            # Made inside the db host with its peer in the worker host: the root namespace
            # never sees either end.
            veth = ("link", "add", self.port(host), "type", "veth", "peer", "name", "eth0")
            ip("-n", self.db, *veth, "netns", ns)
            ip("-n", self.db, "link", "set", self.port(host), "master", "br0")
            ip("-n", self.db, "link", "set", self.port(host), "up")
            ip("-n", ns, "addr", "add", f"{self.addr[host]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def cut(self, host: str) -> None:
        """Pulls the host's cable: its switch port goes down."""
        ip("-n", self.db, "link", "set", self.port(host), "down")

    def restore(self, host: str) -> None:
        """Plugs the host's cable back in."""
        ip("-n", self.db, "link", "set", self.port(host), "up")

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """A command line that runs ``argv`` on ``host`` (in its network namespace)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def argv_db(self, argv: Sequence[str]) -> list[str]:
        """A command line that runs ``argv`` on the db host."""
        return ["ip", "netns", "exec", self.db, *argv]

    def down(self) -> None:
        """Kills what still runs on the hosts and removes every namespace and link."""
        for ns in reversed(self._made):
            _kill_namespace(ns)
        self._made.clear()


def pg_bindir() -> Path:
    """The newest installed PostgreSQL server's programs (Debian keeps them per version)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not found:
        msg = "no PostgreSQL server under /usr/lib/postgresql: run `bash .ci/postgres-up`"
        raise RuntimeError(msg)
    return found[-1].parent


class Cluster:
    """A PostgreSQL cluster of our own in a temporary folder, served from the db host."""

    def __init__(self, net: Network, settings: dict[str, str] | None = None) -> None:
        self.net = net
        self.dir = Path(tempfile.mkdtemp(prefix=f"{net.tag}-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.settings = settings or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def _as_postgres(self, argv: Sequence[str]) -> list[str]:
        return ["setpriv", f"--reuid={PG_USER}", f"--regid={PG_USER}", "--init-groups", *argv]

    def start(self) -> None:
        """initdb, then the server in the db host's namespace; returns once it answers."""
        bindir = pg_bindir()
        shutil.chown(self.dir, PG_USER, PG_USER)
        initdb = [str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
        subprocess.run(
            self._as_postgres([*initdb, "-E", "UTF8", "--no-sync"]), check=True, capture_output=True
        )
        with (self.data / "pg_hba.conf").open("a") as fh:
            fh.write(f"host all all {NET}.0/24 trust\n")
        options = {
            "listen_addresses": DB_ADDR,
            "port": str(PORT),
            "unix_socket_directories": str(self.dir),
            "fsync": "off",  # a throwaway cluster: durability is not under test here
            "max_connections": "200",
            "log_line_prefix": "%m [%p] %u %h: ",
            "track_commit_timestamp": "on",
            **self.settings,
        }
        argv = [str(bindir / "postgres"), "-D", str(self.data)]
        for k, v in options.items():
            argv += ["-c", f"{k}={v}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.net.argv_db(self._as_postgres(argv)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    msg = f"the test cluster did not start:\n{self.log.read_text()[-2000:]}"
                    raise RuntimeError(msg) from None
                time.sleep(0.1)

    def url(self, user: str = "postgres", schema: str | None = None) -> str:
        """How the test reaches the server: its Unix socket."""
        q = f"host={self.dir}" + (f"&schema={schema}" if schema else "")
        return f"postgresql://{user}@/postgres?{q}"

    def host_url(self, user: str, schema: str) -> str:
        """How a worker host reaches the server: over its link to the db host."""
        return f"postgresql://{user}@{DB_ADDR}:{PORT}/postgres?schema={schema}&connect_timeout=5"

    def sql(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Runs one statement as the superuser; returns its rows (none for a command)."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            cur = conn.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []

    def stop(self) -> None:
        """Stops the server at once and removes its folder."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # immediate shutdown: nothing here is kept
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def hosts(
    names: Sequence[str], settings: dict[str, str] | None = None
) -> Iterator[tuple[Network, Cluster]]:
    """The network and the cluster, taken down again however the block ends."""
    clean_leftovers()
    net = Network(names)
    cluster: Cluster | None = None
    try:
        net.up()
        cluster = Cluster(net, settings)
        cluster.start()
        yield net, cluster
    finally:
        if cluster is not None:
            cluster.stop()
        net.down()


@dataclass(frozen=True)
class Mark:
    """One line of a store's trail: a record that landed, or a claim (an epoch taken)."""

    what: str  # "record" or "claim"
    rid: int
    seq: int | None
    kind: str | None
    step: str | None
    epoch: int | None
    who: str  # the PostgreSQL role that committed it: the host's name


def install_trail(cluster: Cluster, schema: str) -> str:
    """Triggers on a store's tables that note, in commit order, who committed each record
    and each claim: the server's own account of which host wrote what, for the fence
    checks. Returns the schema holding the trail (``<schema>_probe``).

    Rows of a refused commit are rolled back with it, so the trail holds what landed.
    """
    probe = f"{schema}_probe"
    cluster.sql(
        f"""
        CREATE SCHEMA "{probe}";
        CREATE TABLE "{probe}".trail (id bigserial PRIMARY KEY, what text NOT NULL,
            rid bigint NOT NULL, seq bigint, kind text, step text, epoch bigint,
            who name NOT NULL DEFAULT current_user);
        CREATE FUNCTION "{probe}".on_record() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO "{probe}".trail (what, rid, seq, kind, step)
            VALUES ('record', NEW.rid, NEW.seq, NEW.kind, NEW.step);
            RETURN NULL; END $$;
        CREATE FUNCTION "{probe}".on_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO "{probe}".trail (what, rid, epoch) VALUES ('claim', NEW.rid, NEW.epoch);
            RETURN NULL; END $$;
        CREATE TRIGGER dwx_trail AFTER INSERT ON "{schema}".log
            FOR EACH ROW EXECUTE FUNCTION "{probe}".on_record();
        CREATE TRIGGER dwx_trail AFTER UPDATE OF epoch ON "{schema}".runs
            FOR EACH ROW WHEN (NEW.epoch IS DISTINCT FROM OLD.epoch)
            EXECUTE FUNCTION "{probe}".on_claim();
        """
    )
    return probe


def read_trail(cluster: Cluster, probe: str) -> list[Mark]:
    """The trail in commit order (commit timestamps: the cluster tracks them)."""
    rows = cluster.sql(
        f'SELECT what, rid, seq, kind, step, epoch, who FROM "{probe}".trail'
        " ORDER BY pg_xact_commit_timestamp(xmin), id"
    )
    return [Mark(*row) for row in rows]
