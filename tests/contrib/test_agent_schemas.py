"""Tool contracts as OpenAI and Anthropic tool schemas, and the models' tool calls parsed back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

import effectflow as ef
from effectflow.contrib import agents
from effectflow.contrib.agents import schemas

from . import agent_app

GOLDEN = Path(__file__).with_name("golden")


@ef.tool("agent_schema_example", effect="pure")
def example(
    text: str,
    ratio: float,
    strict: bool,
    tags: list[str],
    extra: dict[str, int],
    mode: Literal["fast", "slow"] = "fast",
    note: str | None = None,
    untyped=None,  # a hint-less parameter accepts anything
) -> str:
    """Every kind of hint the schema maps."""
    return text


TOOLS = [*agent_app.TOOLS, example]


def _golden(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text())


def test_openai_schemas_match_golden() -> None:
    """The Chat Completions function schemas equal the checked-in ones."""
    assert agents.openai_tools(TOOLS) == _golden("openai_tools.json")


def test_anthropic_schemas_match_golden() -> None:
    """The Anthropic tool schemas equal the checked-in ones."""
    assert agents.anthropic_tools(TOOLS) == _golden("anthropic_tools.json")


def test_injected_parameters_never_reach_the_model() -> None:
    """The idempotency key the runtime passes is not in any schema."""
    for entry in agents.anthropic_tools(TOOLS):
        assert "idempotency_key" not in entry["input_schema"]["properties"]


def test_descriptions_state_the_effect() -> None:
    """An irreversible write tells the model not to repeat it and to use check_effect."""
    email = next(t for t in agents.anthropic_tools(TOOLS) if t["name"] == "agent_email_customer")
    assert email["description"] == (
        "Email the customer.\n\nEffect: external_write, irreversible, idempotent - do not repeat; "
        "if unsure whether it happened, call check_effect."
    )
    assert agents.anthropic_tools([])[-1]["name"] == agents.CHECK_EFFECT


def _openai_message(name: str, arguments: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def test_openai_call_parsed() -> None:
    """A well-formed call is decoded into a ToolCall."""
    message = _openai_message("agent_lookup_order", '{"order_id": "A-17"}')
    assert agents.parse_openai_tool_calls(message, TOOLS) == [
        agents.ToolCall("call_9", "agent_lookup_order", {"order_id": "A-17"})
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "said"),
    [
        ("agent_lookup_order", '{"order_id": "A-17"', "not valid JSON"),
        ("agent_lookup_order", '["A-17"]', "must be a JSON object"),
        ("agent_lookup_order", "{}", "'order_id' is a required property"),
        ("agent_lookup_order", '{"order_id": 17}', "order_id: 17 is not of type 'string'"),
        ("agent_lookup_order", '{"order_id": "A", "x": 1}', "Additional properties"),
        ("agent_delete_everything", "{}", "there is no tool named 'agent_delete_everything'"),
    ],
    ids=["malformed-json", "not-an-object", "missing", "wrong-type", "extra", "unknown-tool"],
)
def test_bad_openai_calls_become_tool_errors(name: str, arguments: str, said: str) -> None:
    """Malformed arguments or an unknown tool become a ToolCallError for the model, not a raise."""
    [error] = agents.parse_openai_tool_calls(_openai_message(name, arguments), TOOLS)
    assert isinstance(error, agents.ToolCallError)
    assert (error.id, error.name) == ("call_9", name)
    assert said in error.message
    content = json.loads(error.as_content())
    assert content["status"] == "error"
    assert content["ran"] is False


def test_anthropic_tool_uses_parsed() -> None:
    """tool_use blocks become ToolCalls, a bad one a ToolCallError; text blocks are skipped."""
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "agent_lookup_order",
                "input": {"order_id": "A"},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "nope", "input": {}},
        ],
    }
    first, second = agents.parse_anthropic_tool_uses(message, TOOLS)
    assert first == agents.ToolCall("toolu_1", "agent_lookup_order", {"order_id": "A"})
    assert isinstance(second, agents.ToolCallError)
    assert "no tool named 'nope'" in second.message


def test_check_effect_is_always_known() -> None:
    """The model may call check_effect whatever tools it was given."""
    message = _openai_message(agents.CHECK_EFFECT, '{"tool_call_id": "call_1"}')
    assert agents.parse_openai_tool_calls(message, []) == [
        agents.ToolCall("call_9", agents.CHECK_EFFECT, {"tool_call_id": "call_1"})
    ]


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (int, {"type": "integer"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
        (dict, {"type": "object"}),
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (Literal[1, 2], {"enum": [1, 2]}),
        (Any, {}),
    ],
)
def test_json_schema_of_hints(hint: Any, schema: dict[str, Any]) -> None:
    """Each supported hint maps to its JSON Schema."""
    assert schemas.json_schema(hint) == schema
