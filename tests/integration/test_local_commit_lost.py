"""A ``local_transaction`` step on PostgreSQL whose COMMIT reply is lost
(docs/concepts.md#the-write-path; the row ``local_rollback`` of docs/decision-table.md).

A TCP proxy between the runtime and the server (written here, on threads) forwards the wire protocol
untouched until it is told to break one connection at its COMMIT: either forward the COMMIT and drop
the server's reply (the transaction committed, the client cannot know), or drop the COMMIT itself
(the transaction never commits). The ledger URL points at the proxy; every check of what exists
reads the tool's own table on a direct connection to the server, not the ledger's opinion.

What must hold: the tool's rows exist exactly once after the run (and after any resume or
recovery), a lost reply is settled from the step's checkpoint row (or left in doubt and settled on
recovery), never recorded as rolled back; and a rollback's record carries no ``local_commit`` event.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

import effectflow as ef
import ledgers
from worlds import step

PG_URL = ledgers.PG
FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.005)
S = ef.StepStatus
R = ef.RunStatus
TABLE = "lost_commit_seats"

#: Startup-phase requests that come before the startup message (and carry no type byte).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


class Proxy:
    """A TCP proxy in front of PostgreSQL that can break one connection at its COMMIT.

    It parses the client's messages (a type byte and a length, after the untyped startup packet) to
    find the COMMIT: a simple query (``Q``) whose text is COMMIT, or a ``Parse`` of COMMIT in the
    extended protocol (then the ``Sync`` after it is what makes the server run it). It reads the
    server's ``BackendKeyData`` to learn each connection's backend pid, so a test breaks exactly the
    connection its tool ran on. (psycopg sends a local transaction's COMMIT as a simple query: its
    transaction block ends outside the pipeline; the ledger's pipelined batches send Parse/Sync.)
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        #: Backend pid -> what to do at that connection's next COMMIT (``lose_reply``, ``drop``).
        self._armed: dict[int, str] = {}
        #: The plan the next ``watch`` call arms (one shot).
        self.plan: str | None = None
        #: While true, new connections are closed at once (the ledger cannot be reached).
        self.down = False
        #: After breaking a COMMIT, go down too (the ledger then cannot be reached to settle it).
        self.down_after_break = False
        #: COMMITs broken so far: (pid, plan).
        self.broken: list[tuple[int, str]] = []
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="pg-proxy", daemon=True)
        self._thread.start()

    # -- control --------------------------------------------------------------------------------

    def watch(self, pid: int) -> None:
        """Arm the pending plan (if any) for the connection of backend ``pid``."""
        with self._lock:
            if self.plan is not None:
                self._armed[pid] = self.plan
                self.plan = None

    def go_down(self, *, cut: bool = False) -> None:
        """Refuse new connections (and with ``cut``, cut the open ones too).

        The tests leave the pool's open connections alone: the store reads a checkpoint on a new
        connection, which is what must fail, and the pool is not what they test.
        """
        self.down = True
        if not cut:
            return
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _close(conn)

    def go_up(self) -> None:
        self.down = False

    def close(self) -> None:
        self._closed = True
        self.go_down(cut=True)
        _close(self._listener)
        self._thread.join(timeout=5)

    # -- forwarding -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            pair = _Pair(self, client, server)
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=pair.client_to_server, daemon=True).start()
            threading.Thread(target=pair.server_to_client, daemon=True).start()

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.difference_update(socks)

    def _plan_for(self, pid: int | None) -> str | None:
        with self._lock:
            return self._armed.get(pid) if pid is not None else None

    def _fired(self, pid: int, plan: str) -> None:
        with self._lock:
            self._armed.pop(pid, None)
            self.broken.append((pid, plan))
        if self.down_after_break:
            self.go_down()


