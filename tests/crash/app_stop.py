"""The application of the crash tests that stop a run's effects rather than make them: a refund that
is compensated (cancelled) when the goal is abandoned, and a ``local_transaction`` seat booking.

``child.py --app app_stop`` imports this module next to ``app``, so a fresh process after a SIGKILL
finds these tools and workflows by the names the ledger recorded. The payment tools translate
provider errors into the signals a tool gives the runtime
(docs/concepts.md#what-a-tool-tells-the-runtime), as a real integration must.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.testing import (
    PaymentsProvider,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
)

#: The payments provider's file, relative to one test's directory.
PAYMENTS_FILE = "payments.db"

#: Workflow names.
REFUND_WORKFLOW = "crash_refund_abandoned"
SEAT_WORKFLOW = "crash_book_seat"

#: Step ids of ``crash_refund_abandoned``.
REFUND = "create_refund"
#: The step the runtime gives the refund's compensation.
CANCEL = f"compensate:{REFUND}"

#: Step ids of ``crash_book_seat``.
HOLD, RESERVE, TICKET = "hold", "reserve", "ticket"

#: The table the seat booking writes, in the ledger's own database (created by the test).
SEATS_TABLE = "crash_seats"
SEATS_DDL = f"CREATE TABLE IF NOT EXISTS {SEATS_TABLE} (seat TEXT NOT NULL, run_id TEXT NOT NULL)"

_world: Path | None = None


def configure(directory: str | os.PathLike[str]) -> None:
    """Point the payment tools at one test's provider file."""
    global _world
    _world = Path(directory)


@contextmanager
def _payments() -> Iterator[PaymentsProvider]:
    if _world is None:
        raise RuntimeError("app_stop.configure(directory) was not called")
    provider = PaymentsProvider(_world / PAYMENTS_FILE)
    try:
        yield provider
    finally:
        provider.close()


def _signals(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Map provider errors to what they prove (docs/concepts.md#what-a-tool-tells-the-runtime)."""
    try:
        return call()
    except ProviderUnavailable as exc:
        raise ef.NotCommitted(str(exc)) from exc
    except ProviderError as exc:  # rejected, or the key reused with another payload
        raise ef.Rejected(str(exc), evidence={"code": exc.code}) from exc
    except ProviderTimeout as exc:
        raise ef.OutcomeUnknown(str(exc)) from exc


# -- payments -------------------------------------------------------------------------------------


@ef.tool("crash_refund_by_key", effect="read")
def refund_by_key(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    """Confirm a refund by the key it was created under (or by its id)."""
    with _payments() as pay:
        if idempotency_key:
            found = pay.get_refund_by_idempotency_key(idempotency_key)
        elif external_effect_id:
            found = pay.get_refund(external_effect_id)
        else:
            return ef.Lookup.unknown(reason="neither a key nor a refund id to look up")
    if found is None:
        return ef.Lookup.not_committed(evidence={"searched_key": idempotency_key})
    return ef.Lookup.confirmed(
        external_effect_id=found["refund_id"],
        evidence={"refund_id": found["refund_id"], "status": found["status"]},
        result=found,
    )


@ef.tool(
    "crash_cancel_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    external_system="payments",
)
def cancel_refund(refund_id: str, *, idempotency_key: str) -> dict[str, Any]:
    """The compensation of a refund: cancel it while the provider's cancel window is open."""
    with _payments() as pay:
        return _signals(lambda: pay.cancel_refund(refund_id, idempotency_key=idempotency_key))


@ef.tool(
    "crash_create_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=refund_by_key,
    effect_id="refund_id",
    compensation=ef.Compensation(tool=cancel_refund, deadline="PT10M", automatic=True),
    external_system="payments",
    target="payment_id",
)
def create_refund(payment_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund part of a payment, at most once per key."""
    with _payments() as pay:
        return _signals(
            lambda: pay.create_refund(payment_id, amount, idempotency_key=idempotency_key)
        )


@ef.workflow(REFUND_WORKFLOW)
def refund_abandoned(ctx: ef.Context, order_id: str, payment_id: str, amount: int) -> None:
    """Refund, then learn the order goes ahead after all: the refund must be compensated."""
    refund = ctx.call(REFUND, create_refund, payment_id=payment_id, amount=amount)
    raise ef.AbandonGoal(f"order {order_id} was kept: refund {refund['refund_id']} is withdrawn")


# -- local transactions ---------------------------------------------------------------------------


def _insert_seat(tx: ef.LocalTransaction, seat: str, booking: str) -> None:
    tx.execute(f"INSERT INTO {SEATS_TABLE} (seat, run_id) VALUES (?, ?)", (seat, booking))


@ef.tool("crash_hold_seat", effect="pure")
def hold_seat(seat: str) -> dict[str, Any]:
    """A pure step before the one under test, so the crash leaves a checkpoint behind it."""
    return {"seat": seat, "price": 42}


@ef.tool("crash_reserve_seat", effect="external_write", commit="local_transaction")
def reserve_seat(seat: str, booking: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    """Write the reservation in the ledger's own transaction."""
    _insert_seat(tx, seat, booking)
    return {"seat": seat, "reserved": True}


@ef.tool("crash_reserve_seat_then_fail", effect="external_write", commit="local_transaction")
def reserve_seat_then_fail(seat: str, booking: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    """Write the reservation, then fail: the write must roll back with the step."""
    _insert_seat(tx, seat, booking)
    raise RuntimeError(f"seat {seat}: the seat map changed during the booking")


@ef.tool("crash_reserve_seat_and_commit", effect="external_write", commit="local_transaction")
def reserve_seat_and_commit(seat: str, booking: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    """Write the reservation, then try to commit it alone: the runtime must refuse."""
    _insert_seat(tx, seat, booking)
    tx.execute("COMMIT")
    return {"seat": seat, "reserved": True}


#: The reservation tool of each ``mode`` of ``crash_book_seat``.
RESERVE_TOOLS = {
    "ok": reserve_seat,
    "fail": reserve_seat_then_fail,
    "commit": reserve_seat_and_commit,
}


@ef.tool("crash_issue_ticket", effect="pure")
def issue_ticket(seat: str, price: int) -> dict[str, Any]:
    """A pure step after the one under test."""
    return {"ticket": f"T-{seat}", "price": price}


@ef.workflow(SEAT_WORKFLOW)
def book_seat(ctx: ef.Context, seat: str, mode: str = "ok") -> dict[str, Any]:
    """Hold (pure), reserve (local transaction, the booking is the run), issue the ticket (pure)."""
    held = ctx.call(HOLD, hold_seat, seat=seat)
    reserved = ctx.call(RESERVE, RESERVE_TOOLS[mode], seat=seat, booking=ctx.run_id)
    ticket = ctx.call(TICKET, issue_ticket, seat=seat, price=held["price"])
    return {"reserved": reserved, "ticket": ticket}
