"""What keeps the HTTP API and the console safe to expose: limits, headers, tokens, signatures.

The API and the console share one set of :class:`Settings` (``app.state.settings``), made by
``create_app`` from its arguments (``effectflow serve`` passes its options through):

* a **request body limit** enforced before any route runs (:class:`BodyLimit`), so an oversized
  request is answered 413 and nothing of it reaches the ledger or the Idempotency-Key table;
* a **cap on stored evidence**, since evidence is kept forever in the effect, its audit event and
  every timeline that shows it (one 30 MB evidence made a 90 MB timeline);
* a **JSON nesting limit** (:func:`loads_limited`): Python's parser, the schema validator and the
  ledger's canonical digests all recurse, so a deeply nested body must be refused up front (400),
  not left to raise ``RecursionError`` somewhere (500);
* **security headers** on every response (:class:`SecurityHeaders`): a CSP without inline script,
  no framing, no sniffing, no referrer;
* **Secure cookies** when the request came over HTTPS, as the server saw it or, only where
  ``trust_proxy`` names the proxy, as the proxy's ``X-Forwarded-Proto`` says;
* a **per-app secret** that signs what the console keeps in cookies (:class:`Signer`);
* **constant-time token checks** (:func:`tenant_of`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from effectflow import errors
from effectflow.api import problems

#: Requests larger than this are refused (413) unless configured otherwise: 1 MiB is far above any
#: decision a person takes, and small enough that a burst of them cannot exhaust memory.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Evidence larger than this (as compact JSON) is refused: evidence is a provider's record or a
#: person's note, and it is copied into the audit log and every timeline read.
DEFAULT_MAX_EVIDENCE_BYTES = 64 * 1024
#: Deeper JSON than this is refused: real provider records nest a handful of levels.
DEFAULT_MAX_JSON_DEPTH = 32

#: The Content-Security-Policy of every response: scripts and styles only from the app's own static
#: files (the console has no inline script or style), never framed, forms post only to the app.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'"
)

#: Headers added to every response, API and console alike.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The hardening options of one app; ``create_app`` makes it and puts it on ``app.state``."""

    #: The largest request body accepted, in bytes; larger ones answer 413 before any route runs.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: The largest evidence stored, in bytes of compact JSON; larger answers 413 (API) or is
    #: explained on the form (console).
    max_evidence_bytes: int = DEFAULT_MAX_EVIDENCE_BYTES
    #: The deepest JSON nesting accepted in API bodies and console evidence.
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    #: The proxies whose ``X-Forwarded-Proto`` / ``X-Forwarded-For`` are believed (IPs, CIDRs, or
    #: ``*``); empty: none, so a client cannot claim HTTPS by sending the header itself.
    trust_proxy: tuple[str, ...] = ()
    #: Mark cookies ``Secure`` on every response, not only on HTTPS requests (for a TLS terminator
    #: that sends no ``X-Forwarded-Proto``).
    secure_cookies: bool = False
    #: The key that signs the console's cookies (flash messages, the sign-in form's token). Random
    #: per app unless given: then a restart drops only pending messages and open sign-in forms.
    secret: bytes = dataclasses.field(default_factory=lambda: os.urandom(32), repr=False)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_evidence_bytes", "max_json_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise errors.ArgumentError(f"{name} must be a positive integer, not {value!r}")
        if len(self.secret) < 16:
            raise errors.ArgumentError("the secret must be at least 16 bytes")

    @staticmethod
    def make(
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_evidence_bytes: int = DEFAULT_MAX_EVIDENCE_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        trust_proxy: str | Sequence[str] | None = None,
        secure_cookies: bool = False,
        secret: str | bytes | None = None,
    ) -> Settings:
        """Settings from ``create_app``'s arguments: ``trust_proxy`` may be a comma-separated
        string (as uvicorn's ``forwarded_allow_ips``), ``secret`` text or bytes.

        Raises:
            errors.ArgumentError: a limit is not a positive integer, or the secret is too short.
        """
        if isinstance(trust_proxy, str):
            proxies = tuple(p.strip() for p in trust_proxy.split(",") if p.strip())
        else:
            proxies = tuple(p.strip() for p in trust_proxy or () if p.strip())
        extra: dict[str, Any] = {}
        if secret is not None:
            extra["secret"] = secret.encode() if isinstance(secret, str) else bytes(secret)
        return Settings(
            max_body_bytes=max_body_bytes,
            max_evidence_bytes=max_evidence_bytes,
            max_json_depth=max_json_depth,
            trust_proxy=proxies,
            secure_cookies=secure_cookies,
            **extra,
        )


