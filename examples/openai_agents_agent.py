"""An OpenAI Agents SDK agent whose side-effecting tools go through effectflow.

What it shows, against a provider that is a local file (its lines are the proof):

(a) an email the model asks for is sent once;
(b) the turn run again (a crashed request retried: the model asks again, with a fresh tool-call
    id) does not send it twice;
(c) a refund waits for a person: the run stops with an interruption, the application saves the
    ``RunState``; approved (``RunState.approve``) and resumed, the refund is made once, and the
    same saved state resumed a second time gets the recorded result;
(d) openai/openai-agents-python#4896: an approval given under an approval policy that changed
    before the run resumed is not spent: nothing is refunded, the model is told, and its new call
    waits for an approval under the current policy;
(e) what the model sees, printed after each call: the tool's JSON output.

Runs offline, with the SDK's own scripted model (``agents.testing.ScriptedModel``) and no API key;
the ledger is SQLite in a temporary folder::

    pip install 'effectflow[openai-agents]'
    python examples/openai_agents_agent.py

The guide is docs/integrations/openai_agents.md; tests/contrib/test_openai_agents_example.py runs
this.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, Runner, RunResult, RunState, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

import effectflow as ef
from effectflow.contrib.openai_agents import effectflow_tools


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
    "Refund order 17.": ("refund", {"order": "o-17", "amount_cents": 4200}),
    "Refund order 18.": ("refund", {"order": "o-18", "amount_cents": 1500}),
}  # fmt: skip


#: The tool-call ids the model issues: never the same twice, as a real model's.
IDS = itertools.count(1)


def scripted_model() -> ScriptedModel:
    """A model without a network: asked by the user, it calls the tool the script names for the
    request, with a fresh tool-call id each time (as a real model does); given the tool's output,
    it answers with it, unless that output asks it to call again."""

    def respond(call: ModelCall) -> list[Any]:
        items = call.input if isinstance(call.input, list) else [call.input]
        last = items[-1]
        request = next(i["content"] for i in reversed(items) if i.get("role") == "user")
        if last.get("type") == "function_call_output" and "call the tool again" not in str(
            last.get("output")
        ):
            return [assistant_message(f"Done: {last['output']}")]
        name, arguments = SCRIPT[request]
        return [function_call(name, arguments, call_id=f"call_{next(IDS)}")]

    return ScriptedModel([ModelStep.respond(respond) for _ in range(40)])


def told(result: RunResult) -> dict[str, Any]:
    """What the model was told by the last tool call: the tool's JSON output."""
    item = next(
        i for i in reversed(result.to_input_list()) if i.get("type") == "function_call_output"
    )
    print(f"  the model sees ({item['call_id']}): {item['output']}")
    content: dict[str, Any] = json.loads(str(item["output"]))
    return content


async def main() -> None:
    """The scenes, each checked against the provider's records."""
    set_tracing_disabled(True)
    with tempfile.TemporaryDirectory() as folder, ef.Runtime(f"sqlite:///{folder}/ledger.db") as rt:
        PROVIDER.path = Path(folder) / "provider.jsonl"
        policy = {"version": "refunds-v1"}

        def agent(conversation: str) -> Agent[Any]:
            # The one line: the tools, guarded, in the conversation the application names.
            tools = effectflow_tools(
                rt,
                [send_email, refund],
                scope=conversation,
                policy=lambda ctx: policy["version"],
                approver=lambda ctx: ctx.context["user"] if ctx.context else "unknown",
            )
            return Agent(name="support", model=scripted_model(), tools=tools)

        print("(a) the model asks for an email: it is sent once")
        ada = agent("ticket-ada")
        result = await Runner.run(ada, "Tell Ada her parcel shipped.")
        assert told(result)["status"] == "done"
        assert len(PROVIDER.records("email")) == 1

        print("(b) the request is retried after a crash: the model asks again, with a fresh id")
        result = await Runner.run(agent("ticket-ada"), "Tell Ada her parcel shipped.")
        assert told(result)["status"] == "already_done"
        emails = PROVIDER.records("email")
        assert len(emails) == 1, emails
        print(f"  the provider's outbox: {len(emails)} email ({emails[0]['id']})")

        print("(c) a refund waits for a person's approval")
        refunds_agent = agent("order-17")
        result = await Runner.run(refunds_agent, "Refund order 17.", context={"user": "alice"})
        [item] = result.interruptions
        print(f"  the run stopped: {item.tool_name}({item.arguments}), call {item.call_id}")
        assert PROVIDER.records("refund") == [], "refunded before the approval"
        state = result.to_state()
        state.approve(item)
        saved = state.to_string()  # the application keeps it until it resumes
        print("  approved with RunState.approve, resumed with Runner.run(agent, state)")
        result = await Runner.run(refunds_agent, await RunState.from_string(refunds_agent, saved))
        assert told(result)["status"] == "done"
        print("  the same saved state resumed again (a retried resume):")
        result = await Runner.run(refunds_agent, await RunState.from_string(refunds_agent, saved))
        assert told(result)["status"] == "done"
        refunds = PROVIDER.records("refund")
        assert [r["order"] for r in refunds] == ["o-17"], refunds
        print(f"  the provider's refunds: {len(refunds)} ({refunds[0]['id']})")

        print("(d) approved, then the approval policy changed before the run resumed")
        refunds_agent = agent("order-18")
        result = await Runner.run(refunds_agent, "Refund order 18.", context={"user": "alice"})
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)
        saved = state.to_string()
        policy["version"] = "refunds-v2"
        print(f"  policy now {policy['version']!r}; resumed with the approval given under v1:")
        result = await Runner.run(refunds_agent, await RunState.from_string(refunds_agent, saved))
        first = next(
            json.loads(i["output"])
            for i in result.to_input_list()
            if i.get("type") == "function_call_output"
        )
        print(f"  the model sees: {json.dumps(first, sort_keys=True)}")
        assert first["status"] == "approval_outdated"
        assert [r["order"] for r in PROVIDER.records("refund")] == ["o-17"], "refunded anyway"
        [again] = result.interruptions
        print(f"  the model called again ({again.call_id}): a new approval, under v2")
        state = result.to_state()
        state.approve(again)
        result = await Runner.run(refunds_agent, state)
        assert told(result)["status"] == "done"
        refunds = PROVIDER.records("refund")
        assert [r["order"] for r in refunds] == ["o-17", "o-18"], refunds

        print("the ledger: one guarded call per conversation and tool-call id")
        for run in sorted(rt.runs(), key=lambda r: r.created_at):
            approvers = [a.approver for a in rt.store.approvals(run.run_id, "call")]
            approved = f" (approved by {', '.join(approvers)})" if approvers else ""
            print(f"  {run.input['scope']} {run.input['call_id']}: {run.status}{approved}")
    print("ok: 1 email and 2 refunds, each approved under the policy in force")


if __name__ == "__main__":
    asyncio.run(main())
