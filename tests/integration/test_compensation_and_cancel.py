"""Approvals, compensation and cancel end to end (docs/concepts.md#cancel; the last rows of
docs/decision-table.md), against real providers.

The providers keep their state in their own SQLite files: they are the truth of what happened in the
world; the ledger is what the runtime knows. Each test reads both.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
from effectflow.testing import (
    Fault,
    FaultAction,
    FaultPlan,
    FaultPoint,
    InjectedCrash,
    MailProvider,
    PaymentsProvider,
    ProviderError,
    ProviderRejected,
)
from worlds import Current, FakeClock, step

FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.005)
S = ef.StepStatus
R = ef.RunStatus


class World:
    """The outside world of this module: payments, mail, and an in-process job service."""

    def __init__(self, tmp_path: Path, clock: FakeClock) -> None:
        self.clock = clock
        self.pay = PaymentsProvider(tmp_path / "pay.db", clock=clock)
        self.mail = MailProvider(tmp_path / "mail.db", clock=clock, delivered_after=100.0)
        #: Slots reserved (and released) at a reversible, non-financial provider, in call order.
        self.slots: list[str] = []
        self.released: list[str] = []
        #: Jobs the job service accepted and the ones it was asked to stop.
        self.jobs: dict[str, str] = {}
        self.stopped_jobs: list[str] = []
        #: Gate for a call that blocks until the test releases it (a call in flight).
        self.gate = threading.Event()
        self.entered = threading.Event()
        #: While True, the email tool raises a plain error after the provider accepted the mail.
        self.mail_reset_after_send = False
        #: How many more refund lookups answer "cannot tell" (the provider's search lags).
        self.lookups_blind = 0

    def close(self) -> None:
        self.pay.close()
        self.mail.close()


#: The world of the running test, for the tools below.
world = Current[World]()


def speak(call: Any) -> Any:
    try:
        return call()
    except ProviderRejected as exc:
        raise ef.Rejected(str(exc), evidence={"code": exc.code}) from exc
    except ProviderError as exc:
        raise ef.NotCommitted(str(exc)) from exc


# -- tools ------------------------------------------------------------------------------------------


@ef.tool("cc_get_refund", effect="read")
def get_refund(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    if world().lookups_blind:
        world().lookups_blind -= 1
        return ef.Lookup.unknown(reason="the refunds index lags")
    found = world().pay.get_refund_by_idempotency_key(idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["refund_id"], result=found)


@ef.tool(
    "cc_cancel_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    retry=FAST,
)
def cancel_refund(refund_id: str, *, idempotency_key: str) -> dict[str, Any]:
    return speak(lambda: world().pay.cancel_refund(refund_id, idempotency_key=idempotency_key))


@ef.tool(
    "cc_create_refund",
    version="3.1",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=get_refund,
    effect_id="refund_id",
    compensation=ef.Compensation(tool=cancel_refund, deadline="PT10M"),
    retry=FAST,
    target="payment_id",
)
def create_refund(payment_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return speak(
        lambda: world().pay.create_refund(payment_id, amount, idempotency_key=idempotency_key)
    )


@ef.tool(
    "cc_email",
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True),
    effect_id="provider_message_id",
    retry=FAST,
)
def email(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    sent = speak(
        lambda: world().mail.send(to, "Your refund", body, idempotency_key=idempotency_key)
    )
    if world().mail_reset_after_send:
        raise ConnectionResetError("connection reset after sending")
    return dict(sent)


@ef.tool("cc_release_slot", effect="external_write", approval=False)
def release_slot(slot_id: str) -> dict[str, Any]:
    world().released.append(slot_id)
    return {"released": slot_id}


@ef.tool(
    "cc_reserve_slot",
    effect="external_write",
    effect_id="slot_id",
    compensation=ef.Compensation(tool=release_slot, automatic=True),
)
def reserve_slot(name: str) -> dict[str, Any]:
    world().slots.append(name)
    return {"slot_id": f"slot_{name}"}


@ef.tool("cc_stop_job", effect="external_write")
def stop_job(*, external_effect_id: str | None = None) -> dict[str, Any]:
    assert external_effect_id is not None
    world().stopped_jobs.append(external_effect_id)
    world().jobs[external_effect_id] = "stopped"
    return {"job": external_effect_id, "state": "stopped"}


@ef.tool("cc_job_state", effect="read")
def job_state(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    state = world().jobs.get(external_effect_id or "")
    if state is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=external_effect_id, state=state)


@ef.tool(
    "cc_start_job",
    effect="external_write",
    confirm=job_state,
    effect_id="job_id",
    completion=ef.Completion(states=["queued", "done"], required="done", deadline=3600),
    cancel=stop_job,
    settles_within=0,
)
def start_job(name: str) -> dict[str, Any]:
    job_id = f"job_{name}"
    world().jobs[job_id] = "queued"
    return {"job_id": job_id, "state": "queued"}


@ef.tool("cc_blocking", effect="external_write", effect_id="value")
def blocking(value: str) -> dict[str, Any]:
    world().entered.set()
    assert world().gate.wait(10)
    return {"value": value}


@ef.tool("cc_compute", effect="pure")
def compute(n: int) -> int:
    if n < 0:
        raise RuntimeError("the reporting service is down")
    return n * 2


# -- workflows --------------------------------------------------------------------------------------


@ef.workflow("cc_refund")
def refund_case(
    ctx: ef.Context, payment_id: str, amount: int, then: str = "finish"
) -> dict[str, Any]:
    refund = ctx.call("create_refund", create_refund, payment_id=payment_id, amount=amount)
    ctx.call(
        "email", email, to="li@example.com", body=f"Refund {refund['refund_id']} is on its way"
    )
    if then == "crash":
        ctx.call("report", compute, n=-1)  # a technical failure after two confirmed effects
    if then == "abandon":
        raise ef.AbandonGoal("the customer withdrew the complaint")
    return dict(refund)


@ef.workflow("cc_email_then_refund")
def email_then_refund(ctx: ef.Context, payment_id: str) -> Any:
    ctx.call("email", email, to="li@example.com", body="We will refund you")
    return ctx.call("create_refund", create_refund, payment_id=payment_id, amount=100)


@ef.workflow(
    "cc_refund_cancel_compensates",
    steps=[ef.StepContract("create_refund", compensation_trigger=("goal_abandoned", "cancelled"))],
)
def refund_cancel_compensates(ctx: ef.Context, payment_id: str) -> Any:
    ctx.call("create_refund", create_refund, payment_id=payment_id, amount=300)
    return ctx.call("second", create_refund, payment_id=f"{payment_id}_b", amount=5)


@ef.workflow("cc_slots")
def slots(ctx: ef.Context, names: list[str]) -> Any:
    for name in names:
        ctx.call(f"reserve_{name}", reserve_slot, name=name)
    raise ef.AbandonGoal("the trip was called off")


@ef.workflow("cc_email_only", steps=[ef.StepContract("email", compensation_trigger="never")])
def email_only(ctx: ef.Context, abandon: bool) -> Any:
    ctx.call("email", email, to="li@example.com", body="Hello")
    if abandon:
        raise ef.AbandonGoal("no longer needed")
    return "sent"


@ef.workflow("cc_job")
def job(ctx: ef.Context, name: str) -> Any:
    return ctx.call("job", start_job, name=name)


@ef.workflow("cc_blocking_two")
def blocking_two(ctx: ef.Context) -> Any:
    ctx.call("a", blocking, value="a")
    ctx.call("b", blocking, value="b")
    return "done"


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    """Moves only when told; starts at the real time so the providers' clocks agree with it."""
    return FakeClock(time.time())


