"""Approvals: a step that needs one (a financial write, a compensation that is not automatic)
waits for a person before its call, and a person gives (``rt.approve``) or declines
(``rt.reject``) it.

The step waits as ``awaiting_approval`` (its error says why, code ``approval_required``) and its
run paused. An
answer is compare-and-swap: of an approval and a decline given at the same moment exactly one is
recorded, and it revokes the run's lease so only the winner's resume can claim it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.ledger.store import Batch
from effectflow.policies import compensation as compensation_policy
from effectflow.runtime import machine_io
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall

#: The error code of a step (and its paused run) that waits for an approval.
APPROVAL_REQUIRED = "approval_required"
#: The error code of a step a person declined (``rt.reject``): it is never called.
APPROVAL_DECLINED = "approval_declined"


def needed(call: StepCall) -> bool:
    """Whether the call waits for a person's approval: financial writes by default (the contract
    says), and compensations by ``compensation_policy.needs_approval``."""
    if call.compensates is not None:
        original = call.port.registry.tool(call.compensates.tool).contract
        return compensation_policy.needs_approval(original, call.contract)
    return call.contract.needs_approval


def given(call: StepCall) -> records.ApprovalRecord | None:
    """The approval given for this step's exact request, if any."""
    for approval in reversed(call.port.store.approvals(call.run_id, call.step_id)):
        if approval.request_digest == call.request_digest:
            return approval
    return None


def wait_for(
    call: StepCall, existing: records.StepRecord | None
) -> Generator[machine_io.Request, Any, None]:
    """Record the step as waiting for a person's approval, pause the run, and unwind."""
    st = call.state
    now = call.port.clock()
    reason = (
        f"{call.tool.ref} is a {call.contract.effect.value}"
        + (" compensation" if call.compensates is not None else "")
        + ": it needs an approval (rt.approve) before the call"
    )
    step = call.step_record(existing, StepStatus.AWAITING_APPROVAL, now)
    step = dataclasses.replace(
        step,
        next_action=NextAction.ASK_A_PERSON,
        error={"code": APPROVAL_REQUIRED, "message": reason},
    )
    batch = st.batch()
    st.link_previous(call.step_id, batch)
    batch.step(step)
    batch.run_changes.update(
        status=records.RunStatus.PAUSED,
        next_action=NextAction.ASK_A_PERSON,
        error={
            "code": APPROVAL_REQUIRED,
            "message": reason,
            "step_id": call.step_id,
            "request_digest": call.request_digest,
        },
        lease_owner=None,
        lease_expires_at=None,
    )
    batch.event(
        "approval_requested",
        now,
        step_id=call.step_id,
        tool=call.tool.ref,
        request_digest=call.request_digest,
        compensates=None if call.compensates is None else call.compensates.effect_id,
    )
    batch.event("run_paused", now, step_id=call.step_id, reason=reason)
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    raise machine_io.Suspend(call.step_id, reason)


# -- a person's answer ---------------------------------------------------------------------------


def approve(
    port: Port,
    run_id: str,
    step_id: str,
    *,
    approver: str,
    approval_id: str,
    note: str | None = None,
) -> records.RunRecord | None:
    """``Runtime.approve`` (documented there): None once the approval is recorded (the caller
    resumes the run), or the run when this very approval was recorded before (nothing to do)."""
    if not approver or not approval_id:
        raise errors.ArgumentError("approve needs approver= and approval_id=")
    digests.check_id(approver, path="approver")
    digests.check_id(approval_id, path="approval_id")
    if note is not None:
        digests.to_jsonable(note, path="note")
    run = port.run(run_id)
    step = next((s for s in port.store.steps(run_id) if s.step_id == step_id), None)
    if _replayed_approval(port, run, step, step_id, approver=approver, approval_id=approval_id):
        return run
    batch, step = _answer_batch(run, step, step_id)
    now = port.clock()
    batch.approvals.append(
        records.ApprovalRecord(
            approval_id=approval_id,
            tenant=port.tenant,
            run_id=run_id,
            step_id=step_id,
            request_digest=step.request_digest,
            approver=approver,
            note=note,
            approved_at=now,
        )
    )
    batch.event(
        "approved",
        now,
        step_id=step_id,
        actor=approver,
        approval_id=approval_id,
        request_digest=step.request_digest,
        note=note,
    )
    try:
        port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    except (errors.StaleState, errors.IdempotencyConflict):
        # Another approval was recorded first: this very one (same id and parameters) is a no-op,
        # anything else is refused. Either way this call resumes nothing: the winner does.
        fresh = port.run(run_id)
        if _replayed_approval(
            port, fresh, step, step_id, approver=approver, approval_id=approval_id
        ):
            return fresh
        raise
    return None


