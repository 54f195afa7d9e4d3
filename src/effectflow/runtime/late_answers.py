"""The late answer of a call that outlived its timeout, after its run stopped waiting for it.

A call that timed out keeps running (``driver``); while its run is live the step machine waits for
it (``lookup``). When the run had to pause first (a person was asked, the lookups found nothing),
the call may still end later: its answer is a fact and is recorded when it comes
(docs/decision-table.md#when-not-found-is-proof). A committed answer confirms the effect — but only
while the effect is still in doubt, checked in the transaction that records it, so a person's
decision taken meanwhile is never overwritten silently: the late answer is then recorded as an
audit event beside it.
"""

from __future__ import annotations

import logging
from typing import Any

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import Batch
from effectflow.runtime import classify, machine_io
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall

log = logging.getLogger(__name__)


def record_when_done(call: StepCall, attempt: records.AttemptRecord, handle: Any) -> None:
    """Record the answer of ``attempt``'s still-running call once it ends (``handle`` is the
    driver's future)."""
    port = call.port
    effect_id_field = call.contract.effect_id
    recordable = call.recordable_result

    def done(future: Any) -> None:
        try:
            exc = future.exception()
            result = (
                machine_io.Result(error=exc)
                if exc is not None
                else machine_io.Result(future.result())
            )
        except BaseException as exc:  # cancelled: no answer will ever come
            log.warning("late call %s ended without an answer: %r", attempt.attempt_id, exc)
            return
        try:
            _record(port, attempt, result, effect_id_field, recordable)
        except Exception:
            log.exception("could not record the late answer of call %s", attempt.attempt_id)

    handle.add_done_callback(done)


def _record(
    port: Port,
    attempt: records.AttemptRecord,
    result: machine_io.Result,
    effect_id_field: str | None,
    recordable: Any,
) -> None:
    """Record the late answer: it confirms an effect still in doubt, goes back to a person when
    it contradicts a decision taken meanwhile, and is an audit fact in any case."""
    store = port.store
    step = next((s for s in store.steps(attempt.run_id) if s.step_id == attempt.step_id), None)
    if step is None or step.effect_id is None:
        return
    effect = store.get_effect(step.effect_id)
    if effect is None:
        return
    now = port.clock()
    outcome, _ = classify.classify(result)
    error = None if result.error is None else classify.error_of(result.error)
    output: Any = None
    response_digest = None
    if outcome is Outcome.COMMITTED:
        output, response_digest, problem = recordable(result.value)
        error = problem
    ended = records.evolve(
        attempt, ended_at=now, outcome=outcome, error=error, response_digest=response_digest
    )
    detail: dict[str, Any] = {"attempt": attempt.number, "outcome": outcome.value, "late": True}
    if error is not None:
        detail["error"] = error
    in_doubt = effect.status in records.IN_DOUBT_STATUSES
    batch = Batch(attempt.run_id, lease_token=None)
    batch.attempt(ended)
    if outcome is Outcome.COMMITTED and in_doubt:
        ext = effect.external_effect_id
        if effect_id_field and isinstance(output, dict) and output.get(effect_id_field) is not None:
            ext = str(output[effect_id_field])
        _confirm(batch, step, effect, output, ext, response_digest, now)
        detail["external_effect_id"] = ext
        detail["confirmed"] = True
    elif outcome is Outcome.COMMITTED and effect.status is not StepStatus.CONFIRMED:
        _contradict(batch, step, effect, now)
        detail["effect_status"] = effect.status.value
        detail["contradicts"] = True
    elif outcome is Outcome.COMMITTED:
        detail["effect_status"] = effect.status.value
    batch.event("outcome", now, step_id=step.step_id, effect_id=effect.effect_id, **detail)
    try:
        store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    except errors.StaleState:
        # The effect moved on in between: record the late answer as a fact beside it.
        retry = Batch(attempt.run_id, lease_token=None)
        retry.attempt(ended)
        retry.event(
            "outcome",
            now,
            step_id=step.step_id,
            effect_id=effect.effect_id,
            **{k: v for k, v in detail.items() if k not in ("confirmed",)},
        )
        store.apply(retry, lease_ttl=port.lease_ttl, now=now)


def _confirm(
    batch: Batch,
    step: records.StepRecord,
    effect: records.EffectRecord,
    output: Any,
    external_effect_id: str | None,
    response_digest: str | None,
    now: float,
) -> None:
    """The late answer committed while the effect was still in doubt: it confirms the effect (if
    nobody moved it meanwhile, checked where it is recorded)."""
    batch.expect_effect(effect.effect_id, version=effect.version)
    batch.effect(
        records.evolve(
            effect,
            status=StepStatus.CONFIRMED,
            external_effect_id=external_effect_id,
            committed_at=now,
            response_digest=response_digest,
            next_action=NextAction.NONE,
            version=effect.version + 1,
            updated_at=now,
        )
    )
    batch.step(
        records.evolve(
            step,
            status=StepStatus.CONFIRMED,
            output=output,
            external_effect_id=external_effect_id,
            confirmed_at=now,
            error=None,
            next_action=NextAction.USE_RESULT,
            updated_at=now,
        )
    )


def _contradict(
    batch: Batch, step: records.StepRecord, effect: records.EffectRecord, now: float
) -> None:
    """Someone decided "not committed" meanwhile, and the call has now committed: the fact
    contradicts the decision. The effect goes back to a person (and into the attention queue)
    rather than out of sight; a resume then cannot send it again."""
    batch.expect_effect(effect.effect_id, version=effect.version)
    batch.effect(
        records.evolve(
            effect,
            status=StepStatus.NEEDS_ATTENTION,
            next_action=NextAction.ASK_A_PERSON,
            version=effect.version + 1,
            updated_at=now,
        )
    )
    batch.step(
        records.evolve(
            step,
            status=StepStatus.NEEDS_ATTENTION,
            next_action=NextAction.ASK_A_PERSON,
            error={
                "code": "late_commit_contradicts",
                "message": f"the call committed after it was decided {effect.status.value}",
            },
            updated_at=now,
        )
    )
