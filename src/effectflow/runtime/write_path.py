"""The write path of docs/concepts.md#the-write-path for an external write, decided by the decision
table.

The order is the product:
1. persist the intent (digest, logical operation, key) — commit — before anything is sent;
2. call the tool with the key (``calling``);
3. persist the outcome (result, external id, completion state, response digest) — commit
   (``outcome``);
4. the outcome commit is the step checkpoint;
5. return to the workflow, which schedules the next step.
Every branch after an attempt goes through ``decision.decide``: a retry with the original key, a
lookup (``lookup``), a completion poll (``completion``), a re-observation (``preconditions``), a
person (``resolution``), or a definite failure.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from effectflow import digests, errors, telemetry
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, NextAction, StepStatus
from effectflow.ledger.store import OperationBinding
from effectflow.policies import compensation as compensation_policy
from effectflow.policies import decision, retry
from effectflow.policies.decision import Action, Situation
from effectflow.runtime import (
    approvals,
    calling,
    changed_code,
    completion,
    facts,
    lookup,
    machine_io,
    preconditions,
    resolution,
)
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.step_call import StepCall


def write(call: StepCall, existing: records.StepRecord | None) -> machine_io.Machine:
    """An external write: its intent and first call (or, for a step the ledger recorded, its
    situation), then the decision table until the step is settled or the run pauses."""
    st = call.state
    op_id = _operation_and_key(call)
    if existing is not None and existing.status in (
        StepStatus.PENDING,
        StepStatus.AWAITING_APPROVAL,
    ):
        existing = None if existing.effect_id is None else existing
    if existing is None:
        skipped = changed_code.unreached(st, call.step_id)
        if skipped and call.compensates is None:
            yield from changed_code.settle_unreached(
                call.port,
                st,
                skipped,
                f"the workflow now calls step {call.step_id} ({call.tool.ref}), which the run "
                "never recorded, without having reached the recorded step(s) "
                + ", ".join(s.step_id for s in skipped)
                + ": its code changed since they ran (a step renamed, removed or reordered)",
            )
        approval = None
        if approvals.needed(call):
            # The same operation already done by another step makes no call: no approval.
            elsewhere = _bound_elsewhere(call, op_id)
            if elsewhere is not None:
                return (yield from _reuse_operation(call, elsewhere))
            approval = approvals.given(call)
            if approval is None:
                yield from approvals.wait_for(call, st.steps.get(call.step_id))
        reused = yield from _record_intent(call, op_id, approval)
        if reused is not None:
            return reused
        step = st.steps[call.step_id]
        situation = yield from calling.send(call, step)
    else:
        step = existing
        st.link_previous(call.step_id, st.pending)
        completion.check_required_state(call, step)
        situation = facts.situation_of(call, step)
        if situation is Situation.IN_DOUBT:
            call.close_orphan_attempts(step)
    return (yield from _until_settled(call, situation))


def _operation_and_key(call: StepCall) -> str:
    """The call's logical operation (the call's, the step contract's template, or the run's own
    step; a new revision's is its own), and its idempotency key derived from it."""
    st = call.state
    sc = call.step_contract
    op_id = (
        call.operation_id
        or (sc.operation_id_for(st.run.input) if sc is not None else None)
        or f"{call.run_id}/{call.step_id}"
    )
    if call.revision > 1:
        op_id = f"{op_id}#r{call.revision}"
    if call.target is not None:
        target = call.target
    elif call.contract.target is not None:
        target = str(call.payload.get(call.contract.target, ""))
    else:
        target = ""
    call.key = digests.idempotency_key(
        tenant=st.run.tenant,
        operation_type=call.contract.name,
        target=target,
        payload_digest=call.request_digest,
        logical_operation_id=op_id,
    )
    return op_id