@pytest.fixture
def w(tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    with world.entered(World(tmp_path, clock)) as made:
        yield made


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def rt(url: str, w: World, clock: FakeClock) -> Iterator[ef.Runtime]:
    with ef.Runtime(url, clock=clock) as runtime:
        yield runtime


def effect_of(rt: ef.Runtime, run_id: str, step_id: str) -> ef.EffectRecord:
    found = step(rt, run_id, step_id)
    assert found.effect_id is not None
    return next(e for e in rt.effects(run_id=run_id) if e.effect_id == found.effect_id)


def kinds(rt: ef.Runtime, run_id: str) -> list[str]:
    return [e.kind for e in rt.audit(run_id)]


def approved_refund(rt: ef.Runtime, run_id: str, then: str = "finish") -> ef.RunRecord:
    run = rt.start(refund_case, run_id=run_id, payment_id="pay_1", amount=500, then=then)
    assert run.status is R.PAUSED
    return rt.approve(run_id, "create_refund", approver="ops-lead", approval_id=f"APR-{run_id}")


# -- approvals --------------------------------------------------------------------------------------


def test_financial_write_waits_for_an_approval_and_records_it(rt: ef.Runtime, w: World) -> None:
    """A refund is not sent until a person approves it; the approval id is on the effect."""
    run = rt.start(refund_case, run_id="r1", payment_id="pay_1", amount=500)
    waiting = step(rt, "r1", "create_refund")
    assert run.status is R.PAUSED
    assert run.error is not None
    assert run.error["code"] == "approval_required"
    assert waiting.status is S.AWAITING_APPROVAL
    assert waiting.next_action is ef.NextAction.ASK_A_PERSON
    assert w.pay.refunds() == [], "nothing may be sent before the approval"

    run = rt.approve("r1", "create_refund", approver="ops-lead", approval_id="APR-1")
    assert run.status is R.SUCCEEDED
    refund = effect_of(rt, "r1", "create_refund")
    assert refund.approval_id == "APR-1"
    assert step(rt, "r1", "create_refund").approval_id == "APR-1"
    assert [r["refund_id"] for r in w.pay.refunds()] == [refund.external_effect_id]
    assert "approved" in kinds(rt, "r1")


def test_an_approval_is_pinned_to_its_step_and_cannot_be_replayed_elsewhere(
    rt: ef.Runtime, w: World
) -> None:
    """The same approval again is a no-op; reusing its id elsewhere is refused; a step that does not
    wait for an approval cannot be approved."""
    approved_refund(rt, "r1")
    again = rt.approve("r1", "create_refund", approver="ops-lead", approval_id="APR-r1")
    assert again.status is R.SUCCEEDED
    assert len(w.pay.refunds()) == 1
    rt.start(refund_case, run_id="r2", payment_id="pay_2", amount=10)
    with pytest.raises(ef.IdempotencyConflict):
        rt.approve("r2", "create_refund", approver="ops-lead", approval_id="APR-r1")
    with pytest.raises(ef.StaleState):
        rt.approve("r2", "email", approver="ops-lead", approval_id="APR-x")
    assert len(w.pay.refunds()) == 1


# -- compensation -----------------------------------------------------------------------------------


def test_abandoned_goal_compensates_as_a_new_effect_with_a_new_approval(
    rt: ef.Runtime, w: World
) -> None:
    """Row "business goal abandoned; compensation tool": a cancel_refund effect with its own key,
    attempts and audit events, after a second approval; the refund stays confirmed; the email,
    which nothing can answer, stays a fact and the run ends cancelled_with_effects."""
    run = approved_refund(rt, "r1", then="abandon")
    assert run.status is R.PAUSED, "a financial compensation needs its own approval"
    assert run.error is not None
    assert run.error["step_id"] == "compensate:create_refund"
    assert w.pay.refunds()[0]["status"] == "succeeded", "nothing is cancelled before approval"

    run = rt.approve("r1", "compensate:create_refund", approver="finance", approval_id="APR-2")
    assert run.status is R.CANCELLED_WITH_EFFECTS
    refund = effect_of(rt, "r1", "create_refund")
    compensation = effect_of(rt, "r1", "compensate:create_refund")
    mail = effect_of(rt, "r1", "email")
    assert refund.status is S.CONFIRMED
    assert refund.compensation_status == "compensated"
    assert compensation.status is S.CONFIRMED
    assert compensation.compensates == refund.effect_id
    assert compensation.approval_id == "APR-2"
    assert refund.approval_id == "APR-r1"
    assert compensation.idempotency_key not in (None, refund.idempotency_key)
    assert mail.status is S.CONFIRMED
    assert mail.compensation_status == "kept"
    assert [a.kind.value for a in rt.attempts("r1", "compensate:create_refund")] == ["call"]
    # The provider: one refund, cancelled once, by our compensation's key.
    [row] = w.pay.refunds()
    assert row["status"] == "canceled"
    cancels = [c for c in w.pay.calls() if c["operation"] == "cancel_refund"]
    assert [c["outcome"] for c in cancels] == ["ok"]
    assert w.mail.messages()
    assert len(w.mail.messages()) == 1
    events = kinds(rt, "r1")
    assert events.index("goal_abandoned") < events.index("compensation_decided")
    assert "effect_kept" in events
    assert rt.verify_audit() == []


def test_a_technical_failure_after_two_confirmed_effects_compensates_nothing(
    rt: ef.Runtime, w: World
) -> None:
    """Row "technical failure of the run": the run fails listing both effects; no compensation."""
    run = approved_refund(rt, "r1", then="crash")
    assert run.status is R.FAILED
    refund, mail = effect_of(rt, "r1", "create_refund"), effect_of(rt, "r1", "email")
    assert run.error is not None
    assert set(run.error["confirmed_effects"]) == {refund.effect_id, mail.effect_id}
    assert refund.status is S.CONFIRMED
    assert refund.compensation_status == "available"
    assert all(e.compensates is None for e in rt.effects(run_id="r1"))
    assert [r["status"] for r in w.pay.refunds()] == ["succeeded"]
    assert not [c for c in w.pay.calls() if c["operation"] == "cancel_refund"]
    assert "compensation_decided" not in kinds(rt, "r1")


def test_compensations_run_newest_first(rt: ef.Runtime, w: World) -> None:
    """Automatic compensations answer the confirmed effects in reverse order; run ends compensated."""
    run = rt.start(slots, run_id="trip", names=["a", "b", "c"])
    assert run.status is R.COMPENSATED
    assert w.slots == ["a", "b", "c"]
    assert w.released == ["slot_c", "slot_b", "slot_a"]
    intents = [e.step_id for e in rt.audit("trip") if e.kind == "intent"]
    assert intents[3:] == ["compensate:reserve_c", "compensate:reserve_b", "compensate:reserve_a"]
    for name in "abc":
        original = effect_of(rt, "trip", f"reserve_{name}")
        assert original.status is S.CONFIRMED
        assert original.compensation_status == "compensated"


def test_a_missed_compensation_deadline_goes_to_a_person(
    rt: ef.Runtime, w: World, clock: FakeClock
) -> None:
    """An operator compensates after the contract's 10-minute deadline: nothing is called, the
    refund's compensation is marked failed and the run waits for a person."""
    approved_refund(rt, "r1")
    clock.advance(11 * 60)
    run = rt.compensate("r1", reason="customer withdrew", by="agent-7")
    assert run.status is R.PAUSED
    assert run.next_action is ef.NextAction.ASK_A_PERSON
    refund = effect_of(rt, "r1", "create_refund")
    assert refund.status is S.CONFIRMED
    assert refund.compensation_status == "compensation_failed"
    assert not [c for c in w.pay.calls() if c["operation"] == "cancel_refund"]
    assert "compensation_failed" in kinds(rt, "r1")


def test_a_failed_compensation_goes_to_a_person(rt: ef.Runtime, w: World) -> None:
    """The provider refuses the cancel (its own window closed): compensation_failed, run paused."""
    approved_refund(rt, "r1")
    w.pay.inject("cancel_refund", "reject")
    rt.compensate("r1", reason="customer withdrew")
    run = rt.approve("r1", "compensate:create_refund", approver="finance", approval_id="APR-2")
    assert run.status is R.PAUSED
    assert effect_of(rt, "r1", "create_refund").compensation_status == "compensation_failed"
    assert effect_of(rt, "r1", "compensate:create_refund").status is S.REJECTED
    assert [r["status"] for r in w.pay.refunds()] == ["succeeded"]


def test_an_irreversible_effect_stays_confirmed_when_the_goal_is_abandoned(
    rt: ef.Runtime, w: World
) -> None:
    """Row "abandoned; irreversible, no compensation": kept, run cancelled_with_effects."""
    run = rt.start(email_only, run_id="e1", abandon=True)
    assert run.status is R.CANCELLED_WITH_EFFECTS
    mail = effect_of(rt, "e1", "email")
    assert mail.status is S.CONFIRMED
    assert mail.compensation_status == "kept"
    assert len(w.mail.messages()) == 1
    assert "effect_kept" in kinds(rt, "e1")


def test_an_operator_can_compensate_a_succeeded_run(rt: ef.Runtime, w: World) -> None:
    """rt.compensate after the fact: the goal is abandoned by a person, with a reason on record."""
    approved_refund(rt, "r1")
    run = rt.compensate("r1", reason="duplicate complaint", by="agent-7")
    assert run.status is R.PAUSED
    run = rt.approve("r1", "compensate:create_refund", approver="finance", approval_id="APR-2")
    assert run.status is R.CANCELLED_WITH_EFFECTS
    assert [r["status"] for r in w.pay.refunds()] == ["canceled"]
    requested = [e for e in rt.audit("r1") if e.kind == "compensate_requested"]
    assert requested
    assert requested[0].actor == "agent-7"
    assert requested[0].detail["reason"] == "duplicate complaint"
    with pytest.raises(ef.ArgumentError):
        rt.compensate("r1", reason="")


# -- cancel (docs/concepts.md#cancel), in every step state ----------------------------------------


def test_cancel_while_a_step_is_pending_stops_it(rt: ef.Runtime, w: World) -> None:
    """Pending (waiting for approval): the step is cancelled, nothing was sent, run cancelled."""
    rt.start(refund_case, run_id="r1", payment_id="pay_1", amount=500)
    inv = rt.cancel("r1", reason="customer withdrew")
    assert inv.status is R.CANCELLED
    assert inv.confirmed == []
    assert inv.unknown == []
    assert inv.cancelled_steps == ["create_refund"]
    assert step(rt, "r1", "create_refund").status is S.CANCELLED
    assert w.pay.refunds() == []
    with pytest.raises(ef.StaleState):
        rt.approve("r1", "create_refund", approver="ops-lead", approval_id="APR-late")
    assert w.pay.refunds() == []


def test_cancel_after_a_confirmed_effect_never_marks_it_undone(rt: ef.Runtime, w: World) -> None:
    """Confirmed: the email stays confirmed and listed; the next step never starts."""
    rt.start(email_then_refund, run_id="r1", payment_id="pay_1")
    inv = rt.cancel("r1")
    mail = effect_of(rt, "r1", "email")
    assert inv.status is R.CANCELLED_WITH_EFFECTS
    assert inv.confirmed == [mail.effect_id]
    assert inv.cancelled_steps == ["create_refund"]
    assert mail.status is S.CONFIRMED
    assert mail.compensation_status == "kept"
    assert len(w.mail.messages()) == 1
    assert w.pay.refunds() == []


def test_cancel_with_an_intent_recorded_queues_it_and_settles_after_reconciliation(
    url: str, w: World, clock: FakeClock
) -> None:
    """Intent recorded (the process died after the intent): the effect is unknown; with no lookup it
    is queued and the run is cancelled_pending_reconciliation until a person settles it, then it
    moves on to cancelled (the person found nothing was sent)."""
    crash = FaultPlan([Fault(FaultPoint.AFTER_INTENT, "email", action=FaultAction.RAISE)])
    with ef.Runtime(url, clock=clock, faults=crash) as dying, pytest.raises(InjectedCrash):
        dying.start(email_only, run_id="e1", abandon=False)
    clock.advance(3600)  # the dead worker's lease has expired
    with ef.Runtime(url, clock=clock) as rt:
        inv = rt.cancel("e1")
        mail = effect_of(rt, "e1", "email")
        assert inv.status is R.CANCELLED_PENDING_RECONCILIATION
        assert inv.unknown == [mail.effect_id]
        assert inv.confirmed == []
        assert rt.run("e1").next_action is ef.NextAction.RECONCILE
        assert w.mail.messages() == []
        rt.resolve(mail.effect_id, committed=False, evidence={"searched": "outbox"}, by="oncall")
        assert rt.run("e1").status is R.CANCELLED
        assert w.mail.messages() == [], "a cancelled run never retries the call"


def test_cancel_with_an_unknown_outcome_moves_on_when_it_is_confirmed(
    rt: ef.Runtime, w: World
) -> None:
    """Unknown (the connection reset after sending): queued; confirmed later -> with effects."""
    w.mail_reset_after_send = True
    run = rt.start(email_only, run_id="e1", abandon=False)
    assert run.status is R.PAUSED
    inv = rt.cancel("e1")
    mail = effect_of(rt, "e1", "email")
    assert inv.status is R.CANCELLED_PENDING_RECONCILIATION
    assert inv.unknown == [mail.effect_id]
    [message] = w.mail.messages()
    rt.resolve(
        mail.effect_id,
        committed=True,
        evidence={"external_effect_id": message["provider_message_id"]},
        by="oncall",
    )
    assert rt.run("e1").status is R.CANCELLED_WITH_EFFECTS
    assert effect_of(rt, "e1", "email").status is S.CONFIRMED
    assert len(w.mail.messages()) == 1


def test_cancel_while_awaiting_completion_stops_the_call_through_its_cancel_operation(
    url: str, w: World, clock: FakeClock
) -> None:
    """Awaiting completion: the job was accepted but is not done; its tool declares a cancel
    operation, so the cancel stops it at the provider and the inventory says so."""
    crash = FaultPlan([Fault(FaultPoint.AFTER_RECORD, "job", action=FaultAction.RAISE)])
    with ef.Runtime(url, clock=clock, faults=crash) as dying, pytest.raises(InjectedCrash):
        dying.start(job, run_id="j1", name="nightly")
    clock.advance(3600)
    with ef.Runtime(url, clock=clock) as rt:
        assert step(rt, "j1", "job").status is S.AWAITING_COMPLETION
        inv = rt.cancel("j1")
        stopped = effect_of(rt, "j1", "job")
        assert inv.stopped == [stopped.effect_id]
        assert inv.confirmed == []
        assert inv.status is R.CANCELLED
        assert stopped.status is S.CANCELLED
        assert stopped.evidence is not None
        assert w.stopped_jobs == ["job_nightly"]
        assert w.jobs == {"job_nightly": "stopped"}


def test_cancel_while_a_call_is_in_flight_lets_it_land_and_stops_before_the_next_step(
    rt: ef.Runtime, w: World
) -> None:
    """In flight (another thread is inside the call): the inventory lists it; the call lands and is
    recorded; the next step never starts."""
    finished: dict[str, ef.RunRecord] = {}
    worker = threading.Thread(
        target=lambda: finished.setdefault("run", rt.start(blocking_two, run_id="b1"))
    )
    worker.start()
    assert w.entered.wait(10)
    inv = rt.cancel("b1", reason="stop")
    landed = effect_of(rt, "b1", "a")
    assert inv.status is R.CANCELLING
    assert inv.in_flight == [landed.effect_id]
    w.gate.set()
    worker.join(10)
    assert finished["run"].status is R.CANCELLED_WITH_EFFECTS
    assert [s.step_id for s in rt.steps("b1")] == ["a"]
    assert effect_of(rt, "b1", "a").status is S.CONFIRMED
    assert rt.cancel("b1").confirmed == [landed.effect_id]


def test_cancel_applies_the_compensation_policy_when_the_trigger_says_so(
    rt: ef.Runtime, w: World
) -> None:
    """A step whose trigger includes ``cancelled``: cancel queues its compensation for approval; once
    approved the refund is cancelled at the provider and listed as compensated."""
    rt.start(refund_cancel_compensates, run_id="r1", payment_id="pay_1")
    rt.approve("r1", "create_refund", approver="ops-lead", approval_id="APR-1")
    assert step(rt, "r1", "second").status is S.AWAITING_APPROVAL
    inv = rt.cancel("r1")
    assert inv.status is R.CANCELLED_WITH_EFFECTS
    assert inv.compensation_pending == ["compensate:create_refund"]
    assert inv.cancelled_steps == ["second"]
    rt.approve("r1", "compensate:create_refund", approver="finance", approval_id="APR-2")
    after = rt.cancel("r1")
    compensation = effect_of(rt, "r1", "compensate:create_refund")
    assert after.compensated == [compensation.effect_id]
    assert [r["status"] for r in w.pay.refunds()] == ["canceled"]


def test_cancel_of_a_finished_run_changes_nothing(rt: ef.Runtime, w: World) -> None:
    approved_refund(rt, "r1")
    inv = rt.cancel("r1")
    assert inv.status is R.SUCCEEDED
    assert rt.run("r1").status is R.SUCCEEDED
    assert [r["status"] for r in w.pay.refunds()] == ["succeeded"]
    with pytest.raises(ef.RunNotFound):
        rt.cancel("nope")


@ef.tool("cc_wait_for_gate", effect="pure")
def wait_for_gate(label: str) -> str:
    world().entered.set()
    assert world().gate.wait(10)
    return label


@ef.workflow("cc_think_then_email")
def think_then_email(ctx: ef.Context) -> Any:
    text = ctx.call("think", wait_for_gate, label="Hello")
    return ctx.call("email", email, to="li@example.com", body=text)


def test_a_cancel_learnt_with_the_intent_stops_the_call_before_it_is_sent(
    rt: ef.Runtime, w: World
) -> None:
    """The cancel arrives while the run computes (no write to learn it from); the next write is the
    email's intent, which brings the cancel back: the email is never sent, its step is cancelled."""
    finished: dict[str, ef.RunRecord] = {}
    worker = threading.Thread(
        target=lambda: finished.setdefault("run", rt.start(think_then_email, run_id="t1"))
    )
    worker.start()
    assert w.entered.wait(10)
    assert rt.cancel("t1").status is R.CANCELLING
    w.gate.set()
    worker.join(10)
    assert finished["run"].status is R.CANCELLED
    mail = effect_of(rt, "t1", "email")
    assert mail.status is S.CANCELLED
    assert [a.outcome.value for a in rt.attempts("t1", "email") if a.outcome] == ["not_committed"]
    assert w.mail.messages() == []
    assert "step_cancelled" in kinds(rt, "t1")


@ef.workflow("cc_async_slots")
async def async_slots(ctx: ef.AsyncContext, names: list[str]) -> Any:
    for name in names:
        await ctx.call(f"reserve_{name}", reserve_slot, name=name)
    raise ef.AbandonGoal("called off")


def test_an_async_workflow_abandoning_its_goal_is_compensated(rt: ef.Runtime, w: World) -> None:
    run = asyncio.run(rt.start_async(async_slots, run_id="a1", names=["x", "y"]))
    assert run.status is R.COMPENSATED
    assert w.released == ["slot_y", "slot_x"]


def test_reconcile_moves_a_cancelled_run_on_once_its_lookup_answers(
    url: str, w: World, clock: FakeClock
) -> None:
    """cancelled_pending_reconciliation -> rt.reconcile looks the refund up -> cancelled_with_effects.
    The refund's response was lost and the cancel came while its lookup could not tell yet."""
    rt = ef.Runtime(url, clock=clock)
    try:
        rt.start(refund_case, run_id="r1", payment_id="pay_1", amount=500)
        w.pay.inject("create_refund", "lose_response", times=3)
        w.lookups_blind = 10
        run = rt.approve("r1", "create_refund", approver="ops-lead", approval_id="APR-1")
        assert run.status is R.PAUSED
        assert step(rt, "r1", "create_refund").status is S.NEEDS_ATTENTION
        inv = rt.cancel("r1")
        assert inv.status is R.CANCELLED_PENDING_RECONCILIATION
        w.lookups_blind = 0
        rt.reconcile()
        final = rt.run("r1")
        assert final.status is R.CANCELLED_WITH_EFFECTS
        refund = effect_of(rt, "r1", "create_refund")
        assert refund.status is S.CONFIRMED
        assert [r["refund_id"] for r in w.pay.refunds()] == [refund.external_effect_id]
        assert rt.steps("r1")[-1].step_id == "create_refund", "nothing ran after the cancel"
    finally:
        rt.close()


@ef.tool("cc_abort_export", effect="external_write")
def abort_export(*, idempotency_key: str | None = None) -> dict[str, Any]:
    world().stopped_jobs.append(str(idempotency_key))
    world().gate.set()  # the provider aborts the running export: the call returns at once
    return {"aborted": True}


@ef.tool("cc_export", effect="external_write", cancel=abort_export)
def export(name: str, *, idempotency_key: str) -> dict[str, Any]:
    world().entered.set()
    assert world().gate.wait(10)
    if world().stopped_jobs:
        raise ef.NotCommitted("the export was aborted before it wrote anything")
    return {"export": name}


@ef.workflow("cc_export_run")
def export_run(ctx: ef.Context) -> Any:
    return ctx.call("export", export, name="ledger-2026")


def test_cancel_stops_a_call_in_flight_through_the_tools_cancel_operation(
    rt: ef.Runtime, w: World
) -> None:
    """In flight in another thread, with a cancel operation: the provider is asked to stop it (by
    the call's key), the call comes back not committed, no retry is sent, and the run ends
    cancelled with no effects."""
    finished: dict[str, ef.RunRecord] = {}
    worker = threading.Thread(
        target=lambda: finished.setdefault("run", rt.start(export_run, run_id="x1"))
    )
    worker.start()
    assert w.entered.wait(10)
    inv = rt.cancel("x1")
    flying = effect_of(rt, "x1", "export")
    assert inv.in_flight == [flying.effect_id]
    assert w.stopped_jobs == [flying.idempotency_key]
    worker.join(10)
    assert finished["run"].status is R.CANCELLED
    # The aborted call did nothing; its retry was stopped by the cancel before it was sent.
    assert effect_of(rt, "x1", "export").status is S.CANCELLED
    outcomes = [a.outcome.value for a in rt.attempts("x1", "export") if a.outcome]
    assert outcomes == ["not_committed", "not_committed"]
    calls = [e for e in rt.audit("x1") if e.kind == "cancel_call"]
    assert calls
    assert calls[0].detail["in_flight"] is True


@ef.workflow("cc_correction")
def correction(ctx: ef.Context) -> Any:
    ctx.call("email", email, to="li@example.com", body="Your order ships tomorrow")
    if ctx.call("still_on", compute, n=0) == 0:  # the order was cancelled after all
        ctx.call("correction", email, to="li@example.com", body="Correction: it will not ship")
        raise ef.AbandonGoal("order cancelled")
    return "shipped"


def test_an_irreversible_effect_is_answered_by_a_business_follow_up_step(
    rt: ef.Runtime, w: World
) -> None:
    """An email cannot be unsent: the workflow sends a correction as a normal step; both stay."""
    run = rt.start(correction, run_id="c1")
    assert run.status is R.CANCELLED_WITH_EFFECTS
    first, second = effect_of(rt, "c1", "email"), effect_of(rt, "c1", "correction")
    assert (first.status, second.status) == (S.CONFIRMED, S.CONFIRMED)
    assert first.compensates is None
    assert second.compensates is None
    bodies = [m["body"] for m in w.mail.messages()]
    assert bodies == ["Your order ships tomorrow", "Correction: it will not ship"]


def test_the_timeline_and_the_attention_queue_show_what_waits(rt: ef.Runtime, w: World) -> None:
    """What the CLI, the API and the console render: a compensation beside what it answers, and
    the approvals and unknown effects waiting for a person."""
    rt.start(refund_case, run_id="r0", payment_id="pay_0", amount=5)
    [waiting] = rt.attention()
    assert (waiting.kind, waiting.run_id, waiting.step_id) == ("approval", "r0", "create_refund")
    approved_refund(rt, "r1", then="abandon")
    w.mail_reset_after_send = True
    rt.start(email_only, run_id="e1", abandon=False)
    queue = {(i.kind, i.run_id, i.step_id) for i in rt.attention()}
    assert queue == {
        ("approval", "r0", "create_refund"),
        ("approval", "r1", "compensate:create_refund"),
        ("unknown_effect", "e1", "email"),
    }
    rt.approve("r1", "compensate:create_refund", approver="finance", approval_id="APR-2")
    view = rt.timeline("r1")
    [refund] = [s for s in view.steps if s.step.step_id == "create_refund"]
    assert refund.effect is not None
    assert refund.compensation is not None
    assert refund.compensation.compensates == refund.effect.effect_id
    assert view.events[0].kind == "run_started"
    assert view.to_dict()["run"]["run_id"] == "r1"
