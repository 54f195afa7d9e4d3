"""A plain Pydantic AI process (no durable engine) the crash test runs, and kills, for real.

Usage: ``python pai_crash_child.py start|recover DIR [--bare]``.

``start`` runs one turn of an ``Agent`` in the conversation ``ticket-1``; the model (Pydantic AI's
``FunctionModel``) calls the tool with a fresh tool-call id (a uuid, as a real model gives), and
the tool appends one JSON line ``{"key": ..., "text": ...}`` to ``DIR/world.jsonl``. The
application saves the conversation (``result.all_messages()``) to ``DIR/conversation.json`` when
the run returns, as an application does; a process killed inside the tool never gets there, so
the model's turn is lost with it. ``--bare`` is Pydantic AI alone (a plain tool that calls
``crash.kill_if("after_effect")`` after its append); without it the tool is an ``ef.tool`` behind
``Effectflow`` on ``sqlite:///DIR/ledger.db`` with ``faults=crash.faults_from_env()``.

``recover`` is what the application does after a crash, in a fresh process: nothing saved, so it
asks the same request again in the same conversation (``conversation_id="ticket-1"``); the model
answers with a *new* tool-call id. It prints ``{"status", "needs_person", "lines", "tool_returns"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import effectflow as ef
from effectflow.contrib import pydantic_ai as ef_pai
from effectflow.testing import crash

TOOL = "pai_child_append_line"
CONVERSATION = "ticket-1"
PROMPT = "append a line"


WORLD = crash.FileWorld(TOOL, "pai_child_find_line")
append_line = WORLD.append_line
_lines, _append = WORLD.lines, WORLD.append


def plain_append_line(ctx: RunContext[None], text: str) -> dict[str, Any]:
    """Append one line to the file (Pydantic AI alone: the call's own id is all it has)."""
    record = _append(text, f"plain-{ctx.tool_call_id}")
    crash.kill_if("after_effect")
    return record


def fresh_ids(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asked without a tool result it calls the tool with a fresh id; given one, it answers."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("the line is written")])
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    return ModelResponse(parts=[ToolCallPart(TOOL, {"text": "hello"}, tool_call_id=call_id)])


def main(argv: list[str]) -> int:
    """Run one turn (``start``) or the application's recovery (``recover``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["start", "recover"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--bare", action="store_true")
    args = parser.parse_args(argv)
    WORLD.file = args.directory / crash.WORLD_FILE
    saved = args.directory / "conversation.json"
    faults = crash.faults_from_env() if args.mode == "start" and not args.bare else None
    with ef.Runtime(f"sqlite:///{args.directory / 'ledger.db'}", faults=faults) as rt:
        if args.bare:
            tool = Tool(plain_append_line, name=TOOL, takes_ctx=True)
            agent: Agent[None, Any] = Agent(FunctionModel(fresh_ids), tools=[tool])
        else:
            agent = Agent(
                FunctionModel(fresh_ids),
                capabilities=[ef_pai.Effectflow(rt, tools=[append_line])],
                output_type=[str, DeferredToolRequests],
            )
        if args.mode == "recover" and saved.exists():
            messages = ModelMessagesTypeAdapter.validate_json(saved.read_bytes())
            deferred = False  # the turn finished before the kill
        else:
            result = agent.run_sync(PROMPT, conversation_id=CONVERSATION)
            saved.write_bytes(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
            messages = result.all_messages()
            deferred = isinstance(result.output, DeferredToolRequests)
        returns = [
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]
        calls = [
            c.tool_call_id for m in messages if isinstance(m, ModelResponse) for c in m.tool_calls
        ]
        out = {
            "status": "deferred" if deferred else "done",
            "needs_person": deferred,
            "lines": len(_lines()),
            "tool_calls": calls,
            "tool_returns": returns,
        }
        print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
