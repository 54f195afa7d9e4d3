"""A provider that commits late, over real HTTP, and the tools and workflows that call it.

The provider (``SlowPosts``) is a threaded HTTP server: ``POST /post`` records the request's
arrival, waits ``latency`` seconds, then commits the post (its own record, which the tests check
the ledger against). ``GET /search?tag=`` finds posts by the tag the caller sent. It never
deduplicates: a second request is a second post.

Run as a script (``python latency_app.py LEDGER_URL PROVIDER_URL TOOL``) it starts one run and
is SIGKILLed by the test while its request is still on the wire.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

import effectflow as ef


class SlowPosts:
    """The provider's own records: which requests arrived, and which posts committed."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.lock = threading.Lock()
        self.arrivals: list[str] = []
        self.posts: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with provider.lock:
                    provider.arrivals.append(body["tag"])
                provider.arrived.set()
                time.sleep(provider.latency)
                with provider.lock:
                    post = {"post_id": f"p{len(provider.posts) + 1}", "tag": body["tag"]}
                    provider.posts.append(post)
                self._answer(post)

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                with provider.lock:
                    found = [p for p in provider.posts if p["tag"] == query["tag"][0]]
                self._answer({"found": found})

            def _answer(self, body: dict[str, Any]) -> None:
                try:
                    data = json.dumps(body).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the caller died while waiting: the post is committed anyway
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def committed(self, tag: str) -> int:
        """How many posts the provider holds under ``tag``."""
        with self.lock:
            return sum(1 for p in self.posts if p["tag"] == tag)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Where the tools send their requests (set by the test, or by the script's argument).
PROVIDER = {"url": ""}
FAST = ef.RetryPolicy(initial_backoff=0.01, max_backoff=0.05, max_lookups=2)


@ef.tool("lat_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    found = httpx.get(f"{PROVIDER['url']}/search", params={"tag": idempotency_key}).json()["found"]
    if not found:
        return ef.Lookup.not_committed(evidence={"searched_tag": idempotency_key})
    return ef.Lookup.confirmed(external_effect_id=found[0]["post_id"], result=found[0])


def _post(text: str, idempotency_key: str) -> dict[str, Any]:
    # The tool itself waits as long as the provider takes: only the runtime's timeout is short.
    answer = httpx.post(
        f"{PROVIDER['url']}/post", json={"text": text, "tag": idempotency_key}, timeout=None
    )
    return dict(answer.json())


@ef.tool(
    "lat_post_bounded",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    timeout=1,
    retry=FAST,
    settles_within=3,
)
def post_bounded(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent, tagged with the key; the provider commits within 3 s of a call or never."""
    return _post(text, idempotency_key)


@ef.tool(
    "lat_post_unbounded",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    timeout=1,
    retry=FAST,
    settles_within="unbounded",
)
def post_unbounded(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent, tagged with the key; nothing says how late the provider may commit."""
    return _post(text, idempotency_key)


@ef.tool(
    "lat_post_async",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    timeout=1,
    retry=FAST,
    settles_within="unbounded",
)
async def post_async(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """The same as ``post_unbounded``, as a coroutine."""
    async with httpx.AsyncClient(timeout=None) as client:
        answer = await client.post(
            f"{PROVIDER['url']}/post", json={"text": text, "tag": idempotency_key}
        )
    return dict(answer.json())


TOOLS = {t.name: t for t in (post_bounded, post_unbounded, post_async)}


@ef.workflow("lat_flow")
def flow(ctx: ef.Context, tool: str) -> Any:
    return ctx.call("post", TOOLS[tool], text="hello")


@ef.workflow("lat_flow_async")
async def flow_async(ctx: ef.AsyncContext, tool: str) -> Any:
    return await ctx.call("post", TOOLS[tool], text="hello")


if __name__ == "__main__":
    ledger, PROVIDER["url"], tool = sys.argv[1:4]
    with ef.Runtime(ledger) as rt:
        rt.start(flow, run_id="wire", tool=tool)
