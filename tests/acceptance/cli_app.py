"""The application the operator CLI tests act on: tools over the simulated providers, two workflows,
and ``prepare``, which leaves a real ledger file with a run in each state the verbs handle.

The CLI imports it with ``--app tests.acceptance.cli_app``; the providers' files live in the folder
named by ``CLI_APP_DIR``, so the test process that prepares the runs and the CLI processes that
act on them see the same world.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.testing import NotifyProvider, PaymentsProvider, ProviderError, ProviderRejected

FAST = ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.001, max_backoff=0.002)

_OPEN: dict[str, tuple[NotifyProvider, PaymentsProvider]] = {}


def providers() -> tuple[NotifyProvider, PaymentsProvider]:
    """The providers of the folder ``CLI_APP_DIR`` names, opened once per process."""
    folder = os.environ["CLI_APP_DIR"]
    if folder not in _OPEN:
        _OPEN[folder] = (
            NotifyProvider(Path(folder) / "notify.db"),
            PaymentsProvider(Path(folder) / "pay.db"),
        )
    return _OPEN[folder]


def close() -> None:
    """Close every provider this process opened."""
    for notify, pay in _OPEN.values():
        notify.close()
        pay.close()
    _OPEN.clear()


def speak(call: Any) -> Any:
    try:
        return call()
    except ProviderRejected as exc:
        raise ef.Rejected(str(exc), evidence={"code": exc.code}) from exc
    except ProviderError as exc:
        raise ef.NotCommitted(str(exc)) from exc


@ef.tool("cli_draft", effect="pure")
def draft(topic: str) -> str:
    return f"About {topic}"


# No key and no lookup: a lost response leaves the post in doubt until a person decides.
@ef.tool("cli_post", effect="external_write", effect_id="notification_id", retry=FAST)
def post(channel: str, text: str) -> dict[str, Any]:
    return dict(speak(lambda: providers()[0].post(channel, text)))


@ef.tool("cli_get_refund", effect="read")
def get_refund(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = providers()[1].get_refund_by_idempotency_key(idempotency_key or "")
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["refund_id"], result=found)


@ef.tool(
    "cli_cancel_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    retry=FAST,
)
def cancel_refund(refund_id: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(
        speak(lambda: providers()[1].cancel_refund(refund_id, idempotency_key=idempotency_key))
    )


@ef.tool(
    "cli_create_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=get_refund,
    effect_id="refund_id",
    compensation=ef.Compensation(tool=cancel_refund, deadline="PT10M"),
    retry=FAST,
)
def create_refund(payment_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return dict(
        speak(
            lambda: providers()[1].create_refund(
                payment_id, amount, idempotency_key=idempotency_key
            )
        )
    )


@ef.workflow("cli_announce")
def announce(ctx: ef.Context, topic: str) -> str:
    text = ctx.call("draft", draft, topic=topic)
    posted = ctx.call("post", post, channel="#ops", text=text)
    return str(posted["notification_id"])


@ef.workflow("cli_refund")
def refund(ctx: ef.Context, payment_id: str, amount: int) -> str:
    made = ctx.call("create_refund", create_refund, payment_id=payment_id, amount=amount)
    return str(made["refund_id"])


def prepare(db_url: str) -> dict[str, str]:
    """Leave in the ledger: ``announce-1`` paused on a post in doubt, and ``refund-1``/``refund-2``
    paused waiting for approval of their refunds. Returns the run ids by role."""
    notify, _ = providers()
    notify.inject("post", "lose_response")
    with ef.Runtime(db_url) as rt:
        rt.start(announce, run_id="announce-1", topic="the deploy")
        rt.start(refund, run_id="refund-1", payment_id="pay_1", amount=500)
        rt.start(refund, run_id="refund-2", payment_id="pay_2", amount=700)
    return {"unknown": "announce-1", "approval": "refund-1", "cancel": "refund-2"}
