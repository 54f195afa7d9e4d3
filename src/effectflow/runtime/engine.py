"""The write path of DESIGN §3 as one step machine, shared by sync and async workflows.

``StepMachine.run`` is a generator: it decides, and *yields* what must happen in the world — commit
a batch, invoke a tool, sleep — to a driver that does it synchronously (``Context``) or with
``await`` (``AsyncContext``). So there is one write path, not two copies that drift apart, and a
driver is free to group the commits of many runs.

The order is the product:
1. persist the intent (digest, logical operation, key) — commit — before anything is sent;
2. call the tool with the key;
3. persist the outcome (result, external id, completion state, response digest) — commit;
4. the outcome commit is the step checkpoint;
5. return to the workflow, which schedules the next step.
Every branch after an attempt goes through ``decision.decide``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.lookup import LookupStatus
from effectflow.contracts.tool import EffectClass, Tool
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import OperationBinding
from effectflow.policies import decision, retry
from effectflow.policies.decision import Action, Situation
from effectflow.runtime import outcomes, requests
from effectflow.runtime import state as state_mod
from effectflow.runtime.faults import FaultPoint

#: Largest canonical argument payload recorded for one step.
MAX_PAYLOAD_BYTES = 1_000_000


class StepMachine:
    """One ``ctx.call``: from arguments to a recorded, decided outcome."""

    def __init__(
        self,
        state: state_mod.RunState,
        step_id: str,
        tool: Tool[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        operation_id: str | None,
        target: str | None,
    ) -> None:
        if not isinstance(tool, Tool):
            raise errors.ContractError(
                f"step {step_id}: {tool!r} is not a tool; decorate it with @ef.tool(...) "
                "so the runtime knows its side-effect contract",
                run_id=state.run.run_id,
                step_id=step_id,
            )
        if not step_id or not isinstance(step_id, str):
            raise errors.ContractError("ctx.call needs a non-empty step id as its first argument")
        self.state = state
        self.step_id = step_id
        self.tool = tool
        self.contract = tool.contract
        self.args = args
        self.kwargs = kwargs
        self.operation_id = operation_id
        self.target = target
        self.step_contract: StepContract | None = state.workflow.steps.get(step_id)
        self.run_id = state.run.run_id
        self.effect: records.EffectRecord | None = None

    # -- entry ------------------------------------------------------------------------------------

    def run(self) -> requests.Machine:
        """Drive the step to a value for the workflow (or raise what the workflow should see)."""
        st = self.state
        if self.step_id in st.seen:
            raise errors.ContractError(
                f"step id {self.step_id!r} is used twice in one run; every ctx.call needs its own "
                "stable step id (e.g. f'refund_{order_id}')",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        st.seen.add(self.step_id)
        sc = self.step_contract
        if (
            sc is not None
            and sc.tool is not None
            and sc.tool not in (self.tool.ref, self.tool.name)
        ):
            raise errors.ContractError(
                f"step {self.step_id}: its contract names tool {sc.tool} but the workflow calls "
                f"{self.tool.ref}",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        named = self.tool.bind_arguments(self.args, self.kwargs)
        payload = digests.to_jsonable(named, path=f"{self.step_id}.args")
        text = digests.canonical_json(payload)
        if len(text.encode("utf-8")) > MAX_PAYLOAD_BYTES:
            raise errors.ArgumentError(
                f"step {self.step_id}: arguments are {len(text)} bytes of JSON, over the "
                f"{MAX_PAYLOAD_BYTES}-byte limit; pass a reference (an id, a URL) instead",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        self.payload: dict[str, Any] = payload
        self.request_digest = "sha256:" + digests.sha256_hex(text)
        existing = st.steps.get(self.step_id)
        if existing is not None:
            self._check_same_request(existing)
            if existing.status is StepStatus.CONFIRMED:
                st.link_previous(self.step_id, st.pending)
                return existing.output
        if not self.contract.effect.writes:
            return (yield from self._pure_or_read(existing))
        return (yield from self._write(existing))

    def _check_same_request(self, existing: records.StepRecord) -> None:
        if existing.tool.split("@", 1)[0] != self.tool.name:
            raise errors.ContractError(
                f"step {self.step_id} was recorded as a call of {existing.tool}, but the workflow "
                f"now calls {self.tool.ref} there; a workflow must reach the same steps on resume",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        if existing.request_digest != self.request_digest:
            raise errors.IdempotencyConflict(
                f"step {self.step_id} was recorded with request {existing.request_digest[:19]}..., "
                f"now called with {self.request_digest[:19]}...: the same step cannot carry "
                "another payload (make the workflow deterministic, or use a new step id)",
                run_id=self.run_id,
                step_id=self.step_id,
                idempotency_key=existing.idempotency_key,
            )

    # -- pure and read ----------------------------------------------------------------------------

    def _pure_or_read(self, existing: records.StepRecord | None) -> requests.Machine:
        st = self.state
        policy = self.contract.retry
        tries = 0
        while True:
            tries += 1
            result: requests.Result = yield requests.Invoke(
                self.tool, self.args, self.kwargs, self.contract.timeout
            )
            now = st.now()
            if result.error is None:
                output = self._recordable(result.value)
                st.faults.hit(FaultPoint.AFTER_PURE_RESULT, self.step_id)
                step = self._step_record(existing, StepStatus.CONFIRMED, now, output=output)
                step = dataclasses.replace(
                    step, confirmed_at=now, next_action=NextAction.USE_RESULT
                )
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
        step = dataclasses.replace(step, next_action=NextAction.NONE)
        st.steps[self.step_id] = step
        st.link_previous(self.step_id, st.pending)
        st.pending.step(step)
        st.pending.event(
            "step_" + status.value, now, step_id=self.step_id, error=outcomes.error_of(exc)
        )

    # -- writes -----------------------------------------------------------------------------------

    def _write(self, existing: records.StepRecord | None) -> requests.Machine:
        st = self.state
        sc = self.step_contract
        op_id = (
            self.operation_id
            or (sc.operation_id_for(st.run.input) if sc is not None else None)
            or f"{self.run_id}/{self.step_id}"
        )
        if self.target is not None:
            target = self.target
        elif self.contract.target is not None:
            target = str(self.payload.get(self.contract.target, ""))
        else:
            target = ""
        self.key = digests.idempotency_key(
            tenant=st.run.tenant,
            operation_type=self.contract.name,
            target=target,
            payload_digest=self.request_digest,
            logical_operation_id=op_id,
        )
        if existing is None:
            reused = yield from self._record_intent(op_id)
            if reused is not None:
                return reused
            step = st.steps[self.step_id]
            situation = yield from self._call(step)
        else:
            step = existing
            st.link_previous(self.step_id, st.pending)
            situation = self._situation_of(step)
            if situation is Situation.IN_DOUBT:
                self._close_orphan_attempts(step)
        while True:
            step = st.steps[self.step_id]
            verdict = decision.decide(situation, self._facts(step))
            action = verdict.action
            if action is Action.USE_RECORDED:
                return st.steps[self.step_id].output
            if action in (Action.EXECUTE, Action.RETRY_WITH_ORIGINAL_KEY):
                used = self._count(records.AttemptKind.CALL)
                if used:
                    yield requests.Sleep(retry.backoff(self.contract.retry, used, st.rng))
                situation = yield from self._call(step, verdict)
                continue
            if action is Action.LOOKUP:
                used = self._count(records.AttemptKind.LOOKUP)
                if used:
                    yield requests.Sleep(retry.backoff(self.contract.retry, used, st.rng))
                situation = yield from self._lookup(step, verdict)
                continue
            if action is Action.ASK_A_PERSON:
                yield from self._ask_a_person(step, verdict)
            if action is Action.FAIL:
                raise self._fail(step, verdict)
            raise errors.StepFailed(
                f"step {self.step_id}: {verdict.reason} ({verdict.row})",
                run_id=self.run_id,
                step_id=self.step_id,
            )

    def _record_intent(self, op_id: str) -> Generator[requests.Request, Any, Any]:
        """Step 1 of the write path: the intent, durable before anything is sent."""
        st = self.state
        store = st.runtime.store
        # The default operation id is this step's own, bound in the same transaction as the step
        # row: with no step row yet it cannot be bound, so the read is skipped (the insert still
        # checks the binding inside the intent's transaction).
        default_op = op_id == f"{self.run_id}/{self.step_id}"
        binding = None if default_op else store.get_operation(st.run.tenant, op_id)
        if binding is not None:
            if binding.request_digest != self.request_digest:
                raise errors.IdempotencyConflict(
                    f"logical operation {op_id!r} is bound to another request "
                    f"({binding.request_digest[:19]}...); nothing was written. A new user request "
                    "needs a new operation id.",
                    run_id=self.run_id,
                    step_id=self.step_id,
                    idempotency_key=binding.idempotency_key,
                )
            if (binding.run_id, binding.step_id) != (self.run_id, self.step_id):
                return (yield from self._reuse_operation(binding))
        now = st.now()
        effect_id = requests.new_id("eff")
        attempt = records.AttemptRecord(
            attempt_id=requests.new_id("att"),
            run_id=self.run_id,
            step_id=self.step_id,
            number=1,
            kind=records.AttemptKind.CALL,
            generation=st.run.generation,
            started_at=now,
            ended_at=None,
            outcome=None,
            error=None,
            response_digest=None,
        )
        step = dataclasses.replace(
            self._step_record(None, StepStatus.INTENT_RECORDED, now),
            logical_operation_id=op_id,
            idempotency_key=self.key,
            effect_id=effect_id,
            next_action=NextAction.RECONCILE,
        )
        effect = records.EffectRecord(
            effect_id=effect_id,
            tenant=st.run.tenant,
            run_id=self.run_id,
            step_id=self.step_id,
            tool=self.tool.ref,
            tool_call_id=attempt.attempt_id,
            logical_operation_id=op_id,
            idempotency_key=self.key,
            request_digest=self.request_digest,
            response_digest=None,
            status=StepStatus.INTENT_RECORDED,
            external_system=self.contract.external_system or self.contract.name,
            external_effect_id=None,
            committed_at=None,
            approval_id=None,
            compensation_status=outcomes.compensation_status(self.tool),
            compensates=None,
            evidence=None,
            resolved_by=None,
            next_action=NextAction.RECONCILE,
            version=1,
            created_at=now,
            updated_at=now,
        )
        retention = (
            self.contract.idempotency.retention_seconds
            if self.contract.idempotency.supported
            else 86400.0
        )
        batch = st.batch()
        st.link_previous(self.step_id, batch)
        batch.operations.append(
            OperationBinding(
                tenant=st.run.tenant,
                logical_operation_id=op_id,
                idempotency_key=self.key,
                request_digest=self.request_digest,
                tool=self.tool.ref,
                run_id=self.run_id,
                step_id=self.step_id,
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
            step_id=self.step_id,
            effect_id=effect_id,
            tool=self.tool.ref,
            effect_class=self.contract.effect.value,
            logical_operation_id=op_id,
            idempotency_key=self.key,
            request_digest=self.request_digest,
        )
        st.faults.hit(FaultPoint.BEFORE_INTENT, self.step_id)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.first_attempt(attempt)
        self.effect = effect
        self.attempt = attempt
        st.faults.hit(FaultPoint.AFTER_INTENT, self.step_id)
        return None

    def _reuse_operation(self, binding: OperationBinding) -> Generator[requests.Request, Any, Any]:
        """The logical operation already belongs to another step (e.g. a re-submitted request)."""
        st = self.state
        other = next(
            (
                s
                for s in st.runtime.store.steps(binding.run_id)
                if s.step_id == binding.step_id and s.status is StepStatus.CONFIRMED
            ),
            None,
        )
        if other is None:
            raise errors.IdempotencyConflict(
                f"logical operation {binding.logical_operation_id!r} is in progress in run "
                f"{binding.run_id} (step {binding.step_id}); settle it there before reusing it",
                run_id=self.run_id,
                step_id=self.step_id,
                idempotency_key=binding.idempotency_key,
            )
        now = st.now()
        step = dataclasses.replace(
            self._step_record(None, StepStatus.CONFIRMED, now, output=other.output),
            logical_operation_id=binding.logical_operation_id,
            idempotency_key=binding.idempotency_key,
            effect_id=other.effect_id,
            external_effect_id=other.external_effect_id,
            completion_state=other.completion_state,
            confirmed_at=other.confirmed_at,
            next_action=NextAction.USE_RESULT,
        )
        batch = st.batch()
        st.link_previous(self.step_id, batch)
        batch.step(step)
        batch.event(
            "deduplicated",
            now,
            step_id=self.step_id,
            effect_id=other.effect_id,
            logical_operation_id=binding.logical_operation_id,
            original_run=binding.run_id,
            original_step=binding.step_id,
        )
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        return other.output

    def _call(
        self, step: records.StepRecord, verdict: decision.Decision | None = None
    ) -> Generator[requests.Request, Any, Situation]:
        """Steps 2-4: call with the key, then record the outcome durably."""
        st = self.state
        if verdict is not None:  # a retry: its attempt is durable before the call, like an intent
            now = st.now()
            attempt = self._new_attempt(records.AttemptKind.CALL, now)
            step = dataclasses.replace(step, next_action=NextAction.RECONCILE, updated_at=now)
            batch = st.batch()
            batch.attempt(attempt)
            batch.step(step)
            batch.event(
                "retry",
                now,
                step_id=self.step_id,
                effect_id=step.effect_id,
                attempt=attempt.number,
                row=verdict.row,
                reason=verdict.reason,
                idempotency_key=self.key,
            )
            yield requests.Commit(batch)
            st.steps[self.step_id] = step
            st.note_attempt(attempt)
        else:
            attempt = st.attempts(self.step_id)[-1]
        kwargs = dict(self.kwargs)
        if self.tool.takes_key:
            kwargs[self.contract.idempotency.key_param] = self.key
        result: requests.Result = yield requests.Invoke(
            self.tool, self.args, kwargs, self.contract.timeout
        )
        st.faults.hit(FaultPoint.AFTER_CALL_BEFORE_RECORD, self.step_id)
        now = st.now()
        outcome, situation = outcomes.classify(result)
        if situation is Situation.NOT_COMMITTED and self._earlier_call_in_doubt(attempt):
            # This call provably did nothing, but an earlier one may have committed: still in doubt.
            situation = Situation.IN_DOUBT
        batch = st.batch()
        effect = self._effect(step)
        output: Any = None
        response_digest: str | None = None
        if outcome is Outcome.COMMITTED:
            output = self._recordable(result.value)
            response_digest = digests.digest(output)
        error = None if result.error is None else outcomes.error_of(result.error)
        ended = dataclasses.replace(
            attempt,
            ended_at=now,
            outcome=outcome,
            error=error,
            response_digest=response_digest,
        )
        batch.attempt(ended)
        status = outcomes.status_of(situation)
        step = dataclasses.replace(step, status=status, error=error, updated_at=now)
        effect = dataclasses.replace(
            effect,
            status=status,
            version=effect.version + 1,
            updated_at=now,
            response_digest=response_digest
            if self.contract.record_response_digest
            else effect.response_digest,
        )
        if outcome is Outcome.COMMITTED:
            step, effect = self._confirm(step, effect, output, now)
        else:
            next_action = outcomes.next_action_of(situation)
            step = dataclasses.replace(step, next_action=next_action)
            effect = dataclasses.replace(effect, next_action=next_action)
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        detail: dict[str, Any] = {"attempt": ended.number, "outcome": outcome.value}
        if error is not None:
            detail["error"] = error
        if response_digest is not None:
            detail["response_digest"] = response_digest
        if isinstance(output, Mapping) and output.get("replayed") is True:
            detail["replayed"] = True
        if effect.external_effect_id is not None:
            detail["external_effect_id"] = effect.external_effect_id
        batch.event("outcome", now, step_id=self.step_id, effect_id=effect.effect_id, **detail)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.note_attempt(ended)
        st.faults.hit(FaultPoint.AFTER_RECORD, self.step_id)
        return situation

    def _lookup(
        self, step: records.StepRecord, verdict: decision.Decision
    ) -> Generator[requests.Request, Any, Situation]:
        """Ask the contract's lookup tool whether the effect exists, and record the answer."""
        st = self.state
        assert self.contract.confirm is not None
        lookup_tool = st.runtime.registry.tool(self.contract.confirm)
        now = st.now()
        attempt = self._new_attempt(records.AttemptKind.LOOKUP, now)
        kwargs: dict[str, Any] = {}
        params = lookup_tool.signature.parameters
        if "idempotency_key" in params:
            kwargs["idempotency_key"] = self.key
        if "external_effect_id" in params:
            kwargs["external_effect_id"] = step.external_effect_id
        result: requests.Result = yield requests.Invoke(
            lookup_tool, (), kwargs, lookup_tool.contract.timeout
        )
        st.faults.hit(FaultPoint.AFTER_LOOKUP_BEFORE_RECORD, self.step_id)
        now = st.now()
        answer = outcomes.lookup_answer(result)
        effect = self._effect(step)
        batch = st.batch()
        if answer.status is LookupStatus.CONFIRMED:
            outcome, situation = Outcome.COMMITTED, Situation.CONFIRMED
        elif answer.status is LookupStatus.NOT_COMMITTED:
            outcome, situation = Outcome.NOT_COMMITTED, Situation.NOT_COMMITTED
        else:
            outcome, situation = Outcome.UNKNOWN, Situation.IN_DOUBT
        evidence = digests.to_jsonable(answer.evidence, path=f"{self.step_id}.lookup.evidence")
        ended = dataclasses.replace(
            attempt,
            ended_at=now,
            outcome=outcome,
            error=None if answer.reason is None else {"code": "unknown", "message": answer.reason},
        )
        batch.attempt(ended)
        status = outcomes.status_of(situation)
        step = dataclasses.replace(step, status=status, updated_at=now)
        effect = dataclasses.replace(
            effect, status=status, version=effect.version + 1, updated_at=now, evidence=evidence
        )
        if answer.status is LookupStatus.CONFIRMED:
            output = answer.result
            if output is None:
                output = {
                    **evidence,
                    **(
                        {self.contract.effect_id: answer.external_effect_id}
                        if self.contract.effect_id
                        else {}
                    ),
                }
            output = self._recordable(output)
            if answer.external_effect_id is not None:
                effect = dataclasses.replace(effect, external_effect_id=answer.external_effect_id)
            step, effect = self._confirm(step, effect, output, now, state=answer.state)
        else:
            next_action = outcomes.next_action_of(situation)
            step = dataclasses.replace(step, next_action=next_action)
            effect = dataclasses.replace(effect, next_action=next_action)
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        batch.event(
            "lookup",
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            lookup_tool=lookup_tool.ref,
            answer=answer.status.value,
            reason=answer.reason,
            row=verdict.row,
            external_effect_id=answer.external_effect_id,
            evidence=evidence,
        )
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.note_attempt(ended)
        return situation

    def _ask_a_person(
        self, step: records.StepRecord, verdict: decision.Decision
    ) -> Generator[requests.Request, Any, None]:
        st = self.state
        now = st.now()
        effect = self._effect(step)
        step = dataclasses.replace(
            step,
            status=StepStatus.NEEDS_ATTENTION,
            next_action=NextAction.ASK_A_PERSON,
            updated_at=now,
        )
        effect = dataclasses.replace(
            effect,
            status=StepStatus.NEEDS_ATTENTION,
            next_action=NextAction.ASK_A_PERSON,
            version=effect.version + 1,
            updated_at=now,
        )
        batch = st.batch()
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        batch.run_changes.update(
            status=records.RunStatus.PAUSED,
            next_action=NextAction.ASK_A_PERSON,
            error={
                "code": "needs_attention",
                "message": verdict.reason,
                "step_id": self.step_id,
                "effect_id": effect.effect_id,
                "row": verdict.row,
            },
            lease_owner=None,
            lease_expires_at=None,
        )
        batch.event(
            "needs_attention",
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            row=verdict.row,
            reason=verdict.reason,
        )
        batch.event("run_paused", now, step_id=self.step_id, reason=verdict.reason)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        raise requests.Suspend(self.step_id, verdict.reason)

    def _fail(self, step: records.StepRecord, verdict: decision.Decision) -> errors.EffectflowError:
        """Record a definite failure (it rides with the run's failure commit) and build the error."""
        st = self.state
        now = st.now()
        effect = self._effect(step)
        step = dataclasses.replace(
            step, status=verdict.status, next_action=NextAction.NONE, updated_at=now
        )
        effect = dataclasses.replace(
            effect,
            status=verdict.status,
            next_action=NextAction.NONE,
            version=effect.version + 1,
            updated_at=now,
        )
        st.steps[self.step_id] = step
        st.pending.step(step)
        st.pending.effect(effect)
        self.effect = effect
        st.pending.event(
            "step_" + verdict.status.value,
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            row=verdict.row,
            reason=verdict.reason,
        )
        message = f"step {self.step_id}: {verdict.reason}"
        if step.error:
            message += f" (last error: {step.error.get('message')})"
        if verdict.status is StepStatus.REJECTED:
            if (step.error or {}).get("type") == "IdempotencyConflict":
                return errors.IdempotencyConflict(
                    message, run_id=self.run_id, step_id=self.step_id, idempotency_key=self.key
                )
            return errors.StepRejected(message, run_id=self.run_id, step_id=self.step_id)
        return errors.RetryBudgetExhausted(message, run_id=self.run_id, step_id=self.step_id)

    # -- helpers ----------------------------------------------------------------------------------

    def _confirm(
        self,
        step: records.StepRecord,
        effect: records.EffectRecord,
        output: Any,
        now: float,
        *,
        state: str | None = None,
    ) -> tuple[records.StepRecord, records.EffectRecord]:
        ext_id = effect.external_effect_id
        if self.contract.effect_id and isinstance(output, Mapping):
            found = output.get(self.contract.effect_id)
            if found is not None:
                ext_id = str(found)
        completion = self.contract.completion
        completion_state = state
        if completion_state is None and isinstance(output, Mapping):
            reported = output.get("status", output.get("state"))
            if completion is not None and reported in completion.states:
                completion_state = str(reported)
        if completion_state is None and completion is not None:
            completion_state = completion.states[0]
        step = dataclasses.replace(
            step,
            status=StepStatus.CONFIRMED,
            output=output,
            external_effect_id=ext_id,
            completion_state=completion_state,
            confirmed_at=now,
            next_action=NextAction.USE_RESULT,
            error=None,
        )
        effect = dataclasses.replace(
            effect,
            status=StepStatus.CONFIRMED,
            external_effect_id=ext_id,
            committed_at=now,
            next_action=NextAction.NONE,
        )
        return step, effect

    def _effect(self, step: records.StepRecord) -> records.EffectRecord:
        cached = self.effect
        if cached is not None and cached.effect_id == step.effect_id:
            return cached
        assert step.effect_id is not None
        found = self.state.runtime.store.get_effect(step.effect_id)
        if found is None:  # pragma: no cover - the ledger wrote both in one transaction
            raise errors.EffectNotFound(
                f"effect {step.effect_id} of step {self.step_id} is missing from the ledger",
                run_id=self.run_id,
                step_id=self.step_id,
                effect_id=step.effect_id,
            )
        return found

    def _new_attempt(self, kind: records.AttemptKind, now: float) -> records.AttemptRecord:
        known = self.state.attempts(self.step_id)
        return records.AttemptRecord(
            attempt_id=requests.new_id("att"),
            run_id=self.run_id,
            step_id=self.step_id,
            number=len(known) + 1,
            kind=kind,
            generation=self.state.run.generation,
            started_at=now,
            ended_at=None,
            outcome=None,
            error=None,
            response_digest=None,
        )

    def _count(self, kind: records.AttemptKind) -> int:
        generation = self.state.run.generation
        return sum(
            1
            for a in self.state.attempts(self.step_id)
            if a.kind is kind and a.generation == generation
        )

    def _earlier_call_in_doubt(self, current: records.AttemptRecord) -> bool:
        """Whether an earlier call may have committed, with no lookup or person answering it since."""
        in_doubt = False
        for attempt in self.state.attempts(self.step_id):
            if attempt.attempt_id == current.attempt_id:
                continue
            if attempt.kind is records.AttemptKind.CALL:
                in_doubt = in_doubt or attempt.outcome in (Outcome.UNKNOWN, None)
            elif attempt.outcome is Outcome.NOT_COMMITTED:
                in_doubt = False
        return in_doubt

    def _facts(self, step: records.StepRecord) -> decision.Facts:
        contract = self.contract
        sc = self.step_contract
        if contract.idempotency.supported:
            # Key-based dedup: only while the provider still remembers the key (its retention);
            # past it a retry could duplicate.
            age = self.state.now() - step.created_at
            idempotent = self.tool.takes_key and age < contract.idempotency.retention_seconds
        else:
            # Natural dedup (an upsert by a natural id, a PUT of the whole state).
            idempotent = contract.effect is EffectClass.IDEMPOTENT_WRITE
        kwargs: dict[str, Any] = {}
        if sc is not None:
            kwargs["when_unknown"] = sc.when_unknown
            kwargs["when_not_committed"] = sc.when_not_committed
        return decision.Facts(
            effect=contract.effect,
            idempotent=idempotent,
            has_lookup=contract.confirm is not None,
            commit=contract.commit,
            attempts_used=self._count(records.AttemptKind.CALL),
            max_attempts=contract.retry.max_attempts,
            lookups_used=self._count(records.AttemptKind.LOOKUP),
            max_lookups=contract.retry.max_lookups,
            has_compensation=contract.compensation is not None,
            **kwargs,
        )

    def _situation_of(self, step: records.StepRecord) -> Situation:
        status = step.status
        if status in records.IN_DOUBT_STATUSES:
            return Situation.IN_DOUBT
        if status in (StepStatus.NOT_COMMITTED, StepStatus.FAILED, StepStatus.PENDING):
            return Situation.NOT_COMMITTED
        if status is StepStatus.REJECTED:
            return Situation.REJECTED
        if status is StepStatus.CONFLICT:
            return Situation.CONFLICT
        raise errors.StepFailed(
            f"step {self.step_id} is {status}; this version cannot continue it",
            run_id=self.run_id,
            step_id=self.step_id,
        )

    def _close_orphan_attempts(self, step: records.StepRecord) -> None:
        """Attempts a crashed process left open are unknown: say so (rides with the next commit)."""
        st = self.state
        now = st.now()
        for attempt in st.attempts(self.step_id):
            if attempt.outcome is None:
                closed = outcomes.lost_in_flight(attempt, now)
                st.pending.attempt(closed)
                st.note_attempt(closed)
                st.pending.event(
                    "recovered_in_doubt",
                    now,
                    step_id=self.step_id,
                    effect_id=step.effect_id,
                    attempt=attempt.number,
                )
        st.link_previous(self.step_id, st.pending)

    def _step_record(
        self,
        existing: records.StepRecord | None,
        status: StepStatus,
        now: float,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
    ) -> records.StepRecord:
        st = self.state
        if existing is not None:
            return dataclasses.replace(
                existing, status=status, output=output, error=error, updated_at=now
            )
        st.seq += 1
        return records.StepRecord(
            run_id=self.run_id,
            step_id=self.step_id,
            seq=st.seq,
            step_revision=1,
            tool=self.tool.ref,
            effect_class=self.contract.effect.value,
            logical_operation_id=None,
            idempotency_key=None,
            request_digest=self.request_digest,
            status=status,
            completion_state=None,
            external_system=self.contract.external_system if self.contract.effect.writes else None,
            external_effect_id=None,
            output=output,
            error=error,
            effect_id=None,
            confirmed_at=None,
            next_step=None,
            compensation_status=outcomes.compensation_status(self.tool),
            next_action=NextAction.EXECUTE,
            created_at=now,
            updated_at=now,
        )

    def _recordable(self, value: Any) -> Any:
        try:
            return digests.to_jsonable(value, path=f"{self.step_id}.result")
        except errors.ArgumentError as exc:
            raise errors.ArgumentError(
                f"{exc.message}; tool results are recorded and replayed, so they must be JSON-like",
                run_id=self.run_id,
                step_id=self.step_id,
            ) from None
