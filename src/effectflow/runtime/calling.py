"""Step 2 of the write path: the call, sent with its key, only on a lease this process can prove.

A retry's attempt is durable before its call, like an intent; a call whose tool takes a deadline
gets one the provider enforces, so a worker taking the run over knows when it can no longer land.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from effectflow import errors, telemetry
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies import decision
from effectflow.policies.decision import Situation
from effectflow.runtime import cancel, lookup, machine_io, outcome
from effectflow.runtime.step_call import StepCall


def send(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision | None = None
) -> Generator[machine_io.Request, Any, Situation]:
    """Steps 2-4: call with the key, then record the outcome durably."""
    st = call.state
    if verdict is not None:  # a retry: its attempt is durable before the call, like an intent
        now = call.port.clock()
        attempt = call.new_attempt(records.AttemptKind.CALL, now)
        # From here the call may be in flight: a crash before its outcome is recorded must
        # leave the step in doubt (looked up), never "not committed" (sent again).
        step, effect = call.mark(step, StepStatus.INTENT_RECORDED, NextAction.RECONCILE, now)
        batch = st.batch()
        batch.full_lease = call.tool.takes_deadline  # the deadline is bounded by the lease
        batch.attempt(attempt)
        batch.step(step)
        batch.effect(effect)
        call.effect = effect
        batch.event(
            "retry",
            now,
            step_id=call.step_id,
            effect_id=step.effect_id,
            attempt=attempt.number,
            row=verdict.row,
            reason=verdict.reason,
            idempotency_key=call.key,
        )
        yield machine_io.Commit(batch)
        st.steps[call.step_id] = step
        st.note_attempt(attempt)
    else:
        attempt = st.attempts(call.step_id)[-1]
    if st.control is not None and call.compensates is None:
        yield from cancel.stop_before_call(call, step, attempt)
    if st.lease_lost or call.port.clock() >= st.lease_valid_until:
        # Never start a call on a lease this process cannot prove it still holds: another
        # worker may already be settling this step.
        raise errors.LeaseLost(
            f"run {call.run_id}: the lease may have expired before {call.step_id}'s call; "
            "not calling",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    kwargs = dict(call.kwargs)
    if call.tool.takes_key:
        kwargs[call.contract.idempotency.key_param] = call.key
    if call.tool.takes_deadline:
        # The provider must refuse this call after the lease this process can prove (and
        # after the tool's timeout): then a worker taking the run over knows when the call
        # can no longer land, and its lookup's "not found" becomes proof.
        window = call.contract.timeout or lookup.DEFAULT_CALL_WINDOW
        due = min(st.lease_valid_until, call.port.clock() + window)
        kwargs["deadline"] = due
        st.call_deadlines[attempt.attempt_id] = due
    st.sent_at[attempt.attempt_id] = (
        call.port.clock()
    )  # bounds count from here, not from the intent
    telemetry.attempt_started(call.run_id, call.step_id, call.tool.ref, attempt.number)
    result: machine_io.Result = yield machine_io.Invoke(
        call.tool, call.args, kwargs, call.contract.timeout
    )
    return (yield from outcome.record(call, step, attempt, result))
