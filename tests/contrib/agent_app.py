"""The agent application the crash test kills: three tools over the simulated providers, a scripted
model and a workflow that lets the model use them.

``agent_child.py`` imports this module, so a fresh process after a SIGKILL finds the same tools and
workflow by the names the ledger recorded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import effectflow as ef
from effectflow import testing
from effectflow.contrib import agents

LEDGER_FILE = "ledger.db"
PAYMENTS_FILE = "payments.db"
MAIL_FILE = "mail.db"
#: One line per model ask, from every process.
ASKS_FILE = "asks.log"

WORKFLOW = "agent_refund"
RUN_ID = "agent-refund-17"
ORDER = {"order_id": "A-17", "payment_id": "pay_17", "amount": 4900, "email": "ana@example.com"}

#: The model's script: look the order up; refund and email (reusing the tool-call id ``call_1``
#: of turn 1, as models do); then answer.
TURNS: list[dict[str, Any]] = [
    {
        "id": "msg_1",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "function": {"name": "agent_lookup_order", "arguments": {"order_id": "A-17"}},
            }
        ],
    },
    {
        "id": "msg_2",
        "content": "Refunding and telling the customer.",
        "tool_calls": [
            {
                "id": "call_1",
                "function": {
                    "name": "agent_refund_payment",
                    "arguments": {"payment_id": "pay_17", "amount": 4900},
                },
            },
            {
                "id": "call_2",
                "function": {
                    "name": "agent_email_customer",
                    "arguments": {
                        "to": "ana@example.com",
                        "subject": "Your refund",
                        "body": "We refunded 49.00 EUR.",
                    },
                },
            },
        ],
    },
    {"id": "msg_3", "content": "Refunded 49.00 EUR and emailed ana@example.com."},
]
#: The step the crash test kills the worker right after recording.
EMAIL_STEP = "turn_2_call_2_agent_email_customer"

_world: Path | None = None


def configure(directory: str | os.PathLike[str]) -> None:
    """Point the tools at one test's provider files."""
    global _world
    _world = Path(directory)


def path(name: str) -> Path:
    """A file of the configured world."""
    if _world is None:
        raise RuntimeError("agent_app.configure(directory) was not called")
    return _world / name


def _speak(exc: testing.ProviderError) -> Exception:
    if isinstance(exc, testing.ProviderUnavailable):
        return ef.NotCommitted(str(exc))
    return ef.Rejected(str(exc))


@ef.tool("agent_lookup_order", effect="read")
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its payment, amount (minor units) and the customer's email."""
    if order_id != ORDER["order_id"]:
        raise ef.Rejected(f"no order {order_id}")
    return dict(ORDER)


@ef.tool("agent_refund_status", effect="read")
def refund_status(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Whether the refund made under our key exists."""
    with testing.PaymentsProvider(path(PAYMENTS_FILE)) as payments:
        found = payments.get_refund_by_idempotency_key(idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["refund_id"], result=found)


@ef.tool(
    "agent_refund_payment",
    effect="idempotent_write",
    reversible=True,
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=refund_status,
    effect_id="refund_id",
    approval=False,
    external_system="payments",
)
def refund_payment(
    payment_id: str,
    amount: int,
    reason: Literal["damaged", "late", "other"] = "other",
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """Refund ``amount`` (minor units) of a payment."""
    try:
        with testing.PaymentsProvider(path(PAYMENTS_FILE)) as payments:
            return payments.create_refund(payment_id, amount, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


@ef.tool("agent_email_status", effect="read")
def email_status(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Whether the message sent under our key exists."""
    with testing.MailProvider(path(MAIL_FILE)) as mail:
        found = mail.status(idempotency_key=idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"], state=found["status"], result=found
    )


@ef.tool(
    "agent_email_customer",
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=email_status,
    effect_id="provider_message_id",
    external_system="mail",
)
def email_customer(
    to: str, subject: str, body: str, cc: list[str] | None = None, *, idempotency_key: str
) -> dict[str, Any]:
    """Email the customer."""
    try:
        with testing.MailProvider(path(MAIL_FILE)) as mail:
            return mail.send(to, subject, body, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


TOOLS: list[ef.Tool[..., Any]] = [lookup_order, refund_payment, email_customer]


def model() -> agents.ScriptedModel:
    """The scripted model, counting its asks in the world's file."""
    return agents.ScriptedModel(TURNS, count_file=path(ASKS_FILE))


@ef.workflow(WORKFLOW)
def agent_refund(ctx: ef.Context, request: str) -> dict[str, Any]:
    """Let the model handle a customer's refund request."""
    result = agents.run_agent(
        ctx, model(), TOOLS, [{"role": "user", "content": request}], max_turns=5
    )
    return {"answer": result.output, "turns": result.turns, "finished": result.finished}
