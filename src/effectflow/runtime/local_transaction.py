"""``local_transaction`` steps: intent, call and outcome are one ACID transaction.

There is no unknown window in the ledger: either the tool's writes and the confirmed step commit
together, or neither does (real rollback) and the step is recorded as not committed. A COMMIT whose
answer is lost is in doubt only in this process: it is settled from the step's checkpoint
(``_settle_commit``) and never recorded as rolled back unless the checkpoint proves it. If it cannot
be settled, nothing is recorded and ``CommitInDoubt`` leaves the run for recovery, where the step's
row is read after the run is claimed (on PostgreSQL the claim waits out the run's row lock, held by
an unfinished checkpoint): the row is the checkpoint, so the step is confirmed, or absent and run
again.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import Batch
from effectflow.policies import compensation as compensation_policy
from effectflow.policies import decision, retry
from effectflow.policies.decision import Situation
from effectflow.runtime import classify, machine_io
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.step_call import StepCall

#: Pauses between reads of a local transaction's checkpoint after its COMMIT got no answer (the
#: ledger may be briefly unreachable); after the last read fails the step is left in doubt.
_SETTLE_PAUSES = (0.2, 1.0)


def run(call: StepCall, existing: records.StepRecord | None) -> machine_io.Machine:
    """A ``local_transaction`` tool's step, tried within its retry budget (see the module)."""
    st = call.state
    policy = call.contract.retry
    if existing is not None and existing.status is not StepStatus.NOT_COMMITTED:
        raise errors.StepFailed(
            f"step {call.step_id} is {existing.status}; a local transaction step is either "
            "confirmed or not committed",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    tries = 0
    while True:
        tries += 1
        started = call.port.clock()
        effect_id = (
            existing.effect_id if existing and existing.effect_id else machine_io.new_id("eff")
        )
        created = _effect_created(call, existing, effect_id, started)
        attempt = call.new_attempt(records.AttemptKind.CALL, started)

        # The deferred writes ride with the checkpoint as a copy: if it rolls back, they are
        # recorded with the rollback instead, and nothing of the failed checkpoint is.
        st.link_previous(call.step_id, st.pending)
        deferred = st.batch()
        checkpoint: list[records.StepRecord] = []
        finish = _local_finish(call, existing, (effect_id, created), attempt, deferred, checkpoint)
        result: machine_io.Result = yield machine_io.InTransaction(
            call.tool, call.args, dict(call.kwargs), finish
        )
        exc = result.error
        doubt = exc if isinstance(exc, errors.CommitInDoubt) else None
        committed = exc is None
        if doubt is not None:
            committed = yield from _settle_commit(call, attempt, doubt)
        if committed:
            step = checkpoint[-1]
            st.steps[call.step_id] = step
            st.note_attempt(records.evolve(attempt, outcome=Outcome.COMMITTED))
            if doubt is not None:
                _settled_event(call, st.pending, attempt, doubt, committed=True)
            return step.output
        # Rolled back: the tool's writes and the checkpoint are gone together. Record that.
        st.pending = deferred
        assert exc is not None
        if isinstance(exc, errors.LeaseLost):
            raise exc
        if doubt is not None:
            _settled_event(call, st.pending, attempt, doubt, committed=False)
            exc = doubt.__cause__ or doubt  # what broke the COMMIT, known not to have landed
        # A COMMIT that never reached the ledger (its checkpoint is absent) is safe to retry.
        retryable = doubt is not None or isinstance(
            exc, errors.NotCommitted | TimeoutError | ConnectionError
        )
        existing = yield from _rolled_back(
            call, existing, (effect_id, created), attempt, exc, retryable
        )
        if existing.status is StepStatus.REJECTED:
            raise errors.StepRejected(
                f"step {call.step_id}: {call.tool.ref} refused; its transaction rolled back: {exc}",
                run_id=call.run_id,
                step_id=call.step_id,
            ) from exc
        if not retryable or tries >= policy.max_attempts:
            raise errors.StepFailed(
                f"step {call.step_id}: {call.tool.ref} failed and its transaction rolled back "
                f"(nothing was written): {exc}",
                run_id=call.run_id,
                step_id=call.step_id,
            ) from exc
        yield machine_io.Sleep(retry.backoff(policy, tries, st.rng))


def _rolled_back(
    call: StepCall,
    existing: records.StepRecord | None,
    effect: tuple[str, float],
    attempt: records.AttemptRecord,
    exc: BaseException,
    retryable: bool,
) -> Generator[machine_io.Request, Any, records.StepRecord]:
    """Record that the transaction rolled back (refused, or not committed); returns the step.
    ``effect``: the effect's id and creation time."""
    st = call.state
    effect_id = effect[0]
    now = call.port.clock()
    error = classify.error_of(exc)
    rejected = isinstance(exc, errors.Rejected)
    status = StepStatus.REJECTED if rejected else StepStatus.NOT_COMMITTED
    batch = st.batch()
    step = call.step_record(existing, status, now, error=error)
    step = records.evolve(
        step,
        effect_id=effect_id,
        next_action=NextAction.EXECUTE if retryable else NextAction.NONE,
    )
    batch.step(step)
    ended = records.evolve(
        attempt,
        ended_at=now,
        outcome=Outcome.REJECTED if rejected else Outcome.NOT_COMMITTED,
        error=error,
    )
    batch.attempt(ended)
    batch.effect(_local_effect(call, effect, attempt, status, now))
    verdict = decision.decide(
        Situation.TRANSACTION_NOT_COMMITTED, decision.Facts(call.contract.effect)
    )
    batch.event(
        "rollback",
        now,
        step_id=call.step_id,
        effect_id=effect_id,
        row=verdict.row,
        reason=verdict.reason,
        error=error,
    )
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    st.note_attempt(ended)
    return step


def _settle_commit(
    call: StepCall, attempt: records.AttemptRecord, exc: BaseException
) -> Generator[machine_io.Request, Any, bool]:
    """Whether a local transaction whose COMMIT got no answer committed, read from its
    checkpoint: the attempt row it writes as committed, in the same transaction as the tool's
    writes. A ledger that cannot be read after a few tries leaves the step in doubt.

    Raises:
        errors.CommitInDoubt: the checkpoint could not be read; nothing was recorded.
    """
    store = call.port.store
    last: BaseException = exc
    for pause in (*_SETTLE_PAUSES, None):
        try:
            return store.checkpoint_committed(call.run_id, attempt.attempt_id)
        except Exception as failure:
            last = failure
        if pause is not None:
            yield machine_io.Sleep(pause)
    raise errors.CommitInDoubt(
        f"step {call.step_id}: the COMMIT of {call.tool.ref}'s local transaction got no answer, "
        f"and its checkpoint could not be read to settle it ({last}). It may have committed: "
        "nothing was recorded, and resuming or recovering the run settles it from the "
        "checkpoint before anything runs again",
        run_id=call.run_id,
        step_id=call.step_id,
    ) from last


def _settled_event(
    call: StepCall,
    batch: Batch,
    attempt: records.AttemptRecord,
    exc: BaseException,
    *,
    committed: bool,
) -> None:
    """Record how a COMMIT that got no answer was settled (its checkpoint read)."""
    batch.event(
        "local_commit_settled",
        call.port.clock(),
        step_id=call.step_id,
        attempt_id=attempt.attempt_id,
        committed=committed,
        evidence="checkpoint_row" if committed else "checkpoint_absent",
        error=classify.error_of(exc.__cause__ or exc),
    )


def _local_finish(
    call: StepCall,
    existing: records.StepRecord | None,
    effect: tuple[str, float],
    attempt: records.AttemptRecord,
    deferred: Batch,
    checkpoint: list[records.StepRecord],
) -> Callable[[Any], Batch]:
    """The checkpoint batch of a local transaction, built inside it from the tool's result
    (and a copy of the deferred writes, which stay as they were if it rolls back); the step it
    confirms is appended to ``checkpoint``. ``effect``: the effect's id and creation time."""
    st = call.state
    effect_id = effect[0]

    def finish(value: Any) -> Batch:
        now = call.port.clock()
        output = call.recordable(value)
        call.port.faults.hit(FaultPoint.IN_LOCAL_TRANSACTION, call.step_id)
        batch = Batch(st.run.run_id, st.run.lease_token)
        batch.absorb(deferred)
        step = call.step_record(existing, StepStatus.CONFIRMED, now, output=output)
        step = records.evolve(
            step,
            effect_id=effect_id,
            confirmed_at=now,
            next_action=NextAction.USE_RESULT,
            logical_operation_id=f"{call.run_id}/{call.step_id}",
        )
        batch.step(step)
        batch.attempt(
            records.evolve(
                attempt,
                ended_at=now,
                outcome=Outcome.COMMITTED,
                response_digest=digests.digest(output),
            )
        )
        batch.effect(_local_effect(call, effect, attempt, StepStatus.CONFIRMED, now))
        batch.event(
            "local_commit",
            now,
            step_id=call.step_id,
            effect_id=effect_id,
            tool=call.tool.ref,
            request_digest=call.request_digest,
            response_digest=digests.digest(output),
        )
        checkpoint.append(step)
        return batch

    return finish


def _effect_created(
    call: StepCall, existing: records.StepRecord | None, effect_id: str, now: float
) -> float:
    """When the effect was first recorded: a retry after a rollback writes the effect that its
    rollback recorded, whose creation time the ledger keeps (a new time in the record written,
    and sealed, would set it apart from the row). ``now`` for an effect not recorded yet."""
    if existing is None or existing.effect_id != effect_id:
        return now
    found = call.port.store.get_effect(effect_id)
    return now if found is None else found.created_at


def _local_effect(
    call: StepCall,
    effect: tuple[str, float],
    attempt: records.AttemptRecord,
    status: StepStatus,
    now: float,
) -> records.EffectRecord:
    effect_id, created_at = effect
    confirmed = status is StepStatus.CONFIRMED
    return records.EffectRecord(
        effect_id=effect_id,
        tenant=call.state.run.tenant,
        run_id=call.run_id,
        step_id=call.step_id,
        tool=call.tool.ref,
        tool_call_id=attempt.attempt_id,
        logical_operation_id=f"{call.run_id}/{call.step_id}",
        idempotency_key=None,
        request_digest=call.request_digest,
        response_digest=None,
        status=status,
        external_system="ledger",
        external_effect_id=None,
        committed_at=now if confirmed else None,
        approval_id=None,
        compensation_status=compensation_policy.initial_status(call.contract),
        compensates=None,
        evidence={"transaction": "committed" if confirmed else "rolled_back"},
        resolved_by=None,
        next_action=NextAction.NONE if confirmed else NextAction.EXECUTE,
        version=1,
        created_at=created_at,
        updated_at=now,
    )
