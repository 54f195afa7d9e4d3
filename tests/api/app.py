"""The application the API tests serve: tools over the simulated providers and three workflows.

``api_refund`` pauses for an approval (a financial write); ``api_email`` loses the response after the
mail provider accepted the message when ``lose_response`` is set, leaving an effect nobody can look
up (it waits for a person); ``api_double`` is a pure step, cheap enough to make many runs.
Where the providers keep their files is set by ``use(folder)`` (a test fixture).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.testing import MailProvider, PaymentsProvider, ProviderError, ProviderRejected

FAST = ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.001, max_backoff=0.005)


class World:
    """The providers of one test."""

    def __init__(self, folder: Path) -> None:
        self.pay = PaymentsProvider(folder / "pay.db")
        self.mail = MailProvider(folder / "mail.db")

    def close(self) -> None:
        self.pay.close()
        self.mail.close()


_WORLDS: list[World] = []


def use(folder: Path) -> World:
    """Point the tools at fresh providers in ``folder``."""
    made = World(folder)
    _WORLDS.append(made)
    return made


def done(made: World) -> None:
    """Close a test's providers."""
    _WORLDS.remove(made)
    made.close()


def world() -> World:
    return _WORLDS[-1]


def speak(call: Any) -> Any:
    try:
        return call()
    except ProviderRejected as exc:
        raise ef.Rejected(str(exc), evidence={"code": exc.code}) from exc
    except ProviderError as exc:
        raise ef.NotCommitted(str(exc)) from exc


@ef.tool("api_get_refund", effect="read")
def get_refund(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = world().pay.get_refund_by_idempotency_key(idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["refund_id"], result=found)


@ef.tool(
    "api_create_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=get_refund,
    effect_id="refund_id",
    retry=FAST,
)
def create_refund(payment_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return speak(
        lambda: world().pay.create_refund(payment_id, amount, idempotency_key=idempotency_key)
    )


@ef.tool(
    "api_email",
    effect="external_write",
    reversible=False,
    effect_id="provider_message_id",
    retry=FAST,
)
def email(to: str, body: str, lose_response: bool) -> dict[str, Any]:
    sent = speak(lambda: world().mail.send(to, "Hello", body))
    if lose_response:
        raise ConnectionResetError("connection reset after sending")
    return dict(sent)


@ef.tool("api_double", effect="pure")
def double(n: int) -> int:
    return n * 2


@ef.workflow("api_refund")
def refund(ctx: ef.Context, payment_id: str, amount: int) -> Any:
    return ctx.call("create_refund", create_refund, payment_id=payment_id, amount=amount)


@ef.workflow("api_email", steps=[ef.StepContract("email", compensation_trigger="never")])
def send_email(ctx: ef.Context, to: str, lose_response: bool = False) -> Any:
    return ctx.call("email", email, to=to, body="Your order ships", lose_response=lose_response)


@ef.workflow("api_double")
def doubled(ctx: ef.Context, n: int) -> Any:
    return ctx.call("double", double, n=n)
