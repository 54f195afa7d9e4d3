"""The OpenAPI 3.1 document of the API, published at ``GET /api/v1/openapi.json``.

Paths are written out here by hand, one function per group (the service's own, the reads, the
actions), so a reviewer reads the whole surface in one place; the schemas they reference are
:mod:`.schemas`, derived from the ledger's frozen dataclasses where they describe records. A test
checks that every route of the app is in the document.
"""

from __future__ import annotations

import enum
from typing import Any

from effectflow.api import problems, schemas
from effectflow.ledger import records

#: The largest page a listing returns.
MAX_LIMIT = 500

_ref = schemas.ref


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return {"$ref": f"#/components/responses/{description}"}


_RUN_ID: dict[str, Any] = {
    "name": "run_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "The run's id.",
}
_LIMIT: dict[str, Any] = {
    "name": "limit",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 50},
    "description": "Items per page.",
}
_SCOPE: dict[str, Any] = {
    "name": "scope",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "minLength": 1},
    "description": "Only the guarded calls a host made in this scope (e.g. a LangGraph thread).",
}
_CALL_ID: dict[str, Any] = {
    "name": "call_id",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "minLength": 1},
    "description": "Only the guarded call with this call id (e.g. the model's tool-call id).",
}
_CURSOR: dict[str, Any] = {
    "name": "cursor",
    "in": "query",
    "required": False,
    "schema": {"type": "string"},
    "description": "The `next_cursor` of the previous page (opaque).",
}
_IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
    "description": "Names this request: a replay with the same key and body returns the first "
    "answer (with `Idempotent-Replayed: true`); the same key with another request answers 422 "
    "`idempotency_key_reused`. Kept 24 hours.",
}


def _statuses(enum_cls: type[enum.StrEnum]) -> dict[str, Any]:
    return {
        "name": "status",
        "in": "query",
        "required": False,
        "style": "form",
        "explode": True,
        "schema": {
            "type": "array",
            "items": {"type": "string", "enum": [m.value for m in enum_cls]},
        },
        "description": "Only items in these statuses (repeat the parameter for several).",
    }


def _read(summary: str, params: list[dict[str, Any]], ok: dict[str, Any], *errs: str) -> Any:
    responses: dict[str, Any] = {"200": ok, "401": _problem("Unauthorized")}
    for code in errs:
        responses[code] = _problem({"400": "BadRequest", "404": "NotFound"}[code])
    return {
        "get": {
            "summary": summary,
            "operationId": _op(summary),
            "parameters": params,
            "responses": responses,
        }
    }


def _op(summary: str) -> str:
    words = [w for w in summary.lower().replace("'", "").split() if w.isalnum()]
    return "_".join(words[:6])


def _action(
    summary: str,
    description: str,
    path_params: list[dict[str, Any]],
    body: dict[str, Any],
    ok: dict[str, Any],
    *,
    body_required: bool = False,
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": description,
            "operationId": _op(summary),
            "parameters": [*path_params, _IDEMPOTENCY_KEY],
            "requestBody": {
                "required": body_required,
                "content": {"application/json": {"schema": body}},
            },
            "responses": {
                "200": ok,
                "400": _problem("BadRequest"),
                "401": _problem("Unauthorized"),
                "404": _problem("NotFound"),
                "409": _problem("Conflict"),
                "413": _problem("TooLarge"),
                "422": _problem("Unprocessable"),
            },
        }
    }


def _problem_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {problems.MEDIA_TYPE: {"schema": _ref("Problem")}},
    }


def _service_paths() -> dict[str, Any]:
    """The service's own paths, answered without a token."""
    return {
        "/api/v1/health": {
            "get": {
                "summary": "Health",
                "operationId": "health",
                "security": [],
                "responses": {"200": _json(_ref("Health"), "The server is up.")},
            }
        },
        "/api/v1/ready": {
            "get": {
                "summary": "Readiness",
                "description": "The ledger answers within 2 s at the schema version this server "
                "writes (503 `ledger_unavailable` or `schema_mismatch` otherwise). No token.",
                "operationId": "ready",
                "security": [],
                "responses": {
                    "200": _json(_ref("Ready"), "The ledger answers at this server's version."),
                    "503": _problem_response(
                        "The ledger does not answer, or is at another version."
                    ),
                },
            }
        },
        "/api/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "The OpenAPI document.")},
            }
        },
    }


