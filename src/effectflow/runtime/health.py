"""A worker's liveness and readiness probes, over HTTP: ``GET /healthz`` and ``GET /readyz``.

``/healthz`` answers whether the process should be restarted: it fails only when the claim loop
stopped turning (``Worker.last_turn`` older than ``Worker.stall_after``) or has ended, never
because the ledger is away (a restart would not bring it back; the loop keeps turning through an
outage, retrying). ``/readyz`` answers whether the worker can take work now: the loop is alive,
the ledger answers a cheap read (its schema version) within ``probe_timeout``, that version is the
one this code was written for, and the worker is not draining. A ledger that an older worker sees
upgraded under it (the version is newer than its code knows) fails readiness with the reason, as
does a ledger behind the code (restored from an older backup).

Each answer is JSON, ``{"status": "ok"|"failing", "checks": {name: {"status", "detail"}}}``:
ids, counts and versions only, never the ledger's URL or a password. Any other path is 404.

The module lives beside ``worker.py`` rather than under ``cli/`` because what it reads is the
``Worker``: an application that runs a ``Worker`` in its own process serves the same probes with
``HealthServer(address).serve(worker)``. The server is the standard library's
``ThreadingHTTPServer`` on a daemon thread: the worker has no event loop to share and two routes
need no framework.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlparse

import effectflow
from effectflow import errors
from effectflow.ledger import upgrades
from effectflow.runtime import worker as worker_mod

#: Seconds a readiness probe waits for the ledger's answer before it reports the ledger away.
DEFAULT_PROBE_TIMEOUT = 2.0

#: The forms ``--health`` accepts, for messages.
ADDRESS_FORMS = "HOST:PORT or :PORT, e.g. 127.0.0.1:8081, :8081 (every interface) or [::]:8081"


@dataclasses.dataclass(frozen=True)
class Check:
    """One thing a probe looked at."""

    #: Whether it passed.
    ok: bool
    #: What was seen, for a person reading the probe's answer.
    detail: str


@dataclasses.dataclass(frozen=True)
class Report:
    """A probe's answer: its checks, by name; it passes when every check does."""

    #: The checks, in the order they were made.
    checks: dict[str, Check]

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(check.ok for check in self.checks.values())

    def as_json(self) -> dict[str, Any]:
        """The body the endpoint sends."""
        return {
            "status": "ok" if self.ok else "failing",
            "checks": {
                name: {"status": "ok" if c.ok else "failing", "detail": c.detail}
                for name, c in self.checks.items()
            },
        }


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (every IPv4 interface) as ``(host, port)``; an IPv6 host in
    brackets (``[::]:8081``). Port 0 asks the system for a free one.

    Raises:
        errors.ArgumentError: anything else (the message names the forms that work).
    """
    raw = text.strip()
    if raw.startswith("["):
        host, closed, rest = raw[1:].partition("]")
        port_text = rest[1:] if closed and rest.startswith(":") else ""
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep or ":" in host:  # no port, or an IPv6 host without its brackets
            port_text = ""
    if (
        not port_text.isdigit()
        or int(port_text) > 65535
        or any(c.isspace() or c in "/[]@" for c in host)
    ):
        raise errors.ArgumentError(f"{text!r} is not an address to listen on; use {ADDRESS_FORMS}")
    return host or "0.0.0.0", int(port_text)


def liveness(worker: worker_mod.Worker) -> Report:
    """Whether the claim loop is alive: running, and turned within ``worker.stall_after``."""
    return Report({"loop": _loop(worker)})


def _loop(worker: worker_mod.Worker) -> Check:
    since = time.monotonic() - worker.last_turn
    if not worker.looping:
        return Check(False, "the claim loop is not running")
    if since > worker.stall_after:
        return Check(
            False,
            f"the claim loop last turned {since:.1f} s ago (hung after {worker.stall_after:g} s)",
        )
    return Check(True, f"the claim loop turned {since:.2f} s ago")


class LedgerProbe:
    """Asks the ledger its schema version on a thread of its own, waiting ``timeout`` at most.

    The ledger's answer can take as long as the store waits for a connection or a lock (seconds;
    forever on a connection whose server vanished without a word), longer than an orchestrator
    waits for a probe. One question is in flight at a time: probes that arrive while it is
    unanswered wait for the same answer instead of piling up threads.
    """

    def __init__(self, store: Any, *, timeout: float = DEFAULT_PROBE_TIMEOUT) -> None:
        self._store = store
        self.timeout = timeout
        dialect = getattr(type(store), "DIALECT", None)
        #: The schema version this code writes (None: a store without packaged migrations).
        self.expected = upgrades.packaged(dialect)[-1][0] if isinstance(dialect, str) else None
        password = urlparse(str(getattr(store, "url", ""))).password
        self._secrets = [password] if password else []
        self._lock = threading.Lock()
        self._pending: _Pending | None = None

    def check(self) -> tuple[Check, Check]:
        """Whether the ledger answers, and whether its schema version is the expected one."""
        with self._lock:
            pending = self._pending
            if pending is None:
                pending = self._pending = _Pending()
                threading.Thread(
                    target=self._ask, args=(pending,), name="effectflow-health-probe", daemon=True
                ).start()
        if not pending.done.wait(self.timeout):
            away = Check(False, f"the ledger did not answer within {self.timeout:g} s")
            return away, Check(False, "unknown: the ledger did not answer")
        if pending.version is None:
            away = Check(False, f"the ledger did not answer: {pending.error}")
            return away, Check(False, "unknown: the ledger did not answer")
        return Check(True, "the ledger answered"), self._schema(pending.version)

    def _ask(self, pending: _Pending) -> None:
        try:
            pending.version = int(self._store.schema_version())
        except Exception as exc:  # any failure to answer is the answer: not ready
            pending.error = self._scrub(f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                if self._pending is pending:
                    self._pending = None
            pending.done.set()

    def _schema(self, version: int) -> Check:
        expected = self.expected
        if expected is None or version == expected:
            return Check(True, f"schema version {version}")
        code = f"this effectflow ({effectflow.__version__}) writes version {expected}"
        if version > expected:
            return Check(
                False,
                f"the ledger is at schema version {version}, newer than {code}: it was upgraded "
                "by a newer effectflow; upgrade this worker",
            )
        return Check(
            False,
            f"the ledger is at schema version {version}, older than {code}: it needs migrating "
            "(restart the worker: opening the ledger applies the migrations)",
        )

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return " ".join(text.split())


@dataclasses.dataclass
class _Pending:
    """One question to the ledger and, once ``done``, its answer."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    version: int | None = None
    error: str = ""


