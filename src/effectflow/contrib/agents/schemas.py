"""Tool contracts as the tool schemas models take, and the model's tool calls parsed back.

The schema comes from the tool function's signature; the parameters the runtime injects (the
idempotency key, ``deadline``, ``precondition``, ``tx``) never reach the model, since a model that
could type a key could also reuse one. Each description ends with what the contract says about the
call, in words meant for the model: whether it changes the world, whether a repeat is safe, and that
``check_effect`` answers "did it already happen?" better than trying again.

A model's malformed call (bad JSON, an unknown tool, arguments that do not fit the schema) becomes a
``ToolCallError`` that goes back to the model as a tool message; it never raises into the run.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from effectflow.contracts.tool import EffectClass, Tool

#: The name of the read-only tool that asks the ledger whether an earlier call already happened.
CHECK_EFFECT = "check_effect"

#: What the model is told when a call's outcome is not known (docs/concepts.md#agents-and-models).
UNKNOWN_OUTCOME = (
    "This may or may not have happened; do not repeat it; it is being checked. "
    f"Call {CHECK_EFFECT} with this tool_call_id later to learn the outcome."
)

#: Parameters the runtime passes itself; a model never sees or fills them.
INJECTED_PARAMS = frozenset({"idempotency_key", "deadline", "precondition", "tx"})

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for, with its arguments decoded."""

    #: The model's tool-call id (``call_…`` / ``toolu_…``); unique only within one model message.
    id: str
    #: The tool's name.
    name: str
    #: The decoded arguments.
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """A tool call the runtime refuses before running anything; it goes back to the model."""

    #: The model's tool-call id, so the answer pairs with the call.
    id: str
    #: The tool name the model gave (possibly unknown).
    name: str
    #: What is wrong, phrased for the model.
    message: str

    def as_content(self) -> str:
        """The tool message's text: the call did not run, and why."""
        return json.dumps({"status": "error", "ran": False, "error": self.message}, sort_keys=True)


# -- JSON Schema from type hints --------------------------------------------------------------------


