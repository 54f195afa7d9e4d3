"""``create_app``: the Starlette application over the runtime's public methods.

One ``ef.Runtime`` per tenant, made on first use and closed on shutdown. Each bearer token maps to
one tenant, and every read and action goes through that tenant's runtime, so another tenant's run or
effect is simply not found: the answer is the same 404 as for an id that never existed.

Every response carries the security headers of ``effectflow.api.hardening``; bodies over the limit
are refused before any route runs, nesting and evidence size are capped, and tokens are compared in
constant time. ``create_app``'s keyword arguments configure each of these.

The endpoints are :mod:`.reads` and :mod:`.actions` (what they share: :mod:`.endpoints`); this
module wires them, the console and the middleware into one application.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from effectflow import errors
from effectflow.api import actions, hardening, idempotency, openapi, problems, reads
from effectflow.contracts import registry as registry_module
from effectflow.runtime.runtime import Runtime

PREFIX = "/api/v1"


class Runtimes:
    """One runtime per tenant over one ledger, made on first use."""

    def __init__(self, db_url: str, registry: registry_module.Registry | None = None) -> None:
        self.db_url = db_url
        self.registry = registry
        self._lock = threading.Lock()
        self._by_tenant: dict[str, Runtime] = {}

    def get(self, tenant: str) -> Runtime:
        """The tenant's runtime."""
        with self._lock:
            found = self._by_tenant.get(tenant)
            if found is None:
                found = Runtime(self.db_url, tenant=tenant, registry=self.registry)
                self._by_tenant[tenant] = found
            return found

    def close(self) -> None:
        """Close every runtime (stops heartbeats, closes the ledger connections)."""
        with self._lock:
            for runtime in self._by_tenant.values():
                runtime.close()
            self._by_tenant.clear()


def load_app_module(spec: str) -> registry_module.Registry | None:
    """Import ``module`` or ``module:object`` so its tools and workflows register; the object, when
    it is a ``Registry``, is the registry the runtimes use.

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: the module has no such object.
    """
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    if not attr:
        return None
    loaded = getattr(module, attr)
    return loaded if isinstance(loaded, registry_module.Registry) else None


async def _not_found(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if not request.url.path.startswith(PREFIX + "/"):  # the console's, answered as Starlette would
        return PlainTextResponse(str(exc.detail), exc.status_code, headers=exc.headers)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = "no such route" if exc.status_code == 404 else str(exc.detail)
    return problems.Problem(
        exc.status_code, code, detail, headers=dict(exc.headers or {})
    ).response(request.url.path)


def _console_routes() -> list[BaseRoute] | None:
    """The web console's routes when ``effectflow.console`` is installed, else None."""
    try:
        console = importlib.import_module("effectflow.console")
    except ModuleNotFoundError as exc:
        if exc.name in ("effectflow.console",):
            return None
        raise
    routes: list[BaseRoute] = console.routes()
    return routes


async def _root(request: Request) -> Response:
    return RedirectResponse(f"{PREFIX}/openapi.json")


def api_routes() -> list[BaseRoute]:
    """The API's routes, relative to ``/api/v1`` where ``create_app`` mounts them (a mount of its
    own, so a console mounted at ``/`` never answers a path under it)."""
    spec = openapi.document()
    bodies = spec["components"]["schemas"]

    def schema(name: str) -> dict[str, Any]:
        return dict(bodies[name])

    return [
        Route("/health", reads.health, methods=["GET"]),
        Route("/ready", reads.ready, methods=["GET"]),
        Route("/openapi.json", reads.openapi_document, methods=["GET"]),
        Route("/runs", reads.list_runs, methods=["GET"]),
        Route("/runs/{run_id}", reads.get_run, methods=["GET"]),
        Route("/runs/{run_id}/timeline", reads.get_timeline, methods=["GET"]),
        Route("/effects", reads.list_effects, methods=["GET"]),
        Route("/attention", reads.list_attention, methods=["GET"]),
        Route(
            "/effects/{effect_id}/resolve",
            actions.action(schema("ResolveRequest"), actions.resolve),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/steps/{step_id}/approve",
            actions.action(schema("ApproveRequest"), actions.approve),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/steps/{step_id}/reject",
            actions.action(schema("RejectRequest"), actions.reject),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/cancel",
            actions.action(schema("CancelRequest"), actions.cancel),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/compensate",
            actions.action(schema("CompensateRequest"), actions.compensate),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/resume",
            actions.action(schema("ResumeRequest"), actions.resume),
            methods=["POST"],
        ),
    ]


def _middleware(settings: hardening.Settings) -> list[Middleware]:
    """Outermost first: headers go on every answer (a 413 too); the proxy's word on the scheme is
    taken, where trusted, before anything looks at it; the body limit runs before any route."""
    stack = [Middleware(hardening.SecurityHeaders)]
    if settings.trust_proxy:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        stack.append(Middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trust_proxy)))
    stack.append(
        Middleware(hardening.BodyLimit, max_bytes=settings.max_body_bytes, api_prefix=PREFIX)
    )
    return stack


