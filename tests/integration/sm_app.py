"""The provider, tools and workflow of the write-path state machine
(``test_write_path_state_machine.py``).

The provider (``Ledgerless``: it keeps its own books, never the ledger's) is a threaded HTTP
server, so a request sent by a process that was SIGKILLed still lands. ``POST /write`` takes one
planned fault from a queue (``plan``) for each request that arrives:

- ``latency``: seconds between the request's arrival and its commit;
- ``mode``: ``ok``; ``lose`` (commit, then drop the connection without an answer: the caller
  cannot tell whether it happened); ``refuse`` (answer 503 before committing anything);
- ``outage``: a callable run right after the commit, before the answer (a ledger outage begins
  while the outcome is still unrecorded).

The provider enforces a bound: a request it has not committed within ``BOUND`` seconds of its
arrival is dropped (never committed; the connection closes unanswered), which is what the bounded
tool's ``settles_within`` declares. Requests with ``dedup`` are deduplicated by their tag (the
idempotency key), as a provider honouring keys does. ``GET /search?tag=`` finds records by tag.

Run as a script (``python sm_app.py LEDGER PROVIDER_URL start RUN_ID TOOL,TOOL`` or
``... recover``) it drives runs in a process the test SIGKILLs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

import effectflow as ef
from effectflow.runtime import lookup

#: Seconds after its arrival past which the provider never commits a request.
BOUND = 0.8
#: What the bounded tool declares (measured from the call's start, a little before its arrival).
SETTLES_WITHIN = 1.0
#: The runtime's timeout for one call: shorter than some latencies on purpose.
TIMEOUT = 0.5


@dataclasses.dataclass(frozen=True)
class Fault:
    """What the provider does with one request."""

    #: Seconds from arrival to commit (past ``BOUND``: never committed).
    latency: float = 0.0
    #: ``ok``, ``lose`` (commit, no answer) or ``refuse`` (503, nothing committed).
    mode: str = "ok"
    #: Run right after the commit, before the answer (a ledger outage); None for none.
    outage: Callable[[], None] | None = None


class Ledgerless:
    """The provider's own records: the truth the state machine checks the ledger against."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: Faults for the next requests, in arrival order (then ``Fault()``).
        self.plan: collections.deque[Fault] = collections.deque()
        #: Every request that arrived: (op, tag).
        self.arrivals: list[tuple[str, str]] = []
        #: Committed records: post_id, op (the logical operation), tag (the key sent).
        self.records: list[dict[str, Any]] = []
        #: Requests of each op still being handled (may still commit).
        self.inflight: collections.Counter[str] = collections.Counter()
        self.changed = threading.Condition(self.lock)
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                arrived = time.monotonic()
                with provider.changed:
                    provider.arrivals.append((body["op"], body["tag"]))
                    provider.inflight[body["op"]] += 1
                    fault = provider.plan.popleft() if provider.plan else Fault()
                    provider.changed.notify_all()
                try:
                    self._write(body, fault, arrived)
                finally:
                    with provider.changed:
                        provider.inflight[body["op"]] -= 1
                        provider.changed.notify_all()

            def _write(self, body: dict[str, Any], fault: Fault, arrived: float) -> None:
                if fault.mode == "refuse":
                    self._answer(503, {"error": "overloaded, nothing done"})
                    return
                time.sleep(min(fault.latency, BOUND + 0.2))
                with provider.lock:
                    late = time.monotonic() - arrived > BOUND
                    same = [r for r in provider.records if r["tag"] == body["tag"]]
                    if late:
                        record = None
                    elif body.get("dedup") and same:
                        record = {**same[0], "replayed": True}
                    else:
                        record = {
                            "post_id": f"p{len(provider.records) + 1}",
                            "op": body["op"],
                            "tag": body["tag"],
                        }
                        provider.records.append(record)
                if record is not None and fault.outage is not None:
                    fault.outage()
                if record is None or fault.mode == "lose":
                    self.close_connection = True  # no answer at all: the caller cannot tell
                    return
                self._answer(200, record)

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                with provider.lock:
                    found = [r for r in provider.records if r["tag"] == query["tag"][0]]
                self._answer(200, {"found": found})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                try:
                    data = json.dumps(body).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the caller died while waiting: what committed stays committed
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def snapshot(self) -> list[dict[str, Any]]:
        """The committed records as they are now."""
        with self.lock:
            return [dict(r) for r in self.records]

    def holds(self, op: str) -> list[dict[str, Any]]:
        """The records the provider holds for ``op``."""
        with self.lock:
            return [dict(r) for r in self.records if r["op"] == op]

    def settle(self, op: str | None = None, timeout: float = 5.0) -> bool:
        """Wait until no request (of ``op``, or at all) is still being handled."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while (self.inflight[op] if op is not None else sum(self.inflight.values())) > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def wait_arrivals(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests arrived in all."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.arrivals) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Where the tools send their requests (set by the test, or by the script's argument).
PROVIDER = {"url": ""}
FAST = ef.RetryPolicy(initial_backoff=0.01, max_backoff=0.05, max_lookups=2)


@ef.tool("sm_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    found = httpx.get(f"{PROVIDER['url']}/search", params={"tag": idempotency_key}).json()["found"]
    if not found:
        return ef.Lookup.not_committed(evidence={"searched_tag": idempotency_key})
    return ef.Lookup.confirmed(external_effect_id=found[0]["post_id"], result=found[0])


def _write(op: str, idempotency_key: str, *, dedup: bool) -> dict[str, Any]:
    # No client timeout: the runtime's own timeout is the moment it stops waiting.
    answer = httpx.post(
        f"{PROVIDER['url']}/write",
        json={"op": op, "tag": idempotency_key, "dedup": dedup},
        timeout=None,
    )
    if answer.status_code == 503:
        raise ef.NotCommitted("the provider refused before doing anything")
    answer.raise_for_status()
    return dict(answer.json())


@ef.tool(
    "sm_post_bounded",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    timeout=TIMEOUT,
    retry=FAST,
    settles_within=SETTLES_WITHIN,
)
def post_bounded(op: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent, tagged with the key; the provider commits within its bound or never."""
    return _write(op, idempotency_key, dedup=False)


