"""LangChain v1 ``create_agent`` and LangGraph ``ToolNode`` with effectflow's middleware: the real
packages, a scripted chat model (no network), the provider's own records as the proof."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command
from pydantic import Field

import effectflow as ef
from contrib import host_world
from effectflow.contrib import langgraph as ef_langgraph

PROVIDER = host_world.Provider()
records = PROVIDER.records
_commit = PROVIDER.commit
TOOLS = host_world.declare("lg", PROVIDER)
find, send, send_lost, send_untagged, refund = (
    TOOLS.find,
    TOOLS.send,
    TOOLS.send_lost,
    TOOLS.send_untagged,
    TOOLS.refund,
)


SEND = {"to": "a@example.com", "text": "hi"}


class ScriptedModel(BaseChatModel):
    """Like a real model: asked without a tool result, it calls the tool (with a fresh tool-call
    id every time it is asked); given a tool result, it answers with that result's text."""

    tool: str
    args: dict[str, Any]
    ids: Any = Field(default_factory=lambda: itertools.count(1))
    asked: list[int] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.asked.append(len(messages))
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"tool said: {messages[-1].content}")
        else:
            call = {"name": self.tool, "args": self.args, "id": f"call_{next(self.ids)}"}
            reply = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


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


def _agent(rt: ef.Runtime, tool: ef.Tool[..., Any], args: dict[str, Any], **kw: Any) -> Any:
    model = ScriptedModel(tool=tool.name, args=args)
    middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[tool], **kw)
    return create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())


def _ask(agent: Any, thread: str = "T1") -> tuple[dict[str, Any], dict[str, Any]]:
    config = {"configurable": {"thread_id": thread}}
    return agent.invoke({"messages": [{"role": "user", "content": "go"}]}, config), config


def _tool_messages(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


# -- the tool, both ways ----------------------------------------------------------------------------


def test_an_ef_tool_becomes_a_langchain_tool_without_the_runtime_parameters_and_back() -> None:
    """Name, description and argument schema come from the contract and signature; the key the
    runtime injects is hidden; the LangChain tool leads back to the ef.tool."""
    made = ef_langgraph.langchain_tool(refund)
    assert made.name == "lg_refund"
    assert made.description.startswith("Refund an order.")
    assert "waits for a person's approval" in made.description
    assert made.args == {"order": {"type": "string"}, "amount": {"type": "integer"}}
    assert made.tool_call_schema["required"] == ["order", "amount"]  # type: ignore[index]
    assert ef_langgraph.effectflow_tool(made) is refund
    plain = StructuredTool.from_function(lambda x: x, name="plain", description="d")
    assert ef_langgraph.effectflow_tool(plain) is None
    with pytest.raises(ef.ContractError, match="not a tool"):
        ef_langgraph.langchain_tool(lambda: None)  # type: ignore[arg-type]


def test_the_langchain_tool_refuses_to_run_outside_the_guarded_path() -> None:
    """Without the middleware a side-effecting call would run unrecorded: it is a loud error."""
    with pytest.raises(ef.ContractError, match="outside the guarded path"):
        ef_langgraph.langchain_tool(send).invoke(SEND)
    assert records() == []


# -- create_agent -----------------------------------------------------------------------------------


def test_create_agent_with_the_middleware_runs_the_tool_once(rt: ef.Runtime) -> None:
    """One tool call, one effect; the model gets the recorded result as JSON; the ledger names
    the thread and the model's tool-call id."""
    state, _ = _ask(_agent(rt, send, SEND))
    [sent] = records()
    [content] = _tool_messages(state)
    assert content == {"status": "done", "happened": True, "result": sent}
    message = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert message.artifact["run_id"] is not None
    assert message.artifact["effect_id"] is not None
    [run] = rt.runs()
    assert run.workflow == "effectflow.guarded_call"
    assert run.input["scope"] == "langgraph:T1:tools"
    assert run.input["call_id"] == "call_1"
    assert state["messages"][-1].content.startswith("tool said:")


def test_a_replay_from_the_checkpoint_before_the_tools_does_not_call_twice(
    rt: ef.Runtime,
) -> None:
    """The graph re-run from its checkpoint (same thread, the same tool call): the ledger answers,
    the provider is not called again."""
    agent = _agent(rt, send, SEND)
    _, config = _ask(agent)
    before_tools = next(s for s in agent.get_state_history(config) if s.next == ("tools",))
    replayed = agent.invoke(None, before_tools.config)
    assert len(records()) == 1
    assert _tool_messages(replayed)[-1]["result"] == records()[0]
    assert len(rt.runs()) == 1


def test_a_regenerated_call_after_a_lost_model_turn_is_answered_as_already_done(
    rt: ef.Runtime,
) -> None:
    """The host lost the model's turn and asked again: a fresh tool-call id for the same action.
    It is not done again, and the model is told so."""
    agent = _agent(rt, send, SEND)
    _, config = _ask(agent)
    # The oldest checkpoint waiting for the model: its turn (and the tool call) is lost.
    [*_, before_model] = (s for s in agent.get_state_history(config) if s.next == ("model",))
    replayed = agent.invoke(None, before_model.config)
    assert len(records()) == 1
    again = _tool_messages(replayed)[-1]
    assert again["status"] == "already_done"
    assert again["result"] == records()[0]
    assert again["message"] == ef_langgraph.ALREADY_DONE
    assert sorted(r.input["call_id"] for r in rt.runs()) == ["call_1", "call_2"]


def test_the_async_agent_is_the_same_call(rt: ef.Runtime) -> None:
    """``ainvoke`` goes through ``awrap_tool_call``: one effect, and a replay calls nothing."""
    agent = _agent(rt, send, SEND)
    config = {"configurable": {"thread_id": "T1"}}

    async def main() -> dict[str, Any]:
        await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config)
        before_tools = next(s for s in agent.get_state_history(config) if s.next == ("tools",))
        return dict(await agent.ainvoke(None, before_tools.config))

    state = asyncio.run(main())
    assert len(records()) == 1
    assert _tool_messages(state)[-1]["result"] == records()[0]


