"""The agent loop in one process: bad calls answered as tool errors, check_effect, the outcome
phrasing, and the model adapters over duck-typed clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import effectflow as ef
from effectflow import errors, testing
from effectflow.contrib import agents
from effectflow.contrib.agents import loop

from . import agent_app


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}}


TURNS: list[dict[str, Any]] = [
    {"tool_calls": [_call("c1", "agent_lookup_order", '{"order_id": ')]},
    {"tool_calls": [_call("c1", "agent_lookup_order", {"order_id": "A-17"})]},
    {
        "tool_calls": [
            _call("c2", "agent_email_customer", {"to": "a@b.c", "subject": "s", "body": "b"}),
            _call("c3", "agent_refund_everyone", {}),
        ]
    },
    {"tool_calls": [_call("c4", agents.CHECK_EFFECT, {"tool_call_id": "c2"})]},
    {"content": "Done."},
]


@ef.workflow("agent_loop_unit")
def agent_loop_unit(ctx: ef.Context) -> dict[str, Any]:
    """The scripted conversation above, over the crash test's tools."""
    model = agents.ScriptedModel(TURNS)
    result = agents.run_agent(
        ctx, model, agent_app.TOOLS, [{"role": "system", "content": "Be careful."}]
    )
    return {"output": result.output, "messages": result.messages, "asked": model.asked}


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    """A fresh ledger, with the crash test's tools pointed at this test's directory."""
    agent_app.configure(tmp_path)
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        yield runtime


def _tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


def test_bad_calls_go_back_to_the_model_and_the_run_goes_on(rt: ef.Runtime) -> None:
    """Malformed JSON and an unknown tool are answered as tool errors; the run still succeeds."""
    run = rt.start(agent_loop_unit, run_id="agent-unit-1")
    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output["output"] == "Done."
    assert run.output["asked"] == 5
    malformed, lookup, email, unknown, check = _tool_messages(run.output["messages"])
    assert malformed["status"] == "error"
    assert "not valid JSON" in malformed["error"]
    assert lookup["status"] == "done"
    assert lookup["result"]["payment_id"] == "pay_17"
    assert email["status"] == "done"
    assert email["operation_id"] == 'guard:["agent:agent-unit-1","scripted_3:c2"]'
    assert "no tool named 'agent_refund_everyone'" in unknown["error"]
    assert check["tool_call_id"] == "c2"
    assert check["happened"] is True
    assert check["result"] == email["result"]


def test_check_effect_for_an_unknown_id() -> None:
    """check_effect of an id no call had says it did not happen here."""
    answer = json.loads(loop._check_effect({}, "nope"))
    assert answer["status"] == "no_such_call"
    assert answer["happened"] is False


class _FailingContext:
    """Stands in for ``ef.Context``: every step fails with one error."""

    run_id = "r"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    ("error", "status", "happened"),
    [
        (errors.StepRejected("no"), "rejected", False),
        (errors.RetryBudgetExhausted("not committed"), "not_committed", False),
        (errors.IdempotencyConflict("other payload"), "refused", False),
        (errors.StepFailed("in doubt"), "unknown", None),
    ],
)
def test_outcomes_are_phrased_for_the_model(
    error: Exception, status: str, happened: bool | None
) -> None:
    """Each way a write can end is told to the model; an unknown one says not to repeat it."""
    call = agents.ToolCall("c1", "agent_email_customer", {})
    outcome = loop._run_tool(
        _FailingContext(error),  # type: ignore[arg-type]
        "s",
        agent_app.email_customer,
        call,
        "op",
    )
    assert (outcome["status"], outcome["happened"]) == (status, happened)
    if status == "unknown":
        assert outcome["message"].startswith(
            "This may or may not have happened; do not repeat it; it is being checked."
        )


def test_openai_adapter_normalizes_the_reply() -> None:
    """OpenAIChatModel sends the conversation without our ids and normalizes the SDK answer."""
    sent: dict[str, Any] = {}

    def create(**kwargs: Any) -> Any:
        sent.update(kwargs)
        call = SimpleNamespace(
            id="call_1", function=SimpleNamespace(name="agent_lookup_order", arguments="{}")
        )
        message = SimpleNamespace(content=None, tool_calls=[call])
        return SimpleNamespace(id="chatcmpl-1", choices=[SimpleNamespace(message=message)])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    model = agents.OpenAIChatModel(client, model="gpt-test")
    reply = model.complete([{"role": "assistant", "id": "x", "content": "hi"}], [])
    assert sent["model"] == "gpt-test"
    assert sent["messages"] == [{"role": "assistant", "content": "hi"}]
    assert reply == {
        "role": "assistant",
        "id": "chatcmpl-1",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "agent_lookup_order", "arguments": "{}"},
            }
        ],
    }


def test_anthropic_adapter_translates_both_ways() -> None:
    """AnthropicModel sends system text, tool_use and tool_result blocks; reads tool_use back."""
    sent: dict[str, Any] = {}

    def create(**kwargs: Any) -> Any:
        sent.update(kwargs)
        return {
            "id": "msg_1",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"a": 1}},
            ],
        }

    model = agents.AnthropicModel(
        SimpleNamespace(messages=SimpleNamespace(create=create)), model="m"
    )
    conversation = [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "id": "msg_0",
            "content": None,
            "tool_calls": [
                {"id": "toolu_0", "type": "function", "function": {"name": "t", "arguments": "{"}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_0", "content": "error"},
    ]
    reply = model.complete(conversation, agents.openai_tools([agent_app.lookup_order]))
    assert sent["system"] == "Be careful."
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_0", "name": "t", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "error"}],
        },
    ]
    assert sent["tools"] == agents.anthropic_tools([agent_app.lookup_order])
    assert reply["content"] == "Looking."
    assert agents.parse_openai_tool_calls(reply) == [agents.ToolCall("toolu_1", "t", {"a": 1})]


def test_scripted_model_counts_across_objects(tmp_path: Path) -> None:
    """With a count file, asks are counted by every ScriptedModel sharing it."""
    count = tmp_path / "asks.log"
    agents.ScriptedModel([{"content": "a"}], count_file=count).complete([], [])
    second = agents.ScriptedModel([{"content": "a"}], count_file=count)
    reply = second.complete([{"role": "assistant", "content": "a"}], [])
    assert second.asked == 2
    assert reply["content"] == "(no more turns)"


def test_tool_named_check_effect_is_refused(rt: ef.Runtime) -> None:
    """A user tool may not take check_effect's name."""

    @ef.tool("check_effect", effect="read", register=False)
    def check_effect() -> None:
        """Shadowing the loop's own tool."""

    with pytest.raises(errors.ContractError):
        agents.run_agent(
            _FailingContext(RuntimeError()),  # type: ignore[arg-type]
            agents.ScriptedModel([]),
            [check_effect],
            [],
        )


def test_refund_tool_uses_the_payments_provider(rt: ef.Runtime, tmp_path: Path) -> None:
    """The refund tool refunds once per key (the crash test's premise)."""
    agent_app.refund_payment("pay_1", 100, idempotency_key="k")
    agent_app.refund_payment("pay_1", 100, idempotency_key="k")
    with testing.PaymentsProvider(tmp_path / agent_app.PAYMENTS_FILE) as payments:
        assert payments.count_refunds("pay_1") == 1