def json_schema(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of one type hint (unknown or missing hints accept anything)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    if isinstance(annotation, type) and annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    pydantic_schema = _pydantic_schema(annotation)
    if pydantic_schema is not None:
        return pydantic_schema
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Union or origin is types.UnionType:
        options = [json_schema(a) for a in args]
        return {"anyOf": options}
    if annotation is list or origin in (list, Sequence, tuple, set, frozenset):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        return {"type": "array", **({"items": json_schema(args[0])} if len(args) == 1 else {})}
    if annotation is dict or origin in (dict, Mapping):
        if len(args) == 2:
            return {"type": "object", "additionalProperties": json_schema(args[1])}
        return {"type": "object"}
    return {}


def _pydantic_schema(annotation: Any) -> dict[str, Any] | None:
    """A pydantic model's own schema, when pydantic is installed (it is optional)."""
    try:
        import pydantic
    except ImportError:
        return None
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        schema: dict[str, Any] = annotation.model_json_schema()
        return schema
    return None


def parameters_schema(tool: Tool[..., Any]) -> dict[str, Any]:
    """The JSON Schema of the arguments a model may pass to ``tool``."""
    try:
        hints = typing.get_type_hints(tool.fn)
    except Exception:  # unresolvable hints (a forward reference): use the raw annotations
        hints = {}
    injected = INJECTED_PARAMS | {tool.contract.idempotency.key_param}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in tool.signature.parameters.items():
        if name in injected or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[name] = json_schema(hints.get(name, param.annotation))
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def effect_note(tool: Tool[..., Any]) -> str:
    """What the contract says about the call, in words meant for the model."""
    contract = tool.contract
    effect = contract.effect
    if effect is EffectClass.PURE:
        return "Effect: pure - changes nothing outside; safe to repeat."
    if effect is EffectClass.READ:
        return "Effect: read - only observes; safe to repeat."
    reversible = "reversible" if contract.reversible else "irreversible"
    idempotent = "idempotent" if contract.idempotency.supported else "not idempotent"
    note = (
        f"Effect: {effect.value}, {reversible}, {idempotent} - do not repeat; "
        f"if unsure whether it happened, call {CHECK_EFFECT}."
    )
    if contract.needs_approval:
        note += " Each call waits for a person's approval."
    return note


def description(tool: Tool[..., Any]) -> str:
    """The tool's docstring, then its effect note."""
    doc = inspect.cleandoc(tool.fn.__doc__ or "").strip()
    return f"{doc}\n\n{effect_note(tool)}" if doc else effect_note(tool)


def check_effect_schema() -> dict[str, Any]:
    """The neutral schema (name, description, parameters) of the read-only ``check_effect``."""
    return {
        "name": CHECK_EFFECT,
        "description": (
            "Ask whether an earlier tool call of this conversation already happened, instead of "
            "trying it again. Pass the tool_call_id of that call.\n\n"
            "Effect: read - only observes; safe to repeat."
        ),
        "parameters": {
            "type": "object",
            "properties": {"tool_call_id": {"type": "string"}},
            "required": ["tool_call_id"],
            "additionalProperties": False,
        },
    }


def _neutral(tools: Sequence[Tool[..., Any]], check_effect: bool) -> list[dict[str, Any]]:
    found = [
        {"name": t.name, "description": description(t), "parameters": parameters_schema(t)}
        for t in tools
    ]
    return [*found, check_effect_schema()] if check_effect else found


def openai_tools(
    tools: Sequence[Tool[..., Any]], *, check_effect: bool = True
) -> list[dict[str, Any]]:
    """Chat Completions function-calling schemas (``{"type": "function", "function": {...}}``)."""
    return [{"type": "function", "function": n} for n in _neutral(tools, check_effect)]


def anthropic_tools(
    tools: Sequence[Tool[..., Any]], *, check_effect: bool = True
) -> list[dict[str, Any]]:
    """Anthropic Messages tool schemas (``{"name", "description", "input_schema"}``)."""
    return [
        {"name": n["name"], "description": n["description"], "input_schema": n["parameters"]}
        for n in _neutral(tools, check_effect)
    ]


# -- parsing the model's calls ----------------------------------------------------------------------


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a dict or of an SDK object (duck-typed: no SDK is imported)."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _check(
    call_id: str, name: str, arguments: Any, known: Mapping[str, dict[str, Any]] | None
) -> ToolCall | ToolCallError:
    if not isinstance(arguments, dict):
        return ToolCallError(call_id, name, "the arguments must be a JSON object")
    if known is None:
        return ToolCall(call_id, name, arguments)
    schema = known.get(name)
    if schema is None:
        return ToolCallError(
            call_id, name, f"there is no tool named {name!r}; the tools are {sorted(known)}"
        )
    problems = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(arguments), key=lambda e: list(e.path)
    )
    if problems:
        said = "; ".join(
            f"{'/'.join(str(p) for p in e.path) or 'arguments'}: {e.message}" for e in problems
        )
        return ToolCallError(call_id, name, f"the arguments do not fit the schema: {said}")
    return ToolCall(call_id, name, arguments)


def _known(tools: Sequence[Tool[..., Any]] | None) -> dict[str, dict[str, Any]] | None:
    if tools is None:
        return None
    return {n["name"]: n["parameters"] for n in _neutral(tools, check_effect=True)}


def parse_openai_tool_calls(
    message: Any, tools: Sequence[Tool[..., Any]] | None = None
) -> list[ToolCall | ToolCallError]:
    """The tool calls of a Chat Completions assistant message (a dict or an SDK object).

    With ``tools``, unknown names and arguments that do not fit the schema become errors too
    (``check_effect`` is always known).
    """
    found: list[ToolCall | ToolCallError] = []
    for raw in _field(message, "tool_calls") or ():
        call_id = str(_field(raw, "id", ""))
        function = _field(raw, "function", {})
        name = str(_field(function, "name", ""))
        text = _field(function, "arguments", "")
        if isinstance(text, str):
            try:
                arguments = json.loads(text) if text.strip() else {}
            except json.JSONDecodeError as exc:
                found.append(
                    ToolCallError(call_id, name, f"the arguments are not valid JSON: {exc}")
                )
                continue
        else:
            arguments = text
        found.append(_check(call_id, name, arguments, _known(tools)))
    return found


def parse_anthropic_tool_uses(
    message: Any, tools: Sequence[Tool[..., Any]] | None = None
) -> list[ToolCall | ToolCallError]:
    """The ``tool_use`` blocks of an Anthropic assistant message (a dict or an SDK object)."""
    found: list[ToolCall | ToolCallError] = []
    content = _field(message, "content") or ()
    if isinstance(content, str):
        return found
    for block in content:
        if _field(block, "type") != "tool_use":
            continue
        call_id = str(_field(block, "id", ""))
        name = str(_field(block, "name", ""))
        found.append(_check(call_id, name, _field(block, "input", {}), _known(tools)))
    return found
