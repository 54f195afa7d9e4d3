"""A LangChain v1 agent (``create_agent``) whose side-effecting tools go through effectflow.

What it shows, against a provider that is a local file (its lines are the proof):

(a) an email the model asks for is sent once;
(b) the host replaying the graph does not send it twice: neither a replay from the checkpoint
    before the tool node (the same tool-call id), nor the model asking again with a fresh id
    after its turn was lost;
(c) a refund waits for a person: the ``interrupt()`` payload the host sees, then
    ``Command(resume={"approved": True, "approver": ...})`` and the refund, made once;
(d) what the model sees, printed after each call: the JSON of its ``ToolMessage``.

Runs offline, with a scripted chat model and an in-memory checkpointer; the ledger is SQLite in a
temporary folder::

    pip install 'effectflow[langgraph]'
    python examples/langgraph_agent.py

The guide is docs/integrations/langgraph.md; tests/acceptance/test_example_langgraph.py runs this.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import Field

import effectflow as ef
from effectflow.contrib.langgraph import EffectflowMiddleware


class Provider:
    """The outside world: every effect it commits is one JSON line in its file."""

    path = Path("provider.jsonl")  # main() points it into a temporary folder

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [r for r in map(json.loads, lines) if kind in (None, r["kind"])]

    def commit(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        record = {"id": f"{kind}_{len(self.records()) + 1}", "kind": kind, "key": key, **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        return receipt(record)


def receipt(record: dict[str, Any]) -> dict[str, Any]:
    """What the provider answers: its record without the idempotency key, which the model (who
    reads the result) has no use for."""
    return {k: v for k, v in record.items() if k != "key"}


PROVIDER = Provider()


@ef.tool("find_email", effect="read")
def find_email(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: after a crash or a lost answer, effectflow asks the provider, not the model."""
    for record in PROVIDER.records("email"):
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=receipt(record))
    return ef.Lookup.not_committed()


# Not idempotent (a second call is a second email), but each email carries its key, so the lookup
# can find it; settles_within=0: a local append lands during the call or never.
@ef.tool("send_email", effect="external_write", confirm=find_email, effect_id="id",
         settles_within=0)  # fmt: skip
def send_email(to: str, subject: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send an email to a customer."""
    return PROVIDER.commit("email", idempotency_key, to=to, subject=subject)


# A financial write waits for a person's approval by default; the provider deduplicates by key.
@ef.tool("refund", effect="financial_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def refund(order: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order."""
    for record in PROVIDER.records("refund"):
        if record["key"] == idempotency_key:
            return receipt(record)
    return PROVIDER.commit("refund", idempotency_key, order=order, amount_cents=amount_cents)


class ScriptedModel(BaseChatModel):
    """A chat model without a network: asked by the user, it calls the tool its script names for
    the request, with a fresh tool-call id each time (as a real model does); given a tool's
    result, it answers with it."""

    script: dict[str, tuple[str, dict[str, Any]]]
    ids: Any = Field(default_factory=lambda: itertools.count(1))

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self  # create_agent binds the tools' schemas; the script needs none

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Done: {last.content}")
        else:
            name, arguments = self.script[last.text]
            call = {"name": name, "args": arguments, "id": f"call_{next(self.ids)}"}
            reply = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def told(state: dict[str, Any]) -> dict[str, Any]:
    """What the model was told by the last tool call: the ToolMessage's JSON content."""
    message = next(m for m in reversed(state["messages"]) if isinstance(m, ToolMessage))
    print(f"  the model sees ({message.tool_call_id}): {message.content}")
    content: dict[str, Any] = json.loads(message.text)
    return content


def main() -> None:
    """The four scenes, each checked against the provider's records."""
    with tempfile.TemporaryDirectory() as folder, ef.Runtime(f"sqlite:///{folder}/ledger.db") as rt:
        PROVIDER.path = Path(folder) / "provider.jsonl"
        model = ScriptedModel(script={
            "Tell Ada her parcel shipped.": (
                "send_email", {"to": "ada@example.com", "subject": "Your parcel shipped"}),
            "Refund order 17.": ("refund", {"order": "o-17", "amount_cents": 4200}),
        })  # fmt: skip
        agent = create_agent(
            model,
            middleware=[EffectflowMiddleware(rt, tools=[send_email, refund])],
            checkpointer=InMemorySaver(),
        )

        print("(a) the model asks for an email: it is sent once")
        config: RunnableConfig = {"configurable": {"thread_id": "ada"}}
        state = agent.invoke({"messages": [HumanMessage("Tell Ada her parcel shipped.")]}, config)
        assert told(state)["status"] == "done"
        assert len(PROVIDER.records("email")) == 1

        print("(b) the host replays the graph: nothing is sent twice")
        history = list(agent.get_state_history(config))  # newest first
        before_tools = next(s for s in history if s.next == ("tools",))
        print("  replayed from the checkpoint before the tool node (the same tool-call id):")
        assert told(agent.invoke(None, before_tools.config))["status"] == "done"
        before_model = [s for s in history if s.next == ("model",)][-1]
        print("  replayed from before the model's turn (it asks again, with a fresh id):")
        assert told(agent.invoke(None, before_model.config))["status"] == "already_done"
        emails = PROVIDER.records("email")
        assert len(emails) == 1, emails
        print(f"  the provider's outbox: {len(emails)} email ({emails[0]['id']})")

        print("(c) a refund waits for a person's approval")
        config = {"configurable": {"thread_id": "order-17"}}
        state = agent.invoke({"messages": [HumanMessage("Refund order 17.")]}, config)
        [asked] = state["__interrupt__"]
        print(f"  the graph paused; the host sees interrupt {asked.id}:")
        for field, value in asked.value.items():
            print(f"    {field}: {json.dumps(value)}")
        assert asked.value["kind"] == "approval"
        assert PROVIDER.records("refund") == [], "refunded before the approval"
        decision = {"approved": True, "approver": "alice@support"}
        print(f"  the host resumes with Command(resume={decision})")
        state = agent.invoke(Command(resume=decision), config)
        assert told(state)["status"] == "done"
        refunds = PROVIDER.records("refund")
        assert [r["order"] for r in refunds] == ["o-17"], refunds
        print(f"  the provider's refunds: {len(refunds)} ({refunds[0]['id']})")
        print(f"  the model answers: {state['messages'][-1].content}")

        print("the ledger: one guarded call per scope and tool-call id")
        for run in sorted(rt.runs(), key=lambda r: r.created_at):
            print(f"  {run.input['scope']} {run.input['call_id']}: {run.status}")
    print("ok: 1 email and 1 refund, whatever the host replayed")


if __name__ == "__main__":
    main()
