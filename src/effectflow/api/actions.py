"""The API's actions: idempotent POSTs (an Idempotency-Key per request, replayed or claimed),
each a thin call of one runtime method on the validated body.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

import jsonschema
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from effectflow import errors
from effectflow.api import endpoints, hardening, idempotency, problems
from effectflow.ledger import records
from effectflow.runtime.runtime import Runtime

log = logging.getLogger("effectflow.api")

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


def action(schema: dict[str, Any], act: Action) -> endpoints.Endpoint:
    """An idempotent POST: auth, the Idempotency-Key, replay or claim, run ``act``, keep the
    answer."""

    async def handle(request: Request) -> Response:
        tenant = endpoints.request_tenant(request)
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
    return endpoints.endpoint(handle)


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
        return endpoints.json_response(result.to_dict())
    except problems.Problem as problem:
        return endpoints.problem_response(request, problem)
    except errors.EffectflowError as exc:
        return endpoints.problem_response(request, problems.from_error(exc))
    except Exception:
        log.exception("%s %s failed", request.method, request.url.path)
        return endpoints.problem_response(
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


def resolve(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.resolve(
        path["effect_id"],
        committed=body["committed"],
        evidence=body["evidence"],
        by=body["by"],
        expected_version=body["expected_version"],
        decision_id=body.get("decision_id") or derived,
    )


def approve(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.approve(
        path["run_id"],
        path["step_id"],
        approver=body["approver"],
        approval_id=body.get("approval_id") or derived,
        note=body.get("note"),
    )


def reject(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.reject(path["run_id"], path["step_id"], by=body["by"], reason=body["reason"])


def cancel(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.cancel(path["run_id"], reason=body.get("reason"), by=body.get("by") or "api")


def compensate(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.compensate(path["run_id"], reason=body["reason"], by=body.get("by") or "api")


def resume(rt: Runtime, path: dict[str, str], body: dict[str, Any], derived: str) -> Any:
    return rt.resume(path["run_id"], by=body.get("by") or "api")
