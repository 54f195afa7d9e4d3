"""Pydantic AI agents with effectflow's ``Effectflow`` capability: the real package, its own test
models (``FunctionModel``, ``TestModel``; no network), the provider's own records as the proof."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import effectflow as ef
from contrib import host_world
from effectflow.contrib import pydantic_ai as ef_pai

PROVIDER = host_world.Provider()
records = PROVIDER.records
_commit = PROVIDER.commit
TOOLS = host_world.declare("pai", PROVIDER)
find, send, send_lost, send_untagged, refund = (
    TOOLS.find,
    TOOLS.send,
    TOOLS.send_lost,
    TOOLS.send_untagged,
    TOOLS.refund,
)


SEND = {"to": "a@example.com", "text": "hi"}
REFUND = {"order": "o1", "amount": 300}


class Scripted:
    """A ``FunctionModel`` function that behaves like a real model where it matters: asked
    without a tool result it calls ``tool`` (a fresh tool-call id every time it is asked); given
    one, it answers with the result. ``again`` makes it ask for the same call once more after
    seeing the first result (a repeat it makes knowingly)."""

    def __init__(self, tool: str, args: dict[str, Any], *, again: bool = False) -> None:
        self.tool, self.args, self.again = tool, args, again
        self.ids = itertools.count(1)
        self.asked: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            p
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]
        last = messages[-1]
        answered = isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        )
        if answered and not (self.again and len(returns) < 2):
            return ModelResponse(parts=[TextPart(f"tool said: {json.dumps(returns[-1].content)}")])
        call_id = f"call_{next(self.ids)}"
        self.asked.append(call_id)
        return ModelResponse(parts=[ToolCallPart(self.tool, self.args, tool_call_id=call_id)])


@pytest.fixture(autouse=True)
def close_run_sync_loop() -> Iterator[None]:
    """``Agent.run_sync`` leaves the event loop it made set on the main thread (Pydantic AI's
    ``_utils.get_event_loop``); closed after each test, it is not collected unclosed later (a
    ResourceWarning, which fails the session under ``filterwarnings = error``)."""
    yield
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return  # none is set (the test ran none, or closed its own)
    loop.close()
    asyncio.set_event_loop(None)


@pytest.fixture(autouse=True)
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "provider.jsonl"
    PROVIDER.file = path
    return path


@pytest.fixture
def rt(any_ledger: str) -> Iterator[ef.Runtime]:
    with ef.Runtime(any_ledger) as runtime:
        yield runtime


@pytest.fixture
def sqlite_rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        yield runtime


def _agent(
    rt: ef.Runtime, tool: ef.Tool[..., Any], args: dict[str, Any], **kw: Any
) -> tuple[Agent[None, Any], Scripted]:
    model = Scripted(tool.name, args, again=kw.pop("again", False))
    agent = Agent(
        FunctionModel(model),
        capabilities=[ef_pai.Effectflow(rt, tools=[tool], **kw)],
        output_type=[str, DeferredToolRequests],
    )
    return agent, model


def _returns(messages: list[ModelMessage]) -> list[Any]:
    """The tool returns the model was given, in order."""
    return [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def _guarded_runs(rt: ef.Runtime) -> dict[str, ef.RunStatus]:
    return {r.input["call_id"]: r.status for r in rt.runs()}


# -- the tools, as the model sees them ---------------------------------------------------------------


def test_ef_tools_become_function_tools_without_the_runtime_parameters(
    sqlite_rt: ef.Runtime,
) -> None:
    """Name, description and JSON schema come from the contract and signature; the key the runtime
    injects is hidden from the model; a non-tool is refused."""
    capability = ef_pai.Effectflow(sqlite_rt, tools=[refund, send])
    toolset = capability.get_toolset()
    assert toolset.id == ef_pai.TOOLSET_ID
    assert sorted(toolset.tools) == ["pai_refund", "pai_send"]
    definition = toolset.tools["pai_refund"].tool_def
    assert definition.description is not None
    assert definition.description.startswith("Refund an order.")
    assert "waits for a person's approval" in definition.description
    schema = definition.parameters_json_schema
    assert schema["properties"] == {"order": {"type": "string"}, "amount": {"type": "integer"}}
    assert schema["required"] == ["order", "amount"]
    assert "idempotency_key" not in json.dumps(schema)
    with pytest.raises(ef.ContractError, match="not a tool"):
        ef_pai.Effectflow(sqlite_rt, tools=[lambda: None])  # type: ignore[list-item]


# -- one call, and its replays -------------------------------------------------------------------


def test_an_agent_with_the_capability_makes_the_call_once(rt: ef.Runtime) -> None:
    """One tool call, one effect; the model gets the recorded result; the ledger names the
    conversation as the scope and the model's tool-call id as the call."""
    agent, _ = _agent(rt, send, SEND)
    result = agent.run_sync("go")
    [sent] = records()
    assert _returns(result.all_messages()) == [{"status": "done", "happened": True, "result": sent}]
    assert result.output.startswith("tool said:")
    [run] = rt.runs()
    assert run.workflow == "effectflow.guarded_call"
    assert run.input["scope"] == f"pydantic_ai:{result.conversation_id}"
    assert run.input["call_id"] == "call_1"
    [effect] = rt.effects()
    assert effect.external_effect_id == sent["id"]


