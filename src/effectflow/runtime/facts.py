"""What the decision table is told about a step: its situation and the facts of its contract,
budgets and attempts (``policies.decision.Facts``)."""

from __future__ import annotations

from typing import Any

from effectflow import errors
from effectflow.contracts.tool import EffectClass
from effectflow.ledger import records
from effectflow.ledger.records import StepStatus
from effectflow.policies import decision
from effectflow.policies.decision import Situation
from effectflow.runtime import classify, completion
from effectflow.runtime.step_call import StepCall


def of(call: StepCall, step: records.StepRecord) -> decision.Facts:
    contract = call.contract
    sc = call.step_contract
    if contract.idempotency.supported:
        # Key-based dedup: only while the provider still remembers the key (its retention);
        # past it a retry could duplicate.
        age = call.port.clock() - step.created_at
        idempotent = call.tool.takes_key and age < contract.idempotency.retention_seconds
    else:
        # Natural dedup (an upsert by a natural id, a PUT of the whole state).
        idempotent = contract.effect is EffectClass.IDEMPOTENT_WRITE
    kwargs: dict[str, Any] = {}
    if sc is not None:
        kwargs["when_unknown"] = sc.when_unknown
        kwargs["when_not_committed"] = sc.when_not_committed
    return decision.Facts(
        effect=contract.effect,
        idempotent=idempotent,
        has_lookup=contract.confirm is not None,
        commit=contract.commit,
        attempts_used=call.count(records.AttemptKind.CALL),
        max_attempts=contract.retry.max_attempts,
        lookups_used=call.count(records.AttemptKind.LOOKUP),
        max_lookups=contract.retry.max_lookups,
        has_compensation=contract.compensation is not None,
        deadline_passed=completion.deadline_passed(call, step),
        may_still_land=_last_lookup_code(call) == classify.NOT_FOUND_MAY_STILL_LAND,
        **kwargs,
    )


def situation_of(call: StepCall, step: records.StepRecord) -> Situation:
    status = step.status
    if status in records.IN_DOUBT_STATUSES:
        return Situation.IN_DOUBT
    if any(
        a.kind is records.AttemptKind.CALL and a.outcome is None
        for a in call.state.attempts(call.step_id)
    ):
        # A call whose outcome was never recorded (its process died during it) may have
        # committed, whatever the step said before it was sent.
        return Situation.IN_DOUBT
    if status in (
        StepStatus.NOT_COMMITTED,
        StepStatus.FAILED,
        StepStatus.PENDING,
        StepStatus.AWAITING_APPROVAL,
    ):
        return Situation.NOT_COMMITTED
    if status is StepStatus.REJECTED:
        return Situation.REJECTED
    if status is StepStatus.CONFLICT:
        return Situation.CONFLICT
    if status is StepStatus.AWAITING_COMPLETION:
        return Situation.BELOW_REQUIRED_STATE
    raise errors.StepFailed(
        f"step {call.step_id} is {status}; this version cannot continue it",
        run_id=call.run_id,
        step_id=call.step_id,
    )


def _last_lookup_code(call: StepCall) -> str | None:
    """The error code of the step's last lookup (``classify.NOT_FOUND_MAY_STILL_LAND``...)."""
    for attempt in reversed(call.state.attempts(call.step_id)):
        if attempt.kind is records.AttemptKind.LOOKUP:
            return None if attempt.error is None else attempt.error.get("code")
    return None
