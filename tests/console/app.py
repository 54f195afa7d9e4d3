"""Tools and a workflow for the console tests: one email whose connection resets after sending,
so the run pauses with an unknown effect an operator must settle through the console."""

from __future__ import annotations

import os
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
