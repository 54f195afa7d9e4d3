"""What an HTTP answer, or its absence, tells the runtime: the mapping table of
:mod:`effectflow.contrib.http.tools`, written once as data and two functions.

The table and the decisions behind each row are in that module's docstring; this module is the
code a test walks row by row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import httpx

from effectflow import errors

#: Statuses that prove the provider refused the request before processing it.
DEFAULT_NOT_COMMITTED_STATUSES: frozenset[int] = frozenset({429, 503})

#: Words in a 409's code or title meaning "the first request with this key is still running".
_IN_PROGRESS_MARKERS = ("in_progress", "in progress", "in_use", "outstanding", "concurrent")

#: Words in a 4xx's code or title meaning "this key was used with another payload".
_REUSED_MARKERS = (
    "reused",
    "already used",
    "idempotency_error",
    "key_mismatch",
    "different payload",
    "conflicting payload",
)

#: Transport errors raised before any byte of the request left this process.
_NOTHING_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)


class HttpIdempotencyConflict(errors.IdempotencyConflict):
    """The provider refused a key already used with another payload; the answer is the evidence."""

    def __init__(self, message: str, *, idempotency_key: str, evidence: dict[str, Any]) -> None:
        super().__init__(message, idempotency_key=idempotency_key)
        #: The HTTP status and the provider's error code and title, recorded on the attempt.
        self.evidence = evidence


def signal_for_transport_error(exc: Exception, *, method: str, url: str) -> errors.ToolSignal:
    """The signal for a request that got no HTTP answer (the table in :mod:`.tools`)."""
    evidence = {"error": type(exc).__name__, "detail": str(exc), "method": method, "url": url}
    if isinstance(exc, _NOTHING_SENT):
        return errors.NotCommitted(f"{method} {url}: nothing sent ({exc})", evidence=evidence)
    return errors.OutcomeUnknown(
        f"{method} {url}: sent, but no answer ({type(exc).__name__}: {exc}); outcome unknown",
        evidence=evidence,
    )


def signal_for_response(
    response: httpx.Response,
    *,
    idempotency_key: str | None = None,
    not_committed_statuses: Collection[int] = DEFAULT_NOT_COMMITTED_STATUSES,
    where: str | None = None,
) -> errors.ToolSignal | errors.IdempotencyConflict | None:
    """The signal for an HTTP answer, or None for a 2xx (the table in :mod:`.tools`).

    Args:
        response: The answer, its body read.
        idempotency_key: The key sent as ``Idempotency-Key``, if any: only then can a 409 mean
            "in progress" or a 4xx mean "key reused".
        not_committed_statuses: Statuses that prove nothing was processed.
        where: The request as the message quotes it (the step records the message); by default
            its method and URL without the query string. ``http_tool`` passes its URL template,
            so no argument value is quoted.
    """
    status = response.status_code
    if 200 <= status < 300:
        return None
    evidence = response_evidence(response)
    if where is None:
        where = f"{response.request.method} {response.request.url.copy_with(query=None)}"
    words = " ".join(str(evidence.get(k, "")) for k in ("code", "title", "type")).lower()
    if idempotency_key is not None and status == 409 and _has(words, _IN_PROGRESS_MARKERS):
        return errors.NotCommitted(
            f"{where}: 409, the first request with this key is still in progress; retry later",
            evidence=evidence,
        )
    if status == 412:
        return errors.Conflict(f"{where}: 412, the precondition failed", evidence=evidence)
    if idempotency_key is not None and 400 <= status < 500 and _has(words, _REUSED_MARKERS):
        return HttpIdempotencyConflict(
            f"{where}: {status}, the key was already used with another payload",
            idempotency_key=idempotency_key,
            evidence=evidence,
        )
    if status in not_committed_statuses:
        return errors.NotCommitted(f"{where}: {status}, refused unprocessed", evidence=evidence)
    if 400 <= status < 500:
        return errors.Rejected(f"{where}: {status} {evidence.get('code', '')}", evidence=evidence)
    return errors.OutcomeUnknown(
        f"{where}: {status} after sending; outcome unknown", evidence=evidence
    )


def _has(words: str, markers: Sequence[str]) -> bool:
    return any(marker in words for marker in markers)


def response_evidence(response: httpx.Response) -> dict[str, Any]:
    """The status plus the provider's code, title and message, whatever error shape it uses."""
    evidence: dict[str, Any] = {"status": response.status_code}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict):  # Stripe's {"error": {"type", "code", "message"}}
            body = {**nested, "type": nested.get("type")}
        elif isinstance(nested, str) and "code" not in body:
            body = {**body, "code": nested}
        for field in ("code", "title", "type"):
            if isinstance(body.get(field), str):
                evidence[field] = body[field]
        message = body.get("message", body.get("detail"))
        if isinstance(message, str):
            evidence["message"] = message[:500]
    elif response.text:
        evidence["message"] = response.text[:500]
    retry_after = response.headers.get("retry-after")
    if retry_after is not None:
        evidence["retry_after"] = retry_after
    return evidence
