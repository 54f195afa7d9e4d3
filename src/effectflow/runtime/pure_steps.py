"""Pure and read steps: no unknown window. Their result is recorded and replayed, riding with the
next durable write unless their contract says ``durable``."""

from __future__ import annotations

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies import retry
from effectflow.runtime import classify, machine_io
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.step_call import StepCall


def run(call: StepCall, existing: records.StepRecord | None) -> machine_io.Machine:
    st = call.state
    policy = call.contract.retry
    tries = 0
    while True:
        tries += 1
        result: machine_io.Result = yield machine_io.Invoke(
            call.tool, call.args, call.kwargs, call.contract.timeout
        )
        now = call.port.clock()
        if result.error is None:
            output = call.recordable(result.value)
            call.port.faults.hit(FaultPoint.AFTER_PURE_RESULT, call.step_id)
            step = call.step_record(existing, StepStatus.CONFIRMED, now, output=output)
            step = records.evolve(step, confirmed_at=now, next_action=NextAction.USE_RESULT)
            st.steps[call.step_id] = step
            st.link_previous(call.step_id, st.pending)
            st.pending.step(step)
            st.pending.event(
                "recorded",
                now,
                step_id=call.step_id,
                tool=call.tool.ref,
                request_digest=call.request_digest,
                response_digest=digests.digest(output),
            )
            if call.contract.durable:
                yield machine_io.Commit(st.batch())
            return output
        exc = result.error
        if isinstance(exc, errors.Rejected):
            _defer_failure(call, existing, StepStatus.REJECTED, exc, now)
            raise errors.StepRejected(
                f"step {call.step_id}: {call.tool.ref} rejected the request: {exc}",
                run_id=call.run_id,
                step_id=call.step_id,
            ) from exc
        transient = isinstance(
            exc, errors.NotCommitted | errors.OutcomeUnknown | TimeoutError | ConnectionError
        )
        if not transient or not isinstance(exc, Exception):
            raise exc
        if tries >= policy.max_attempts:
            _defer_failure(call, existing, StepStatus.FAILED, exc, now)
            raise errors.RetryBudgetExhausted(
                f"step {call.step_id}: {call.tool.ref} failed {tries} times: {exc}",
                run_id=call.run_id,
                step_id=call.step_id,
            ) from exc
        yield machine_io.Sleep(retry.backoff(policy, tries, st.rng))


def _defer_failure(
    call: StepCall,
    existing: records.StepRecord | None,
    status: StepStatus,
    exc: BaseException,
    now: float,
) -> None:
    st = call.state
    step = call.step_record(existing, status, now, error=classify.error_of(exc))
    step = records.evolve(step, next_action=NextAction.NONE)
    st.steps[call.step_id] = step
    st.link_previous(call.step_id, st.pending)
    st.pending.step(step)
    st.pending.event(
        "step_" + status.value, now, step_id=call.step_id, error=classify.error_of(exc)
    )
