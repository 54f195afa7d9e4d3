"""The same agent under Pydantic AI's DBOS durability (``DBOSDurability``; DBOS on a SQLite system
database in the test's directory), and which layer owns what: DBOS records the model's requests
as its steps and the workflow's progress, Pydantic AI the conversation, effectflow the tool's
effect (its intent, key and outcome). A run resumed with a person's decision is a new workflow of
the same conversation, and the guard knows its call.

The SIGKILL and DBOS's own recovery are in ``test_pydantic_ai_crash.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.durable_exec.dbos import DBOSAgent, DBOSDurability
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

WORLD = {"file": ""}


def lines() -> list[dict[str, Any]]:
    """The provider's own record: one JSON line per write."""
    path = Path(WORLD["file"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _write(key: str, **fields: Any) -> dict[str, Any]:
    record = {"id": f"w_{len(lines()) + 1}", "key": key, **fields}
    with Path(WORLD["file"]).open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


@ef.tool("pai_dbos_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    for record in lines():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
    return ef.Lookup.not_committed()


@ef.tool("pai_dbos_send", effect="external_write", confirm=find, effect_id="id", settles_within=0)
def send(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send a message."""
    return _write(idempotency_key, text=text)


@ef.tool(
    "pai_dbos_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
)
def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order. The provider deduplicates by key."""
    for record in lines():
        if record["key"] == idempotency_key:
            return record
    return _write(idempotency_key, order=order, amount=amount)


def _model(tool: str, args: dict[str, Any]) -> FunctionModel:
    """A model that calls ``tool`` with a fresh tool-call id until it sees a result."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        ):
            return ModelResponse(parts=[TextPart("done")])
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=call_id)])

    return FunctionModel(respond)


class Host:
    """DBOS launched on a SQLite system database, the agent, and its workflows."""

    def __init__(self, rt: ef.Runtime, directory: Path, tool: ef.Tool[..., Any]) -> None:
        args = {"text": "hi"} if tool is send else {"order": "o1", "amount": 30}
        self.agent = Agent(
            _model(tool.name, args),
            name="pai_dbos_agent",
            capabilities=[ef_pai.Effectflow(rt, tools=[tool]), DBOSDurability[None]()],
            output_type=[str, DeferredToolRequests],
        )
        agent = self.agent

        @DBOS.workflow()
        async def turn(prompt: str) -> dict[str, Any]:
            result = await agent.run(prompt)
            return {"result": result, "conversation_id": result.conversation_id}

        @DBOS.workflow()
        async def resume(history: list[ModelMessage], results: DeferredToolResults) -> Any:
            return await agent.run(message_history=history, deferred_tool_results=results)

        self.turn, self.resume = turn, resume
        DBOS.launch()

    def steps(self, workflow_id: str) -> list[str]:
        """The names of the steps DBOS recorded for a workflow."""
        return [s["function_name"] for s in DBOS.list_workflow_steps(workflow_id)]


@pytest.fixture
def dbos_dir(tmp_path: Path) -> Iterator[Path]:
    """DBOS configured on ``tmp_path``; destroyed (with its registry) after the test."""
    WORLD["file"] = str(tmp_path / "world.jsonl")
    system_db = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    DBOS(config={"name": "effectflow-pai-tests", "system_database_url": system_db})
    try:
        yield tmp_path
    finally:
        DBOS.destroy(destroy_registry=True)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        yield runtime


def test_under_dbos_durability_each_layer_owns_its_part(dbos_dir: Path, rt: ef.Runtime) -> None:
    """One turn in a DBOS workflow: one line; DBOS's record holds the two model requests and no
    step of the tool; the ledger holds the tool's call under the conversation Pydantic AI derived
    from the workflow id, with its key on the provider's line."""
    host = Host(rt, dbos_dir, send)

    async def main() -> dict[str, Any]:
        with SetWorkflowID("wf-one"):
            out: dict[str, Any] = await host.turn("go")
        return out

    out = asyncio.run(main())
    [line] = lines()
    result = out["result"]
    assert result.run_id == "wf-one:1", "Pydantic AI's run id comes from the DBOS workflow"
    assert host.steps("wf-one") == ["pai_dbos_agent__model.request"] * 2
    [run] = rt.runs()
    assert run.input["scope"] == f"pydantic_ai:{out['conversation_id']}"
    [call] = [
        c for m in result.all_messages() if isinstance(m, ModelResponse) for c in m.tool_calls
    ]
    assert run.input["call_id"] == call.tool_call_id
    [effect] = rt.effects()
    assert effect.status is ef.StepStatus.CONFIRMED
    assert effect.external_effect_id == line["id"]
    assert effect.idempotency_key == line["key"]


def test_an_approval_under_dbos_resumes_in_a_new_workflow_of_the_same_conversation(
    dbos_dir: Path, rt: ef.Runtime
) -> None:
    """The refund waits for a person: the first workflow ends with ``DeferredToolRequests``; the
    person's answer runs in a second workflow, whose run inherits the conversation from the
    history, so the guard finds the same call: approved (``rt.approve``, audited) and made once."""
    host = Host(rt, dbos_dir, refund)

    async def main() -> Any:
        with SetWorkflowID("wf-ask"):
            first = (await host.turn("refund o1"))["result"]
        requests = first.output
        assert isinstance(requests, DeferredToolRequests)
        assert lines() == [], "nothing is refunded before the approval"
        [pending] = requests.approvals
        decision = {pending.tool_call_id: {"approved": True, "approver": "alice"}}
        with SetWorkflowID("wf-approved"):
            return await host.resume(first.all_messages(), ef_pai.answer(requests, decision))

    done = asyncio.run(main())
    [line] = lines()
    assert done.output == "done"
    [run] = rt.runs()
    assert run.status is ef.RunStatus.SUCCEEDED
    assert [e.actor for e in rt.audit(run.run_id) if e.kind == "approved"] == ["alice"]
    assert rt.effects()[0].external_effect_id == line["id"]
    assert host.steps("wf-ask") == ["pai_dbos_agent__model.request"]
    assert host.steps("wf-approved") == ["pai_dbos_agent__model.request"]


# DBOSAgent is deprecated in Pydantic AI 2.x in favour of DBOSDurability (it warns on construction);
# it is tested because agents built on it are still in service.
@pytest.mark.filterwarnings("ignore::pydantic_ai._warnings.PydanticAIDeprecationWarning")
def test_the_dbos_agent_wrapper_makes_the_same_guarded_call(dbos_dir: Path, rt: ef.Runtime) -> None:
    """``DBOSAgent(agent)``, the wrapper that runs the agent as its own DBOS workflow: the tool's
    call is the same guarded call (one line, its key in the ledger), DBOS records the model's
    requests."""
    agent = Agent(
        _model(send.name, {"text": "hi"}),
        name="pai_dbos_wrapped",
        capabilities=[ef_pai.Effectflow(rt, tools=[send])],
    )
    wrapped = DBOSAgent(agent)
    DBOS.launch()

    async def main() -> Any:
        with SetWorkflowID("wf-wrapped"):
            return await wrapped.run("go")

    result = asyncio.run(main())
    [line] = lines()
    assert result.output == "done"
    [run] = rt.runs()
    assert run.input["scope"] == f"pydantic_ai:{result.conversation_id}"
    assert rt.effects()[0].idempotency_key == line["key"]
    steps = [s["function_name"] for s in DBOS.list_workflow_steps("wf-wrapped")]
    assert steps == ["pai_dbos_wrapped__model.request"] * 2
