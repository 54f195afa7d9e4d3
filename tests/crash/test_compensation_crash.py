"""A real worker process is SIGKILLed in the middle of a compensation; a fresh process recovers it
(``rt.recover()`` alone: the run was left ``running`` by a dead owner, nothing needs reconciling).
The compensation is neither repeated nor lost: the payments provider's own file holds one refund,
cancelled once, and the ledger agrees (docs/concepts.md#the-write-path, docs/concepts.md#cancel,
the last rows of docs/decision-table.md).

Approvals: the refund is a ``financial_write``, and a financial effect's compensation needs an
approval whatever the compensation tool declares (``automatic=True`` and ``approval=False`` do not
lift it). Nothing here weakens that. A setup process approves the refund (the run then abandons its
goal and waits for the cancel's approval); the crash process approves the cancel itself, because
``rt.approve`` continues the run in the approving process: that is the process that runs the
compensation, so it is the one that must die at the fault point. Approving from pytest would run
the compensation here, where it cannot be killed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import effectflow as ef
from effectflow.runtime.faults import FaultPoint
from effectflow.testing import PaymentsProvider

from . import app_stop
from .conftest import World, assert_clean, assert_killed

S = ef.StepStatus
RUN_ID = "refund-1"
INPUT = {"order_id": "order-1", "payment_id": "pay_1", "amount": 2500}
APPS = ("app_stop",)
REFUND_APPROVAL = "apr-refund-1"
CANCEL_APPROVAL = "apr-cancel-1"


@dataclasses.dataclass(frozen=True)
class Window:
    """One crash inside the compensation step, and what the ledger and provider show."""

    #: Where the worker running the compensation dies.
    point: FaultPoint
    #: The compensation step's status right after the crash.
    after_crash: ef.StepStatus
    #: The cancel calls the provider logged, in order, over both processes.
    calls: tuple[str, ...]
    #: ``lose_response`` faults on the provider's cancel before the crash run.
    lost_responses: int = 0

    @property
    def id(self) -> str:
        """The test id."""
        return f"{self.point}" + ("-lost_response" if self.lost_responses else "")


WINDOWS = [
    # Approved, not yet intended: nothing durable of the cancel but the approval (the step still
    # reads awaiting_approval until a worker takes it up); it runs once.
    Window(FaultPoint.BEFORE_INTENT, S.AWAITING_APPROVAL, ("ok",)),
    # The intent (key) is durable, nothing was sent: recovery sends it, with that key.
    Window(FaultPoint.AFTER_INTENT, S.INTENT_RECORDED, ("ok",)),
    # Sent and applied, not recorded: recovery retries with the original key; the provider replays.
    Window(FaultPoint.AFTER_CALL_BEFORE_RECORD, S.INTENT_RECORDED, ("ok", "replayed")),
    # Recorded, but the run's end state is not: recovery only concludes the run.
    Window(FaultPoint.AFTER_RECORD, S.CONFIRMED, ("ok",)),
    # The cancel was applied but its response lost, and the unknown outcome recorded: recovery
    # replays with the original key and learns it happened.
    Window(FaultPoint.AFTER_RECORD, S.UNKNOWN, ("ok", "replayed"), lost_responses=1),
]


def _payments(world: World) -> PaymentsProvider:
    return PaymentsProvider(world.directory / app_stop.PAYMENTS_FILE)


def _by_step(items: list[Any]) -> dict[str, Any]:
    return {item.step_id: item for item in items}


def _set_up_waiting_compensation(world: World) -> None:
    """Start the run, approve the refund: it is made, the goal is abandoned, the cancel waits."""
    statuses = assert_clean(
        world.child(
            apps=APPS,
            start=((app_stop.REFUND_WORKFLOW, RUN_ID, INPUT),),
            approve=((RUN_ID, app_stop.REFUND, REFUND_APPROVAL),),
        )
    )
    assert statuses == {RUN_ID: ef.RunStatus.PAUSED.value}
    with world.ledger() as rt:
        steps = _by_step(rt.steps(RUN_ID))
        assert steps[app_stop.REFUND].status is S.CONFIRMED
        assert steps[app_stop.CANCEL].status is S.AWAITING_APPROVAL
        assert (steps[app_stop.CANCEL].error or {}).get("code") == "approval_required"
    with _payments(world) as pay:
        assert [r["status"] for r in pay.refunds()] == ["succeeded"]
        assert pay.calls("cancel_refund") == []


def test_every_write_window_of_the_compensation_has_a_case() -> None:
    """Each window of the write path a compensation passes through is crashed by a case."""
    write_path = {
        FaultPoint.BEFORE_INTENT,
        FaultPoint.AFTER_INTENT,
        FaultPoint.AFTER_CALL_BEFORE_RECORD,
        FaultPoint.AFTER_RECORD,
    }
    assert {w.point for w in WINDOWS} == write_path
    assert any(w.lost_responses for w in WINDOWS)


@pytest.mark.parametrize("case", WINDOWS, ids=lambda w: w.id)
def test_crash_in_compensation_then_recover(world: World, case: Window) -> None:
    """After a SIGKILL inside the compensation, recovery cancels the refund exactly once, with the
    compensation's own key, and the run ends ``compensated``."""
    _set_up_waiting_compensation(world)
    if case.lost_responses:
        with _payments(world) as pay:
            pay.inject("cancel_refund", "lose_response", times=case.lost_responses)

    crash = world.child(
        apps=APPS,
        approve=((RUN_ID, app_stop.CANCEL, CANCEL_APPROVAL),),
        kill=f"{case.point}:{app_stop.CANCEL}",
    )
    assert_killed(crash)
    with world.ledger() as rt:
        assert rt.run(RUN_ID).status is ef.RunStatus.RUNNING
        assert _by_step(rt.steps(RUN_ID))[app_stop.CANCEL].status is case.after_crash
    with _payments(world) as pay:
        sent_before_recovery = len(pay.calls("cancel_refund"))

    statuses = assert_clean(world.child(apps=APPS, recover=True))
    assert statuses == {RUN_ID: ef.RunStatus.COMPENSATED.value}

    # The provider's file: one refund, cancelled, the cancel applied once.
    with _payments(world) as pay:
        refunds = pay.refunds()
        cancels = pay.calls("cancel_refund")
        creates = pay.calls("create_refund")
    assert len(refunds) == 1
    assert refunds[0]["status"] == "canceled"
    assert [c["outcome"] for c in creates] == ["ok"]
    assert tuple(c["outcome"] for c in cancels) == case.calls
    assert sum(1 for c in cancels if c["outcome"] == "ok") == 1
    if case.after_crash is S.CONFIRMED:
        assert len(cancels) == sent_before_recovery, "a confirmed cancel was sent again"

    # The ledger: the compensation is its own confirmed effect, answering the refund.
    with world.ledger() as rt:
        run = rt.run(RUN_ID)
        steps = _by_step(rt.steps(RUN_ID))
        effects = _by_step(rt.effects(run_id=RUN_ID))
        refund_step, cancel_step = steps[app_stop.REFUND], steps[app_stop.CANCEL]
        refund, cancel = effects[app_stop.REFUND], effects[app_stop.CANCEL]
        events = rt.audit(RUN_ID)
        assert run.status is ef.RunStatus.COMPENSATED
        assert run.error is None

        assert refund.status is S.CONFIRMED
        assert refund.compensation_status == "compensated"
        assert refund_step.compensation_status == "compensated"
        assert refund.external_effect_id == refunds[0]["refund_id"]
        assert refund.approval_id == REFUND_APPROVAL

        assert cancel_step.status is S.CONFIRMED
        assert cancel_step.compensates == refund.effect_id
        assert cancel.status is S.CONFIRMED
        assert cancel.compensates == refund.effect_id
        assert cancel.effect_id == cancel_step.effect_id
        assert cancel.approval_id == CANCEL_APPROVAL
        assert cancel_step.logical_operation_id == f"compensate:{refund.effect_id}"
        assert cancel_step.output["refund_id"] == refund.external_effect_id
        assert cancel_step.output["status"] == "canceled"
        # One key for the whole compensation, its own (not the refund's), on every call.
        key = cancel_step.idempotency_key
        assert key is not None
        assert key != refund.idempotency_key
        assert cancel.idempotency_key == key
        assert {c["key"] for c in cancels} == {key}, "a cancel attempt used another key"
        keyed = [
            e for e in events if e.step_id == app_stop.CANCEL and "idempotency_key" in e.detail
        ]
        assert keyed
        assert {e.detail["idempotency_key"] for e in keyed} == {key}
        # Decided once, intended once: the crash neither restarted nor duplicated it.
        assert [e.kind for e in events].count("compensation_decided") == 1
        intents = [e for e in events if e.kind == "intent" and e.step_id == app_stop.CANCEL]
        assert len(intents) == 1
        assert intents[0].detail["compensates"] == refund.effect_id
        attempts = rt.attempts(RUN_ID, app_stop.CANCEL)
        assert all(a.ended_at is not None for a in attempts), "an attempt was left open"
        assert [a.outcome.value for a in attempts if a.outcome][-1] == "committed"
        assert sum(1 for e in effects.values() if e.compensates is not None) == 1
        assert len(rt.effects(run_id=RUN_ID)) == 2
        assert rt.verify_audit() == []
