"""A private PostgreSQL server for the tests that stop or restart their ledger's server.

Other tests share the server at 127.0.0.1:5432; restarting it would break them. ``private_pg``
gives a test a database on a cluster of its own, initdb'd into a temporary directory once per
session (initdb takes ~1.5 s; a start ~0.2 s), listening on 127.0.0.1 and a free port, trust auth,
fsync on. The test may ``stop``, ``start`` and ``restart`` it in ``fast`` or ``immediate`` mode (the
latter is a crash: the next start replays the WAL), the way DBOS's chaos tests restart theirs.

PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as the ``postgres`` OS user
(``runuser``); as anyone else, as that user. Where the binaries (``initdb``, ``pg_ctl``) are not
found, the fixtures skip and say why (they fail instead where ``EFFECTFLOW_REQUIRE_PG`` is set:
``ledgers.pg_missing``). ``EFFECTFLOW_TEST_PG_BIN`` names their directory; otherwise the newest
``/usr/lib/postgresql/*/bin`` (Debian), then ``pg_config --bindir``, then ``PATH``.

``tests/conftest.py`` registers the fixtures, so every test folder can ask for ``private_pg``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
import pytest

import ledgers

#: How a server is stopped: ``fast`` ends the sessions and checkpoints; ``immediate`` kills the
#: processes like a crash (the next start recovers from the WAL).
Mode = Literal["fast", "immediate"]

#: Seconds pg_ctl may wait for a start or a stop.
PG_CTL_TIMEOUT = 60

#: Ports tried for the server: below Linux's ephemeral range (32768-60999), so that while the
#: server is down no client socket (nor another ``bind(0)``) takes its port.
PORTS = range(20000, 32000)


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None where there is none."""
    candidates: list[Path] = []
    if os.environ.get("EFFECTFLOW_TEST_PG_BIN"):
        candidates.append(Path(os.environ["EFFECTFLOW_TEST_PG_BIN"]))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: -int(p.name))]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _free_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


