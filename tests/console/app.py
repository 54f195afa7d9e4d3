"""Tools and a workflow for the console tests: one email whose connection resets after sending,
so the run pauses with an unknown effect an operator must settle through the console; and a payout
that waits for an approval, then takes three seconds to run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.testing import MailProvider


def mail() -> MailProvider:
    return MailProvider(Path(os.environ["EFFECTFLOW_TEST_DIR"]) / "mail.db")


@ef.tool("con_email", effect="external_write", effect_id="provider_message_id")
def email(to: str, body: str) -> dict[str, Any]:
    provider = mail()
    try:
        sent = provider.send(to, "Your case", body)
    finally:
        provider.close()
    if (Path(os.environ["EFFECTFLOW_TEST_DIR"]) / "reset").exists():
        raise ConnectionResetError("connection reset after the mail was accepted")
    return dict(sent)


@ef.tool("con_note", effect="pure")
def note(text: str) -> str:
    return text.upper()


@ef.workflow("con_case")
def case(ctx: ef.Context, case_id: str) -> str:
    sent = ctx.call("email", email, to=f"c{case_id}@example.com", body="hello")
    return str(ctx.call("note", note, text=str(sent["provider_message_id"])))


#: How long the slow payout takes, in seconds: an action that runs it (an approval resumes the run
#: in the server's process) must not hold up any other request meanwhile.
SLOW_S = 3.0


@ef.tool(
    "con_slow_payout",
    effect="external_write",
    approval=True,
    idempotency=ef.Idempotency(supported=True),
    effect_id="payout_id",
)
def slow_payout(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    time.sleep(SLOW_S)
    return {"payout_id": f"po_{idempotency_key[-8:]}", "amount": amount}


@ef.workflow("con_slow")
def slow(ctx: ef.Context, amount: int) -> str:
    paid = ctx.call("pay", slow_payout, amount=amount)
    return str(paid["payout_id"])