def test_testmodel_calls_the_guarded_tool_with_arguments_from_its_schema(
    sqlite_rt: ef.Runtime,
) -> None:
    """Pydantic AI's ``TestModel`` fills the arguments from the JSON schema the capability
    published and gets the recorded result back."""
    agent = Agent(TestModel(), capabilities=[ef_pai.Effectflow(sqlite_rt, tools=[send])])
    result = agent.run_sync("go")
    [sent] = records()
    assert set(sent) == {"id", "key", "to", "text"}
    assert _returns(result.all_messages()) == [{"status": "done", "happened": True, "result": sent}]
    assert len(sqlite_rt.runs()) == 1


def test_a_confirmed_call_replayed_by_the_host_is_answered_from_the_record(rt: ef.Runtime) -> None:
    """The host runs the same tool call again (its history kept the model's turn, not the tool's
    result, as after a crash): the ledger answers with the recorded result; the provider is not
    called again."""
    agent, model = _agent(rt, send, SEND)
    first = agent.run_sync("go")
    before_tools = first.all_messages()[:2]  # the prompt, and the model's turn with call_1
    assert isinstance(before_tools[-1], ModelResponse)
    replayed = agent.run_sync(message_history=before_tools)
    [sent] = records()
    assert _returns(replayed.all_messages()) == [
        {"status": "done", "happened": True, "result": sent}
    ]
    assert model.asked == ["call_1"], "the replay ran the recorded call; the model was not asked"
    assert _guarded_runs(rt) == {"call_1": ef.RunStatus.SUCCEEDED}


def test_a_regenerated_call_id_is_deduplicated_and_the_model_is_told(rt: ef.Runtime) -> None:
    """The host lost the model's turn and asked again in the same conversation: a fresh tool-call
    id for the same action. It is not done again, and the model is told it already was."""
    agent, model = _agent(rt, send, SEND)
    first = agent.run_sync("go")
    # Everything after the prompt is lost; the same prompt is asked again in the conversation.
    again = agent.run_sync("go", conversation_id=first.conversation_id)
    assert model.asked == ["call_1", "call_2"]
    [sent] = records()
    [answer] = _returns(again.all_messages())
    assert answer["status"] == "already_done"
    assert answer["result"] == sent
    assert answer["message"] == ef_pai.ALREADY_DONE
    assert _guarded_runs(rt) == {"call_1": ef.RunStatus.SUCCEEDED, "call_2": ef.RunStatus.SUCCEEDED}


def test_a_repeat_the_conversation_still_shows_is_a_new_request(rt: ef.Runtime) -> None:
    """The model asks for the same call again having seen the first result: a new request (two
    effects), unlike a call regenerated after a lost turn (one;
    docs/concepts.md#regenerated-calls)."""
    agent, model = _agent(rt, send, SEND, again=True)
    result = agent.run_sync("go")
    assert model.asked == ["call_1", "call_2"]
    assert [r["status"] for r in _returns(result.all_messages())] == ["done", "done"]
    assert len(records()) == 2


def test_the_async_run_is_the_same_call(sqlite_rt: ef.Runtime) -> None:
    """``await agent.run`` makes the call once, and a replay of the same call calls nothing."""
    agent, _ = _agent(sqlite_rt, send, SEND)

    async def main() -> list[Any]:
        first = await agent.run("go")
        replayed = await agent.run(message_history=first.all_messages()[:2])
        return _returns(replayed.all_messages())

    [answer] = asyncio.run(main())
    [sent] = records()
    assert answer == {"status": "done", "happened": True, "result": sent}


