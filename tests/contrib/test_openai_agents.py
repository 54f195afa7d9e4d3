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
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import ModelBehaviorError, UserError
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message
from agents.testing import function_call as model_function_call

import effectflow as ef
from contrib import host_world
from effectflow.contrib import openai_agents as ef_agents
from effectflow.runtime.guard import request_digest

set_tracing_disabled(True)

PROVIDER = host_world.Provider()
records = PROVIDER.records
_commit = PROVIDER.commit
TOOLS = host_world.declare("oa", PROVIDER)
find, send, send_lost, send_untagged, refund = (
    TOOLS.find,
    TOOLS.send,
    TOOLS.send_lost,
    TOOLS.send_untagged,
    TOOLS.refund,
)


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
    PROVIDER.file = path
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


def _run_with(agent: Agent[Any], input: Any, context: Any) -> Any:
    """``Runner.run`` with the application's own context object."""
    return asyncio.run(Runner.run(agent, input, context=context))


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

    @function_tool(name_override="oa_send", needs_approval=True)
    def asks_first(to: str, text: str) -> str:
        raise AssertionError("the contract's function makes the call, not this one")

    [kept] = ef_agents.effectflow_tools(rt, [asks_first], scope="ticket-7")
    assert kept.needs_approval is True, "a contract without approval keeps the tool's own"

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
    # The same tool call again (a fresh model numbers its calls from 1: the same id, as when the
    # saved conversation is replayed).
    again, _ = _agent(rt, send_untagged, SEND, model=Model("oa_untagged", SEND))
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


# -- approvals --------------------------------------------------------------------------------------


