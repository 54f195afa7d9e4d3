"""The lookup path: settling a step whose outcome is not yet a fact, without calling its tool.

The best evidence is the late answer of a call that outlived its timeout and still runs here;
otherwise the contract's lookup tool is asked, by key and external id. Its "not found" is proof that
nothing happened only once the call can no longer land
(docs/decision-table.md#when-not-found-is-proof): its enforced deadline passed, or its
``settles_within``; before that it is recorded as unknown, and looked up again after. The same path
settles the steps a cancel or a changed workflow leaves in doubt (``look_up_recorded``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import Any

from effectflow import digests, telemetry
from effectflow.contracts.lookup import Lookup, LookupStatus
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.policies import decision
from effectflow.policies.decision import Situation
from effectflow.runtime import classify, completion, facts, machine_io, outcome
from effectflow.runtime import state as state_mod
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall

#: Seconds a provider may take to commit a call it accepted just before the call's deadline.
DEADLINE_GRACE = 0.5

#: The deadline window of a call whose tool takes a deadline but declares no timeout (seconds).
DEFAULT_CALL_WINDOW = 60.0

#: How long one settling round waits for the late answer of a call that outlived its timeout and
#: still runs here, when no bound says when it can no longer land (seconds).
LATE_ANSWER_WAIT = 30.0


def look_up_recorded(
    port: Port, state: state_mod.RunState, step: records.StepRecord
) -> tuple[StepCall, decision.Decision] | None:
    """The call of a recorded step in doubt, ready to be looked up from its recorded request and
    key, with the decision table's verdict on it (its orphaned attempts closed as unknown); None
    when its tool is unknown here or declares no lookup."""
    call = StepCall.for_recorded(port, state, step)
    if call is None or call.contract.confirm is None:
        return None
    call.close_orphan_attempts(step)
    return call, decision.decide(Situation.IN_DOUBT, facts.of(call, step))


def settle(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision
) -> Generator[machine_io.Request, Any, Situation]:
    """Settle an in-doubt step without calling its tool: the late answer of a call still
    running here, else the contract's lookup tool (its "not found" is proof only once the call can
    no longer land: docs/decision-table.md#when-not-found-is-proof)."""
    until = _may_land_until(call, step)
    late = yield from _late_answer(call, step, until)
    if late is not None:
        return late
    situation, premature = yield from _look(call, step, verdict, until)
    if premature and until != math.inf:
        # Not found, but the call may still land until its bound: look again once it cannot.
        yield machine_io.Sleep(until - call.port.clock())
        late = yield from _late_answer(call, step, until)
        if late is not None:
            return late
        situation, _ = yield from _look(call, step, verdict, until)
    return situation


def _late_answer(
    call: StepCall, step: records.StepRecord, until: float
) -> Generator[machine_io.Request, Any, Situation | None]:
    """A call of this step that outlived its timeout and still runs here is waited for (up to
    its bound, or ``LATE_ANSWER_WAIT``): its answer is the best evidence there is, and while it
    runs no lookup can prove it did nothing. None when there is no such call, or it still runs.
    """
    st = call.state
    running = [a for a in call.calls_in_doubt() if a.attempt_id in st.in_flight]
    if not running or step.status is StepStatus.AWAITING_COMPLETION:
        return None
    attempt = running[-1]
    wait = LATE_ANSWER_WAIT if until == math.inf else until - call.port.clock()
    result: machine_io.Result | None = yield machine_io.AwaitCall(
        st.in_flight[attempt.attempt_id], max(0.0, wait)
    )
    if result is None:
        return None
    del st.in_flight[attempt.attempt_id]
    return (yield from outcome.record(call, step, attempt, result, late=True))


def _look(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision, until: float
) -> Generator[machine_io.Request, Any, tuple[Situation, bool]]:
    """One lookup, recorded: (situation, whether "not found" was demoted to unknown because the
    call may still land until ``until``)."""
    st = call.state
    assert call.contract.confirm is not None
    lookup_tool = call.port.registry.tool(call.contract.confirm)
    now = call.port.clock()
    attempt = call.new_attempt(records.AttemptKind.LOOKUP, now)
    kwargs: dict[str, Any] = {}
    params = lookup_tool.signature.parameters
    if "idempotency_key" in params:
        kwargs["idempotency_key"] = call.key
    if "external_effect_id" in params:
        kwargs["external_effect_id"] = step.external_effect_id
    telemetry.lookup_started(call.run_id, call.step_id, call.tool.ref, lookup_tool.ref)
    result: machine_io.Result = yield machine_io.Invoke(
        lookup_tool, (), kwargs, lookup_tool.contract.timeout
    )
    call.port.faults.hit(FaultPoint.AFTER_LOOKUP_BEFORE_RECORD, call.step_id)
    now = call.port.clock()
    answer, premature = _answer(result, step, until, now)
    telemetry.lookup_ended(call.run_id, call.step_id, call.tool.ref, answer.status.value)
    effect = call.effect_of(step)
    batch = st.batch()
    if answer.status is LookupStatus.CONFIRMED:
        outcome, situation = Outcome.COMMITTED, Situation.CONFIRMED
    elif answer.status is LookupStatus.NOT_COMMITTED:
        outcome, situation = Outcome.NOT_COMMITTED, Situation.NOT_COMMITTED
    else:
        outcome, situation = Outcome.UNKNOWN, Situation.IN_DOUBT
    evidence = digests.to_jsonable(answer.evidence, path=f"{call.step_id}.lookup.evidence")
    code = classify.NOT_FOUND_MAY_STILL_LAND if premature else "unknown"
    ended = dataclasses.replace(
        attempt,
        ended_at=now,
        outcome=outcome,
        error=None if answer.reason is None else {"code": code, "message": answer.reason},
    )
    batch.attempt(ended)
    step, effect, situation = _looked_up(call, step, effect, answer, situation, evidence, now)
    if situation is Situation.CONFIRMED:
        call.answer_original(batch, now)
    batch.step(step)
    batch.effect(effect)
    call.effect = effect
    batch.event(
        "lookup",
        now,
        step_id=call.step_id,
        effect_id=effect.effect_id,
        lookup_tool=lookup_tool.ref,
        answer=answer.status.value,
        state=answer.state,
        reason=answer.reason,
        row=verdict.row,
        external_effect_id=answer.external_effect_id,
        evidence=evidence,
    )
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    st.note_attempt(ended)
    return situation, premature