class _Pair:
    """One client connection and its server connection."""

    def __init__(self, proxy: Proxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.pid: int | None = None
        #: Set once the COMMIT went to the server and its reply is to be dropped.
        self.swallow = threading.Event()

    def cut(self) -> None:
        _close(self.client)
        _close(self.server)
        self.proxy._forget(self.client, self.server)

    def client_to_server(self) -> None:
        try:
            startup = True
            parsed_commit = False
            while True:
                if startup:
                    head = _recv_exact(self.client, 4)
                    (length,) = struct.unpack("!i", head)
                    body = _recv_exact(self.client, length - 4)
                    code = struct.unpack("!i", body[:4])[0] if len(body) >= 4 else 0
                    if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                        raise AssertionError("the proxy needs sslmode=disable&gssencmode=disable")
                    self.server.sendall(head + body)
                    startup = False
                    continue
                head = _recv_exact(self.client, 5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = _recv_exact(self.client, length - 4)
                message = head + body
                plan = self.proxy._plan_for(self.pid)
                is_commit = kind == b"Q" and _is_commit(body)
                if kind == b"P":
                    # Parse: a statement name, then its text.
                    text = body.split(b"\x00", 2)[1] if body.count(b"\x00") >= 2 else b""
                    parsed_commit = parsed_commit or _is_commit(text)
                elif kind == b"S" and parsed_commit:
                    is_commit, parsed_commit = True, False
                if plan is None or not (is_commit or (kind == b"P" and parsed_commit)):
                    self.server.sendall(message)
                    continue
                if plan == "drop":
                    # The COMMIT never reaches the server: it sees its client go away and aborts.
                    self.proxy._fired(self.pid or 0, plan)
                    self.cut()
                    return
                if kind == b"P":
                    self.server.sendall(message)  # the Sync after it runs the COMMIT
                    continue
                self.swallow.set()
                self.server.sendall(message)
                self.proxy._fired(self.pid or 0, plan)
                return  # the server->client side cuts both once the reply arrived
        except (OSError, AssertionError, struct.error):
            self.cut()

    def server_to_client(self) -> None:
        try:
            buffer = b""
            while self.pid is None:
                chunk = self.server.recv(65536)
                if not chunk:
                    raise OSError("server closed")
                buffer += chunk
                self.pid = _backend_pid(buffer)
                self.client.sendall(chunk)
            while True:
                chunk = self.server.recv(65536)
                if not chunk:
                    raise OSError("server closed")
                if self.swallow.is_set():
                    # The server answered the COMMIT (it committed): the client never hears it.
                    self.cut()
                    return
                self.client.sendall(chunk)
        except OSError:
            self.cut()


def _is_commit(text: bytes) -> bool:
    return text.rstrip(b"\x00").strip().rstrip(b";").strip().upper() in (b"COMMIT", b"END")


def _backend_pid(buffer: bytes) -> int | None:
    """The pid of the server's ``BackendKeyData`` message, once the buffer holds it."""
    at = 0
    while at + 5 <= len(buffer):
        kind = buffer[at : at + 1]
        (length,) = struct.unpack("!i", buffer[at + 1 : at + 5])
        if at + 1 + length > len(buffer):
            return None
        if kind == b"K":
            return int(struct.unpack("!i", buffer[at + 5 : at + 9])[0])
        at += 1 + length
    return None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("peer closed")
        data += chunk
    return data


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


# -- the tool and its workflow ----------------------------------------------------------------------

_PROXY: list[Proxy] = []


@ef.tool("lost_quote", effect="pure")
def quote(seat: str) -> dict[str, Any]:
    return {"seat": seat, "price": 120}


@ef.tool("lost_reserve", effect="external_write", commit="local_transaction", retry=FAST)
def reserve(seat: str, price: int, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    (pid,) = tx.execute("SELECT pg_backend_pid()").fetchone()
    _PROXY[-1].watch(int(pid))
    tx.execute(f"INSERT INTO {TABLE} (seat, price) VALUES (%s, %s)", (seat, price))
    return {"seat": seat, "reserved": True}


@ef.tool("lost_clash", effect="external_write", commit="local_transaction")
def clash_tool(seat: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    # A deferred unique constraint: both rows go in, and the COMMIT is what refuses them.
    tx.execute(
        "CREATE TABLE IF NOT EXISTS lost_clash (seat TEXT UNIQUE DEFERRABLE INITIALLY DEFERRED)"
    )
    tx.execute(f"INSERT INTO {TABLE} (seat, price) VALUES (%s, 0)", (seat,))
    tx.execute("INSERT INTO lost_clash (seat) VALUES (%s), (%s)", (seat, seat))
    return {"seat": seat}


@ef.workflow("lost_clash")
def clash(ctx: ef.Context, seat: str) -> Any:
    offer = ctx.call("quote", quote, seat=seat)
    return ctx.call("clash", clash_tool, seat=offer["seat"])


@ef.workflow("lost_booking_async")
async def booking_async(ctx: ef.AsyncContext, seat: str) -> dict[str, Any]:
    offer = await ctx.call("quote", quote, seat=seat)
    return dict(await ctx.call("reserve", reserve, seat=seat, price=offer["price"]))


@ef.workflow("lost_booking")
def booking(ctx: ef.Context, seat: str) -> dict[str, Any]:
    offer = ctx.call("quote", quote, seat=seat)
    return dict(ctx.call("reserve", reserve, seat=seat, price=offer["price"]))


# -- fixtures ---------------------------------------------------------------------------------------


def _admin(sql: str, url: str = PG_URL) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A database for this module, dropped at its end."""
    with ledgers.pg_database("effectflow_lost") as url:
        yield url


@pytest.fixture
def direct(database: str) -> Iterator[str]:
    """A fresh schema holding the tool's table; the URL of a direct connection to it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    _admin(f"CREATE SCHEMA {schema}", database)
    url = f"{database}?options=-csearch_path%3D{schema}"
    _admin(f"CREATE TABLE {TABLE} (seat TEXT NOT NULL, price INTEGER NOT NULL)", url)
    yield url
    _admin(f"DROP SCHEMA {schema} CASCADE", database)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    parsed = urlparse(PG_URL)
    made = Proxy((parsed.hostname or "127.0.0.1", parsed.port or 5432))
    _PROXY.append(made)
    yield made
    _PROXY.remove(made)
    made.close()


@pytest.fixture
def proxied(direct: str, proxy: Proxy) -> str:
    """The same schema, reached through the proxy (the ledger URL)."""
    parsed = urlparse(direct)
    netloc = parsed.netloc.replace(f":{parsed.port or 5432}", f":{proxy.port}")
    if ":" not in netloc.split("@")[-1]:
        netloc = f"{netloc}:{proxy.port}"
    query = f"{parsed.query}&sslmode=disable&gssencmode=disable"
    return urlunparse(parsed._replace(netloc=netloc, query=query))


@pytest.fixture
def rt(proxied: str) -> Iterator[ef.Runtime]:
    with ef.Runtime(proxied) as runtime:
        yield runtime


def seats(direct: str, seat: str) -> int:
    """How many rows the tool wrote for ``seat``: the tool's own table, read on the server."""
    with psycopg.connect(direct) as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE seat = %s", (seat,)).fetchone()
    assert row is not None
    return int(row[0])


def kinds(rt: ef.Runtime, run_id: str, step_id: str) -> list[str]:
    return [e.kind for e in rt.audit(run_id) if e.step_id == step_id]


# -- tests ------------------------------------------------------------------------------------------


def test_the_proxy_forwards_untouched_until_armed(
    rt: ef.Runtime, direct: str, proxy: Proxy
) -> None:
    """Through the proxy, unarmed, a booking commits its row once (the proxy itself changes nothing)."""
    run = rt.start(booking, run_id="plain", seat="1A")

    assert run.status is R.SUCCEEDED
    assert seats(direct, "1A") == 1
    assert proxy.broken == []


def test_a_lost_commit_reply_is_settled_from_the_checkpoint_as_committed(
    rt: ef.Runtime, direct: str, proxy: Proxy
) -> None:
    """The COMMIT lands but its reply is lost: the step is confirmed from its checkpoint row, the
    row exists once, and a resume writes nothing more."""
    proxy.plan = "lose_reply"
    run = rt.start(booking, run_id="lost-reply", seat="2B")

    assert [plan for _, plan in proxy.broken] == ["lose_reply"]
    assert seats(direct, "2B") == 1
    assert run.status is R.SUCCEEDED, run.error
    assert run.output == {"seat": "2B", "reserved": True}
    reserve_step = step(rt, "lost-reply", "reserve")
    assert reserve_step.status is S.CONFIRMED
    attempts = rt.attempts("lost-reply", "reserve")
    assert [a.outcome.value for a in attempts if a.outcome] == ["committed"]
    (effect,) = rt.effects(run_id="lost-reply")
    assert effect.status is S.CONFIRMED
    assert kinds(rt, "lost-reply", "reserve") == ["local_commit", "local_commit_settled"]
    (settled,) = [e for e in rt.audit("lost-reply") if e.kind == "local_commit_settled"]
    assert settled.detail["committed"] is True
    assert settled.detail["attempt_id"] == attempts[0].attempt_id
    assert rt.verify_audit() == []

    again = rt.resume("lost-reply")
    assert again.status is R.SUCCEEDED
    assert seats(direct, "2B") == 1


def test_a_lost_reply_with_the_ledger_down_is_left_in_doubt_then_settled_on_resume(
    rt: ef.Runtime, direct: str, proxy: Proxy
) -> None:
    """The COMMIT lands, its reply is lost and the ledger cannot be reached to read the checkpoint:
    ``CommitInDoubt``, nothing recorded as rolled back or failed; resuming settles the step from its
    checkpoint row, and the row still exists once."""
    proxy.plan, proxy.down_after_break = "lose_reply", True
    with pytest.raises(ef.CommitInDoubt) as raised:
        rt.start(booking, run_id="lost-down", seat="3C")

    assert raised.value.step_id == "reserve"
    assert raised.value.run_id == "lost-down"
    assert "may have committed" in str(raised.value)
    assert seats(direct, "3C") == 1
    proxy.go_up()
    run = rt.run("lost-down")
    assert run.status is R.RUNNING  # left for recovery, not failed
    assert step(rt, "lost-down", "reserve").status is S.CONFIRMED  # the checkpoint committed

    resumed = rt.resume("lost-down")
    assert resumed.status is R.SUCCEEDED, resumed.error
    assert resumed.output == {"seat": "3C", "reserved": True}
    assert seats(direct, "3C") == 1
    attempts = rt.attempts("lost-down", "reserve")
    assert [a.outcome.value for a in attempts if a.outcome] == ["committed"]
    assert kinds(rt, "lost-down", "reserve") == ["local_commit"]
    assert rt.verify_audit() == []
    assert rt.resume("lost-down").status is R.SUCCEEDED
    assert seats(direct, "3C") == 1


def test_a_commit_that_never_reaches_the_server_is_settled_as_not_committed_and_retried_once(
    rt: ef.Runtime, direct: str, proxy: Proxy
) -> None:
    """The COMMIT itself is dropped: no row exists, the checkpoint is absent, so the step is
    recorded as not committed (with no trace of the failed checkpoint) and retried once."""
    proxy.plan = "drop"
    run = rt.start(booking, run_id="dropped", seat="4D")

    assert [plan for _, plan in proxy.broken] == ["drop"]
    assert run.status is R.SUCCEEDED, run.error
    assert seats(direct, "4D") == 1
    attempts = rt.attempts("dropped", "reserve")
    assert [a.outcome.value for a in attempts if a.outcome] == ["not_committed", "committed"]
    assert attempts[0].error is not None
    assert attempts[0].error["type"] == "OperationalError"
    # The rollback's record holds the settle and the rollback, then the retry commits once.
    assert kinds(rt, "dropped", "reserve") == ["local_commit_settled", "rollback", "local_commit"]
    (settled,) = [e for e in rt.audit("dropped") if e.kind == "local_commit_settled"]
    assert settled.detail["committed"] is False
    assert settled.detail["attempt_id"] == attempts[0].attempt_id
    # The pure step that rode with the failed checkpoint was recorded once, with the rollback.
    assert kinds(rt, "dropped", "quote") == ["recorded"]
    assert step(rt, "dropped", "quote").next_step == "reserve"
    assert rt.verify_audit() == []
    assert rt.resume("dropped").status is R.SUCCEEDED
    assert seats(direct, "4D") == 1


def test_a_dropped_commit_with_the_ledger_down_runs_once_on_resume(
    rt: ef.Runtime, direct: str, proxy: Proxy
) -> None:
    """The COMMIT is dropped and the ledger stays down: in doubt, no row; resuming finds no
    checkpoint and runs the step, so the row exists exactly once."""
    proxy.plan, proxy.down_after_break = "drop", True
    with pytest.raises(ef.CommitInDoubt):
        rt.start(booking, run_id="dropped-down", seat="5E")

    assert seats(direct, "5E") == 0
    proxy.go_up()
    assert rt.run("dropped-down").status is R.RUNNING
    assert "reserve" not in {s.step_id for s in rt.steps("dropped-down")}

    resumed = rt.resume("dropped-down")
    assert resumed.status is R.SUCCEEDED, resumed.error
    assert seats(direct, "5E") == 1
    assert kinds(rt, "dropped-down", "reserve") == ["local_commit"]
    assert rt.verify_audit() == []


def test_a_commit_the_server_refuses_rolls_back_with_no_local_commit_event(
    rt: ef.Runtime, direct: str
) -> None:
    """A COMMIT answered with an error (a deferred constraint) rolls back for sure: the step is not
    committed and the run's audit holds a rollback but no ``local_commit`` from the checkpoint
    that failed."""
    run = rt.start(clash, run_id="clash", seat="6F")

    assert run.status is R.FAILED
    assert seats(direct, "6F") == 0
    reserve_step = step(rt, "clash", "clash")
    assert reserve_step.status is S.NOT_COMMITTED
    assert reserve_step.error is not None
    assert reserve_step.error["type"] == "UniqueViolation"
    audit = [e.kind for e in rt.audit("clash")]
    assert "local_commit" not in audit
    assert "local_commit_settled" not in audit
    assert kinds(rt, "clash", "clash") == ["rollback"]
    assert kinds(rt, "clash", "quote") == ["recorded"]
    (effect,) = rt.effects(run_id="clash")
    assert effect.status is S.NOT_COMMITTED
    assert rt.verify_audit() == []


@pytest.mark.parametrize(
    ("plan", "outcomes"),
    [("lose_reply", ["committed"]), ("drop", ["not_committed", "committed"])],
)
def test_an_async_workflow_settles_a_broken_commit_the_same_way(
    rt: ef.Runtime, direct: str, proxy: Proxy, plan: str, outcomes: list[str]
) -> None:
    """The asyncio driver goes through the same settle: one row either way."""
    proxy.plan = plan
    run = rt.start(booking_async, run_id=f"async-{plan}", seat=f"7{plan}")

    assert [p for _, p in proxy.broken] == [plan]
    assert run.status is R.SUCCEEDED, run.error
    assert seats(direct, f"7{plan}") == 1
    attempts = rt.attempts(f"async-{plan}", "reserve")
    assert [a.outcome.value for a in attempts if a.outcome] == outcomes
    assert kinds(rt, f"async-{plan}", "reserve").count("local_commit") == 1
    assert rt.verify_audit() == []


def test_another_worker_recovers_a_commit_left_in_doubt_without_writing_twice(
    proxied: str, direct: str, proxy: Proxy
) -> None:
    """Left in doubt with the ledger down, the run is recovered by another runtime once its lease
    lapses: the step is read from its checkpoint (confirmed) and the row still exists once."""
    proxy.plan, proxy.down_after_break = "lose_reply", True
    with ef.Runtime(proxied, lease_ttl=1.0) as first, pytest.raises(ef.CommitInDoubt):
        first.start(booking, run_id="handed-over", seat="8H")
    assert seats(direct, "8H") == 1
    proxy.go_up()

    with ef.Runtime(direct) as other:
        deadline = time.monotonic() + 10
        recovered: list[ef.RunRecord] = []
        while not recovered and time.monotonic() < deadline:
            time.sleep(0.2)
            recovered = [r for r in other.recover() if r.run_id == "handed-over"]
        assert [r.status for r in recovered] == [R.SUCCEEDED]
        assert seats(direct, "8H") == 1
        assert kinds(other, "handed-over", "reserve") == ["local_commit"]
        assert other.verify_audit() == []