@ef.tool(
    "oa_refund",
    version=2,
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
)
def refund_v2(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order (the contract's second version: its approval rules changed)."""
    return _commit("rf", idempotency_key, order=order, amount=amount)


class AsksAgainModel(Model):
    """A model that, told its call was not done (``again_on`` in the tool's output), calls the
    tool again with a new id."""

    def __init__(
        self, tool: str, args: dict[str, Any], again_on: str = "approval_outdated"
    ) -> None:
        super().__init__(tool, args)
        self.again_on = again_on

    def _respond(self, call: ModelCall) -> list[Any]:
        last = call.input[-1] if isinstance(call.input, list) and call.input else {}
        output = str(last.get("output", "")) if isinstance(last, dict) else ""
        if self.again_on in output and len(self.issued) < 2:
            call_id = f"{self.prefix}_{next(self.ids)}"
            self.issued.append(call_id)
            return [model_function_call(self.tool, self.args, call_id=call_id)]
        return super()._respond(call)


def _resume(agent: Agent[Any], serialized: str) -> Any:
    state = asyncio.run(RunState.from_string(agent, serialized))
    return _run(agent, state)


def _approved(result: Any) -> str:
    """The run state with every interruption approved (``RunState.approve``), serialized as an
    application stores it until the person answered."""
    assert result.interruptions, "the run did not stop for an approval"
    state = result.to_state()
    for item in result.interruptions:
        state.approve(item)
    serialized: str = state.to_string()
    return serialized


def test_a_call_that_needs_approval_stops_the_run_and_is_made_once_approved(
    rt: ef.Runtime,
) -> None:
    """The contract's approval is the SDK's ``needs_approval``: the run stops with the call as
    an interruption and nothing sent; the ledger lists the request for a person; approved through
    ``RunState.approve`` and resumed, the refund is made once, and the ledger's approval names the
    approver and the exact request."""
    agent, _ = _agent(rt, refund, REFUND, approver=lambda ctx: ctx.context["user"])
    first = _run_with(agent, "refund it", {"user": "alice"})
    [item] = first.interruptions
    assert (item.tool_name, json.loads(item.arguments)) == ("oa_refund", REFUND)
    assert records() == []
    [waiting] = rt.attention()
    assert waiting.run_id is not None
    resumed = _resume(agent, _approved(first))
    [refunded] = records()
    assert _outputs(resumed) == [{"status": "done", "happened": True, "result": refunded}]
    [run] = rt.runs()
    [approval] = rt.store.approvals(run.run_id, "call")
    assert approval.approver == "alice"
    [effect] = rt.effects()
    assert approval.request_digest == effect.request_digest == request_digest(refund, REFUND)
    assert rt.attention() == []


def test_a_call_declined_through_the_sdk_is_never_made(rt: ef.Runtime) -> None:
    """``RunState.reject``: the SDK tells the model and calls nothing, so the provider never sees
    the refund. The ledger hears of it when the model asks again for the same refund: the old
    request is declined there from the SDK's record, and the new one waits for its own approval."""
    model = AsksAgainModel("oa_refund", REFUND, again_on="not this one")
    agent, _ = _agent(rt, refund, REFUND, model=model)
    first = _run(agent, "refund it")
    state = first.to_state()
    [item] = first.interruptions
    state.reject(item, rejection_message="not this one")
    resumed = _run(agent, state)
    assert records() == []
    [again] = resumed.interruptions
    assert again.call_id == model.issued[1] == "call_2"
    by_call = {r.input["call_id"]: r for r in rt.runs()}
    [declined] = rt.steps(by_call["call_1"].run_id)
    assert declined.status is ef.StepStatus.REJECTED
    assert "not this one" in str(declined.error)
    [waiting] = rt.attention()
    assert waiting.run_id == by_call["call_2"].run_id


def test_reject_declines_in_the_sdk_and_the_ledger_at_once(rt: ef.Runtime) -> None:
    """``ef_agents.reject``: the model is told the reason, nothing is sent, and nothing is left
    waiting for an approval in the ledger."""
    agent, _ = _agent(rt, refund, REFUND)
    first = _run(agent, "refund it")
    assert len(rt.attention()) == 1
    state = first.to_state()
    [item] = first.interruptions
    ef_agents.reject(rt, state, item, scope="ticket-7", by="bob", reason="not this one")
    resumed = _run(agent, state)
    assert records() == []
    assert "not this one" in resumed.final_output
    assert rt.attention() == []
    [run] = rt.runs()
    [step] = rt.steps(run.run_id)
    assert step.status is ef.StepStatus.REJECTED


def test_an_approval_given_under_a_policy_since_changed_is_refused_and_asked_again(
    rt: ef.Runtime,
) -> None:
    """openai/openai-agents-python#4896: approved, saved, and the approval policy changed before
    the run resumed. The SDK keeps its approval; effectflow re-checks it on resume: nothing is
    sent, the model is told a new approval is needed, its new call stops the run again, and only
    the approval under the current policy makes the refund."""
    policy = {"version": "refund-limits-1"}
    model = AsksAgainModel("oa_refund", REFUND)
    agent, _ = _agent(rt, refund, REFUND, model=model, policy=lambda ctx: policy["version"])
    first = _run(agent, "refund it")
    serialized = _approved(first)
    policy["version"] = "refund-limits-2"  # while the run was paused
    resumed = _resume(agent, serialized)
    assert records() == []
    [outdated] = _outputs(resumed)
    assert outdated["status"] == "approval_outdated"
    assert outdated["happened"] is False
    [again] = resumed.interruptions  # the model's new call: a new approval under the new policy
    assert again.call_id == model.issued[1] != model.issued[0]
    old = next(r for r in rt.runs() if model.issued[0] in r.input["call_id"])
    [old_step] = rt.steps(old.run_id)
    assert old_step.status is ef.StepStatus.REJECTED
    assert "policy changed" in str(old_step.error)
    assert ef_agents.RECHECK in str(old_step.error), "declined by the re-check, not a person"
    final = _resume(agent, _approved(resumed))
    [refunded] = records()
    assert _outputs(final)[-1] == {"status": "done", "happened": True, "result": refunded}
    new = next(r for r in rt.runs() if model.issued[1] in r.input["call_id"])
    assert ef_agents.split_call_id(new.input["call_id"]) == (model.issued[1], "refund-limits-2")
    assert len(rt.store.approvals(new.run_id, "call")) == 1


def _with_amount(serialized: str, amount: int, *, keep_sdk_fingerprint: bool) -> str:
    """The saved run state with the refund's amount changed while it waited. The SDK fingerprints
    each tool invocation in its state; an edit that drops that record (a state written without
    one) leaves the SDK nothing to compare."""
    state = json.loads(serialized.replace('\\"amount\\":30', f'\\"amount\\":{amount}'))
    if not keep_sdk_fingerprint:
        state["context"].pop("tool_invocations", None)
    return json.dumps(state)


def test_an_approval_of_a_changed_payload_is_never_spent_on_it(rt: ef.Runtime) -> None:
    """The saved run state was changed while it waited (the amount approved is not the amount
    resumed). The SDK catches an edit its fingerprint covers; without one it asks again. Approved
    again there, the call still names the tool-call id the ledger recorded with the first amount:
    effectflow refuses to make another request under it. Nothing is sent, the first request is
    declined in the ledger, and the model is told to ask for a new approval."""
    agent, _ = _agent(rt, refund, REFUND)
    serialized = _approved(_run(agent, "refund it"))
    with pytest.raises(ModelBehaviorError):
        _resume(agent, _with_amount(serialized, 3000, keep_sdk_fingerprint=True))
    asked_again = _resume(agent, _with_amount(serialized, 3000, keep_sdk_fingerprint=False))
    [item] = asked_again.interruptions
    assert json.loads(item.arguments)["amount"] == 3000
    resumed = _resume(agent, _approved(asked_again))
    assert records() == []
    [out] = _outputs(resumed)
    assert out["status"] == "approval_outdated"
    [run] = rt.runs()
    assert run.input["arguments"] == REFUND
    [step] = rt.steps(run.run_id)
    assert step.status is ef.StepStatus.REJECTED
    assert "request changed" in str(step.error)
    assert rt.store.approvals(run.run_id, "call") == []


def test_an_approval_given_under_another_contract_version_is_refused(rt: ef.Runtime) -> None:
    """Without an explicit policy the contract is the policy: a run approved under ``oa_refund@1``
    resumed after the application moved to ``oa_refund@2`` sends nothing."""
    agent, _ = _agent(rt, refund, REFUND)
    serialized = _approved(_run(agent, "refund it"))
    upgraded, _ = _agent(rt, refund_v2, REFUND)
    resumed = _resume(upgraded, serialized)
    assert records() == []
    assert [o["status"] for o in _outputs(resumed)] == ["approval_outdated"]


def test_arguments_the_schema_rejects_are_refused_before_anything_is_recorded(
    rt: ef.Runtime,
) -> None:
    """A model's call that does not fit the tool's JSON schema is answered ``refused`` and
    never reaches the ledger or the provider."""
    agent, _ = _agent(rt, send, {"to": 7, "text": "hi"})
    result = _run(agent, "go")
    [out] = _outputs(result)
    assert out["status"] == "refused"
    assert out["happened"] is False
    assert "is not of type 'string'" in out["error"]
    assert rt.runs() == []
    assert records() == []


def _parallel_model(calls: list[tuple[str, dict[str, Any]]]) -> Model:
    """A model whose first answer holds several tool calls at once (the SDK runs them
    concurrently), then text."""

    class Parallel(Model):
        def _respond(self, call: ModelCall) -> list[Any]:
            if self.issued:
                return [assistant_message("done")]
            self.issued = [f"call_p{i}" for i in range(len(calls))]
            return [
                model_function_call(name, args, call_id=call_id)
                for (name, args), call_id in zip(calls, self.issued, strict=True)
            ]

    return Parallel(calls[0][0], calls[0][1])


def test_parallel_calls_of_one_response_are_each_made_once(rt: ef.Runtime) -> None:
    """Two different messages in one model response: two guarded calls, two messages; the same
    message twice in one response (a model's stutter): one message, the second call answered with
    the first one's result."""
    other = {"to": "b@example.com", "text": "hi"}
    agent, _ = _agent(
        rt, send, SEND, model=_parallel_model([("oa_send", SEND), ("oa_send", other)])
    )
    result = _run(agent, "go")
    assert sorted(o["status"] for o in _outputs(result)) == ["done", "done"]
    assert sorted(r["to"] for r in records()) == ["a@example.com", "b@example.com"]
    twice = _parallel_model([("oa_send", SEND), ("oa_send", SEND)])
    agent, _ = _agent(rt, send, SEND, scope="ticket-9", model=twice)
    result = _run(agent, "go")
    assert sorted(o["status"] for o in _outputs(result)) == ["already_done", "done"]
    assert sorted(r["to"] for r in records()) == ["a@example.com", "a@example.com", "b@example.com"]


def test_with_a_session_a_repeat_after_the_result_is_a_new_request(rt: ef.Runtime) -> None:
    """The SDK's ``SQLiteSession`` gives each run the conversation so far: the model that sends
    the message again after it saw the result asks knowingly, and a second message is sent."""

    async def two_turns() -> list[dict[str, Any]]:
        session = SQLiteSession("ticket-7")
        try:
            agent, _ = _agent(rt, send, SEND)
            await Runner.run(agent, "go", session=session)
            return _outputs(await Runner.run(agent, "again", session=session))
        finally:
            session.close()

    assert [o["status"] for o in asyncio.run(two_turns())][-1] == "done"
    assert len(records()) == 2
