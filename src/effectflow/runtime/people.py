"""A person's decisions: settling an unknown effect (``port.resolve``) and approving a step
(``port.approve``). Both are pinned, fenced and audited: a stale version or a reused id is refused, and
the decision revokes any worker's lease so a zombie cannot write over it.

Both are compare-and-swap (DESIGN §9): what a decision was made on (the effect's version and status,
the step's state, the run's lease token) is checked by the store inside the transaction that records
it (``Batch.expect_*``), so of two concurrent contradicting decisions exactly one is recorded and the
other gets ``StaleState`` having changed nothing. The checks made here before building the batch
only give the early, precise refusal; they are repeated where it counts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, RunStatus, StepStatus
from effectflow.ledger.store import Batch, DecisionRecord
from effectflow.runtime import ending, leases, outcomes, requests
from effectflow.runtime.port import Port


def _awaits_approval(step: records.StepRecord) -> bool:
    return (
        step.status is StepStatus.PENDING and (step.error or {}).get("code") == "approval_required"
    )


def resolve(
    port: Port,
    effect_id: str,
    *,
    committed: bool,
    evidence: dict[str, Any],
    by: str,
    expected_version: int | None = None,
    decision_id: str | None = None,
) -> tuple[records.EffectRecord, bool]:
    """``Runtime.resolve`` (documented there): the effect as decided, and whether its run waited
    only for this answer (a cancelled run, which the caller resumes to give it its end state)."""
    if not by:
        raise errors.ArgumentError("resolve needs `by`: the person (or system) deciding")
    digests.check_id(by, path="by")
    if decision_id is not None:
        digests.check_id(decision_id, path="decision_id")
    evidence = digests.to_jsonable(evidence, path="evidence")
    effect = port.store.get_effect(effect_id, tenant=port.tenant)
    if effect is None:
        raise errors.EffectNotFound(
            f"no effect {effect_id} in tenant {port.tenant}", effect_id=effect_id
        )
    params = digests.digest(
        {"effect_id": effect_id, "committed": committed, "evidence": evidence, "by": by}
    )
    if decision_id is not None:
        replayed = _replayed_decision(port, decision_id, params, effect_id)
        if replayed is not None:
            return replayed, False
    if expected_version is not None and expected_version != effect.version:
        raise errors.StaleState(
            f"effect {effect_id} is at version {effect.version}, not {expected_version}; "
            "reload it and decide again",
            effect_id=effect_id,
            run_id=effect.run_id,
        )
    if effect.status not in records.IN_DOUBT_STATUSES:
        raise errors.StaleState(
            f"effect {effect_id} is {effect.status}, not unknown: there is nothing to resolve",
            effect_id=effect_id,
            run_id=effect.run_id,
        )
    run = port.run(effect.run_id)
    now = port.clock()
    if (
        run.status is RunStatus.RUNNING
        and run.lease_owner
        and (run.lease_expires_at or 0) > now
        and leases.owner_alive(run.lease_owner)
    ):
        raise errors.StaleState(
            f"run {run.run_id} is being executed by {run.lease_owner}; wait until it pauses",
            run_id=run.run_id,
            effect_id=effect_id,
        )
    step = next(s for s in port.store.steps(run.run_id) if s.step_id == effect.step_id)
    attempts = port.store.attempts(run.run_id, step.step_id)
    batch = Batch(run.run_id, lease_token=None)
    # What the decision was made on, checked where it is recorded: the effect's version and status,
    # the step as read (no worker moved it), and the lease token it revokes (no worker claimed the
    # run meanwhile, which would get the same token again).
    batch.expect_effect(effect_id, version=effect.version, status=effect.status)
    batch.expect_step(step.step_id, status=step.status, updated_at=step.updated_at)
    batch.expect_run(lease_token=run.lease_token)
    # A person's decision revokes any lease: a zombie holding the old token can write nothing.
    batch.run_changes.update(
        lease_token=run.lease_token + 1,
        lease_owner=None,
        lease_expires_at=None,
        next_action=NextAction.EXECUTE,
    )
    batch.attempt(
        records.AttemptRecord(
            attempt_id=requests.new_id("att"),
            run_id=run.run_id,
            step_id=step.step_id,
            number=len(attempts) + 1,
            kind=records.AttemptKind.RESOLUTION,
            generation=run.generation,
            started_at=now,
            ended_at=now,
            outcome=records.Outcome.COMMITTED if committed else records.Outcome.NOT_COMMITTED,
            error=None,
            response_digest=digests.digest(evidence),
        )
    )
    for attempt in attempts:
        if attempt.outcome is None:
            batch.attempt(outcomes.lost_in_flight(attempt, now))
    if committed:
        ext_id = evidence.get("external_effect_id", effect.external_effect_id)
        ext_id = None if ext_id is None else str(ext_id)
        output = confirmed_output(evidence, ext_id, _effect_id_field(port, effect))
        new_effect = dataclasses.replace(
            effect,
            status=StepStatus.CONFIRMED,
            external_effect_id=ext_id,
            committed_at=now,
            evidence=evidence,
            resolved_by=by,
            next_action=NextAction.NONE,
            version=effect.version + 1,
            updated_at=now,
        )
        new_step = dataclasses.replace(
            step,
            status=StepStatus.CONFIRMED,
            external_effect_id=ext_id,
            output=output,
            confirmed_at=now,
            next_action=NextAction.USE_RESULT,
            updated_at=now,
        )
    else:
        new_effect = dataclasses.replace(
            effect,
            status=StepStatus.NOT_COMMITTED,
            evidence=evidence,
            resolved_by=by,
            next_action=NextAction.EXECUTE,
            version=effect.version + 1,
            updated_at=now,
        )
        new_step = dataclasses.replace(
            step,
            status=StepStatus.NOT_COMMITTED,
            next_action=NextAction.EXECUTE,
            updated_at=now,
        )
    batch.effect(new_effect)
    batch.step(new_step)
    if decision_id is not None:
        batch.decisions.append(DecisionRecord(decision_id, port.tenant, params, effect_id, now))
    batch.event(
        "resolution",
        now,
        step_id=step.step_id,
        effect_id=effect_id,
        actor=by,
        committed=committed,
        evidence=evidence,
        decision_id=decision_id,
        previous_status=effect.status.value,
    )
    try:
        port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    except (errors.StaleState, errors.IdempotencyConflict):
        # Another decision was recorded first. The same decision (same id, same parameters)
        # recorded by a concurrent call is this one's answer too; anything else is refused.
        if decision_id is not None:
            replayed = _replayed_decision(port, decision_id, params, effect_id)
            if replayed is not None:
                return replayed, False
        raise
    # A cancelled run waited only for this answer: the caller gives it its end state now.
    return new_effect, run.control is not None and run.control.get("kind") == ending.CANCEL


def confirmed_output(
    evidence: dict[str, Any], external_effect_id: str | None, effect_id_field: str | None
) -> Any:
    """The result a step confirmed by a person returns to its workflow.

    ``evidence["result"]`` when the person gave one (the provider's answer, as the tool would have
    returned it); otherwise the evidence itself, with the contract's effect-id field (e.g.
    ``provider_message_id``) set to ``evidence["external_effect_id"]``, so the workflow reads the
    id where it reads it after a call.
    """
    result = evidence.get("result")
    if result is not None:
        return result
    output = dict(evidence)
    if effect_id_field and external_effect_id is not None:
        output[effect_id_field] = external_effect_id
    return output


def _effect_id_field(port: Port, effect: records.EffectRecord) -> str | None:
    """The field of the tool's result that carries the provider's id: recorded on the effect at
    intent time, so a resolution records the same result with or without the application's
    registry; effects recorded before that fall back to the registry."""
    if effect.effect_id_field is not None:
        return effect.effect_id_field
    try:
        return port.registry.tool(effect.tool).contract.effect_id
    except errors.ContractError:
        return None


def _replayed_decision(
    port: Port, decision_id: str, params: str, effect_id: str
) -> records.EffectRecord | None:
    """The effect as decided, when ``decision_id`` was already recorded with these parameters;
    None when it was not recorded.

    Raises:
        errors.IdempotencyConflict: it was recorded with other parameters (or another tenant).
    """
    pinned = port.store.get_decision(port.tenant, decision_id)
    if pinned is None:
        return None
    if pinned.params_digest != params or pinned.tenant != port.tenant:
        raise errors.IdempotencyConflict(
            f"decision {decision_id} was already taken with other parameters",
            effect_id=effect_id,
        )
    found = port.store.get_effect(effect_id, tenant=port.tenant)
    assert found is not None
    return found


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
                "code": "approval_declined",
                "type": "StepRejected",
                "message": f"declined by {by}: {reason}",
                "by": by,
                "reason": reason,
            },
            updated_at=now,
        )
    )
    batch.event(
        "approval_declined",
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
        and error.get("code") == "approval_declined"
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
    if step is None or not _awaits_approval(step):
        raise errors.StaleState(
            f"step {step_id} of run {run.run_id} is not waiting for an approval"
            + ("" if step is None else f" (it is {step.status})")
            + "; nothing was recorded",
            run_id=run.run_id,
            step_id=step_id,
        )
    batch = Batch(run.run_id, lease_token=None)
    batch.expect_step(
        step_id,
        status=StepStatus.PENDING,
        error_code="approval_required",
        request_digest=step.request_digest,
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
