"""The OpenAI Agents SDK with effectflow's guarded function tools: the real ``Agent`` and
``Runner``, the SDK's own scripted ``Model`` (``agents.testing.ScriptedModel``: no network, no
key), the provider's own records as the proof."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    Runner,
    RunState,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import UserError
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as model_function_call

import effectflow as ef
from effectflow.contrib import openai_agents as ef_agents

set_tracing_disabled(True)

PROVIDER = {"file": ""}


def records() -> list[dict[str, Any]]:
    """What the provider committed, in order."""
    path = Path(PROVIDER["file"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _commit(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    record = {"id": f"{kind}_{len(records()) + 1}", "key": key, **fields}
    with Path(PROVIDER["file"]).open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


@ef.tool("oa_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    for record in records():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
    return ef.Lookup.not_committed()


@ef.tool("oa_send", effect="external_write", confirm=find, effect_id="id", settles_within=0)
def send(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send a message."""
    return _commit("msg", idempotency_key, to=to, text=text)


@ef.tool("oa_lost", effect="external_write", confirm=find, effect_id="id", settles_within=0)
def send_lost(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send a message; the provider commits it and the answer is lost on the way back."""
    _commit("msg", idempotency_key, to=to, text=text)
    raise ef.OutcomeUnknown("connection reset after the request was sent")


@ef.tool("oa_untagged", effect="external_write", effect_id="id")
def send_untagged(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not searchable: after a lost answer only a person can tell."""
    _commit("raw", idempotency_key, to=to, text=text)
    raise ef.OutcomeUnknown("the answer was lost")


@ef.tool(
    "oa_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
)
def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order. The provider deduplicates by key."""
    for record in records():
        if record["key"] == idempotency_key:
            return {**record, "replayed": True}
    return _commit("rf", idempotency_key, order=order, amount=amount)


SEND = {"to": "a@example.com", "text": "hi"}
REFUND = {"order": "o-1", "amount": 30}


class Model:
    """Like a real model, over the SDK's ``ScriptedModel``: asked without a tool result last,
    it calls the tool (a fresh tool-call id every time it is asked); given one, it answers with
    that result's text."""

    def __init__(self, tool: str, args: dict[str, Any], prefix: str = "call") -> None:
        self.ids = itertools.count(1)
        self.tool = tool
        self.args = args
        self.prefix = prefix
        self.issued: list[str] = []
        self.scripted = ScriptedModel([ModelStep.respond(self._respond) for _ in range(40)])

    def _respond(self, call: ModelCall) -> list[Any]:
        last = call.input[-1] if isinstance(call.input, list) and call.input else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            return [assistant_message(f"tool said: {last.get('output')}")]
        call_id = f"{self.prefix}_{next(self.ids)}"
        self.issued.append(call_id)
        return [model_function_call(self.tool, self.args, call_id=call_id)]


@pytest.fixture(autouse=True)
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "provider.jsonl"
    PROVIDER["file"] = str(path)
    return path


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        yield runtime


def _agent(
    rt: ef.Runtime,
    tool: ef.Tool[..., Any] | FunctionTool,
    args: dict[str, Any],
    *,
    scope: str = "ticket-7",
    model: Model | None = None,
    **kw: Any,
) -> tuple[Agent[Any], Model]:
    name = tool.name
    model = model or Model(name, args)
    tools = ef_agents.effectflow_tools(rt, [tool], scope=scope, **kw)
    return Agent(name="support", model=model.scripted, tools=tools), model


def _run(agent: Agent[Any], input: Any) -> Any:
    """``Runner.run`` on a fresh event loop (``run_sync`` leaves its loop open)."""
    return asyncio.run(Runner.run(agent, input))


def _outputs(result: Any) -> list[dict[str, Any]]:
    """The tool outputs the run produced, as the model saw them."""
    return [
        json.loads(item["output"])
        for item in result.to_input_list()
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


# -- the tool, both ways ----------------------------------------------------------------------------


def test_an_ef_tool_becomes_a_function_tool_without_the_runtime_parameters() -> None:
    """Name, description and JSON schema come from the contract and signature; the key the
    runtime injects is hidden; the definition alone refuses to run."""
    made = ef_agents.function_tool(refund)
    assert made.name == "oa_refund"
    assert made.description.startswith("Refund an order.")
    assert "waits for a person's approval" in made.description
    assert made.params_json_schema["properties"] == {
        "order": {"type": "string"},
        "amount": {"type": "integer"},
    }
    assert made.params_json_schema["required"] == ["order", "amount"]
    assert made.strict_json_schema
    assert made.effectflow is refund
    with pytest.raises(ef.ContractError, match="not a tool"):
        ef_agents.function_tool(lambda: None)  # type: ignore[arg-type]


def test_the_bare_definition_refuses_to_run_outside_the_guarded_path() -> None:
    """Without ``effectflow_tools`` a side-effecting call would run unrecorded: a loud error."""
    made = ef_agents.function_tool(send)
    agent = Agent(name="a", model=Model("oa_send", SEND).scripted, tools=[made])
    with pytest.raises(UserError, match="outside the guarded path"):
        _run(agent, "go")
    assert records() == []


def test_a_users_own_function_tool_keeps_its_name_description_and_schema(
    rt: ef.Runtime,
) -> None:
    """A ``@function_tool`` whose name is an ``ef.tool``'s: the SDK's definition is kept as it
    was, and the call goes through the ledger under that tool's contract."""

    @function_tool(name_override="oa_send", description_override="Mail a customer.")
    def mail(to: str, text: str) -> str:
        raise AssertionError("the contract's function makes the call, not this one")

    [guarded] = ef_agents.effectflow_tools(rt, [mail], scope="ticket-7")
    assert (guarded.name, guarded.description) == ("oa_send", "Mail a customer.")
    assert guarded.params_json_schema == mail.params_json_schema
    assert guarded.on_invoke_tool != mail.on_invoke_tool
    agent, _ = _agent(rt, mail, SEND)
    result = _run(agent, "go")
    [sent] = records()
    assert _outputs(result) == [{"status": "done", "happened": True, "result": sent}]

    @function_tool
    def unknown_tool(x: str) -> str:
        return x

    with pytest.raises(ef.ContractError, match="no side-effect contract"):
        ef_agents.effectflow_tools(rt, [unknown_tool], scope="ticket-7")


# -- one call, replays ------------------------------------------------------------------------------


def test_one_tool_call_is_one_effect_recorded_under_the_conversation_and_call_id(
    rt: ef.Runtime,
) -> None:
    """The model's call runs once; it gets the recorded result as JSON; the ledger names the
    conversation and ``ToolContext.tool_call_id``."""
    agent, model = _agent(rt, send, SEND)
    result = _run(agent, "go")
    [sent] = records()
    assert _outputs(result) == [{"status": "done", "happened": True, "result": sent}]
    assert result.final_output.startswith("tool said:")
    [run] = rt.runs()
    assert run.workflow == "effectflow.guarded_call"
    assert run.input["scope"] == "openai-agents:ticket-7"
    assert run.input["call_id"] == model.issued[0] == "call_1"
    [effect] = rt.effects()
    assert effect.external_effect_id == sent["id"]


def test_a_confirmed_call_replayed_from_a_saved_run_state_answers_from_the_record(
    rt: ef.Runtime,
) -> None:
    """The application saved the run at its approval and resumes that saved state twice (a
    retried request, a second worker): the second resume gets the recorded result, and the
    provider holds one refund."""
    agent, _ = _agent(rt, refund, REFUND)
    first = _run(agent, "refund it")
    [item] = first.interruptions
    saved = first.to_state()
    saved.approve(item)
    serialized = saved.to_string()
    for _ in range(2):
        state = asyncio.run(RunState.from_string(agent, serialized))
        resumed = _run(agent, state)
        [out] = _outputs(resumed)
        assert out["status"] == "done"
    [refunded] = records()
    assert out["result"] == refunded
    assert len(rt.effects()) == 1


# -- lost answers -----------------------------------------------------------------------------------


def test_a_lost_response_is_settled_by_the_lookup(rt: ef.Runtime) -> None:
    """The provider committed and the answer was lost: the lookup finds it by key; the model
    gets the committed record, and nothing is sent twice."""
    agent, _ = _agent(rt, send_lost, SEND)
    result = _run(agent, "go")
    [sent] = records()
    assert _outputs(result) == [{"status": "done", "happened": True, "result": sent}]
    [effect] = rt.effects()
    assert effect.status is ef.StepStatus.CONFIRMED


def test_an_outcome_nobody_can_look_up_is_phrased_for_the_model_and_listed_for_a_person(
    rt: ef.Runtime,
) -> None:
    """Without a lookup the call may or may not have happened: the model is told not to repeat
    it; a person sees it in ``rt.attention()``; once resolved, a replay of the same call answers
    with the recorded result instead of sending again."""
    agent, _ = _agent(rt, send_untagged, SEND)
    result = _run(agent, "go")
    [out] = _outputs(result)
    assert out["status"] == "unknown"
    assert out["happened"] is None
    assert "do not repeat it" in out["message"]
    [item] = rt.attention()
    assert item.effect_id == out["effect_id"]
    [written] = records()
    rt.resolve(out["effect_id"], committed=True, evidence={"result": written}, by="alice")
    # The same tool call again (the same id: the saved conversation replayed).
    replay = Model("oa_untagged", SEND)
    replay.ids = itertools.count(1)
    again, _ = _agent(rt, send_untagged, SEND, model=replay)
    result = _run(again, "go")
    [out] = _outputs(result)
    assert out["status"] == "done"
    assert len(records()) == 1


# -- regenerated calls ------------------------------------------------------------------------------


def test_a_regenerated_call_id_is_deduplicated_within_the_conversation(
    rt: ef.Runtime,
) -> None:
    """The turn was lost and re-run: the model asked again issues a new tool-call id for the same
    message. It is the first call's operation: answered as already done, one message sent."""
    agent, model = _agent(rt, send, SEND)
    _run(agent, "go")
    result = _run(agent, "go")  # the same request again: its first answer was lost
    assert model.issued == ["call_1", "call_2"]
    [out] = _outputs(result)
    assert out["status"] == "already_done"
    assert out["happened"] is True
    assert out["result"] == records()[0]
    assert len(records()) == 1


def test_a_repeat_the_conversation_shows_the_result_of_is_a_new_request(
    rt: ef.Runtime,
) -> None:
    """The conversation (the run's input) shows the first message's result, and the model sends
    it again: that is the model asking knowingly, a second message."""
    agent, _ = _agent(rt, send, SEND)
    first = _run(agent, "go")
    second = _run(agent, [*first.to_input_list(), {"role": "user", "content": "again"}])
    assert [o["status"] for o in _outputs(second)] == ["done", "done"]
    assert len(records()) == 2


def test_another_conversation_is_another_scope(rt: ef.Runtime) -> None:
    """The same message in two conversations is two requests."""
    agent, _ = _agent(rt, send, SEND, scope="ticket-7")
    other, _ = _agent(rt, send, SEND, scope="ticket-8")
    _run(agent, "go")
    _run(other, "go")
    assert len(records()) == 2
