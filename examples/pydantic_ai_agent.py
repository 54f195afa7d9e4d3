"""A Pydantic AI agent whose side-effecting tools go through effectflow.

What it shows, against a provider that is a local file (its lines are the proof):

(a) an email the model asks for is sent once;
(b) the turn is lost and asked again in the same conversation (the model asks again, with a fresh
    tool-call id): the email is not sent twice, and the model is told it already was;
(c) a refund waits for a person: the run ends with ``DeferredToolRequests``; the person's decision
    (``answer``) resumes it, is recorded in the ledger (``rt.approve``) and the refund is made
    once; the same answer resumed a second time gets the recorded result;
(d) the same agent under Pydantic AI's DBOS durability (``DBOSDurability``, DBOS on SQLite): DBOS
    runs the turn again from its recorded model step (``DBOS.fork_workflow``) and the tool call it
    replays is answered from the ledger: still one email.

Runs offline, with Pydantic AI's own ``FunctionModel`` and no API key; the ledger and DBOS's
system database are SQLite in a temporary folder::

    pip install 'effectflow[pydantic-ai,dbos]'
    python examples/pydantic_ai_agent.py

The guide is docs/integrations/pydantic_ai.md; tests/contrib/test_pydantic_ai_example.py runs this.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent, AgentRunResult, DeferredToolRequests
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import effectflow as ef
from effectflow.contrib.pydantic_ai import Effectflow, answer


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


SCRIPT = {
    "Tell Ada her parcel shipped.": (
        "send_email", {"to": "ada@example.com", "subject": "Your parcel shipped"}),
    "Tell Bo his parcel shipped.": (
        "send_email", {"to": "bo@example.com", "subject": "Your parcel shipped"}),
    "Refund order 17.": ("refund", {"order": "o-17", "amount_cents": 4200}),
}  # fmt: skip

#: The tool-call ids the model issues: never the same twice, as a real model's.
IDS = itertools.count(1)


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model without a network: asked by the user, it calls the tool the script names for the
    request, with a fresh tool-call id each time (as a real model does); given the tool's result,
    it answers with it."""
    last = messages[-1]
    returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if isinstance(last, ModelRequest) and returned:
        return ModelResponse(parts=[TextPart(f"Done: {json.dumps(returned[-1].content)}")])
    prompt = next(
        p.content
        for m in reversed(messages)
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    )
    name, arguments = SCRIPT[str(prompt)]
    return ModelResponse(parts=[ToolCallPart(name, arguments, tool_call_id=f"call_{next(IDS)}")])


def told(result: AgentRunResult[Any]) -> dict[str, Any]:
    """What the model was told by the last tool call: the tool's result."""
    part = next(
        p
        for m in reversed(result.all_messages())
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    )
    print(f"  the model sees ({part.tool_call_id}): {json.dumps(part.content, sort_keys=True)}")
    content: dict[str, Any] = part.content
    return content


async def main(folder: Path) -> None:
    """The scenes, each checked against the provider's records."""
    PROVIDER.path = folder / "provider.jsonl"
    with ef.Runtime(f"sqlite:///{folder / 'ledger.db'}") as rt:
        # The one line: the capability, with the tools it guards.
        agent = Agent(
            FunctionModel(respond),
            name="support",
            capabilities=[Effectflow(rt, tools=[send_email, refund])],
            output_type=[str, DeferredToolRequests],
        )

        print("(a) the model asks for an email: it is sent once")
        first = await agent.run("Tell Ada her parcel shipped.")
        assert told(first)["status"] == "done"
        assert len(PROVIDER.records("email")) == 1

        print("(b) the turn is lost and asked again in the conversation, with a fresh id")
        again = await agent.run(
            "Tell Ada her parcel shipped.", conversation_id=first.conversation_id
        )
        assert told(again)["status"] == "already_done"
        emails = PROVIDER.records("email")
        assert len(emails) == 1, emails
        print(f"  the provider's outbox: {len(emails)} email ({emails[0]['id']})")

        print("(c) a refund waits for a person's approval")
        asked = await agent.run("Refund order 17.")
        requests = asked.output
        assert isinstance(requests, DeferredToolRequests)
        [pending] = requests.approvals
        shown = requests.metadata[pending.tool_call_id]
        print(f"  the run ended with DeferredToolRequests: {pending.tool_name}({pending.args})")
        print(f"  kind: {json.dumps(shown['kind'])}")
        print(f"  resume_with: {json.dumps(shown['resume_with'])}")
        assert PROVIDER.records("refund") == [], "refunded before the approval"
        decision = answer(requests, {pending.tool_call_id: {"approved": True, "approver": "alice"}})
        history = asked.all_messages()
        done = await agent.run(message_history=history, deferred_tool_results=decision)
        assert told(done)["status"] == "done"
        print("  the same answer resumed again (a retried resume):")
        done = await agent.run(message_history=history, deferred_tool_results=decision)
        assert told(done)["status"] == "done"
        refunds = PROVIDER.records("refund")
        assert [r["order"] for r in refunds] == ["o-17"], refunds
        approvers = [a.approver for a in rt.store.approvals(shown["run_id"], "call")]
        print(f"  the provider's refunds: {len(refunds)} ({refunds[0]['id']}), approved by "
              f"{', '.join(approvers)}")  # fmt: skip

        print("(d) under DBOS durability: DBOS runs the turn again from its recorded model step")
        await _under_dbos(rt, folder)
        emails = PROVIDER.records("email")
        assert [e["to"] for e in emails] == ["ada@example.com", "bo@example.com"], emails

        print("the ledger: one guarded call per conversation and tool-call id")
        for run in sorted(rt.runs(), key=lambda r: r.created_at):
            print(f"  {run.input['call_id']} in {run.input['scope']}: {run.status}")
    print("ok: 2 emails and 1 refund, whatever ran again")


async def _under_dbos(rt: ef.Runtime, folder: Path) -> None:
    """The agent in a ``@DBOS.workflow``; a fork from the second step replays the first (the
    model's tool call, recorded by DBOS) and the tool runs again in workflow code."""
    durable = Agent(
        FunctionModel(respond),
        name="support_durable",
        capabilities=[Effectflow(rt, tools=[send_email]), DBOSDurability[None]()],
        output_type=[str, DeferredToolRequests],
    )

    @DBOS.workflow()
    async def turn(prompt: str, conversation: str) -> dict[str, Any]:
        # The conversation named by the application: a fork (a new workflow id) is the same one.
        result = await durable.run(prompt, conversation_id=conversation)
        return told(result)

    DBOS(config={"name": "effectflow-example", "system_database_url":
                 f"sqlite:///{folder / 'dbos.sqlite'}"})  # fmt: skip
    DBOS.launch()
    try:
        with SetWorkflowID("case-bo"):
            first = await turn("Tell Bo his parcel shipped.", "case-bo")
        assert first["status"] == "done"
        steps = [s["function_name"] for s in await DBOS.list_workflow_steps_async("case-bo")]
        print(f"  DBOS recorded: {', '.join(steps)}")
        forked = await DBOS.fork_workflow_async("case-bo", 2)
        print(f"  DBOS forked case-bo from step 2 as {forked.workflow_id}:")
        replayed = await forked.get_result()
        assert replayed["status"] == "done", replayed
        assert replayed["result"] == first["result"], "answered from the ledger"
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))