def _answer(
    result: machine_io.Result, step: records.StepRecord, until: float, now: float
) -> tuple[Lookup, bool]:
    """The lookup's answer, and whether it was a "not found" demoted to unknown because the call
    may still land until ``until`` (a completion poll's "not found" is never demoted)."""
    answer = classify.lookup_answer(result)
    premature = answer.status is LookupStatus.NOT_COMMITTED and until > now
    if premature and step.status is not StepStatus.AWAITING_COMPLETION:
        answer = Lookup.unknown(
            reason=(
                "not found, but the call may still land: "
                + (
                    "its tool takes no deadline and declares no settles_within"
                    if until == math.inf
                    else f"not before {until:.3f} (its deadline or settles_within)"
                )
            ),
            evidence=answer.evidence,
        )
    return answer, premature


def _looked_up(
    call: StepCall,
    step: records.StepRecord,
    effect: records.EffectRecord,
    answer: Lookup,
    situation: Situation,
    evidence: Any,
    now: float,
) -> tuple[records.StepRecord, records.EffectRecord, Situation]:
    """The step and its effect as the lookup's answer leaves them, and the situation then."""
    if step.status is StepStatus.AWAITING_COMPLETION and situation is not Situation.CONFIRMED:
        # The effect was accepted; a poll that cannot see it does not make it unknown again.
        situation = Situation.BELOW_REQUIRED_STATE
        status = StepStatus.AWAITING_COMPLETION
    else:
        status = classify.status_of(situation)
    step = dataclasses.replace(step, status=status, updated_at=now)
    effect = dataclasses.replace(
        effect, status=status, version=effect.version + 1, updated_at=now, evidence=evidence
    )
    if answer.status is LookupStatus.CONFIRMED:
        output = step.output if step.output is not None else answer.result
        if output is None:
            output = {
                **evidence,
                **(
                    {call.contract.effect_id: answer.external_effect_id}
                    if call.contract.effect_id
                    else {}
                ),
            }
        output = call.recordable(output)
        if answer.external_effect_id is not None:
            effect = dataclasses.replace(effect, external_effect_id=answer.external_effect_id)
        step, effect = completion.confirm(call, step, effect, output, now, state=answer.state)
        if step.status is StepStatus.AWAITING_COMPLETION:
            situation = Situation.BELOW_REQUIRED_STATE
    elif status is StepStatus.AWAITING_COMPLETION:
        step = dataclasses.replace(step, next_action=NextAction.WAIT)
        effect = dataclasses.replace(effect, next_action=NextAction.WAIT)
    else:
        next_action = classify.next_action_of(situation)
        step = dataclasses.replace(step, next_action=next_action)
        effect = dataclasses.replace(effect, next_action=next_action)
    return step, effect, situation


def _may_land_until(call: StepCall, step: records.StepRecord) -> float:
    """The moment after which no unresolved call of the step can reach the provider any more
    (docs/decision-table.md#when-not-found-is-proof); ``math.inf`` when that cannot be known,
    and the past when none is open.

    A call can no longer land once its enforced deadline passed (the tool takes ``deadline``,
    which the provider refuses calls after), or once the contract's ``settles_within`` passed
    since it was sent — unless it still runs here (it may not even have been sent yet). The
    runtime's own ``timeout`` bounds nothing: it is when the runtime stops waiting, not when
    the provider stops committing.
    """
    if step.status is StepStatus.AWAITING_COMPLETION:
        return -math.inf
    st = call.state
    settles = call.contract.settles_within_seconds
    window = call.contract.timeout or DEFAULT_CALL_WINDOW
    until = -math.inf
    for attempt in call.calls_in_doubt():
        # A call made here: when it was handed to the tool. One an earlier holder of the run
        # made: no later than this process's claim (that holder was dead, or past its lease,
        # and the engine never starts a call on a lease it cannot prove).
        sent = st.sent_at.get(attempt.attempt_id, max(attempt.started_at, st.claimed_at))
        handle = st.in_flight.get(attempt.attempt_id)
        running_here = handle is not None and not handle.done()
        bounds = []
        if call.tool.takes_deadline:
            due = st.call_deadlines.get(attempt.attempt_id, sent + window)
            bounds.append(due + DEADLINE_GRACE)
        if settles is not None and not running_here:
            bounds.append(sent + settles)
        until = max(until, min(bounds) if bounds else math.inf)
    return until
