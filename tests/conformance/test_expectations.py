"""Batch expectations on every backend: what a decision was made on is checked in the transaction
that records it, and a batch whose expectation fails writes nothing
(docs/concepts.md#peoples-decisions-are-compare-and-swap)."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

import pytest
from test_store import T0, TTL, claim, create_run, intent_batch, make_effect, snapshot

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import StepStatus
from effectflow.ledger.store import Batch, DecisionRecord, LedgerStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import Backend


def resolution(run_id: str, version: int, *, by: str, decision_id: str | None = None) -> Batch:
    """An unfenced batch confirming the effect of ``send``, made on ``version`` of it."""
    batch = Batch(run_id, lease_token=None)
    batch.expect_effect(f"eff_{run_id}_send", version=version, status=StepStatus.INTENT_RECORDED)
    batch.effect(
        make_effect(run_id, status=StepStatus.CONFIRMED, version=version + 1, resolved_by=by)
    )
    if decision_id is not None:
        batch.decisions.append(DecisionRecord(decision_id, "acme", "sha256:p", "e", T0))
    batch.event("resolution", T0 + 5, actor=by)
    return batch


def with_intent(store: LedgerStore, run_id: str = "r1") -> records.RunRecord:
    create_run(store, run_id)
    run = claim(store, run_id)
    store.apply(intent_batch(run), lease_ttl=TTL, now=T0)
    return run


def test_a_batch_whose_expectations_hold_is_written(store: LedgerStore) -> None:
    """Expectations on the run, a step and an effect that still hold let the batch through."""
    run = with_intent(store)
    batch = resolution("r1", 1, by="alice")
    batch.expect_run(lease_token=run.lease_token, status=(records.RunStatus.RUNNING,))
    batch.expect_step("send", status=StepStatus.INTENT_RECORDED, error_code=None)
    store.apply(batch, lease_ttl=TTL, now=T0)
    effect = store.get_effect("eff_r1_send")
    assert effect is not None
    assert effect.resolved_by == "alice"


@pytest.mark.parametrize(
    "expect",
    [
        lambda b: b.expect_effect("eff_r1_send", version=7),
        lambda b: b.expect_effect("eff_r1_send", status=(StepStatus.UNKNOWN,)),
        lambda b: b.expect_effect("eff_missing", version=1),
        lambda b: b.expect_step("send", status=StepStatus.PENDING),
        lambda b: b.expect_step("send", error_code="approval_required"),
        lambda b: b.expect_step("missing", status=StepStatus.INTENT_RECORDED),
        lambda b: b.expect_run(lease_token=99),
        lambda b: b.expect_run(control=({"kind": "cancel"},)),
        lambda b: b.expect_unapproved("send", "sha256:req"),
    ],
    ids=[
        "effect-version",
        "effect-status",
        "effect-missing",
        "step-status",
        "step-error-code",
        "step-missing",
        "run-lease",
        "run-control",
        "already-approved",
    ],
)
def test_a_failed_expectation_refuses_the_whole_batch(
    store: LedgerStore, expect: Callable[[Batch], None]
) -> None:
    """One expectation that no longer holds refuses the batch with StaleState; nothing of it is
    written (no row, no audit event, no decision, no approval, no run change)."""
    run = with_intent(store)
    approval = records.ApprovalRecord("APR-1", "acme", "r1", "send", "sha256:req", "x", None, T0)
    # An approval of the step's request, for the ``already-approved`` case.
    setup = Batch("r1", lease_token=None)
    setup.approvals.append(dataclasses.replace(approval, approval_id="APR-0"))
    store.apply(setup, lease_ttl=TTL, now=T0)
    before = snapshot(store, "r1")
    batch = resolution("r1", 1, by="alice", decision_id="dec-1")
    batch.approvals.append(dataclasses.replace(approval, request_digest="sha256:other"))
    batch.run_changes.update(lease_token=run.lease_token + 1, lease_owner=None)
    expect(batch)
    with pytest.raises(errors.StaleState) as refused:
        store.apply(batch, lease_ttl=TTL, now=T0)
    assert refused.value.run_id == "r1"
    assert snapshot(store, "r1") == before
    assert store.get_decision("acme", "dec-1") is None
    assert store.get_approval("acme", "APR-1") is None


def test_in_a_group_commit_a_refused_batch_refuses_only_itself(store: LedgerStore) -> None:
    """apply_many: the batch whose expectation fails gets StaleState, the others commit."""
    for run_id in ("r1", "r2", "r3"):
        with_intent(store, run_id)
    before = snapshot(store, "r2")
    results = store.apply_many(
        [resolution("r1", 1, by="a"), resolution("r2", 5, by="b"), resolution("r3", 1, by="c")],
        lease_ttl=TTL,
        now=T0,
    )
    assert [type(r.error).__name__ for r in results] == ["NoneType", "StaleState", "NoneType"]
    assert snapshot(store, "r2") == before
    for run_id, by in (("r1", "a"), ("r3", "c")):
        effect = store.get_effect(f"eff_{run_id}_send")
        assert effect is not None
        assert effect.resolved_by == by


def race_two(stores: list[LedgerStore], run_id: str) -> list[str]:
    """Both stores apply a decision made on version 1 of the run's effect at the same moment."""
    barrier = threading.Barrier(2)
    outcomes = ["", ""]

    def decide(i: int) -> None:
        batch = resolution(run_id, 1, by=f"person-{i}")
        barrier.wait()
        try:
            stores[i].apply(batch, lease_ttl=TTL, now=T0)
            outcomes[i] = "recorded"
        except errors.StaleState:
            outcomes[i] = "refused"

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_two_stores_deciding_at_once_record_one(backend: Backend) -> None:
    """Two stores (two processes' connections) apply a decision made on the same version at the
    same moment, many times: exactly one is recorded each time, the other gets StaleState."""
    stores = [backend.open(), backend.open()]
    try:
        for trial in range(20):
            run_id = f"race-{trial}"
            with_intent(stores[0], run_id)
            assert sorted(race_two(stores, run_id)) == ["recorded", "refused"], trial
            kinds = [e.kind for e in stores[0].audit(run_id)]
            assert kinds.count("resolution") == 1
    finally:
        for opened in stores:
            opened.close()


