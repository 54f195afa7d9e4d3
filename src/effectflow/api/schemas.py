"""The schemas of the OpenAPI document's ``components``: the records derived from the ledger's
frozen dataclasses (so they cannot drift from what ``to_dict()`` returns), the action bodies the
API validates requests against, and the problem document.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from effectflow.ledger import records
from effectflow.runtime import views

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field's type hint (the subset the records use)."""
    if hint is Any:
        return {}
    if hint in _PRIMITIVES:
        return dict(_PRIMITIVES[hint])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [m.value for m in hint]}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return {"$ref": f"#/components/schemas/{_name(hint)}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        inner = _type_schema(options[0]) if len(options) == 1 else {}
        if type(None) not in args:
            return inner
        if "type" in inner and isinstance(inner["type"], str):
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin in (list, tuple):
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object"}
    raise TypeError(f"no JSON Schema for {hint!r}")


_NAMES = {
    records.RunRecord: "Run",
    records.StepRecord: "Step",
    records.AttemptRecord: "Attempt",
    records.EffectRecord: "Effect",
    records.AuditEvent: "AuditEvent",
    records.Inventory: "Inventory",
    views.StepView: "StepView",
    views.Timeline: "Timeline",
    views.AttentionItem: "AttentionItem",
}


def _name(cls: type[Any]) -> str:
    return _NAMES[cls]


def record_schema(cls: type[Any]) -> dict[str, Any]:
    """The schema of a record's ``to_dict()``: every field, all required."""
    hints = typing.get_type_hints(cls)
    props = {f.name: _type_schema(hints[f.name]) for f in dataclasses.fields(cls)}
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "description": (cls.__doc__ or "").strip().splitlines()[0],
    }


def run_schema() -> dict[str, Any]:
    """A run as the API answers it (``views.RunView.to_dict``): the record's fields, and whether
    the run is interrupted (derived, never stored)."""
    schema = record_schema(records.RunRecord)
    schema["properties"] = {
        **schema["properties"],
        "interrupted": {
            "type": "boolean",
            "description": "The run is running but nobody executes it: its owner died (a dead "
            "pid on the server's host) or its lease expired. `effectflow recover` (or a worker, "
            "or resuming it) continues it.",
        },
        "interruption": {
            "type": ["string", "null"],
            "description": "Why it is interrupted, for people; null when it is not.",
        },
    }
    schema["required"] = [*schema["required"], "interrupted", "interruption"]
    return schema


def ref(name: str) -> dict[str, Any]:
    """A reference to one of these schemas."""
    return {"$ref": f"#/components/schemas/{name}"}


def _body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_PERSON = {"type": "string", "minLength": 1, "maxLength": 200}
_TEXT = {"type": "string", "maxLength": 2000}

RESOLVE_BODY = _body(
    {
        "committed": {"type": "boolean", "description": "Whether the effect happened."},
        "evidence": {"type": "object", "description": "What proves it (a provider record)."},
        "by": _PERSON,
        "expected_version": {
            "type": "integer",
            "description": "The effect version the decision was made on; a stale one answers "
            "409 `stale_state` and changes nothing.",
        },
        "decision_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "Pins the decision in the ledger; derived from the Idempotency-Key "
            "when omitted.",
        },
    },
    ["committed", "evidence", "by", "expected_version"],
)
APPROVE_BODY = _body(
    {
        "approver": _PERSON,
        "approval_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "The approval's own id (a ticket); derived from the Idempotency-Key "
            "when omitted.",
        },
        "note": _TEXT,
    },
    ["approver"],
)
REJECT_BODY = _body(
    {"by": _PERSON, "reason": {**_TEXT, "minLength": 1, "description": "Why it is declined."}},
    ["by", "reason"],
)
CANCEL_BODY = _body({"reason": _TEXT, "by": _PERSON}, [])
COMPENSATE_BODY = _body(
    {"reason": {**_TEXT, "minLength": 1, "description": "The business condition."}, "by": _PERSON},
    ["reason"],
)
RESUME_BODY = _body({"by": _PERSON}, [])

PROBLEM_SCHEMA = {
    "type": "object",
    "description": "An RFC 9457 problem document.",
    "properties": {
        "type": {"type": "string", "format": "uri-reference"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "code": {"type": "string", "description": "The stable error code."},
        "run_id": {"type": "string"},
        "step_id": {"type": "string"},
        "effect_id": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "string"}},
        "max_bytes": {"type": "integer", "description": "The size limit that was exceeded."},
        "max_depth": {"type": "integer", "description": "The nesting limit that was exceeded."},
    },
    "required": ["type", "title", "status", "detail", "instance", "code"],
}


def page(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": ref(item)},
            "next_cursor": {"type": ["string", "null"]},
        },
        "required": ["items", "next_cursor"],
    }


def components() -> dict[str, Any]:
    """Every schema of the document, by name (the records first, in the order they are named)."""
    schemas: dict[str, Any] = {name: record_schema(cls) for cls, name in _NAMES.items()}
    schemas["Run"] = run_schema()
    schemas.update(
        Problem=PROBLEM_SCHEMA,
        RunPage=page("Run"),
        EffectPage=page("Effect"),
        AttentionList={
            "type": "object",
            "properties": {"items": {"type": "array", "items": ref("AttentionItem")}},
            "required": ["items"],
        },
        Health={
            "type": "object",
            "properties": {"status": {"const": "ok"}, "version": {"type": "string"}},
            "required": ["status", "version"],
        },
        Ready={
            "type": "object",
            "properties": {"status": {"const": "ok"}, "schema_version": {"type": "integer"}},
            "required": ["status", "schema_version"],
        },
        ResolveRequest=RESOLVE_BODY,
        ApproveRequest=APPROVE_BODY,
        RejectRequest=REJECT_BODY,
        CancelRequest=CANCEL_BODY,
        CompensateRequest=COMPENSATE_BODY,
        ResumeRequest=RESUME_BODY,
    )
    return schemas