@ef.tool(
    "sm_post_unbounded",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    timeout=TIMEOUT,
    retry=FAST,
    settles_within="unbounded",
)
def post_unbounded(op: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent, tagged with the key; nothing says how late the provider may commit."""
    return _write(op, idempotency_key, dedup=False)


@ef.tool(
    "sm_put",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="post_id",
    timeout=TIMEOUT,
    retry=FAST,
)
def put(op: str, *, idempotency_key: str) -> dict[str, Any]:
    """The provider deduplicates by key: a retry with the original key is the same record."""
    return _write(op, idempotency_key, dedup=True)


@ef.tool(
    "sm_pay",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="post_id",
    timeout=TIMEOUT,
    retry=FAST,
)
def pay(op: str, *, idempotency_key: str) -> dict[str, Any]:
    """Moves money: waits for a person's approval; the provider deduplicates by key."""
    return _write(op, idempotency_key, dedup=True)


TOOLS = {t.name: t for t in (post_bounded, post_unbounded, put, pay)}


@ef.workflow("sm_flow")
def flow(ctx: ef.Context, label: str, tools: list[str]) -> list[Any]:
    """One write step per tool, each its own logical operation ``label/wN``."""
    return [
        ctx.call(f"w{i}", TOOLS[tool], op=f"{label}/w{i}")["post_id"]
        for i, tool in enumerate(tools)
    ]


def runtime(ledger: str, tenant: str) -> ef.Runtime:
    """The runtime every process of the machine uses: a short ledger retry, so that a ledger
    outage outlasting it leaves the run for recovery within the test's time."""
    return ef.Runtime(ledger, tenant=tenant, ledger_retry=0.5)


#: A call that outlived its timeout is waited for this long (not 30 s) when no bound says when it
#: can no longer land, so that the unbounded tool reaches a person quickly.
LATE_ANSWER_WAIT = 0.3


if __name__ == "__main__":
    ledger, PROVIDER["url"], tenant, verb = sys.argv[1:5]
    lookup.LATE_ANSWER_WAIT = LATE_ANSWER_WAIT
    with runtime(ledger, tenant) as rt:
        if verb == "start":
            run_id, tools = sys.argv[5], sys.argv[6].split(",")
            rt.start(flow, run_id=run_id, label=run_id, tools=tools)
        else:
            rt.recover()