# -- outcomes nobody saw -------------------------------------------------------------------------------


def test_a_lost_response_is_settled_by_the_lookup_without_a_person(rt: ef.Runtime) -> None:
    """The provider committed and the answer was lost: the lookup finds it, the model gets it,
    nothing is sent twice and nothing is deferred."""
    agent, _ = _agent(rt, send_lost, SEND)
    result = agent.run_sync("go")
    assert isinstance(result.output, str)
    [sent] = records()
    assert _returns(result.all_messages()) == [{"status": "done", "happened": True, "result": sent}]


def test_an_in_doubt_call_is_deferred_and_the_resolution_is_its_result(rt: ef.Runtime) -> None:
    """No lookup can tell: the run ends with ``DeferredToolRequests`` naming the effect; the
    person's ``committed`` decision goes into ``rt.resolve`` and its evidence is the result the
    model gets; nothing is sent twice."""
    agent, _ = _agent(rt, send_untagged, SEND)
    first = agent.run_sync("go")
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    [pending] = requests.approvals
    asked = requests.metadata[pending.tool_call_id]
    assert asked[ef_pai.PAYLOAD_MARK] is True
    assert asked["kind"] == "in_doubt"
    assert asked["next_action"] == "resolve"
    assert "may or may not have happened" in asked["for_model"]
    [held] = records()
    [effect] = rt.effects()
    assert asked["effect_id"] == effect.effect_id
    decision = {"committed": True, "evidence": {"result": held}, "by": "ops"}
    done = agent.run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=ef_pai.answer(requests, {pending.tool_call_id: decision}),
    )
    assert _returns(done.all_messages()) == [{"status": "done", "happened": True, "result": held}]
    assert len(records()) == 1
    assert rt.effects()[0].status is ef.StepStatus.CONFIRMED
    assert any(e.actor == "ops" for e in rt.audit(asked["run_id"]))


def test_without_deferral_the_model_is_told_it_is_being_checked(sqlite_rt: ef.Runtime) -> None:
    """``defer=False``: the run goes on and the model hears the phrase meant for it."""
    agent, _ = _agent(sqlite_rt, send_untagged, SEND, defer=False)
    result = agent.run_sync("go")
    assert isinstance(result.output, str)
    [answer] = _returns(result.all_messages())
    assert answer["status"] == "unknown"
    assert answer["happened"] is None
    assert "do not repeat it" in answer["message"]
    assert len(records()) == 1


# -- approvals through deferred tools ------------------------------------------------------------


def test_an_approval_is_a_deferred_tool_and_the_answer_approves_it(rt: ef.Runtime) -> None:
    """A financial write ends the run with ``DeferredToolRequests``; the person's answer resumes
    it, goes into ``rt.approve`` (audited with the approver) and the call runs once."""
    agent, _ = _agent(rt, refund, REFUND)
    first = agent.run_sync("go")
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    [pending] = requests.approvals
    asked = requests.metadata["call_1"]
    assert asked["kind"] == "approval"
    assert asked["next_action"] == "approve"
    assert asked["tool"].startswith("pai_refund")
    assert asked["tool_call_id"] == pending.tool_call_id == "call_1"
    assert asked["run_id"] == rt.runs()[0].run_id
    assert records() == []
    results = ef_pai.answer(requests, {"call_1": {"approved": True, "approver": "alice"}})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    [answer] = _returns(done.all_messages())
    assert answer["status"] == "done"
    assert answer["result"]["order"] == "o1"
    assert len(records()) == 1
    assert [e.actor for e in rt.audit(asked["run_id"]) if e.kind == "approved"] == ["alice"]