def create_app(
    db_url: str,
    tokens: dict[str, str],
    *,
    app_module: str | None = None,
    request_keys_path: str | None = None,
    max_body_bytes: int = hardening.DEFAULT_MAX_BODY_BYTES,
    max_evidence_bytes: int = hardening.DEFAULT_MAX_EVIDENCE_BYTES,
    max_json_depth: int = hardening.DEFAULT_MAX_JSON_DEPTH,
    trust_proxy: str | Sequence[str] | None = None,
    secure_cookies: bool = False,
    secret: str | bytes | None = None,
) -> Starlette:
    """The HTTP API over the ledger at ``db_url``.

    Args:
        db_url: The ledger URL (as ``ef.Runtime`` takes it).
        tokens: Bearer token → tenant.
        app_module: ``module`` or ``module:object`` to import so the application's workflows and
            tools are registered (approve, resume, cancel and compensate drive runs in this
            process); an object that is a ``Registry`` is used as the runtimes' registry.
        request_keys_path: The SQLite file of the Idempotency-Key table (default: beside a SQLite
            ledger; see ``effectflow.api.idempotency``).
        max_body_bytes: Larger request bodies answer 413 before any route reads them.
        max_evidence_bytes: Larger evidence (compact JSON) is refused: 413 ``evidence_too_large``
            from the API, an explained error on the console's form.
        max_json_depth: Deeper JSON (API bodies, the console's evidence) answers 400
            ``json_too_deep``.
        trust_proxy: The reverse proxies (IPs, CIDRs, ``*``; a list or comma-separated) whose
            ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed. Without it the headers are
            ignored, so no client makes itself look like HTTPS.
        secure_cookies: Mark the console's cookies ``Secure`` always (by default: on HTTPS
            requests, as the server or a trusted proxy saw them).
        secret: The key that signs the console's cookies (flash messages, the sign-in form token);
            at least 16 bytes. Random per app by default; give one to share it between processes.

    Raises:
        errors.ArgumentError: no tokens, an empty token or tenant, a limit that is not a
            positive integer, or a secret shorter than 16 bytes.
    """
    if not tokens or any(not t or not tenant for t, tenant in tokens.items()):
        raise errors.ArgumentError("tokens must map each non-empty token to a non-empty tenant")
    settings = hardening.Settings.make(
        max_body_bytes=max_body_bytes,
        max_evidence_bytes=max_evidence_bytes,
        max_json_depth=max_json_depth,
        trust_proxy=trust_proxy,
        secure_cookies=secure_cookies,
        secret=secret,
    )
    registry = load_app_module(app_module) if app_module else None
    runtimes = Runtimes(db_url, registry)
    keys = idempotency.RequestKeys(request_keys_path or idempotency.default_path(db_url))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            runtimes.close()
            keys.close()

    routes: list[BaseRoute] = [Mount(PREFIX, routes=api_routes())]
    console = _console_routes()
    if console is None:
        routes.append(Route("/", _root, methods=["GET"]))
    else:
        routes.append(Mount("/", routes=console))
    app = Starlette(
        routes=routes,
        middleware=_middleware(settings),
        exception_handlers={HTTPException: _not_found},
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tokens = dict(tokens)
    app.state.runtimes = runtimes
    app.state.request_keys = keys
    app.state.openapi = openapi.document()
    return app
