"""An ``ef.tool`` as a LangChain tool, and back: one definition serves both.

The LangChain tool carries the effectflow tool it was made from, so the middleware finds the
contract behind every tool call. Its name and description are the contract's, its argument schema
comes from the function signature without the parameters the runtime injects (the idempotency key,
``deadline``, ``precondition``, ``tx``): a model that could type a key could also reuse one.

The LangChain tool does not run its function itself: a side-effecting call outside the guarded
path is exactly what this integration exists to prevent, so calling it without
``EffectflowMiddleware`` (or ToolNode's ``wrap_tool_call``) is a loud error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import definitions
from effectflow.contrib.agents import schemas


class EffectflowTool(StructuredTool):
    """A LangChain tool backed by an ``ef.tool``; only ``EffectflowMiddleware`` runs it."""

    #: The effectflow tool behind it: its contract decides how each call is made.
    effectflow: Tool[..., Any]


def langchain_tool(tool: Tool[..., Any]) -> EffectflowTool:
    """The LangChain tool for ``tool`` (give it to ``create_agent(tools=...)`` or a ``ToolNode``).

    Raises:
        errors.ContractError: ``tool`` is not an ``ef.tool``.
    """
    definitions.checked(tool, "langchain_tool")

    def unguarded(**arguments: Any) -> Any:
        raise errors.ContractError(
            f"the effectflow tool {tool.ref} ran outside the guarded path; add "
            "middleware=[EffectflowMiddleware(rt)] to create_agent, or pass "
            "wrap_tool_call=/awrap_tool_call= of an EffectflowMiddleware to ToolNode"
        )

    return EffectflowTool(
        name=tool.name,
        description=definitions.description(tool),
        args_schema=schemas.parameters_schema(tool),
        func=unguarded,
        effectflow=tool,
    )


def langchain_tools(tools: Iterable[Tool[..., Any]]) -> list[EffectflowTool]:
    """``langchain_tool`` of each tool, in order."""
    return [langchain_tool(t) for t in tools]


def effectflow_tool(tool: BaseTool | None) -> Tool[..., Any] | None:
    """The ``ef.tool`` behind a LangChain tool, or None for a tool effectflow does not back."""
    return tool.effectflow if isinstance(tool, EffectflowTool) else None
