"""Steps with no unknown window: pure and read steps (their result is recorded and replayed), and
``local_transaction`` writes (their writes commit with the checkpoint, or roll back with it).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import Batch
from effectflow.policies import decision, retry
from effectflow.policies.decision import Situation
from effectflow.runtime import outcomes, requests
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.machine import MachineBase

#: Pauses between reads of a local transaction's checkpoint after its COMMIT got no answer (the
#: ledger may be briefly unreachable); after the last read fails the step is left in doubt.
_SETTLE_PAUSES = (0.2, 1.0)


class SimpleStepsMixin(MachineBase):
    """Pure, read and local-transaction steps."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    _local_step: records.StepRecord

    def _pure_or_read(self, existing: records.StepRecord | None) -> requests.Machine:
        st = self.state
        policy = self.contract.retry
        tries = 0
        while True:
            tries += 1
            result: requests.Result = yield requests.Invoke(
                self.tool, self.args, self.kwargs, self.contract.timeout
            )
            now = self.port.clock()
            if result.error is None:
                output = self._recordable(result.value)
                self.port.faults.hit(FaultPoint.AFTER_PURE_RESULT, self.step_id)
                step = self._step_record(existing, StepStatus.CONFIRMED, now, output=output)
                step = records.evolve(step, confirmed_at=now, next_action=NextAction.USE_RESULT)
                st.steps[self.step_id] = step
                st.link_previous(self.step_id, st.pending)
                st.pending.step(step)
                st.pending.event(
                    "recorded",
                    now,
                    step_id=self.step_id,
                    tool=self.tool.ref,
                    request_digest=self.request_digest,
                    response_digest=digests.digest(output),
                )
                if self.contract.durable:
                    yield requests.Commit(st.batch())
                return output
            exc = result.error
            if isinstance(exc, errors.Rejected):
                self._defer_failure(existing, StepStatus.REJECTED, exc, now)
                raise errors.StepRejected(
                    f"step {self.step_id}: {self.tool.ref} rejected the request: {exc}",
                    run_id=self.run_id,
                    step_id=self.step_id,
                ) from exc
            transient = isinstance(
                exc, errors.NotCommitted | errors.OutcomeUnknown | TimeoutError | ConnectionError
            )
            if not transient or not isinstance(exc, Exception):
                raise exc
            if tries >= policy.max_attempts:
                self._defer_failure(existing, StepStatus.FAILED, exc, now)
                raise errors.RetryBudgetExhausted(
                    f"step {self.step_id}: {self.tool.ref} failed {tries} times: {exc}",
                    run_id=self.run_id,
                    step_id=self.step_id,
                ) from exc
            yield requests.Sleep(retry.backoff(policy, tries, st.rng))

    def _defer_failure(
        self,
        existing: records.StepRecord | None,
        status: StepStatus,
        exc: BaseException,
        now: float,
    ) -> None:
        st = self.state
        step = self._step_record(existing, status, now, error=outcomes.error_of(exc))
        step = records.evolve(step, next_action=NextAction.NONE)
        st.steps[self.step_id] = step
        st.link_previous(self.step_id, st.pending)
        st.pending.step(step)
        st.pending.event(
            "step_" + status.value, now, step_id=self.step_id, error=outcomes.error_of(exc)
        )

    def _local(self, existing: records.StepRecord | None) -> requests.Machine:
        """A ``local_transaction`` tool: intent, call and outcome are one ACID transaction.

        There is no unknown window in the ledger: either the tool's writes and the confirmed step
        commit together, or neither does (real rollback) and the step is recorded as not committed.
        A COMMIT whose answer is lost is in doubt only in this process: it is settled from the
        step's checkpoint (``_settle_commit``) and never recorded as rolled back unless the
        checkpoint proves it. If it cannot be settled, nothing is recorded and ``CommitInDoubt``
        leaves the run for recovery, where the step's row is read after the run is claimed (on
        PostgreSQL the claim waits out the run's row lock, held by an unfinished checkpoint): the
        row is the checkpoint, so the step is confirmed, or absent and run again.
        """
        st = self.state
        policy = self.contract.retry
        if existing is not None and existing.status is not StepStatus.NOT_COMMITTED:
            raise errors.StepFailed(
                f"step {self.step_id} is {existing.status}; a local transaction step is either "
                "confirmed or not committed",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        tries = 0
        while True:
            tries += 1
            started = self.port.clock()
            effect_id = (
                existing.effect_id if existing and existing.effect_id else requests.new_id("eff")
            )
            attempt = self._new_attempt(records.AttemptKind.CALL, started)

            # The deferred writes ride with the checkpoint as a copy: if it rolls back, they are
            # recorded with the rollback instead, and nothing of the failed checkpoint is.
            st.link_previous(self.step_id, st.pending)
            deferred = st.batch()
            finish = self._local_finish(existing, effect_id, attempt, deferred)
            result: requests.Result = yield requests.InTransaction(
                self.tool, self.args, dict(self.kwargs), finish
            )
            exc = result.error
            doubt = exc if isinstance(exc, errors.CommitInDoubt) else None
            committed = exc is None
            if doubt is not None:
                committed = yield from self._settle_commit(attempt, doubt)
            if committed:
                step = self._local_step
                st.steps[self.step_id] = step
                st.note_attempt(records.evolve(attempt, outcome=Outcome.COMMITTED))
                if doubt is not None:
                    self._settled_event(st.pending, attempt, doubt, committed=True)
                return step.output
            # Rolled back: the tool's writes and the checkpoint are gone together. Record that.
            st.pending = deferred
            assert exc is not None
            if isinstance(exc, errors.LeaseLost):
                raise exc
            if doubt is not None:
                self._settled_event(st.pending, attempt, doubt, committed=False)
                exc = doubt.__cause__ or doubt  # what broke the COMMIT, known not to have landed
            now = self.port.clock()
            error = outcomes.error_of(exc)
            rejected = isinstance(exc, errors.Rejected)
            # A COMMIT that never reached the ledger (its checkpoint is absent) is safe to retry.
            retryable = doubt is not None or isinstance(
                exc, errors.NotCommitted | TimeoutError | ConnectionError
            )
            status = StepStatus.REJECTED if rejected else StepStatus.NOT_COMMITTED
            batch = st.batch()
            step = self._step_record(existing, status, now, error=error)
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
            batch.effect(self._local_effect(effect_id, attempt, status, now))
            verdict = decision.decide(
                Situation.TRANSACTION_NOT_COMMITTED, decision.Facts(self.contract.effect)
            )
            batch.event(
                "rollback",
                now,
                step_id=self.step_id,
                effect_id=effect_id,
                row=verdict.row,
                reason=verdict.reason,
                error=error,
            )
            yield requests.Commit(batch)
            st.steps[self.step_id] = step
            st.note_attempt(ended)
            existing = step
            if rejected:
                raise errors.StepRejected(
                    f"step {self.step_id}: {self.tool.ref} refused; its transaction rolled back: "
                    f"{exc}",
                    run_id=self.run_id,
                    step_id=self.step_id,
                ) from exc
            if not retryable or tries >= policy.max_attempts:
                raise errors.StepFailed(
                    f"step {self.step_id}: {self.tool.ref} failed and its transaction rolled back "
                    f"(nothing was written): {exc}",
                    run_id=self.run_id,
                    step_id=self.step_id,
                ) from exc
            yield requests.Sleep(retry.backoff(policy, tries, st.rng))

    def _settle_commit(
        self, attempt: records.AttemptRecord, exc: BaseException
    ) -> Generator[requests.Request, Any, bool]:
        """Whether a local transaction whose COMMIT got no answer committed, read from its
        checkpoint: the attempt row it writes as committed, in the same transaction as the tool's
        writes. A ledger that cannot be read after a few tries leaves the step in doubt.

        Raises:
            errors.CommitInDoubt: the checkpoint could not be read; nothing was recorded.
        """
        store = self.port.store
        last: BaseException = exc
        for pause in (*_SETTLE_PAUSES, None):
            try:
                return store.checkpoint_committed(self.run_id, attempt.attempt_id)
            except Exception as failure:
                last = failure
            if pause is not None:
                yield requests.Sleep(pause)
        raise errors.CommitInDoubt(
            f"step {self.step_id}: the COMMIT of {self.tool.ref}'s local transaction got no answer, "
            f"and its checkpoint could not be read to settle it ({last}). It may have committed: "
            "nothing was recorded, and resuming or recovering the run settles it from the "
            "checkpoint before anything runs again",
            run_id=self.run_id,
            step_id=self.step_id,
        ) from last

    def _settled_event(
        self,
        batch: Batch,
        attempt: records.AttemptRecord,
        exc: BaseException,
        *,
        committed: bool,
    ) -> None:
        """Record how a COMMIT that got no answer was settled (its checkpoint read)."""
        batch.event(
            "local_commit_settled",
            self.port.clock(),
            step_id=self.step_id,
            attempt_id=attempt.attempt_id,
            committed=committed,
            evidence="checkpoint_row" if committed else "checkpoint_absent",
            error=outcomes.error_of(exc.__cause__ or exc),
        )

    def _local_finish(
        self,
        existing: records.StepRecord | None,
        effect_id: str,
        attempt: records.AttemptRecord,
        deferred: Batch,
    ) -> Callable[[Any], Batch]:
        """The checkpoint batch of a local transaction, built inside it from the tool's result
        (and a copy of the deferred writes, which stay as they were if it rolls back)."""
        st = self.state

        def finish(value: Any) -> Batch:
            now = self.port.clock()
            output = self._recordable(value)
            self.port.faults.hit(FaultPoint.IN_LOCAL_TRANSACTION, self.step_id)
            batch = Batch(st.run.run_id, st.run.lease_token)
            batch.absorb(deferred)
            step = self._step_record(existing, StepStatus.CONFIRMED, now, output=output)
            step = records.evolve(
                step,
                effect_id=effect_id,
                confirmed_at=now,
                next_action=NextAction.USE_RESULT,
                logical_operation_id=f"{self.run_id}/{self.step_id}",
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
            batch.effect(self._local_effect(effect_id, attempt, StepStatus.CONFIRMED, now))
            batch.event(
                "local_commit",
                now,
                step_id=self.step_id,
                effect_id=effect_id,
                tool=self.tool.ref,
                request_digest=self.request_digest,
                response_digest=digests.digest(output),
            )
            self._local_step = step
            return batch

        return finish

    def _local_effect(
        self,
        effect_id: str,
        attempt: records.AttemptRecord,
        status: StepStatus,
        now: float,
    ) -> records.EffectRecord:
        confirmed = status is StepStatus.CONFIRMED
        return records.EffectRecord(
            effect_id=effect_id,
            tenant=self.state.run.tenant,
            run_id=self.run_id,
            step_id=self.step_id,
            tool=self.tool.ref,
            tool_call_id=attempt.attempt_id,
            logical_operation_id=f"{self.run_id}/{self.step_id}",
            idempotency_key=None,
            request_digest=self.request_digest,
            response_digest=None,
            status=status,
            external_system="ledger",
            external_effect_id=None,
            committed_at=now if confirmed else None,
            approval_id=None,
            compensation_status=outcomes.compensation_status(self.tool),
            compensates=None,
            evidence={"transaction": "committed" if confirmed else "rolled_back"},
            resolved_by=None,
            next_action=NextAction.NONE if confirmed else NextAction.EXECUTE,
            version=1,
            created_at=now,
            updated_at=now,
        )
