"""The OpenAI Agents SDK host of the crash harness: an ``Agent`` whose conversation is kept in the
SDK's own ``SQLiteSession``, alone or with ``effectflow_tools`` (docs/integrations/crash_harness.md).

Usage::

    python benchmarks/compare/hosts/openai_agents.py start   DIR [--bare]
    python benchmarks/compare/hosts/openai_agents.py recover DIR [--bare]

``start`` runs one turn ("append a line") in the session ``harness-session`` (its file in DIR); the
SDK's scripted model (``agents.testing.ScriptedModel``) calls the tool with a fresh tool-call id (a
uuid, as a real model gives), and the tool appends one JSON line ``{"key": ..., "text": ...}`` to
``DIR/world.jsonl`` (the outside world). ``--bare`` is the SDK alone: a plain ``@function_tool``
that calls ``crash.kill_if("after_effect")`` right after its append. Without it the same append is
an ``ef.tool`` (``external_write``, a lookup that reads the file for the call's key,
``settles_within=0``) given to the agent by ``effectflow_tools(rt, [...], scope=session id)`` on
``sqlite:///DIR/ledger.db`` with ``faults=crash.faults_from_env()``.

``recover`` is what an application on the SDK does after a crash, in a fresh process: the SDK has
no durable execution of its own (a ``RunState`` is saved only at an interruption, and nothing here
asks for one), so the request whose turn did not finish is run again in the same session. The
model, asked again, calls the tool with a new tool-call id. It prints ``{"status", "needs_person",
"lines"}``: ``needs_person`` when the ledger lists something for a person (``rt.attention()``).
"""

# This script's folder holds the other hosts' scripts, named like the packages they drive
# (``dbos.py``, ``langgraph.py``); Python puts the folder first on ``sys.path``, so it is dropped
# before any package is imported, and the imports below come after that.
# ruff: noqa: E402

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import argparse
import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as model_function_call

import effectflow as ef
from effectflow.contrib import openai_agents as ef_agents
from effectflow.testing import crash

SESSION = "harness-session"
ASK = "append a line"
TOOL = "harness_oa_append_line"


WORLD = crash.FileWorld(TOOL, "harness_oa_find_line")
append_line = WORLD.append_line
_lines, _append = WORLD.lines, WORLD.append


@function_tool(name_override=TOOL)
def plain_append_line(text: str) -> str:
    """Append one line to the file, and die right there when told to (the SDK alone has no key
    to give: each call gets its own)."""
    record = _append(text, f"plain-{uuid.uuid4().hex}")
    crash.kill_if("after_effect")
    return json.dumps(record)


def _respond(call: ModelCall) -> list[Any]:
    """A model that behaves like a real one where it matters: asked without a tool result last,
    it calls the tool with a fresh tool-call id; given one, it answers."""
    last = call.input[-1] if isinstance(call.input, list) and call.input else {}
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return [assistant_message(f"tool said: {last.get('output')}")]
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    return [model_function_call(TOOL, {"text": "hello"}, call_id=call_id)]


async def _finished(session: SQLiteSession) -> bool:
    """Whether the session holds the turn's final answer (the kill came after the turn ended)."""
    items = await session.get_items()
    return bool(items) and items[-1].get("role") == "assistant"


async def _turn(rt: ef.Runtime, directory: Path, mode: str, bare: bool) -> dict[str, Any]:
    set_tracing_disabled(True)
    session = SQLiteSession(SESSION, str(directory / "session.sqlite"))
    tools: list[FunctionTool] = (
        [plain_append_line]
        if bare
        else ef_agents.effectflow_tools(rt, [append_line], scope=SESSION)
    )
    model = ScriptedModel([ModelStep.respond(_respond) for _ in range(4)])
    agent = Agent(name="harness", model=model, tools=tools)
    try:
        if mode == "start" or not await _finished(session):
            await Runner.run(agent, ASK, session=session)
    finally:
        session.close()
    asked = bool(rt.attention())
    return {"status": "done", "needs_person": asked, "lines": len(_lines())}


def main(argv: list[str]) -> int:
    """Run one turn (``start``) or the application's recovery (``recover``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["start", "recover"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--bare", action="store_true")
    args = parser.parse_args(argv)
    WORLD.file = args.directory / crash.WORLD_FILE
    faults = crash.faults_from_env() if args.mode == "start" and not args.bare else None
    url = f"sqlite:///{args.directory / 'ledger.db'}"
    with ef.Runtime(url, faults=faults) as rt:
        print(json.dumps(asyncio.run(_turn(rt, args.directory, args.mode, args.bare))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
