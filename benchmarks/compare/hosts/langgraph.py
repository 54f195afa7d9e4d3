"""The LangGraph host of the crash harness: a LangChain v1 ``create_agent`` graph on
``SqliteSaver``, alone or with ``EffectflowMiddleware`` (docs/integrations/crash_harness.md).

Usage::

    python benchmarks/compare/hosts/langgraph.py start   DIR [--bare]
    python benchmarks/compare/hosts/langgraph.py recover DIR [--bare]

``start`` asks the agent for one line on a fresh thread; the scripted model calls the tool with a
fresh tool-call id (a uuid, as a real model gives), and the tool appends one JSON line
``{"key": ..., "text": ...}`` to ``DIR/world.jsonl`` (the outside world). ``--bare`` is LangGraph
alone: a plain LangChain tool that calls ``crash.kill_if("after_effect")`` right after its
append. Without it the same append is an ``ef.tool`` (``external_write``, a lookup that reads the
file for the call's key, ``settles_within=0``) behind ``EffectflowMiddleware`` on
``sqlite:///DIR/ledger.db`` with ``faults=crash.faults_from_env()``.

``recover`` is LangGraph's own recovery in a fresh process: continue the thread from its
checkpoint (``agent.invoke(None, config)``), or ask again when no checkpoint holds the turn. It
prints ``{"status", "needs_person", "lines"}``: ``needs_person`` when the graph stopped at
LangGraph's ``interrupt()`` (where the middleware puts what needs a person).

The graph runs with ``durability="sync"``: each step's checkpoint is saved before the next step
starts, so the checkpoint holds the model's tool call when the tool dies and the resumed graph
re-runs that very call (the duplicate LangGraph alone shows; ``tests/contrib/test_langgraph_crash.py``
has ``"async"`` too).
"""

# This script's folder holds ``langgraph.py`` (this file) and the other hosts' scripts, named like
# the packages they drive; Python puts the folder first on ``sys.path``, so it is dropped before any
# of those packages is imported, and the imports below come after that.
# ruff: noqa: E402

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import argparse
import json
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver

import effectflow as ef
from effectflow.contrib import langgraph as ef_langgraph
from effectflow.testing import crash

THREAD: RunnableConfig = {"configurable": {"thread_id": "harness-thread"}}
ASK: Any = {"messages": [{"role": "user", "content": "append a line"}]}
TOOL = "harness_lg_append_line"


WORLD = crash.FileWorld(TOOL, "harness_lg_find_line")
append_line = WORLD.append_line
_lines, _append = WORLD.lines, WORLD.append


def plain_append_line(text: str) -> dict[str, Any]:
    """Append one line to the file, and die right there when told to (LangGraph alone has no
    key to give: each call gets its own)."""
    record = _append(text, f"plain-{uuid.uuid4().hex}")
    crash.kill_if("after_effect")
    return record


class FreshIdModel(BaseChatModel):
    """A scripted chat model that behaves like a real one where it matters: asked without a tool
    result it calls the tool with a fresh tool-call id each time; given one, it answers."""

    @property
    def _llm_type(self) -> str:
        return "scripted-fresh-ids"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FreshIdModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"tool said: {messages[-1].content}")
        else:
            call = {"name": TOOL, "args": {"text": "hello"}, "id": f"call_{uuid.uuid4().hex[:16]}"}
            reply = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def main(argv: list[str]) -> int:
    """Run one turn (``start``) or LangGraph's recovery (``recover``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["start", "recover"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--bare", action="store_true")
    args = parser.parse_args(argv)
    WORLD.file = args.directory / crash.WORLD_FILE
    faults = crash.faults_from_env() if args.mode == "start" and not args.bare else None
    conn = sqlite3.connect(args.directory / "checkpoints.sqlite", check_same_thread=False)
    url = f"sqlite:///{args.directory / 'ledger.db'}"
    with closing(conn), ef.Runtime(url, faults=faults) as rt:
        saver = SqliteSaver(conn)
        if args.bare:
            tool = StructuredTool.from_function(plain_append_line, name=TOOL)
            agent = create_agent(FreshIdModel(), [tool], checkpointer=saver)
        else:
            middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[append_line])
            agent = create_agent(FreshIdModel(), middleware=[middleware], checkpointer=saver)
        if args.mode == "start":
            state = agent.invoke(ASK, THREAD, durability="sync")
        elif agent.get_state(THREAD).next:
            state = agent.invoke(None, THREAD, durability="sync")
        elif not agent.get_state(THREAD).values:
            state = agent.invoke(ASK, THREAD, durability="sync")  # nothing saved: ask again
        else:
            state = agent.get_state(THREAD).values  # the turn finished before the kill
        interrupted = bool(state.get("__interrupt__"))
        status = "interrupted" if interrupted else "done"
        print(json.dumps({"status": status, "needs_person": interrupted, "lines": len(_lines())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
