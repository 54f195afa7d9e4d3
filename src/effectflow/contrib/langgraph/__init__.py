"""LangChain v1 and LangGraph: effectflow's write path under ``create_agent`` and ``ToolNode``
(``pip install effectflow[langgraph]``).

One import, one line::

    from effectflow.contrib.langgraph import EffectflowMiddleware

    agent = create_agent(model, middleware=[EffectflowMiddleware(rt, tools=[send_email])],
                         checkpointer=checkpointer)

``langchain_tool`` turns an ``ef.tool`` into a LangChain tool (and ``effectflow_tool`` back), so
one definition serves both; a ``ToolNode`` takes the same middleware's ``wrap_tool_call`` /
``awrap_tool_call``. The package is named for LangGraph because what it relies on — the thread
and checkpoint namespace as the scope, ``interrupt()`` and ``Command(resume=...)`` — is LangGraph's;
``create_agent`` is a LangGraph graph.
"""

from effectflow.contrib.langgraph.middleware import (
    ALREADY_DONE,
    DECLINED,
    PAYLOAD_MARK,
    EffectflowMiddleware,
    scope_of,
)
from effectflow.contrib.langgraph.tools import (
    EffectflowTool,
    effectflow_tool,
    langchain_tool,
    langchain_tools,
)

__all__ = [
    "ALREADY_DONE",
    "DECLINED",
    "PAYLOAD_MARK",
    "EffectflowMiddleware",
    "EffectflowTool",
    "effectflow_tool",
    "langchain_tool",
    "langchain_tools",
    "scope_of",
]
