"""What every endpoint of the API shares: the tenant a bearer token names, its runtime, the
query parameters the listings take, and errors rendered as problem documents.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from effectflow import errors
from effectflow.api import hardening, openapi, problems
from effectflow.ledger import records
from effectflow.runtime.runtime import Runtime

log = logging.getLogger("effectflow.api")

Endpoint = Callable[[Request], Awaitable[Response]]


def request_tenant(request: Request) -> str:
    """The tenant the request's bearer token maps to (constant-time lookup).

    Raises:
        problems.Problem: 401, no token, a malformed header or an unknown token.
    """
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


def request_runtime(request: Request) -> Runtime:
    """The runtime of the request's tenant."""
    return request.app.state.runtimes.get(request_tenant(request))  # type: ignore[no-any-return]


def problem_response(request: Request, problem: problems.Problem) -> Response:
    """The problem document, its ``instance`` the request's path."""
    return problem.response(request.url.path)


def endpoint(handler: Endpoint) -> Endpoint:
    """Render any error of ``handler`` as a problem document (never a bare 500 page)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except problems.Problem as problem:
            return problem_response(request, problem)
        except errors.EffectflowError as exc:
            return problem_response(request, problems.from_error(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return problem_response(
                request, problems.Problem(500, "internal_error", "the server failed; see its log")
            )

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


def limit_param(request: Request, default: int = 50) -> int:
    """The ``limit`` query parameter, 1 to ``openapi.MAX_LIMIT``."""
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


def statuses_param(request: Request, allowed: type[records.RunStatus | records.StepStatus]) -> Any:
    """The repeated ``status`` query parameter, each one of ``allowed`` (None: every status)."""
    given = request.query_params.getlist("status")
    valid = {m.value for m in allowed}
    unknown = [s for s in given if s not in valid]
    if unknown:
        raise problems.invalid(f"unknown status {unknown[0]!r}; use one of {sorted(valid)}")
    return given or None


def text_param(request: Request, name: str) -> str | None:
    """A text query parameter; given, it may not be empty."""
    value = request.query_params.get(name)
    if value is not None and not value:
        raise problems.invalid(f"{name} must not be empty; leave it out to list every run")
    return value


def json_response(data: Any, status: int = 200) -> Response:
    """A JSON answer."""
    return JSONResponse(data, status_code=status)
