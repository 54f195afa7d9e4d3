"""A worker process of the Agents SDK approval flow that the crash test kills, for real.

Usage: ``python oa_crash_child.py approve|resume DIR [--bare | --no-lookup]``.

``approve`` runs the turn ("refund order o-1") to the SDK's interruption (the tool needs an
approval), approves it (``RunState.approve``) and saves the ``RunState`` to ``DIR/run_state.json``,
as an application does when a person answers later. ``resume`` loads that saved state and runs it
(``Runner.run(agent, state)``): the tool appends one JSON line to ``DIR/world.jsonl`` (the
outside world); it prints ``{"status", "needs_person", "outputs", "lines"}``. A resume the crash
harness kills is followed by another ``resume`` from the same saved state: the SDK's own way to go
on, since it keeps no other record of the run.

``--bare`` is the SDK alone (a ``@function_tool(needs_approval=True)`` that calls
``crash.kill_if("after_effect")`` right after its append); without it, the same append is an
``ef.tool`` with ``approval=True`` and a lookup by key, through ``effectflow_tools`` on
``DIR/ledger.db`` with ``faults=crash.faults_from_env()``. ``--no-lookup`` gives that ``ef.tool``
no lookup (a provider nobody can search): after a kill right after its write, only a person can
say whether it happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, Runner, RunState, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as model_function_call

import effectflow as ef
from effectflow.contrib import openai_agents as ef_agents
from effectflow.testing import crash

TOOL = "oac_refund"
SCOPE = "order-o-1"


class World:
    """This process's outside world (``main`` points it at DIR)."""

    file = Path(crash.WORLD_FILE)


def _lines() -> list[dict[str, Any]]:
    if not World.file.exists():
        return []
    return [json.loads(line) for line in World.file.read_text(encoding="utf-8").splitlines()]


def _append(order: str, key: str) -> dict[str, Any]:
    record = {"key": key, "order": order}
    with World.file.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


@ef.tool("oac_find_refund", effect="read")
def find_refund(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: the file is the provider's own record, searched for the call's key."""
    for record in _lines():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=idempotency_key, result=record)
    return ef.Lookup.not_committed()


@ef.tool(
    TOOL,
    effect="external_write",
    approval=True,
    confirm=find_refund,
    effect_id="key",
    settles_within=0,
)
def refund(order: str, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order (a person approves each refund)."""
    return _append(order, idempotency_key)


@ef.tool(TOOL, version=2, effect="external_write", approval=True, effect_id="key")
def refund_unsearchable(order: str, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order (a person approves each refund); the provider cannot be searched."""
    return _append(order, idempotency_key)


@function_tool(name_override=TOOL, needs_approval=True)
def plain_refund(order: str) -> str:
    """Refund an order, and die right after the write when told to (no key to give)."""
    record = _append(order, f"plain-{uuid.uuid4().hex}")
    crash.kill_if("after_effect")
    return json.dumps(record)


def _respond(call: ModelCall) -> list[Any]:
    last = call.input[-1] if isinstance(call.input, list) and call.input else {}
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return [assistant_message(f"tool said: {last.get('output')}")]
    call_id = f"call_{uuid.uuid4().hex[:16]}"
    return [model_function_call(TOOL, {"order": "o-1"}, call_id=call_id)]


async def _main(
    rt: ef.Runtime, directory: Path, mode: str, bare: bool, lookup: bool
) -> dict[str, Any]:
    set_tracing_disabled(True)
    guarded = refund if lookup else refund_unsearchable
    tools: list[FunctionTool] = (
        [plain_refund] if bare else ef_agents.effectflow_tools(rt, [guarded], scope=SCOPE)
    )
    model = ScriptedModel([ModelStep.respond(_respond) for _ in range(4)])
    agent = Agent(name="refunds", model=model, tools=tools)
    saved = directory / "run_state.json"
    if mode == "approve":
        result = await Runner.run(agent, "refund order o-1")
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)
        saved.write_text(state.to_string(), encoding="utf-8")
        return {"status": "approved", "needs_person": False, "lines": len(_lines())}
    state = await RunState.from_string(agent, saved.read_text(encoding="utf-8"))
    result = await Runner.run(agent, state)
    outputs = [
        item.get("output")
        for item in result.to_input_list()
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    return {
        "status": "done",
        "needs_person": bool(rt.attention()),
        "outputs": outputs,
        "lines": len(_lines()),
    }


def main(argv: list[str]) -> int:
    """Approve and save, or resume the saved run; returns the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["approve", "resume"])
    parser.add_argument("directory", type=Path)
    variant = parser.add_mutually_exclusive_group()
    variant.add_argument("--bare", action="store_true")
    variant.add_argument("--no-lookup", action="store_true")
    args = parser.parse_args(argv)
    World.file = args.directory / crash.WORLD_FILE
    faults = crash.faults_from_env() if not args.bare else None
    with ef.Runtime(f"sqlite:///{args.directory / 'ledger.db'}", faults=faults) as rt:
        print(
            json.dumps(
                asyncio.run(_main(rt, args.directory, args.mode, args.bare, not args.no_lookup))
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