def settings_of(request: Request) -> Settings:
    """The app's settings; an app that was not made by ``create_app`` gets the defaults (and a
    secret of its own, kept on its state so every request of that app signs alike)."""
    state = request.app.state
    found = getattr(state, "settings", None)
    if not isinstance(found, Settings):
        found = Settings()
        state.settings = found
    return found


def secure(request: Request, settings: Settings) -> bool:
    """Whether cookies set on this response must be ``Secure``: the request is HTTPS (as the server
    saw it, or as a trusted proxy said), or the app is told to always mark them."""
    return settings.secure_cookies or request.url.scheme == "https"


# -- tokens ---------------------------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def tenant_of(tokens: Mapping[str, str], candidate: str) -> str | None:
    """The tenant of ``candidate``, or None: compared with every known token in constant time.

    A dict lookup hashes the guess and then compares it with a stored key byte by byte, so its
    timing says how much of a guess was right; here each comparison is ``hmac.compare_digest`` of
    two fixed-length digests, and the loop never stops early, so the time depends only on how many
    tokens the server knows.
    """
    given = _digest(candidate)
    found: str | None = None
    for token, tenant in tokens.items():
        if hmac.compare_digest(given, _digest(token)):
            found = tenant
    return found


# -- JSON -----------------------------------------------------------------------------------------


class JSONTooDeep(ValueError):
    """A JSON document nests deeper than the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON nests deeper than {limit} levels")
        #: The limit it broke.
        self.limit = limit


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0, ``[]`` is 1), counted without recursion, stopping
    as soon as ``limit`` is passed (then the answer is ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def loads_limited(raw: str | bytes, max_depth: int) -> Any:
    """``json.loads`` that refuses nesting deeper than ``max_depth``.

    Raises:
        JSONTooDeep: the document nests deeper (also when it is so deep the parser itself gives up
            with ``RecursionError``).
        ValueError: it is not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``).
    """
    try:
        data = json.loads(raw)
    except RecursionError:
        raise JSONTooDeep(max_depth) from None
    if json_depth(data, max_depth) > max_depth:
        raise JSONTooDeep(max_depth)
    return data


def json_size(value: Any) -> int:
    """The size of ``value`` as compact UTF-8 JSON: what the ledger stores of it."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


# -- signed values --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs small JSON values for cookies with HMAC-SHA256 over the app's secret.

    Each value names its ``purpose`` (a flash message cannot be replayed as a sign-in token) and
    carries its expiry; :meth:`loads` answers None for anything forged, altered, expired or
    malformed, so callers treat all of those as "no value".
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, purpose: str, body: str) -> bytes:
        return hmac.new(self._secret, f"{purpose}\0{body}".encode(), hashlib.sha256).digest()

    def dumps(self, purpose: str, value: Any, max_age: float) -> str:
        """``value`` signed for ``purpose``, valid for ``max_age`` seconds."""
        data = {"v": value, "exp": round(time.time() + max_age)}
        body = _b64(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
        return f"{body}.{_b64(self._mac(purpose, body))}"

    def loads(self, purpose: str, signed: str | None) -> Any:
        """The value ``dumps`` signed for ``purpose``, or None."""
        if not signed or signed.count(".") != 1:
            return None
        body, mac = signed.split(".")
        try:
            given = _unb64(mac)
        except ValueError:
            return None
        if not hmac.compare_digest(given, self._mac(purpose, body)):
            return None
        try:
            data = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("exp"), int):
            return None
        if data["exp"] < time.time():
            return None
        return data.get("v")


# -- middleware -----------------------------------------------------------------------------------


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP response the wrapped app sends (a header the
    app set itself is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in self._headers if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit:
    """Refuses a request whose body is larger than ``max_bytes`` before the app sees any of it.

    A declared ``Content-Length`` over the limit is answered at once; otherwise the body is read
    (at most ``max_bytes``, also when sent chunked) and handed to the app whole. Under ``api_prefix``
    the answer is a 413 problem document; elsewhere (the console's forms) a short page.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, api_prefix: str) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.api_prefix = api_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        first: Message
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see that
                first = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        detail = f"the request body is larger than {self.max_bytes} bytes"
        headers = {"Connection": "close"}
        response: Response
        if path == self.api_prefix or path.startswith(self.api_prefix + "/"):
            problem = problems.Problem(413, "payload_too_large", detail, headers=headers)
            response = problem.response(path)
        else:
            response = Response(
                "<!doctype html><title>Too large</title><h1>Too large</h1>"
                f"<p>The form is larger than this server accepts ({self.max_bytes} bytes). "
                "Go back, shorten it and send it again.</p>",
                status_code=413,
                media_type="text/html",
                headers=headers,
            )
        await response(scope, receive, send)
