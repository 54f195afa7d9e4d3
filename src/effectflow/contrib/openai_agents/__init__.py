"""The OpenAI Agents SDK: effectflow's write path under an ``Agent``'s function tools
(``pip install 'effectflow[openai-agents]'``).

One import, one line::

    from effectflow.contrib.openai_agents import effectflow_tools

    agent = Agent(name="support", tools=effectflow_tools(rt, [send_email], scope=ticket_id))

Each tool is an ``ef.tool`` (its function and its side-effect contract), or the user's own
``FunctionTool`` whose name is a registered ``ef.tool``: the SDK sees the same name, description
and JSON schema, with ``on_invoke_tool`` going through ``rt.guard_async`` (scope = the
conversation the application names, call id = ``ToolContext.tool_call_id``) and the contract's
approval requirement as ``needs_approval`` (``result.interruptions``, ``RunState.approve`` /
``reject``, ``Runner.run(agent, state)``); ``reject`` declines in the SDK and the ledger at
once. See docs/integrations/openai_agents.md.
"""

try:
    import agents  # noqa: F401 - fails here, with the extra to install, when it is missing
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        "effectflow.contrib.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'effectflow[openai-agents]'"
    ) from exc

from effectflow.contrib.openai_agents.calls import (
    ALREADY_DONE,
    APPROVAL_OUTDATED,
    DECLINED,
    RECHECK,
    SCOPE_PREFIX,
    SDK_APPROVER,
    GuardedCall,
    Source,
    call_id_of,
    split_call_id,
)
from effectflow.contrib.openai_agents.decisions import reject
from effectflow.contrib.openai_agents.guarded import effectflow_tool, effectflow_tools
from effectflow.contrib.openai_agents.tools import (
    EffectflowFunctionTool,
    contract_of,
    function_tool,
)

__all__ = [
    "ALREADY_DONE",
    "APPROVAL_OUTDATED",
    "DECLINED",
    "RECHECK",
    "SCOPE_PREFIX",
    "SDK_APPROVER",
    "EffectflowFunctionTool",
    "GuardedCall",
    "Source",
    "call_id_of",
    "contract_of",
    "effectflow_tool",
    "effectflow_tools",
    "function_tool",
    "reject",
    "split_call_id",
]