def test_a_decision_or_approval_id_taken_is_an_idempotency_conflict(store: LedgerStore) -> None:
    """A decision or approval id already recorded refuses the batch with IdempotencyConflict (not
    the driver's unique violation), and writes nothing of it."""
    with_intent(store, "r1")
    with_intent(store, "r2")
    store.apply(resolution("r1", 1, by="a", decision_id="dec-1"), lease_ttl=TTL, now=T0)
    before = snapshot(store, "r2")
    with pytest.raises(errors.IdempotencyConflict, match="dec-1"):
        store.apply(resolution("r2", 1, by="b", decision_id="dec-1"), lease_ttl=TTL, now=T0)
    assert snapshot(store, "r2") == before
    approval = records.ApprovalRecord("APR-1", "acme", "r1", "send", "sha256:req", "x", None, T0)
    first = Batch("r1", lease_token=None)
    first.approvals.append(approval)
    store.apply(first, lease_ttl=TTL, now=T0)
    again = Batch("r2", lease_token=None)
    again.approvals.append(dataclasses.replace(approval, run_id="r2"))
    again.event("approved", T0)
    with pytest.raises(errors.IdempotencyConflict, match="APR-1"):
        store.apply(again, lease_ttl=TTL, now=T0)
    assert snapshot(store, "r2") == before


def test_an_expectation_names_real_fields() -> None:
    """A misspelt field is refused when the expectation is made, not silently never checked."""
    with pytest.raises(errors.ContractError, match="verison"):
        Batch("r1", lease_token=None).expect_effect("e", verison=1)
