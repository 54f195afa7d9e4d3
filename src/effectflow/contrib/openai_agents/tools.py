"""An ``ef.tool`` as an Agents SDK ``FunctionTool``, and a ``FunctionTool`` guarded.

``function_tool`` gives the SDK definition of an ``ef.tool``: its name, its docstring with what the
contract means for the model, and the JSON schema of its signature without the parameters the
runtime injects (the idempotency key, ``deadline``, ``precondition``, ``tx``): a model that could
type a key could also reuse one. On its own it refuses to run, since a side-effecting call outside
the guarded path is what this integration exists to prevent.

``guarded`` takes any ``FunctionTool`` (one ``function_tool`` made, or the user's own whose name
matches a registered ``ef.tool``) and returns a copy with the same name, description and JSON
schema whose ``on_invoke_tool`` goes through ``rt.guard_async`` and whose ``needs_approval`` is the
contract's (``calls.GuardedCall``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from effectflow import errors
from effectflow.contracts.registry import Registry
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import definitions
from effectflow.contrib.agents import schemas


@dataclasses.dataclass
class EffectflowFunctionTool(FunctionTool):
    """A ``FunctionTool`` backed by an ``ef.tool``: the contract behind every call of it."""

    #: The effectflow tool behind it: its contract decides how each call is made.
    effectflow: Tool[..., Any] | None = dataclasses.field(default=None, kw_only=True)


def function_tool(tool: Tool[..., Any]) -> EffectflowFunctionTool:
    """The Agents SDK tool definition of ``tool``; give it to ``effectflow_tools`` (alone it
    refuses to run).

    Raises:
        errors.ContractError: ``tool`` is not an ``ef.tool``.
    """
    definitions.checked(tool, "function_tool")

    async def unguarded(ctx: ToolContext[Any], arguments: str) -> Any:
        raise errors.ContractError(
            f"the effectflow tool {tool.ref} ran outside the guarded path; give the agent "
            "effectflow_tools(rt, [...], scope=...) instead"
        )

    schema = schemas.parameters_schema(tool)
    return EffectflowFunctionTool(
        name=tool.name,
        description=definitions.description(tool),
        params_json_schema=schema,
        on_invoke_tool=unguarded,
        # The SDK's strict mode wants every property required; a signature with defaults keeps
        # its optional parameters, as ``function_tool`` does for them.
        strict_json_schema=set(schema["required"]) == set(schema["properties"]),
        effectflow=tool,
    )


def contract_of(tool: FunctionTool, registry: Registry) -> Tool[..., Any]:
    """The ``ef.tool`` behind ``tool``: the one it was made from, or the registered tool of its
    name (a user's own ``@function_tool`` whose contract was declared with ``@ef.tool``).

    Raises:
        errors.ContractError: no ``ef.tool`` of that name is registered.
    """
    if isinstance(tool, EffectflowFunctionTool) and tool.effectflow is not None:
        return tool.effectflow
    try:
        return registry.tool(tool.name)
    except errors.ContractError:
        raise errors.ContractError(
            f"the function tool {tool.name!r} has no side-effect contract: declare its function "
            f"with @ef.tool({tool.name!r}, effect=...) (the function that makes the call, with "
            "its idempotency key), or pass the ef.tool itself"
        ) from None
