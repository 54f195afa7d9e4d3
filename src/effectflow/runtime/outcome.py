"""Steps 3-4 of the write path: a call's answer recorded durably as its attempt's outcome.

The outcome commit is the step checkpoint. The answer of a call that outlived its timeout and was
waited for later (``lookup``) is recorded the same way, marked ``late``.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from effectflow import errors, telemetry
from effectflow.ledger import records
from effectflow.ledger.records import Outcome, StepStatus
from effectflow.policies.decision import Situation
from effectflow.runtime import classify, completion, machine_io
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.step_call import StepCall


def record(
    call: StepCall,
    step: records.StepRecord,
    attempt: records.AttemptRecord,
    result: machine_io.Result,
    *,
    late: bool = False,
) -> Generator[machine_io.Request, Any, Situation]:
    """Steps 3-4: the call's answer (or, ``late``, the answer of a call that outlived its
    timeout) recorded durably as the attempt's outcome."""
    st = call.state
    if result.pending is not None:
        st.in_flight[attempt.attempt_id] = result.pending
    call.port.faults.hit(FaultPoint.AFTER_CALL_BEFORE_RECORD, call.step_id)
    now = call.port.clock()
    outcome, situation = classify.classify(result)
    telemetry.attempt_ended(call.run_id, call.step_id, call.tool.ref, outcome.value)
    if situation is Situation.NOT_COMMITTED and call.earlier_call_in_doubt(attempt):
        # This call provably did nothing, but an earlier one may have committed: still in doubt.
        situation = Situation.IN_DOUBT
    batch = st.batch()
    # The intent is already durable: losing this record to a power cut (not a crash) leaves
    # the step in doubt, settled like a crash between call and record. So, on a ledger opened
    # with durability=intents, it need not wait for its own fsync.
    batch.deferrable = True
    effect = call.effect_of(step)
    output, response_digest, problem, error = _answer(call, result, outcome)
    ended = records.evolve(
        attempt,
        ended_at=now,
        outcome=outcome,
        error=error,
        response_digest=response_digest,
    )
    batch.attempt(ended)
    status = classify.status_of(situation)
    step = records.evolve(step, status=status, error=error, updated_at=now)
    effect = records.evolve(
        effect,
        status=status,
        version=effect.version + 1,
        updated_at=now,
        response_digest=response_digest
        if call.contract.record_response_digest
        else effect.response_digest,
    )
    if outcome is Outcome.COMMITTED:
        step, effect = completion.confirm(call, step, effect, output, now)
        if problem is not None:
            # The effect happened: it is confirmed with what can be recorded of it, and the
            # step keeps the problem, so a replay raises what the workflow saw.
            effect = records.evolve(effect, evidence=problem)
            step = records.evolve(step, error=problem)
        if step.status is StepStatus.AWAITING_COMPLETION:
            situation = Situation.BELOW_REQUIRED_STATE
        else:
            call.answer_original(batch, now)
    else:
        next_action = classify.next_action_of(situation)
        step = records.evolve(step, next_action=next_action)
        effect = records.evolve(effect, next_action=next_action)
    batch.step(step)
    batch.effect(effect)
    call.effect = effect
    detail = _detail(ended, step, effect, output, late=late)
    batch.event("outcome", now, step_id=call.step_id, effect_id=effect.effect_id, **detail)
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    st.note_attempt(ended)
    call.port.faults.hit(FaultPoint.AFTER_RECORD, call.step_id)
    if problem is not None:
        raise errors.ResultNotRecordable(
            f"step {call.step_id}: {call.tool.ref} committed (effect {effect.effect_id}"
            + (f", external id {effect.external_effect_id}" if effect.external_effect_id else "")
            + f") but its result cannot be recorded: {problem['message']}. The effect is "
            "recorded as confirmed with a digest of the raw result; make the tool return "
            "JSON-like data",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    return situation


def _detail(
    ended: records.AttemptRecord,
    step: records.StepRecord,
    effect: records.EffectRecord,
    output: Any,
    *,
    late: bool,
) -> dict[str, Any]:
    """What the ``outcome`` audit event says of the call."""
    assert ended.outcome is not None
    detail: dict[str, Any] = {"attempt": ended.number, "outcome": ended.outcome.value}
    if late:
        detail["late"] = True
    if ended.error is not None:
        detail["error"] = ended.error
    if ended.response_digest is not None:
        detail["response_digest"] = ended.response_digest
    if isinstance(output, Mapping) and output.get("replayed") is True:
        detail["replayed"] = True
    if effect.external_effect_id is not None:
        detail["external_effect_id"] = effect.external_effect_id
    if step.completion_state is not None:
        detail["completion_state"] = step.completion_state
    return detail


def _answer(
    call: StepCall, result: machine_io.Result, outcome: Outcome
) -> tuple[Any, str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """What the call answered, as recorded: (output, response digest, problem, error); a
    committed result that cannot be recorded as it is gives a ``problem`` (then also the error)."""
    output: Any = None
    response_digest: str | None = None
    problem: dict[str, Any] | None = None
    error = None if result.error is None else classify.error_of(result.error)
    if result.pending is not None:
        error = {**(error or {}), "code": "timeout_still_running"}
    if outcome is Outcome.COMMITTED:
        output, response_digest, problem = call.recordable_result(result.value)
        if problem is not None:
            error = problem
    return output, response_digest, problem, error