def readiness(worker: worker_mod.Worker, probe: LedgerProbe) -> Report:
    """Whether the worker can take work: loop alive, ledger answering at the right schema version,
    not draining."""
    ledger, schema = probe.check()
    in_flight = worker.in_flight
    if worker.stopping:
        draining = Check(
            False,
            f"draining: no new runs are claimed; {len(in_flight)} run(s) in progress"
            + (f" ({', '.join(in_flight[:20])})" if in_flight else ""),
        )
    else:
        draining = Check(True, f"claiming; {len(in_flight)} run(s) in progress")
    return Report({"draining": draining, "loop": _loop(worker), "ledger": ledger, "schema": schema})


class HealthServer:
    """``/healthz`` and ``/readyz`` on ``address``. The socket is bound at construction, so a port
    in use fails before the worker claims anything; requests are answered once ``serve`` is
    called (until then they wait in the listen backlog)."""

    def __init__(
        self, address: tuple[str, int], *, probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    ) -> None:
        self._probe_timeout = probe_timeout
        self._worker: worker_mod.Worker | None = None
        self._probe: LedgerProbe | None = None
        self._thread: threading.Thread | None = None
        handler = _handler(self)
        server_class = http.server.ThreadingHTTPServer
        if ":" in address[0]:
            server_class = _ThreadingHTTPServerV6
        #: The underlying server (``server_address`` says the port bound, for ``:0``).
        self.httpd = server_class(address, handler)

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self.httpd.server_address[1])

    @property
    def where(self) -> str:
        """``host:port`` listened on (IPv6 in brackets)."""
        host = self.httpd.server_address[0]
        host = host.decode() if isinstance(host, bytes) else str(host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def serve(self, worker: worker_mod.Worker) -> None:
        """Answer probes about ``worker`` from a daemon thread."""
        self._worker = worker
        self._probe = LedgerProbe(worker.runtime.store, timeout=self._probe_timeout)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="effectflow-health",
            daemon=True,
        )
        self._thread.start()

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        """The status and body for a GET of ``path``."""
        route = path.split("?", 1)[0]
        if route not in ("/healthz", "/readyz"):
            return 404, {"status": "failing", "error": "not found; try /healthz or /readyz"}
        if self._worker is None or self._probe is None:
            return 503, {"status": "failing", "checks": {}, "error": "starting"}
        report = (
            liveness(self._worker) if route == "/healthz" else readiness(self._worker, self._probe)
        )
        return (200 if report.ok else 503), report.as_json()

    def close(self) -> None:
        """Stop answering and release the port."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
        self.httpd.server_close()


class _ThreadingHTTPServerV6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler(server: HealthServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        # Probes arrive every few seconds: the default log line per request would drown the log.
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            status, body = server.answer(self.path)
            data = json.dumps(body).encode() + b"\n"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_HEAD(self) -> None:
            status, _ = server.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler
