"""``create_app``: the Starlette application over the runtime's public methods.

One ``ef.Runtime`` per tenant, made on first use and closed on shutdown. Each bearer token maps to
one tenant, and every read and action goes through that tenant's runtime, so another tenant's run or
effect is simply not found: the answer is the same 404 as for an id that never existed.

Every response carries the security headers of ``effectflow.api.hardening``; bodies over the limit
are refused before any route runs, nesting and evidence size are capped, and tokens are compared in
constant time. ``create_app``'s keyword arguments configure each of these.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import jsonschema
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from effectflow import errors
from effectflow.api import hardening, idempotency, openapi, pagination, problems
from effectflow.contracts import registry as registry_module
from effectflow.ledger import records
from effectflow.runtime.runtime import Runtime

log = logging.getLogger("effectflow.api")

PREFIX = "/api/v1"

Endpoint = Callable[[Request], Awaitable[Response]]


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


# -- plumbing -----------------------------------------------------------------------------------


def _tenant(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise problems.unauthorized("send Authorization: Bearer <token>")
    if scheme.lower() != "bearer" or not token.strip():
        raise problems.unauthorized("the Authorization header must be: Bearer <token>")
    tenant = hardening.tenant_of(request.app.state.tokens, token.strip())
    if tenant is None:
        raise problems.unauthorized("unknown token")
    return str(tenant)


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtimes.get(_tenant(request))  # type: ignore[no-any-return]


def _problem_response(request: Request, problem: problems.Problem) -> Response:
    return problem.response(request.url.path)


def endpoint(handler: Endpoint) -> Endpoint:
    """Render any error of ``handler`` as a problem document (never a bare 500 page)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except problems.Problem as problem:
            return _problem_response(request, problem)
        except errors.EffectflowError as exc:
            return _problem_response(request, problems.from_error(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return _problem_response(
                request, problems.Problem(500, "internal_error", "the server failed; see its log")
            )

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


def _limit(request: Request, default: int = 50) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise problems.invalid(f"limit must be an integer, not {text!r}") from None
    if not 1 <= value <= openapi.MAX_LIMIT:
        raise problems.invalid(f"limit must be between 1 and {openapi.MAX_LIMIT}")
    return value


def _statuses(request: Request, allowed: type[records.RunStatus | records.StepStatus]) -> Any:
    given = request.query_params.getlist("status")
    valid = {m.value for m in allowed}
    unknown = [s for s in given if s not in valid]
    if unknown:
        raise problems.invalid(f"unknown status {unknown[0]!r}; use one of {sorted(valid)}")
    return given or None


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    if value is not None and not value:
        raise problems.invalid(f"{name} must not be empty; leave it out to list every run")
    return value


def _json(data: Any, status: int = 200) -> Response:
    return JSONResponse(data, status_code=status)


# -- reads --------------------------------------------------------------------------------------


@endpoint
async def health(request: Request) -> Response:
    """Liveness: no auth, no ledger access."""
    import effectflow

    return _json({"status": "ok", "version": effectflow.__version__})


@endpoint
async def openapi_document(request: Request) -> Response:
    """The OpenAPI document."""
    return _json(request.app.state.openapi)


@endpoint
async def list_runs(request: Request) -> Response:
    """A page of runs, newest first."""
    rt = _runtime(request)
    statuses = _statuses(request, records.RunStatus)
    limit = _limit(request)
    cursor = request.query_params.get("cursor")
    host = {name: _text(request, name) for name in ("scope", "call_id")}

    def read() -> tuple[list[dict[str, Any]], str | None]:
        page, after = pagination.runs_page(rt.store, rt.tenant, statuses, limit, cursor, **host)
        return [rt.run_view(r).to_dict() for r in page], after

    items, after = await run_in_threadpool(read)
    return _json({"items": items, "next_cursor": after})


@endpoint
async def get_run(request: Request) -> Response:
    """One run."""
    rt = _runtime(request)
    view = await run_in_threadpool(lambda: rt.run_view(rt.run(request.path_params["run_id"])))
    return _json(view.to_dict())


@endpoint
async def get_timeline(request: Request) -> Response:
    """A run's timeline."""
    rt = _runtime(request)

    def read() -> dict[str, Any]:
        timeline = rt.timeline(request.path_params["run_id"])
        return {**timeline.to_dict(), "run": rt.run_view(timeline.run).to_dict()}

    return _json(await run_in_threadpool(read))


@endpoint
async def list_effects(request: Request) -> Response:
    """A page of effects, oldest first."""
    rt = _runtime(request)
    statuses = _statuses(request, records.StepStatus)
    limit = _limit(request)
    run_id = request.query_params.get("run_id")
    cursor = request.query_params.get("cursor")

    def read() -> tuple[list[records.EffectRecord], str | None]:
        if run_id is not None:
            rt.run(run_id)  # another tenant's run is not found
        return pagination.effects_page(rt.store, rt.tenant, run_id, statuses, limit, cursor)

    page, after = await run_in_threadpool(read)
    return _json({"items": [e.to_dict() for e in page], "next_cursor": after})


@endpoint
async def list_attention(request: Request) -> Response:
    """The attention queue."""
    rt = _runtime(request)
    limit = _limit(request, default=openapi.MAX_LIMIT)
    items = await run_in_threadpool(lambda: rt.attention(limit=limit))
    return _json({"items": [i.to_dict() for i in items]})


# -- actions ------------------------------------------------------------------------------------

#: An action: the tenant's runtime, the path parameters, the validated body, a per-key id.
Action = Callable[[Runtime, dict[str, str], dict[str, Any], str], Any]


def _derived_id(tenant: str, key: str) -> str:
    """A ledger id (decision, approval) pinned to this tenant's Idempotency-Key."""
    return "api-" + hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:32]


def too_deep(limit: int) -> problems.Problem:
    """The 400 for JSON nested deeper than ``limit`` (rather than a ``RecursionError``'s 500)."""
    return problems.Problem(
        400, "json_too_deep", f"the JSON nests deeper than {limit} levels", max_depth=limit
    )


async def _body(request: Request, schema: dict[str, Any]) -> dict[str, Any]:
    raw = await request.body()
    settings = hardening.settings_of(request)
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = hardening.loads_limited(raw, settings.max_json_depth)
        except hardening.JSONTooDeep:
            raise too_deep(settings.max_json_depth) from None
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            raise problems.invalid("the body is not JSON") from None
    problems_found = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path)
    )
    if problems_found:
        found = [
            f"{'/'.join(str(p) for p in e.absolute_path) or 'body'}: {e.message}"
            for e in problems_found
        ]
        raise problems.invalid("the body does not match the request schema", errors=found)
    assert isinstance(data, dict)
    return data


