"""A step nothing automatic can settle goes to a person, and a person settles it.

``ask_a_person`` pauses the run with the step ``needs_attention`` (the decision table said so);
``resolve`` (``rt.resolve``) records a person's answer — it happened, or it did not — pinned, fenced
and audited, and compare-and-swap (docs/concepts.md#peoples-decisions-are-compare-and-swap): what
the decision was made on (the effect's version and status, the step's state, the run's lease token)
is checked by the store inside the transaction that records it, so of two contradicting decisions
exactly one is recorded. The decision revokes any worker's lease, so a zombie holding the old token
can write nothing over it."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import ControlKind, NextAction, RunStatus, StepStatus
from effectflow.ledger.store import Batch, DecisionRecord
from effectflow.policies import decision
from effectflow.runtime import classify, late_answers, leases, machine_io
from effectflow.runtime.control import Control
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall


def ask_a_person(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision
) -> Generator[machine_io.Request, Any, None]:
    st = call.state
    for attempt in call.calls_in_doubt():
        handle = st.in_flight.pop(attempt.attempt_id, None)
        if handle is not None:  # still running: its answer is recorded when it comes
            late_answers.record_when_done(call, attempt, handle)
    now = call.port.clock()
    step, effect = call.mark(step, StepStatus.NEEDS_ATTENTION, NextAction.ASK_A_PERSON, now)
    batch = st.batch()
    batch.step(step)
    batch.effect(effect)
    call.effect = effect
    batch.run_changes.update(
        status=records.RunStatus.PAUSED,
        next_action=NextAction.ASK_A_PERSON,
        error={
            "code": "needs_attention",
            "message": verdict.reason,
            "step_id": call.step_id,
            "effect_id": effect.effect_id,
            "row": verdict.row,
        },
        lease_owner=None,
        lease_expires_at=None,
    )
    batch.event(
        "needs_attention",
        now,
        step_id=call.step_id,
        effect_id=effect.effect_id,
        row=verdict.row,
        reason=verdict.reason,
    )
    batch.event("run_paused", now, step_id=call.step_id, reason=verdict.reason)
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    raise machine_io.Suspend(call.step_id, verdict.reason)


# -- a person's answer ---------------------------------------------------------------------------


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
    if not isinstance(committed, bool):
        # bool("no") is True: a form's or a client's string would say the effect happened.
        raise errors.ArgumentError(
            f"committed must be True or False, got {committed!r}; nothing was recorded"
        )
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
    run, now = _decidable(port, effect, expected_version)
    step = next(s for s in port.store.steps(run.run_id) if s.step_id == effect.step_id)
    batch = _decision_batch(
        port, run, step, effect, committed=committed, evidence=evidence, now=now
    )
    new_effect, new_step = _decided(port, effect, step, committed, evidence, by, now)
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
    control = Control.of(run.control)
    return new_effect, control is not None and control.kind is ControlKind.CANCEL


def _decidable(
    port: Port, effect: records.EffectRecord, expected_version: int | None
) -> tuple[records.RunRecord, float]:
    """The effect's run and the time of the decision, once the early checks pass: the effect is
    still at the version the person saw, still in doubt, and no live worker executes its run (the
    store checks again where it records the decision).

    Raises:
        errors.StaleState: the effect or its run moved on; nothing is recorded.
    """
    if expected_version is not None and expected_version != effect.version:
        raise errors.StaleState(
            f"effect {effect.effect_id} is at version {effect.version}, not {expected_version}; "
            "reload it and decide again",
            effect_id=effect.effect_id,
            run_id=effect.run_id,
        )
    if effect.status not in records.IN_DOUBT_STATUSES:
        raise errors.StaleState(
            f"effect {effect.effect_id} is {effect.status}, not unknown: there is nothing to "
            "resolve",
            effect_id=effect.effect_id,
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
            effect_id=effect.effect_id,
        )
    return run, now


def _decision_batch(
    port: Port,
    run: records.RunRecord,
    step: records.StepRecord,
    effect: records.EffectRecord,
    *,
    committed: bool,
    evidence: dict[str, Any],
    now: float,
) -> Batch:
    """The batch of a person's decision: what it was made on (checked where it is recorded), the
    lease it revokes, and the attempt that records it (closing any a dead process left open)."""
    attempts = port.store.attempts(run.run_id, step.step_id)
    batch = Batch(run.run_id, lease_token=None)
    # What the decision was made on, checked where it is recorded: the effect's version and status,
    # the step as read (no worker moved it), and the lease token it revokes (no worker claimed the
    # run meanwhile, which would get the same token again).
    batch.expect_effect(effect.effect_id, version=effect.version, status=effect.status)
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
            attempt_id=machine_io.new_id("att"),
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
            batch.attempt(classify.lost_in_flight(attempt, now))
    return batch


def _decided(
    port: Port,
    effect: records.EffectRecord,
    step: records.StepRecord,
    committed: bool,
    evidence: dict[str, Any],
    by: str,
    now: float,
) -> tuple[records.EffectRecord, records.StepRecord]:
    """The effect and its step as the person decided: confirmed with the result the evidence
    gives, or not committed (a resume retries it with its original key)."""
    if not committed:
        return dataclasses.replace(
            effect,
            status=StepStatus.NOT_COMMITTED,
            evidence=evidence,
            resolved_by=by,
            next_action=NextAction.EXECUTE,
            version=effect.version + 1,
            updated_at=now,
        ), dataclasses.replace(
            step, status=StepStatus.NOT_COMMITTED, next_action=NextAction.EXECUTE, updated_at=now
        )
    ext_id = evidence.get("external_effect_id", effect.external_effect_id)
    ext_id = None if ext_id is None else str(ext_id)
    output = confirmed_output(evidence, ext_id, _effect_id_field(port, effect))
    return dataclasses.replace(
        effect,
        status=StepStatus.CONFIRMED,
        external_effect_id=ext_id,
        committed_at=now,
        evidence=evidence,
        resolved_by=by,
        next_action=NextAction.NONE,
        version=effect.version + 1,
        updated_at=now,
    ), dataclasses.replace(
        step,
        status=StepStatus.CONFIRMED,
        external_effect_id=ext_id,
        output=output,
        confirmed_at=now,
        next_action=NextAction.USE_RESULT,
        updated_at=now,
    )


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