def reject(
    port: Port,
    run_id: str,
    step_id: str,
    *,
    by: str,
    reason: str,
) -> records.RunRecord | None:
    """``Runtime.reject`` (documented there): None once the decline is recorded (the caller
    resumes the run), or the run when this very decline was recorded before."""
    if not isinstance(by, str) or not by.strip():
        raise errors.ArgumentError(
            "reject needs by=: the person declining (the audit log records it)"
        )
    if not isinstance(reason, str) or not reason.strip():
        raise errors.ArgumentError("reject needs reason=: why the step is declined (recorded)")
    digests.check_id(by, path="by")
    digests.to_jsonable(reason, path="reason")
    run = port.run(run_id)
    step = next((s for s in port.store.steps(run_id) if s.step_id == step_id), None)
    if step is not None and _declined(step, by, reason):
        return run  # this very decision, recorded already (a retried request)
    batch, step = _answer_batch(run, step, step_id)
    now = port.clock()
    batch.step(
        dataclasses.replace(
            step,
            status=StepStatus.REJECTED,
            next_action=NextAction.NONE,
            error={
                "code": APPROVAL_DECLINED,
                "type": "StepRejected",
                "message": f"declined by {by}: {reason}",
                "by": by,
                "reason": reason,
            },
            updated_at=now,
        )
    )
    batch.event(
        APPROVAL_DECLINED,
        now,
        step_id=step_id,
        actor=by,
        reason=reason,
        request_digest=step.request_digest,
    )
    try:
        port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    except errors.StaleState:
        fresh = next((s for s in port.store.steps(run_id) if s.step_id == step_id), None)
        if fresh is not None and _declined(fresh, by, reason):
            return port.run(run_id)  # a concurrent call recorded this very decision
        raise
    return None


def _declined(step: records.StepRecord, by: str, reason: str) -> bool:
    error = step.error or {}
    return (
        step.status is StepStatus.REJECTED
        and error.get("code") == APPROVAL_DECLINED
        and (error.get("by"), error.get("reason")) == (by, reason)
    )


def _answer_batch(
    run: records.RunRecord, step: records.StepRecord | None, step_id: str
) -> tuple[Batch, records.StepRecord]:
    """The batch of a person's answer to an approval (given or declined), carrying what it was
    made on: the step still waits for one, for this very request; no approval of that request was
    recorded meanwhile; and the lease it revokes is the one read (so of two answers at the same
    moment exactly one is recorded, and only its resume can claim the run).

    Raises:
        errors.StaleState: the step does not wait for an approval; nothing is recorded.
    """
    if step is None or not awaits_approval(step):
        raise errors.StaleState(
            f"step {step_id} of run {run.run_id} is not waiting for an approval"
            + ("" if step is None else f" (it is {step.status})")
            + "; nothing was recorded",
            run_id=run.run_id,
            step_id=step_id,
        )
    batch = Batch(run.run_id, lease_token=None)
    batch.expect_step(
        step_id, status=StepStatus.AWAITING_APPROVAL, request_digest=step.request_digest
    )
    batch.expect_unapproved(step_id, step.request_digest)
    batch.expect_run(lease_token=run.lease_token)
    batch.run_changes.update(
        lease_token=run.lease_token + 1, lease_owner=None, lease_expires_at=None
    )
    return batch, step


def _replayed_approval(
    port: Port,
    run: records.RunRecord,
    step: records.StepRecord | None,
    step_id: str,
    *,
    approver: str,
    approval_id: str,
) -> bool:
    """Whether ``approval_id`` was already recorded for this very approval (a no-op).

    Raises:
        errors.IdempotencyConflict: it was recorded for another step, request or approver.
    """
    used = port.store.get_approval(port.tenant, approval_id)
    if used is None:
        return False
    same = (used.tenant, used.run_id, used.step_id, used.approver) == (
        port.tenant,
        run.run_id,
        step_id,
        approver,
    )
    if not same or step is None or used.request_digest != step.request_digest:
        raise errors.IdempotencyConflict(
            f"approval {approval_id} was already given for another step or request",
            run_id=run.run_id,
            step_id=step_id,
        )
    return True


def awaits_approval(step: records.StepRecord) -> bool:
    """Whether the step waits for a person's approval before its call."""
    return step.status is StepStatus.AWAITING_APPROVAL