def _until_settled(call: StepCall, situation: Situation) -> machine_io.Machine:
    """Every branch after an attempt goes through the decision table, until the step has a value
    for the workflow (or raises, or pauses the run)."""
    st = call.state
    while True:
        step = st.steps[call.step_id]
        verdict = decision.decide(situation, facts.of(call, step))
        telemetry.decided(
            call.run_id,
            call.step_id,
            step.effect_id,
            step.logical_operation_id,
            call.tool.ref,
            verdict.row,
            verdict.action.value,
        )
        action = verdict.action
        if action is Action.USE_RECORDED:
            return st.steps[call.step_id].output
        if action in (Action.EXECUTE, Action.RETRY_WITH_ORIGINAL_KEY):
            used = call.count(records.AttemptKind.CALL)
            if used:
                yield machine_io.Sleep(retry.backoff(call.contract.retry, used, st.rng))
            situation = yield from calling.send(call, step, verdict)
            continue
        if action is Action.LOOKUP:
            used = call.count(records.AttemptKind.LOOKUP)
            if used:
                yield machine_io.Sleep(retry.backoff(call.contract.retry, used, st.rng))
            situation = yield from lookup.settle(call, step, verdict)
            continue
        if action is Action.AWAIT_COMPLETION:
            yield machine_io.Sleep(completion.wait(call, step))
            situation = yield from lookup.settle(call, step, verdict)
            continue
        if action is Action.REOBSERVE:
            yield from preconditions.reobserve(call, step, verdict)
        if action is Action.ASK_A_PERSON:
            yield from resolution.ask_a_person(call, step, verdict)
        if action is Action.FAIL:
            raise _fail(call, step, verdict)
        raise errors.StepFailed(
            f"step {call.step_id}: {verdict.reason} ({verdict.row})",
            run_id=call.run_id,
            step_id=call.step_id,
        )


def _record_intent(
    call: StepCall, op_id: str, approval: records.ApprovalRecord | None = None
) -> Generator[machine_io.Request, Any, Any]:
    """Step 1 of the write path: the intent, durable before anything is sent."""
    st = call.state
    store = call.port.store
    # The default operation id is this step's own, bound in the same transaction as the step
    # row: with no step row yet it cannot be bound, so the read is skipped (the insert still
    # checks the binding inside the intent's transaction).
    default_op = op_id == f"{call.run_id}/{call.step_id}"
    binding = None if default_op else store.get_operation(st.run.tenant, op_id)
    if binding is not None:
        if binding.request_digest != call.request_digest:
            raise errors.IdempotencyConflict(
                f"logical operation {op_id!r} is bound to another request "
                f"({binding.request_digest[:19]}...); nothing was written. A new user request "
                "needs a new operation id.",
                run_id=call.run_id,
                step_id=call.step_id,
                idempotency_key=binding.idempotency_key,
            )
        if (binding.run_id, binding.step_id) != (call.run_id, call.step_id):
            return (yield from _reuse_operation(call, binding))
    now = call.port.clock()
    step, effect, attempt = _intent_records(call, op_id, approval, now)
    effect_id = effect.effect_id
    retention = (
        call.contract.idempotency.retention_seconds
        if call.contract.idempotency.supported
        else 86400.0
    )
    batch = st.batch()
    # A deadline is bounded by the lease this process can prove: its call gets a whole one.
    batch.full_lease = call.tool.takes_deadline
    st.link_previous(call.step_id, batch)
    if call.compensates is not None:
        call.mark_original(batch, CompensationStatus.COMPENSATING, now)
    batch.operations.append(
        OperationBinding(
            tenant=st.run.tenant,
            logical_operation_id=op_id,
            idempotency_key=call.key,
            request_digest=call.request_digest,
            tool=call.tool.ref,
            run_id=call.run_id,
            step_id=call.step_id,
            created_at=now,
            key_expires_at=now + retention,
        )
    )
    batch.step(step)
    batch.effect(effect)
    batch.attempt(attempt)
    batch.event(
        "intent",
        now,
        step_id=call.step_id,
        effect_id=effect_id,
        tool=call.tool.ref,
        effect_class=call.contract.effect.value,
        logical_operation_id=op_id,
        idempotency_key=call.key,
        request_digest=call.request_digest,
        step_revision=call.revision,
        approval_id=None if approval is None else approval.approval_id,
        compensates=None if call.compensates is None else call.compensates.effect_id,
    )
    call.port.faults.hit(FaultPoint.BEFORE_INTENT, call.step_id)
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    st.first_attempt(attempt)
    call.effect = effect
    call.port.faults.hit(FaultPoint.AFTER_INTENT, call.step_id)
    return None