def _read_paths() -> dict[str, Any]:
    """The reads: runs, a run, its timeline, effects, the attention queue."""
    return {
        "/api/v1/runs": _read(
            "List runs",
            [_statuses(records.RunStatus), _SCOPE, _CALL_ID, _LIMIT, _CURSOR],
            _json(_ref("RunPage"), "Runs, newest first."),
            "400",
        ),
        "/api/v1/runs/{run_id}": _read(
            "Get a run", [_RUN_ID], _json(_ref("Run"), "The run."), "404"
        ),
        "/api/v1/runs/{run_id}/timeline": _read(
            "Get a run's timeline",
            [_RUN_ID],
            _json(_ref("Timeline"), "Steps with attempts, effects and compensations; events."),
            "404",
        ),
        "/api/v1/effects": _read(
            "List effects",
            [
                _statuses(records.StepStatus),
                {**_RUN_ID, "in": "query", "required": False, "description": "Of one run only."},
                _LIMIT,
                _CURSOR,
            ],
            _json(_ref("EffectPage"), "External effects, oldest first."),
            "400",
            "404",
        ),
        "/api/v1/attention": _read(
            "List the attention queue",
            [{**_LIMIT, "schema": {**_LIMIT["schema"], "default": MAX_LIMIT}}],
            _json(_ref("AttentionList"), "What waits for a person, oldest first."),
            "400",
        ),
    }


def _action_paths() -> dict[str, Any]:
    """The actions: a person's decisions, each an idempotent POST."""
    step_id = {**_RUN_ID, "name": "step_id", "description": "The step's id in its run."}
    effect_id = {**_RUN_ID, "name": "effect_id", "description": "The effect's id."}
    run_ok = _json(_ref("Run"), "The run after the action.")
    return {
        "/api/v1/effects/{effect_id}/resolve": _action(
            "Resolve an unknown effect",
            "A person settles an effect in doubt: it happened or it did not. Then resume the run.",
            [effect_id],
            _ref("ResolveRequest"),
            _json(_ref("Effect"), "The effect as settled."),
            body_required=True,
        ),
        "/api/v1/runs/{run_id}/steps/{step_id}/approve": _action(
            "Approve a step",
            "Approve a step waiting for approval; the run continues in the server's process.",
            [_RUN_ID, step_id],
            _ref("ApproveRequest"),
            run_ok,
            body_required=True,
        ),
        "/api/v1/runs/{run_id}/steps/{step_id}/reject": _action(
            "Decline a step",
            "Decline a step waiting for approval: it is never called, and the run continues in "
            "the server's process with the step rejected.",
            [_RUN_ID, step_id],
            _ref("RejectRequest"),
            run_ok,
            body_required=True,
        ),
        "/api/v1/runs/{run_id}/cancel": _action(
            "Cancel a run",
            "Cancel a run and answer what it left in the world.",
            [_RUN_ID],
            _ref("CancelRequest"),
            _json(_ref("Inventory"), "What the run left in the world."),
        ),
        "/api/v1/runs/{run_id}/compensate": _action(
            "Compensate a run",
            "The business goal is abandoned: compensate the run's effects per its contracts.",
            [_RUN_ID],
            _ref("CompensateRequest"),
            run_ok,
            body_required=True,
        ),
        "/api/v1/runs/{run_id}/resume": _action(
            "Resume a run",
            "Continue a paused, interrupted or failed run in the server's process.",
            [_RUN_ID],
            _ref("ResumeRequest"),
            run_ok,
        ),
    }


def _responses() -> dict[str, Any]:
    """The problem responses the paths reference, by name."""
    return {
        "BadRequest": _problem_response(
            "A malformed request, parameter or cursor, or JSON nested too deep (`json_too_deep`)."
        ),
        "Unauthorized": _problem_response("No token, or an unknown one."),
        "NotFound": _problem_response("No such run or effect in this tenant."),
        "Conflict": _problem_response(
            "Stale state, an id already used otherwise, or the same key in progress."
        ),
        "TooLarge": _problem_response(
            "The body is larger than the server accepts (`payload_too_large`, nothing of "
            "it was read), or the evidence larger than it stores (`evidence_too_large`)."
        ),
        "Unprocessable": _problem_response(
            "The Idempotency-Key was used for another request, or the runtime refused an argument."
        ),
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    import effectflow

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "effectflow",
            "version": effectflow.__version__,
            "description": "Runs, their timelines and effects, the attention queue, and the "
            "decisions people take on them. Errors are RFC 9457 problem documents with a stable "
            "`code`.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {**_service_paths(), **_read_paths(), **_action_paths()},
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token the server maps to one tenant.",
                }
            },
            "schemas": schemas.components(),
            "responses": _responses(),
        },
    }