def _fingerprint(request: Request, raw: bytes) -> str:
    try:
        body = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")) if raw else ""
    except (ValueError, RecursionError):  # not JSON, or too deep to re-encode: the bytes are
        body = raw.hex()
    text = f"{request.method} {request.url.path}\n{body}"
    return hashlib.sha256(text.encode()).hexdigest()


def action(schema: dict[str, Any], act: Action) -> Endpoint:
    """An idempotent POST: auth, the Idempotency-Key, replay or claim, run ``act``, keep the
    answer."""

    async def handle(request: Request) -> Response:
        tenant = _tenant(request)
        key = request.headers.get("idempotency-key")
        if not key:
            raise problems.Problem(
                400, "idempotency_key_missing", "actions need an Idempotency-Key header"
            )
        if len(key) > 255:
            raise problems.invalid("the Idempotency-Key is longer than 255 characters")
        keys: idempotency.RequestKeys = request.app.state.request_keys
        fingerprint = _fingerprint(request, await request.body())
        claim = await run_in_threadpool(keys.begin, tenant, key, fingerprint)
        if claim.mismatch:
            raise problems.Problem(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used for another request; use a new key",
            )
        if claim.in_progress:
            raise problems.Problem(
                409, "request_in_progress", "a request with this Idempotency-Key is in progress"
            )
        if claim.stored is not None:
            return Response(
                claim.stored.body,
                status_code=claim.stored.status,
                media_type=claim.stored.media_type,
                headers={"Idempotent-Replayed": "true"},
            )
        response = await _run_action(request, tenant, key, schema, act)
        if response.status_code >= 500:
            await run_in_threadpool(keys.release, tenant, key)
        else:
            stored = idempotency.Stored(
                response.status_code,
                response.media_type or "application/json",
                bytes(response.body),
            )
            await run_in_threadpool(keys.finish, tenant, key, stored)
        return response

    handle.__name__ = getattr(act, "__name__", "action")
    return endpoint(handle)