def _intent_records(
    call: StepCall, op_id: str, approval: records.ApprovalRecord | None, now: float
) -> tuple[records.StepRecord, records.EffectRecord, records.AttemptRecord]:
    """The step, its effect and its first attempt as the intent records them: the effect may
    exist from the moment this commits (``intent_recorded``, next action ``reconcile``)."""
    st = call.state
    effect_id = machine_io.new_id("eff")
    attempt = records.AttemptRecord(
        attempt_id=machine_io.new_id("att"),
        run_id=call.run_id,
        step_id=call.step_id,
        number=1,
        kind=records.AttemptKind.CALL,
        generation=st.run.generation,
        started_at=now,
        ended_at=None,
        outcome=None,
        error=None,
        response_digest=None,
    )
    step = records.evolve(
        call.step_record(None, StepStatus.INTENT_RECORDED, now, revision=call.revision),
        logical_operation_id=op_id,
        idempotency_key=call.key,
        effect_id=effect_id,
        next_action=NextAction.RECONCILE,
        required_state=completion.required_state(call),
        approval_id=None if approval is None else approval.approval_id,
    )
    effect = records.EffectRecord(
        effect_id=effect_id,
        tenant=st.run.tenant,
        run_id=call.run_id,
        step_id=call.step_id,
        tool=call.tool.ref,
        tool_call_id=attempt.attempt_id,
        logical_operation_id=op_id,
        idempotency_key=call.key,
        request_digest=call.request_digest,
        response_digest=None,
        status=StepStatus.INTENT_RECORDED,
        external_system=call.contract.external_system or call.contract.name,
        external_effect_id=None,
        committed_at=None,
        approval_id=None if approval is None else approval.approval_id,
        compensation_status=compensation_policy.initial_status(call.contract),
        compensates=None if call.compensates is None else call.compensates.effect_id,
        evidence=None,
        resolved_by=None,
        next_action=NextAction.RECONCILE,
        version=1,
        created_at=now,
        updated_at=now,
        effect_id_field=call.contract.effect_id,
    )
    return step, effect, attempt


def _bound_elsewhere(call: StepCall, op_id: str) -> OperationBinding | None:
    """The binding of ``op_id`` to another step for this very request, if there is one."""
    if op_id == f"{call.run_id}/{call.step_id}":
        return None
    binding = call.port.store.get_operation(call.state.run.tenant, op_id)
    if binding is None or binding.request_digest != call.request_digest:
        return None
    if (binding.run_id, binding.step_id) == (call.run_id, call.step_id):
        return None
    return binding


def _reuse_operation(
    call: StepCall, binding: OperationBinding
) -> Generator[machine_io.Request, Any, Any]:
    """The logical operation already belongs to another step (e.g. a re-submitted request)."""
    st = call.state
    other = next(
        (
            s
            for s in call.port.store.steps(binding.run_id)
            if s.step_id == binding.step_id and s.status is StepStatus.CONFIRMED
        ),
        None,
    )
    if other is None:
        raise errors.IdempotencyConflict(
            f"logical operation {binding.logical_operation_id!r} is in progress in run "
            f"{binding.run_id} (step {binding.step_id}); settle it there before reusing it",
            run_id=call.run_id,
            step_id=call.step_id,
            idempotency_key=binding.idempotency_key,
        )
    now = call.port.clock()
    step = records.evolve(
        call.step_record(None, StepStatus.CONFIRMED, now, output=other.output),
        logical_operation_id=binding.logical_operation_id,
        idempotency_key=binding.idempotency_key,
        effect_id=other.effect_id,
        external_effect_id=other.external_effect_id,
        completion_state=other.completion_state,
        confirmed_at=other.confirmed_at,
        next_action=NextAction.USE_RESULT,
    )
    batch = st.batch()
    st.link_previous(call.step_id, batch)
    batch.step(step)
    batch.event(
        "deduplicated",
        now,
        step_id=call.step_id,
        effect_id=other.effect_id,
        logical_operation_id=binding.logical_operation_id,
        original_run=binding.run_id,
        original_step=binding.step_id,
    )
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    return other.output


def _fail(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision
) -> errors.EffectflowError:
    """Record a definite failure (it rides with the run's failure commit) and build the error."""
    st = call.state
    now = call.port.clock()
    step, effect = call.mark(step, verdict.status, NextAction.NONE, now)
    st.steps[call.step_id] = step
    st.pending.step(step)
    st.pending.effect(effect)
    call.effect = effect
    st.pending.event(
        "step_" + verdict.status.value,
        now,
        step_id=call.step_id,
        effect_id=effect.effect_id,
        row=verdict.row,
        reason=verdict.reason,
    )
    message = f"step {call.step_id}: {verdict.reason}"
    if step.error:
        message += f" (last error: {step.error.get('message')})"
    if verdict.status is StepStatus.REJECTED:
        if (step.error or {}).get("type") == "IdempotencyConflict":
            return errors.IdempotencyConflict(
                message, run_id=call.run_id, step_id=call.step_id, idempotency_key=call.key
            )
        return errors.StepRejected(message, run_id=call.run_id, step_id=call.step_id)
    return errors.RetryBudgetExhausted(message, run_id=call.run_id, step_id=call.step_id)
