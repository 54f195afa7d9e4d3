"""One ``ctx.call``: which path a step takes.

``run`` is a generator: it decides, and *yields* what must happen in the world — commit a batch,
invoke a tool, sleep (``machine_io``) — to a driver that does it (``driver``), so one write path
serves sync and async workflows. A step the ledger settled returns its recorded result (or raises
its recorded failure); otherwise a pure or read step, a local transaction or an external write
takes its own path (``pure_steps``, ``local_transaction``, ``write_path``).
"""

from __future__ import annotations

from effectflow import digests, errors
from effectflow.contracts import redaction
from effectflow.contracts.tool import CommitSemantics
from effectflow.ledger import records
from effectflow.ledger.records import StepStatus
from effectflow.runtime import (
    approvals,
    changed_code,
    local_transaction,
    machine_io,
    pure_steps,
    write_path,
)
from effectflow.runtime.step_call import StepCall

#: Largest canonical argument payload recorded for one step.
MAX_PAYLOAD_BYTES = 1_000_000

#: Step statuses whose failure was raised to the workflow (and is raised again on a replay).
_RAISED = frozenset({StepStatus.FAILED, StepStatus.REJECTED})


def run(call: StepCall) -> machine_io.Machine:
    """Drive the step to a value for the workflow (or raise what the workflow should see)."""
    st = call.state
    if call.step_id in st.seen:
        raise errors.ContractError(
            f"step id {call.step_id!r} is used twice in one run; every ctx.call needs its own "
            "stable step id (e.g. f'refund_{order_id}')",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    if st.control is not None and call.compensates is None:
        # An operator asked to cancel or compensate: no new step starts.
        raise machine_io.Stop(st.control)
    if call.port.draining.is_set() and call.compensates is None:
        raise machine_io.Release()
    st.seen.add(call.step_id)
    sc = call.step_contract
    if sc is not None and sc.tool is not None and sc.tool not in (call.tool.ref, call.tool.name):
        raise errors.ContractError(
            f"step {call.step_id}: its contract names tool {sc.tool} but the workflow calls "
            f"{call.tool.ref}",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    named = call.tool.bind_arguments(call.args, call.kwargs)
    payload = digests.to_jsonable(named, path=f"{call.step_id}.args")
    text = digests.canonical_json(payload)
    size = len(text.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise errors.ArgumentError(
            f"step {call.step_id}: arguments are {size} bytes of JSON, over the "
            f"{MAX_PAYLOAD_BYTES}-byte limit; pass a reference (an id, a URL) instead",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    call.payload = payload
    call.request_digest = "sha256:" + digests.sha256_hex(text)
    # What the step records of its arguments: after the digest, which is the unredacted call's.
    call.arguments = redaction.recorded(
        payload, call.contract.redact, call.request_digest, size=size
    )
    existing = st.steps.get(call.step_id)
    if (
        existing is not None
        and existing.status is StepStatus.CONFLICT
        and existing.request_digest != call.request_digest
    ):
        # A write that conflicted, now called with a new precondition (the workflow observed
        # again): a new revision of the step, with its own logical operation, key and effect.
        call.revision = existing.step_revision + 1
        existing = None
    if existing is not None:
        changed = _changed_request(call, existing)
        if changed is not None:
            if existing.effect_id is None:
                raise changed  # nothing left the process under the recorded request
            # The code changed under a step that has an effect: settle that effect from its
            # recorded request and key, then let a person decide; never fail and drop it.
            yield from changed_code.settle_unreached(call.port, st, [existing], changed.message)
        if existing.status is StepStatus.CONFIRMED:
            st.link_previous(call.step_id, st.pending)
            if (existing.error or {}).get("code") == "result_not_recordable":
                raise _unrecordable_again(call, existing)
            return existing.output
        if existing.status in _RAISED and st.redrive_step != call.step_id:
            # The workflow saw this step fail and went on (it handled the failure): a replay
            # raises the same failure, so it takes the same path, rather than calling again.
            # Only a redrive of the run that failed *at* this step calls it again.
            st.link_previous(call.step_id, st.pending)
            raise _recorded_failure(call, existing)
    if not call.contract.effect.writes:
        return (yield from pure_steps.run(call, existing))
    if call.contract.commit is CommitSemantics.LOCAL_TRANSACTION:
        return (yield from local_transaction.run(call, existing))
    return (yield from write_path.write(call, existing))


def _unrecordable_again(call: StepCall, existing: records.StepRecord) -> errors.ResultNotRecordable:
    problem = existing.error or {}
    return errors.ResultNotRecordable(
        f"step {call.step_id}: {existing.tool} committed (effect {existing.effect_id}) but its "
        f"result could not be recorded: {problem.get('message')} (recorded; replayed)",
        run_id=call.run_id,
        step_id=call.step_id,
    )


def _recorded_failure(call: StepCall, existing: records.StepRecord) -> errors.EffectflowError:
    error = existing.error or {}
    message = (
        f"step {call.step_id} {existing.status.value} earlier"
        + (f": {error.get('message')}" if error.get("message") else "")
        + " (recorded; replayed, not called again)"
    )
    if existing.status is StepStatus.REJECTED:
        if error.get("code") == approvals.APPROVAL_DECLINED:
            return errors.StepRejected(
                f"step {call.step_id} was not approved: {error.get('message')} (recorded; "
                "it was never called)",
                run_id=call.run_id,
                step_id=call.step_id,
            )
        if error.get("type") == "IdempotencyConflict":
            return errors.IdempotencyConflict(
                message,
                run_id=call.run_id,
                step_id=call.step_id,
                idempotency_key=existing.idempotency_key,
            )
        return errors.StepRejected(message, run_id=call.run_id, step_id=call.step_id)
    return errors.RetryBudgetExhausted(message, run_id=call.run_id, step_id=call.step_id)


def _changed_request(call: StepCall, existing: records.StepRecord) -> errors.EffectflowError | None:
    """Why the workflow's call of this step is not the call the ledger recorded, if it is not."""
    if existing.tool.split("@", 1)[0] != call.tool.name:
        return errors.ContractError(
            f"step {call.step_id} was recorded as a call of {existing.tool}, but the workflow "
            f"now calls {call.tool.ref} there; a workflow must reach the same steps on resume",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    if existing.request_digest != call.request_digest:
        return errors.IdempotencyConflict(
            f"step {call.step_id} was recorded with request {existing.request_digest[:19]}..., "
            f"now called with {call.request_digest[:19]}...: the same step cannot carry "
            "another payload (make the workflow deterministic, or use a new step id)",
            run_id=call.run_id,
            step_id=call.step_id,
            idempotency_key=existing.idempotency_key,
        )
    return None
