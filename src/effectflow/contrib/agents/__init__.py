"""Agent integration: tool contracts as model tool schemas, and a recorded agent loop
(docs/concepts.md#agents-and-models).

``openai_tools`` / ``anthropic_tools`` turn ``ef.Tool`` objects into the schemas models take, with
the contract's effect class in each description; ``run_agent`` runs a model inside a workflow, every
model turn a recorded ``pure`` step and every tool call a ``ctx.call`` keyed by the run, the model
message and the tool-call id.
"""

from effectflow.contrib.agents.loop import (
    AgentResult,
    AnthropicModel,
    Model,
    OpenAIChatModel,
    ScriptedModel,
    run_agent,
)
from effectflow.contrib.agents.schemas import (
    CHECK_EFFECT,
    UNKNOWN_OUTCOME,
    ToolCall,
    ToolCallError,
    anthropic_tools,
    check_effect_schema,
    json_schema,
    openai_tools,
    parse_anthropic_tool_uses,
    parse_openai_tool_calls,
)

__all__ = [
    "CHECK_EFFECT",
    "UNKNOWN_OUTCOME",
    "AgentResult",
    "AnthropicModel",
    "Model",
    "OpenAIChatModel",
    "ScriptedModel",
    "ToolCall",
    "ToolCallError",
    "anthropic_tools",
    "check_effect_schema",
    "json_schema",
    "openai_tools",
    "parse_anthropic_tool_uses",
    "parse_openai_tool_calls",
    "run_agent",
]
