"""The Pydantic AI host of the crash harness: an ``Agent`` under Pydantic AI's DBOS durability
(``DBOSDurability``, DBOS on a SQLite system database), alone or with effectflow's ``Effectflow``
capability (docs/integrations/pydantic_ai.md).

Usage::

    python -P benchmarks/compare/hosts/pydantic_ai.py start   DIR [--bare]
    python -P benchmarks/compare/hosts/pydantic_ai.py recover DIR [--bare]

``start`` runs one agent turn inside a ``@DBOS.workflow`` (workflow id ``pai-turn``); the scripted
model (Pydantic AI's ``FunctionModel``) calls the tool with a fresh tool-call id (a uuid, as a
real model gives), and the tool appends one JSON line ``{"key": ..., "text": ...}`` to
``DIR/world.jsonl`` (the outside world). ``--bare`` is Pydantic AI and DBOS alone: the tool's
write is a ``@DBOS.step`` (what DBOS asks of a tool with I/O) that calls
``crash.kill_if("after_effect")`` right after its append. Without it the same append is an
``ef.tool`` (``external_write``, a lookup that reads the file for the call's key,
``settles_within=0``) behind ``Effectflow`` on ``sqlite:///DIR/ledger.db`` with
``faults=crash.faults_from_env()``.

``recover`` is DBOS's own recovery in a fresh process: ``DBOS.launch()`` resumes the pending
workflow, whose recorded model step gives the same tool call again, and the tool runs again. It
prints ``{"status", "needs_person", "tool_returns", "lines"}``: ``needs_person`` when the run
ended with ``DeferredToolRequests`` (where effectflow puts what needs a person).

``--no-lookup`` (with effectflow): the write has no lookup and no key the provider honours, so
after a kill right after it nothing can tell whether it happened: the recovered run ends with
``DeferredToolRequests`` (a person asked). ``answer DIR --no-lookup`` is that person: the line is
in the provider's file, so the decision ``committed`` resumes the conversation in a new workflow
(``answer`` in ``effectflow.contrib.pydantic_ai``), and the tool's result is the line.
"""

# This script's folder holds ``pydantic_ai.py`` (this file) and the other hosts' scripts, named
# like the packages they drive; Python puts the folder first on ``sys.path`` unless run with -P, so
# it is dropped before any of those packages is imported, and the imports below come after that.
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

from dbos import DBOS, SetWorkflowID
from pydantic_ai import (
    Agent,
    AgentRunResult,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
)
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import (
    ModelMessage,
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

WORKFLOW_ID = "pai-turn"
TOOL = "harness_pai_append_line"
UNCHECKED = "harness_pai_append_unchecked"


WORLD = crash.FileWorld(TOOL, "harness_pai_find_line")
append_line = WORLD.append_line
_lines, _append = WORLD.lines, WORLD.append


@ef.tool(UNCHECKED, effect="external_write", effect_id="key")
def append_unchecked(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Append one line to the file (``--no-lookup``: nothing can check it afterwards)."""
    return _append(text, idempotency_key)


@DBOS.step()
async def append_step(text: str, key: str) -> dict[str, Any]:
    """DBOS alone: the write as a step, and the kill right after it (before DBOS checkpoints the
    step's output)."""
    record = _append(text, key)
    crash.kill_if("after_effect")
    return record


async def plain_append_line(ctx: RunContext[None], text: str) -> dict[str, Any]:
    """Append one line to the file."""
    return await append_step(text, f"plain-{ctx.tool_call_id}")


def fresh_id_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model that behaves like a real one where it matters: asked without a tool
    result it calls the tool with a fresh tool-call id each time; given one, it answers."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("the line is written")])
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    [tool] = info.function_tools  # the one the agent offers (plain, guarded, or unchecked)
    return ModelResponse(parts=[ToolCallPart(tool.name, {"text": "hello"}, tool_call_id=call_id)])


def _agent(rt: ef.Runtime, *, bare: bool, lookup: bool = True) -> Agent[None, Any]:
    durability = DBOSDurability[None]()
    if bare:
        tool = Tool(plain_append_line, name=TOOL, takes_ctx=True)
        return Agent(FunctionModel(fresh_id_model), name="pai_host", tools=[tool],
                     capabilities=[durability])  # fmt: skip
    return Agent(
        FunctionModel(fresh_id_model),
        name="pai_host",
        capabilities=[
            ef_pai.Effectflow(rt, tools=[append_line if lookup else append_unchecked]),
            durability,
        ],
        output_type=[str, DeferredToolRequests],
    )


def main(argv: list[str]) -> int:
    """Run one turn (``start``), DBOS's recovery (``recover``), or a person's answer
    (``answer``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["start", "recover", "answer"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--no-lookup", action="store_true")
    args = parser.parse_args(argv)
    WORLD.file = args.directory / crash.WORLD_FILE
    faults = crash.faults_from_env() if args.mode == "start" and not args.bare else None
    url = f"sqlite:///{args.directory / 'ledger.db'}"
    with ef.Runtime(url, faults=faults) as rt:
        agent = _agent(rt, bare=args.bare, lookup=not args.no_lookup)

        @DBOS.workflow()
        async def turn(prompt: str) -> dict[str, Any]:
            return _outcome(await agent.run(prompt))

        @DBOS.workflow()
        async def resume(history: list[ModelMessage], results: DeferredToolResults) -> Any:
            return _outcome(await agent.run(message_history=history, deferred_tool_results=results))

        system_db = f"sqlite:///{args.directory / 'dbos.sqlite'}"
        DBOS(config={"name": "effectflow-pai-host", "system_database_url": system_db})
        DBOS.launch()  # in ``recover``: resumes this executor's pending workflow
        try:
            out = asyncio.run(_drive(args.mode, turn, resume))
        finally:
            DBOS.destroy()
        print(json.dumps({**out, "lines": len(_lines())}, default=str))
    return 0


def _outcome(result: AgentRunResult[Any]) -> dict[str, Any]:
    """What a workflow returns (DBOS records it): the conversation, and what waits for a person."""
    deferred = result.output if isinstance(result.output, DeferredToolRequests) else None
    returns = [
        p.content
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    return {
        "needs_person": deferred is not None,
        "requests": deferred,
        "messages": result.all_messages(),
        "tool_returns": returns,
    }


async def _drive(mode: str, turn: Any, resume: Any) -> dict[str, Any]:
    if mode == "start":
        with SetWorkflowID(WORKFLOW_ID):
            result = await turn("append a line")
        status = "SUCCESS"
    elif mode == "recover":
        handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
        result = await handle.get_result()  # waits for the recovery the launch started
        status = (await handle.get_status()).status
    else:
        # A person looked at the provider and found the line: the call happened. The decision
        # resumes the conversation in a workflow of its own; the ledger records it (rt.resolve).
        asked = await (await DBOS.retrieve_workflow_async(WORKFLOW_ID)).get_result()
        requests: DeferredToolRequests = asked["requests"]
        [pending] = requests.approvals
        [line] = _lines()
        decision = {"committed": True, "evidence": {"result": line}, "by": "ops"}
        results = ef_pai.answer(requests, {pending.tool_call_id: decision})
        with SetWorkflowID(f"{WORKFLOW_ID}-answer"):
            result = await resume(asked["messages"], results)
        status = "SUCCESS"
    return {
        "status": status,
        "needs_person": bool(result["needs_person"]),
        "tool_returns": result["tool_returns"],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