def test_a_declined_approval_is_not_done_and_the_model_is_told(rt: ef.Runtime) -> None:
    """``approved: False`` is ``rt.reject``: the call is never made, its step is ``rejected`` by
    that person (audited), and the model hears a person said no and why."""
    agent, _ = _agent(rt, refund, REFUND)
    first = agent.run_sync("go")
    no = {"approved": False, "approver": "bob", "reason": "over the limit"}
    done = agent.run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=ef_pai.answer(first.output, {"call_1": no}),
    )
    assert _returns(done.all_messages()) == [
        {
            "status": "declined",
            "happened": False,
            "error": ef_pai.DECLINED,
            "reason": "over the limit",
        }
    ]
    assert records() == []
    [run] = rt.runs()
    [step] = rt.steps(run.run_id)
    assert step.status is ef.StepStatus.REJECTED
    [declined] = [e for e in rt.audit(run.run_id) if e.kind == "approval_declined"]
    assert declined.actor == "bob"
    assert rt.attention() == []


def test_pydantic_ais_own_tool_denied_is_recorded_as_the_decline(sqlite_rt: ef.Runtime) -> None:
    """A plain ``ToolDenied`` never reaches the tool; the capability records it in the ledger, so
    the call does not wait for an approval nobody will give."""
    agent, _ = _agent(sqlite_rt, refund, REFUND)
    first = agent.run_sync("go")
    denied = DeferredToolResults(approvals={"call_1": ToolDenied("not today")})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=denied)
    assert _returns(done.all_messages()) == ["not today"]
    assert records() == []
    [run] = sqlite_rt.runs()
    [step] = sqlite_rt.steps(run.run_id)
    assert step.status is ef.StepStatus.REJECTED
    [declined] = [e for e in sqlite_rt.audit(run.run_id) if e.kind == "approval_declined"]
    assert declined.actor == ef_pai.capability.TOOL_DENIED_BY
    assert sqlite_rt.attention() == []


def test_an_approval_that_says_nobody_is_asked_again_and_the_next_one_applies(
    sqlite_rt: ef.Runtime,
) -> None:
    """The audit log records who decided: a bare ``ToolApproved`` (or a decision without its
    approver) changes nothing and the call is deferred again, saying why; the corrected answer
    is the one applied."""
    agent, _ = _agent(sqlite_rt, refund, REFUND)
    first = agent.run_sync("go")
    bare = DeferredToolResults(approvals={"call_1": ToolApproved()})
    again = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=bare)
    assert isinstance(again.output, DeferredToolRequests)
    assert "approved without a decision" in again.output.metadata["call_1"]["refused"]
    nameless = ef_pai.answer(again.output, {"call_1": {"approved": True}})
    third = agent.run_sync(message_history=again.all_messages(), deferred_tool_results=nameless)
    assert isinstance(third.output, DeferredToolRequests)
    assert "must say who made it" in third.output.metadata["call_1"]["refused"]
    assert records() == []
    assert sqlite_rt.runs()[0].status is ef.RunStatus.PAUSED
    ok = ef_pai.answer(third.output, {"call_1": {"approved": True, "approver": "alice"}})
    done = agent.run_sync(message_history=third.all_messages(), deferred_tool_results=ok)
    [answer] = _returns(done.all_messages())
    assert answer["status"] == "done"
    assert len(records()) == 1


def test_an_approval_given_elsewhere_lets_the_call_go_on(sqlite_rt: ef.Runtime) -> None:
    """Approved in the console or the CLI (``rt.approve``): the resumed run answers with ``{}``
    ("decided elsewhere") and the call runs once, with the approval already recorded; the same
    ``{}`` before anyone decided defers the call again, saying so."""
    agent, _ = _agent(sqlite_rt, refund, REFUND)
    early = agent.run_sync("go")
    too_soon = agent.run_sync(
        message_history=early.all_messages(),
        deferred_tool_results=ef_pai.answer(early.output, {"call_1": {}}),
    )
    assert isinstance(too_soon.output, DeferredToolRequests)
    assert "approved without a decision" in too_soon.output.metadata["call_1"]["refused"]
    assert records() == []
    first = too_soon
    asked = first.output.metadata["call_1"]
    sqlite_rt.approve(asked["run_id"], asked["step_id"], approver="carol", approval_id="a-1")
    assert len(records()) == 1, "the approval ran the call: the ledger's run went on"
    done = agent.run_sync(
        message_history=first.all_messages(),
        deferred_tool_results=ef_pai.answer(first.output, {"call_1": {}}),
    )
    [answer] = _returns(done.all_messages())
    assert answer["status"] == "done"
    assert answer["result"] == records()[0]
    assert len(records()) == 1


