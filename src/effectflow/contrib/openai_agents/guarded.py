"""``effectflow_tools``: the user's tools, guarded, in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agents import FunctionTool

from effectflow.contracts.tool import Tool
from effectflow.contrib.openai_agents import calls
from effectflow.contrib.openai_agents import tools as tools_mod

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime


def effectflow_tool(
    rt: Runtime,
    tool: Tool[..., Any] | FunctionTool,
    *,
    scope: calls.Source,
    policy: calls.Source | None = None,
    approver: calls.Source = calls.SDK_APPROVER,
) -> tools_mod.EffectflowFunctionTool:
    """``tool`` as a ``FunctionTool`` whose every call goes through ``rt.guard_async``.

    Args:
        rt: The runtime whose ledger records the calls.
        tool: An ``ef.tool``, or a ``FunctionTool`` (its name, description and JSON schema are
            kept; its contract is the ``ef.tool`` of its name).
        scope: The conversation the calls belong to (a session id, a ticket): fixed, or a
            function of the run's ``RunContextWrapper``. A turn re-run after a crash must give
            the same one; a new conversation a new one.
        policy: The approval policy in force, for contracts that need approval (see
            ``calls.GuardedCall``).
        approver: Who approves through ``RunState.approve``, for the audit log.

    Raises:
        errors.ContractError: the tool has no contract.
    """
    base = tool if isinstance(tool, FunctionTool) else tools_mod.function_tool(tool)
    made = tools_mod.contract_of(base, rt.registry)
    guard = calls.GuardedCall(
        rt, made, base.params_json_schema, scope=scope, policy=policy, approver=approver
    )
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(FunctionTool)}
    fields.update(
        on_invoke_tool=guard.invoke,
        # The contract's approval is recorded and re-checked by the guard; a tool whose contract
        # needs none keeps its own ``needs_approval`` (the SDK's alone: the ledger has no say).
        needs_approval=guard.needs_approval
        if made.contract.needs_approval
        else base.needs_approval,
        # The SDK has already made the schema strict; do not make it again.
        strict_json_schema=base.strict_json_schema,
    )
    return tools_mod.EffectflowFunctionTool(**fields, effectflow=made)


def effectflow_tools(
    rt: Runtime,
    tools: Iterable[Tool[..., Any] | FunctionTool],
    *,
    scope: calls.Source,
    policy: calls.Source | None = None,
    approver: calls.Source = calls.SDK_APPROVER,
) -> list[FunctionTool]:
    """``effectflow_tool`` of each tool, in order (give them to ``Agent(tools=...)``)."""
    return [effectflow_tool(rt, t, scope=scope, policy=policy, approver=approver) for t in tools]