def test_an_approval_is_an_interrupt_and_the_resume_approves_it(rt: ef.Runtime) -> None:
    """A financial write pauses the graph with ``interrupt()``; ``Command(resume=...)`` carries the
    approval into ``rt.approve`` and the call runs once."""
    agent = _agent(rt, refund, {"order": "o1", "amount": 300})
    state, config = _ask(agent)
    [asked] = state["__interrupt__"]
    payload = asked.value
    assert payload[ef_langgraph.PAYLOAD_MARK] is True
    assert payload["kind"] == "approval"
    assert payload["next_action"] == "approve"
    assert payload["tool"].startswith("lg_refund")
    assert payload["tool_call_id"] == "call_1"
    assert "approval" in payload["for_model"]
    assert payload["run_id"] == rt.runs()[0].run_id
    assert records() == []
    done = agent.invoke(Command(resume={"approved": True, "approver": "alice"}), config)
    [content] = _tool_messages(done)
    assert content["status"] == "done"
    assert content["result"]["order"] == "o1"
    assert len(records()) == 1
    approvals = [e for e in rt.audit(payload["run_id"]) if "approv" in e.kind]
    assert approvals


class TwoRefunds(ScriptedModel):
    """Asks for two refunds in one message (parallel tool calls), then answers."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])
        calls = [
            {"name": "lg_refund", "args": {"order": o, "amount": 5}, "id": f"call_{o}"}
            for o in ("a", "b")
        ]
        reply = AIMessage(content="", tool_calls=[{**c, "type": "tool_call"} for c in calls])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_parallel_approvals_are_two_interrupts_answered_by_interrupt_id(rt: ef.Runtime) -> None:
    """Two calls in one model message wait for two approvals; one resume map answers both, and
    each call runs once."""
    middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[refund])
    model = TwoRefunds(tool="lg_refund", args={})
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    state, config = _ask(agent)
    pending = state["__interrupt__"]
    assert sorted(i.value["tool_call_id"] for i in pending) == ["call_a", "call_b"]
    decisions = {i.id: {"approved": True, "approver": "alice"} for i in pending}
    done = agent.invoke(Command(resume=decisions), config)
    assert "__interrupt__" not in done
    assert sorted(c["result"]["order"] for c in _tool_messages(done)) == ["a", "b"]
    assert len(records()) == 2


def test_a_declined_approval_is_not_done_and_the_model_is_told(rt: ef.Runtime) -> None:
    """``approved: False`` is ``rt.reject``: the call is never made, its step is ``rejected`` by
    that person (audited), and the model hears a person said no and why."""
    agent = _agent(rt, refund, {"order": "o1", "amount": 300})
    _, config = _ask(agent)
    done = agent.invoke(
        Command(resume={"approved": False, "approver": "bob", "reason": "over the limit"}), config
    )
    [content] = _tool_messages(done)
    assert content == {
        "status": "declined",
        "happened": False,
        "error": ef_langgraph.DECLINED,
        "reason": "over the limit",
    }
    assert records() == []
    [run] = rt.runs()
    [step] = rt.steps(run.run_id)
    assert step.status is ef.StepStatus.REJECTED
    [declined] = [e for e in rt.audit(run.run_id) if e.kind == "approval_declined"]
    assert declined.actor == "bob"
    assert rt.attention() == []


def test_a_refused_decision_asks_again_and_the_corrected_one_is_applied(
    sqlite_rt: ef.Runtime,
) -> None:
    """The audit log records who decided: a resume without it changes nothing and the node
    interrupts again, saying why; the next ``Command(resume=...)`` is the one applied."""
    agent = _agent(sqlite_rt, refund, {"order": "o1", "amount": 300})
    _, config = _ask(agent)
    again = agent.invoke(Command(resume={"approved": True}), config)
    [asked] = again["__interrupt__"]
    assert "must say who made it" in asked.value["refused"]
    assert asked.value["kind"] == "approval"
    assert records() == []
    assert sqlite_rt.runs()[0].status is ef.RunStatus.PAUSED
    done = agent.invoke(Command(resume={"approved": True, "approver": "alice"}), config)
    [content] = _tool_messages(done)
    assert content["status"] == "done"
    assert len(records()) == 1


def test_a_lost_response_is_settled_by_the_lookup_without_a_person(rt: ef.Runtime) -> None:
    """The provider committed and the answer was lost: the lookup finds it, the model gets it,
    nothing is sent twice and nobody is interrupted."""
    state, _ = _ask(_agent(rt, send_lost, SEND))
    assert "__interrupt__" not in state
    [sent] = records()
    [content] = _tool_messages(state)
    assert content == {"status": "done", "happened": True, "result": sent}


def test_an_in_doubt_call_is_an_interrupt_and_the_resolution_is_its_result(
    rt: ef.Runtime,
) -> None:
    """No lookup can tell: the graph pauses; the person's ``committed`` decision goes into
    ``rt.resolve`` and its evidence is the result the model gets."""
    agent = _agent(rt, send_untagged, SEND)
    state, config = _ask(agent)
    [asked] = state["__interrupt__"]
    assert asked.value["kind"] == "in_doubt"
    assert asked.value["next_action"] == "resolve"
    assert asked.value["effect_id"] is not None
    assert "may or may not have happened" in asked.value["for_model"]
    [held] = records()
    # A resume that decides nothing ({}: "decided elsewhere") asks the ledger, and pauses again.
    again = agent.invoke(Command(resume={}), config)
    assert again["__interrupt__"][0].value["effect_id"] == asked.value["effect_id"]
    decision = {"committed": True, "evidence": {"result": held}, "by": "ops"}
    done = agent.invoke(Command(resume=decision), config)
    assert _tool_messages(done) == [{"status": "done", "happened": True, "result": held}]
    assert len(records()) == 1


def test_without_interrupts_the_model_is_told_it_is_being_checked(rt: ef.Runtime) -> None:
    """``interrupt=False``: the graph goes on and the model hears the phrase meant for it."""
    state, _ = _ask(_agent(rt, send_untagged, SEND, interrupt=False))
    [content] = _tool_messages(state)
    assert content["status"] == "unknown"
    assert content["happened"] is None
    assert "do not repeat it" in content["message"]


def test_arguments_the_schema_refuses_go_back_to_the_model_and_record_nothing(
    sqlite_rt: ef.Runtime,
) -> None:
    """A model's malformed call is refused before any intent; the model is told why."""
    state, _ = _ask(_agent(sqlite_rt, send, {"to": "a"}))
    [content] = _tool_messages(state)
    assert content["status"] == "refused"
    assert "'text' is a required property" in content["error"]
    assert sqlite_rt.runs() == []
    assert records() == []


