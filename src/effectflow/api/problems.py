"""Errors as RFC 9457 problem documents (``application/problem+json``).

Every error the API answers carries ``type``, ``title``, ``status``, ``detail``, ``instance`` and the
stable ``code`` of the error (the same codes as ``EffectflowError.code``), plus the ids the error
names (``run_id``, ``effect_id``...), so clients branch on ``code`` and never parse ``detail``.

Status codes, chosen once here:

=====================  ======  ==========================================================
code                   status  when
=====================  ======  ==========================================================
unauthorized           401     no bearer token, or one the server does not know
invalid_request        400     a malformed body, query parameter or cursor
json_too_deep          400     a JSON body (or its evidence) nests deeper than the server allows
idempotency_key_missing 400    an action without an ``Idempotency-Key`` header
run_not_found          404     no such run *in this tenant* (another tenant's run looks missing)
effect_not_found       404     no such effect in this tenant
not_found              404     no such route
method_not_allowed     405
stale_state            409     the effect or step moved on: reload and decide again
idempotency_conflict   409     a decision / approval id was already used with other parameters
                               (the ledger's own idempotency: a conflict with its state)
lease_lost             409     a worker holds the run
request_in_progress    409     the same ``Idempotency-Key`` is being processed right now
payload_too_large      413     the request body is larger than the server accepts (answered
                               before any route runs: nothing of it is read or stored)
evidence_too_large     413     a resolve's evidence is larger than the server stores
idempotency_key_reused 422     the same ``Idempotency-Key`` was sent with another request
bad_argument           422     the runtime refused an argument (``ArgumentError``)
contract_error         422     the run's workflow or tools are not known to this server
internal_error         500
=====================  ======  ==========================================================
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from effectflow import errors

MEDIA_TYPE = "application/problem+json"

#: The ``type`` URI of a problem is this prefix and its code: stable, and not a page to fetch.
TYPE_PREFIX = "urn:effectflow:problem:"

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

#: How each runtime error maps to an HTTP status; the most specific class wins (MRO order).
_STATUS_OF: dict[type[errors.EffectflowError], int] = {
    errors.RunNotFound: 404,
    errors.EffectNotFound: 404,
    errors.StaleState: 409,
    errors.IdempotencyConflict: 409,
    errors.LeaseLost: 409,
    errors.ArgumentError: 422,
    errors.ContractError: 422,
}


class Problem(Exception):
    """An error answer the API raises from anywhere in a request and renders in one place."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        #: The HTTP status.
        self.status = status
        #: The stable error code.
        self.code = code
        #: What went wrong, for a person.
        self.detail = detail
        #: Extra response headers (``WWW-Authenticate``).
        self.headers = headers or {}
        #: Extra members of the document (ids, the validation errors).
        self.extra = extra

    def response(self, instance: str) -> Response:
        """The ``application/problem+json`` response; ``instance`` is the request's path."""
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.code,
            "title": _TITLES.get(self.status, "Error"),
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            "code": self.code,
            **self.extra,
        }
        return Response(
            json.dumps(body, ensure_ascii=False),
            status_code=self.status,
            media_type=MEDIA_TYPE,
            headers=self.headers,
        )


def from_error(exc: errors.EffectflowError) -> Problem:
    """The problem for a runtime error: its status by class, its code and ids as the error has
    them."""
    status = next((_STATUS_OF[c] for c in type(exc).__mro__ if c in _STATUS_OF), 500)
    data = exc.to_dict()
    data.pop("code", None)
    data.pop("message", None)
    return Problem(status, exc.code, exc.message, **data)


def unauthorized(detail: str) -> Problem:
    """A 401 that tells the client which scheme to use."""
    return Problem(
        401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="effectflow"'}
    )


def invalid(detail: str, **extra: Any) -> Problem:
    """A 400 for a request the API cannot read."""
    return Problem(400, "invalid_request", detail, **extra)