def test_parallel_approvals_are_two_deferred_calls_answered_together(
    sqlite_rt: ef.Runtime,
) -> None:
    """Two refunds in one model response wait for two approvals; one answer resumes both, and
    each call runs once."""

    def two_refunds(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if _returns(messages):
            return ModelResponse(parts=[TextPart("ok")])
        return ModelResponse(
            parts=[
                ToolCallPart("pai_refund", {"order": o, "amount": 5}, tool_call_id=f"call_{o}")
                for o in ("a", "b")
            ]
        )

    agent = Agent(
        FunctionModel(two_refunds),
        capabilities=[ef_pai.Effectflow(sqlite_rt, tools=[refund])],
        output_type=[str, DeferredToolRequests],
    )
    first = agent.run_sync("go")
    requests = first.output
    assert sorted(c.tool_call_id for c in requests.approvals) == ["call_a", "call_b"]
    yes = {"approved": True, "approver": "alice"}
    results = ef_pai.answer(requests, {"call_a": yes, "call_b": yes})
    done = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert done.output == "ok"
    assert sorted(r["result"]["order"] for r in _returns(done.all_messages())) == ["a", "b"]
    assert sorted(r["order"] for r in records()) == ["a", "b"]


def test_answer_refuses_a_call_effectflow_does_not_wait_for(sqlite_rt: ef.Runtime) -> None:
    """A decision for a tool-call id that is not one of effectflow's pending calls is refused
    before anything is resumed."""
    agent, _ = _agent(sqlite_rt, refund, REFUND)
    first = agent.run_sync("go")
    with pytest.raises(ef.ArgumentError, match="no effectflow call waits"):
        ef_pai.answer(first.output, {"call_9": {"approved": True, "approver": "a"}})


# -- what the capability leaves alone ------------------------------------------------------------


def test_arguments_the_schema_refuses_go_back_to_the_model_and_record_nothing(
    sqlite_rt: ef.Runtime,
) -> None:
    """A model's malformed call is refused before any intent; the model is asked to fix it."""
    agent, _ = _agent(sqlite_rt, send, {"to": "a"})
    result = agent.run_sync("go")
    [retry] = [
        p
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]
    assert retry.outcome == "retried"
    assert "'text' is a required property" in str(retry.content)
    assert sqlite_rt.runs() == []
    assert records() == []


def test_the_agents_other_tools_run_as_pydantic_ai_runs_them(sqlite_rt: ef.Runtime) -> None:
    """A tool effectflow does not back is the user's own, unchanged; it records nothing."""

    def echo(text: str) -> str:
        """Echo."""
        return f"echo {text}"

    model = Scripted("echo", {"text": "x"})
    agent = Agent(
        FunctionModel(model),
        tools=[echo],
        capabilities=[ef_pai.Effectflow(sqlite_rt, tools=[send])],
    )
    result = agent.run_sync("go")
    assert _returns(result.all_messages()) == ["echo x"]
    assert sqlite_rt.runs() == []
    assert records() == []


def test_conversation_call_ids_count_only_calls_whose_result_the_model_saw() -> None:
    """A call answered with its result counts; one the model was told may have happened, one
    denied, one without an answer, and the current call do not."""
    calls = [
        ToolCallPart("t", {}, tool_call_id=i) for i in ("done", "unknown", "denied", "open", "now")
    ]
    messages: list[ModelMessage] = [
        ModelResponse(parts=list(calls)),
        ModelRequest(
            parts=[
                ToolReturnPart("t", {"status": "done", "happened": True}, tool_call_id="done"),
                ToolReturnPart("t", {"status": "unknown", "happened": None}, "unknown"),
                ToolReturnPart("t", "no", tool_call_id="denied", outcome="denied"),
                ToolReturnPart("t", "plain result", tool_call_id="now"),
            ]
        ),
    ]
    assert ef_pai.conversation_call_ids(messages, "now") == {"done"}


def test_without_pydantic_ai_the_import_names_the_extra_to_install() -> None:
    """The integration is optional: where Pydantic AI is missing, importing it says which extra
    to install (core effectflow imports it nowhere)."""
    code = (
        "import sys\n"
        "sys.modules['pydantic_ai'] = None  # as if not installed\n"
        "import effectflow\n"
        "try:\n"
        "    import effectflow.contrib.pydantic_ai\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'effectflow[pydantic-ai]'" in done.stdout