def test_other_tools_pass_through_and_a_graph_without_a_thread_is_refused(
    sqlite_rt: ef.Runtime,
) -> None:
    """A tool effectflow does not back runs as LangChain runs it; an effectflow tool needs the
    graph's durable identity (a checkpointer's thread)."""
    echo = StructuredTool.from_function(lambda text: f"echo {text}", name="echo", description="e")
    model = ScriptedModel(tool="echo", args={"text": "x"})
    middleware = ef_langgraph.EffectflowMiddleware(sqlite_rt, tools=[send])
    agent = create_agent(model, [echo], middleware=[middleware], checkpointer=InMemorySaver())
    state, _ = _ask(agent)
    assert [m.content for m in state["messages"] if isinstance(m, ToolMessage)] == ["echo x"]
    no_thread = create_agent(ScriptedModel(tool="lg_send", args=SEND), middleware=[middleware])
    with pytest.raises(ef.ArgumentError, match="thread_id"):
        no_thread.invoke({"messages": [{"role": "user", "content": "go"}]})
    assert records() == []


# -- ToolNode ---------------------------------------------------------------------------------------


def _tool_node_graph(rt: ef.Runtime) -> Any:
    guard = ef_langgraph.EffectflowMiddleware(rt)
    model = ScriptedModel(tool="lg_send", args=SEND)
    node = ToolNode(
        ef_langgraph.langchain_tools([send]),
        wrap_tool_call=guard.wrap_tool_call,
        awrap_tool_call=guard.awrap_tool_call,
    )
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    graph.add_edge("model", END)
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tool_node_takes_the_same_wrapper(rt: ef.Runtime, mode: str) -> None:
    """``ToolNode(wrap_tool_call=..., awrap_tool_call=...)``: one effect, and a replay from the
    checkpoint before the tools calls nothing."""
    graph = _tool_node_graph(rt)
    config = {"configurable": {"thread_id": "T1"}}
    start = {"messages": [{"role": "user", "content": "go"}]}

    def before_tools() -> Any:
        return next(s for s in graph.get_state_history(config) if s.next == ("tools",)).config

    if mode == "sync":
        graph.invoke(start, config)
        state = graph.invoke(None, before_tools())
    else:

        async def main() -> Any:
            await graph.ainvoke(start, config)
            return await graph.ainvoke(None, before_tools())

        state = asyncio.run(main())
    [sent] = records()
    assert _tool_messages(state)[-1] == {"status": "done", "happened": True, "result": sent}
    [run] = rt.runs()
    assert run.input["scope"] == "langgraph:T1:tools"


class AskingTwiceModel(ScriptedModel):
    """A model that, having seen the first result, knowingly asks for the same call again."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done >= 2:
            reply = AIMessage(content="sent twice, as asked")
        else:
            call = {"name": self.tool, "args": self.args, "id": f"call_{next(self.ids)}"}
            reply = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_a_repeat_the_conversation_still_shows_is_a_new_request(rt: ef.Runtime) -> None:
    """The model asks for the same call again while the first is in the conversation: that is a
    new request (two effects), unlike a call regenerated after a lost turn (the fork test above:
    one; docs/concepts.md#regenerated-calls)."""
    model = AskingTwiceModel(tool=send.name, args=SEND)
    middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[send])
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    state, _ = _ask(agent)
    assert [c["status"] for c in _tool_messages(state)] == ["done", "done"]
    assert len(records()) == 2