async def _run_action(
    request: Request, tenant: str, key: str, schema: dict[str, Any], act: Action
) -> Response:
    try:
        body = await _body(request, schema)
        if "evidence" in body:
            _check_evidence(request, body["evidence"])
        rt = request.app.state.runtimes.get(tenant)
        params = dict(request.path_params)
        result = await run_in_threadpool(act, rt, params, body, _derived_id(tenant, key))
        if isinstance(result, records.RunRecord):  # a run answers as every read shows one
            result = rt.run_view(result)
        return _json(result.to_dict())
    except problems.Problem as problem:
        return _problem_response(request, problem)
    except errors.EffectflowError as exc:
        return _problem_response(request, problems.from_error(exc))
    except Exception:
        log.exception("%s %s failed", request.method, request.url.path)
        return _problem_response(
            request, problems.Problem(500, "internal_error", "the server failed; see its log")
        )


def _check_evidence(request: Request, evidence: Any) -> None:
    """Refuse evidence over the stored-size cap: it would be kept in the effect and its audit event
    forever, and copied into every read of the run's timeline."""
    limit = hardening.settings_of(request).max_evidence_bytes
    size = hardening.json_size(evidence)
    if size > limit:
        raise problems.Problem(
            413,
            "evidence_too_large",
            f"the evidence is {size} bytes as JSON; this server stores at most {limit}",
            max_bytes=limit,
        )


def _resolve(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.resolve(
        path["effect_id"],
        committed=body["committed"],
        evidence=body["evidence"],
        by=body["by"],
        expected_version=body["expected_version"],
        decision_id=body.get("decision_id") or derived,
    )


def _approve(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.approve(
        path["run_id"],
        path["step_id"],
        approver=body["approver"],
        approval_id=body.get("approval_id") or derived,
        note=body.get("note"),
    )


def _reject(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.reject(path["run_id"], path["step_id"], by=body["by"], reason=body["reason"])


def _cancel(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.cancel(path["run_id"], reason=body.get("reason"), by=body.get("by") or "api")


def _compensate(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.compensate(path["run_id"], reason=body["reason"], by=body.get("by") or "api")


def _resume(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.resume(path["run_id"], by=body.get("by") or "api")


# -- the app ------------------------------------------------------------------------------------


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
        Route("/health", health, methods=["GET"]),
        Route("/openapi.json", openapi_document, methods=["GET"]),
        Route("/runs", list_runs, methods=["GET"]),
        Route("/runs/{run_id}", get_run, methods=["GET"]),
        Route("/runs/{run_id}/timeline", get_timeline, methods=["GET"]),
        Route("/effects", list_effects, methods=["GET"]),
        Route("/attention", list_attention, methods=["GET"]),
        Route(
            "/effects/{effect_id}/resolve",
            action(schema("ResolveRequest"), _resolve),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/steps/{step_id}/approve",
            action(schema("ApproveRequest"), _approve),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/steps/{step_id}/reject",
            action(schema("RejectRequest"), _reject),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/cancel",
            action(schema("CancelRequest"), _cancel),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/compensate",
            action(schema("CompensateRequest"), _compensate),
            methods=["POST"],
        ),
        Route(
            "/runs/{run_id}/resume",
            action(schema("ResumeRequest"), _resume),
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