class PgServer:
    """One private PostgreSQL cluster: its data directory, its port, and pg_ctl over it."""

    def __init__(self, bin_dir: Path, directory: Path, user: str | None) -> None:
        self.bin_dir = bin_dir
        #: Holds ``data/`` (the cluster), ``server.log`` and the Unix socket.
        self.directory = directory
        #: The OS user the server runs as (None: this process's own user).
        self.user = user
        self.port = 0

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.directory / "data"

    @property
    def log(self) -> Path:
        """The server's log file (appended to by every start)."""
        return self.directory / "server.log"

    @property
    def admin_url(self) -> str:
        """The URL of the maintenance database, ``postgres``."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        """The URL of one database of this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    # -- pg_ctl -----------------------------------------------------------------------------------

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / command[0]), *command[1:]]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    def _checked(self, *command: str) -> None:
        done = self._run(*command)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command[:2])} failed (rc={done.returncode}): "
                f"{done.stdout}{done.stderr}\n{self.tail_log()}"
            )

    def tail_log(self, lines: int = 30) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def initdb(self) -> None:
        """Create the cluster: trust auth, user ``postgres``, C locale, on a free port."""
        self._checked(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions",
        )  # fmt: skip

    def _configure(self, port: int) -> None:
        # postgresql.auto.conf is read last; rewriting it on a new port keeps the rest intact.
        settings = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.directory}'",
            # Workers x pools x tests: more than the default 100 under chaos.
            "max_connections": "300",
            "logging_collector": "off",
        }
        text = "".join(f"{k} = {v}\n" for k, v in settings.items())
        (self.data / "postgresql.auto.conf").write_text(text)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.data / "postgresql.auto.conf", entry.pw_uid, entry.pw_gid)
        self.port = port

    @property
    def running(self) -> bool:
        """Whether a postmaster runs on the data directory."""
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def start(self) -> None:
        """Start the server and wait until it accepts connections (after an immediate stop, that
        includes crash recovery). The first start picks a free port; later ones keep it."""
        if self.running:
            return
        if self.port:
            self._checked(*self._start_command())
            return
        for _ in range(5):  # another process may take the port between probe and start
            self._configure(_free_port())
            done = self._run(*self._start_command())
            if done.returncode == 0:
                return
        raise RuntimeError(
            f"pg_ctl start failed (rc={done.returncode}): {done.stdout}{done.stderr}\n"
            f"{self.tail_log()}"
        )

    def _start_command(self) -> tuple[str, ...]:
        return (
            "pg_ctl", "-D", str(self.data), "-l", str(self.log),
            "-w", "-t", str(PG_CTL_TIMEOUT), "start",
        )  # fmt: skip

    def stop(self, mode: Mode = "fast") -> None:
        """Stop the server (``fast``: sessions ended, a checkpoint; ``immediate``: a crash)."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"mode is fast or immediate, not {mode!r}")
        self._checked(
            "pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", str(PG_CTL_TIMEOUT), "stop"
        )

    def restart(self, mode: Mode = "fast", *, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start."""
        self.stop(mode)
        try:
            time.sleep(down_for)
        finally:
            self.start()

    def destroy(self) -> None:
        """Stop the server (immediately: nothing in it is kept) and delete its directory."""
        with contextlib.suppress(RuntimeError):
            if self.running:
                self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- databases --------------------------------------------------------------------------------

    def create_database(self, prefix: str = "ef_priv") -> str:
        """A new empty database; returns its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def drop_database(self, url: str) -> None:
        """Drop one database, ending its sessions."""
        name = url.rsplit("/", 1)[1].split("?", 1)[0]
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclasses.dataclass(frozen=True)
class PrivatePg:
    """What a test gets: a fresh database on the private server, and the server's switches."""

    #: The server (shared by the session's tests that ask for ``private_pg``).
    server: PgServer
    #: The URL of the test's own database.
    url: str

    @property
    def admin_url(self) -> str:
        """The server's maintenance database (to terminate sessions, create databases)."""
        return self.server.admin_url

    def stop(self, mode: Mode = "fast") -> None:
        """Stop the server (the fixture starts it again after the test if the test did not)."""
        self.server.stop(mode)

    def start(self) -> None:
        """Start the server; returns once it accepts connections."""
        self.server.start()

    def restart(self, mode: Mode = "fast", *, down_for: float = 0.0) -> None:
        """Stop in ``mode``, stay down ``down_for`` seconds, start."""
        self.server.restart(mode, down_for=down_for)


def _os_user() -> str | None:
    """The OS user to run PostgreSQL as: ``postgres`` as root (it refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        ledgers.pg_missing(
            "running as root and there is no postgres OS user to run a private server"
        )
    if shutil.which("runuser") is None:
        ledgers.pg_missing(
            "running as root and there is no runuser to run a private server as postgres"
        )
    return "postgres"


@pytest.fixture(scope="session")
def private_pg_server() -> Iterator[PgServer]:
    """A private PostgreSQL cluster for the session, started; deleted after the session."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        ledgers.pg_missing(
            "no PostgreSQL server binaries (initdb, pg_ctl) here to run a private server: "
            "install postgresql or set EFFECTFLOW_TEST_PG_BIN"
        )
    user = _os_user()
    # Under /tmp, not pytest's tmp_path: that is private to this user (and a Unix socket's path
    # must stay short).
    directory = Path(tempfile.mkdtemp(prefix="ef-pg-", dir="/tmp"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    server = PgServer(bin_dir, directory, user)
    try:
        server.initdb()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def private_pg(private_pg_server: PgServer) -> Iterator[PrivatePg]:
    """A fresh database on the private server, which the test may stop, start and restart; the
    server is up when the test begins and is started again after it if the test left it down."""
    private_pg_server.start()
    url = private_pg_server.create_database()
    try:
        yield PrivatePg(private_pg_server, url)
    finally:
        private_pg_server.start()
        private_pg_server.drop_database(url)
