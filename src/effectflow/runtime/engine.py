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

The paths that settle a step without calling its tool again (lookups, completion polling, approvals,
re-observation, asking a person) live in ``settle``; steps with no unknown window (pure, read, local
transactions) in ``simple_steps``; the records and facts they share in ``machine``.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.tool import CommitSemantics, EffectClass, Tool
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import OperationBinding
from effectflow.policies import decision, retry
from effectflow.policies.decision import Action, Situation
from effectflow.runtime import outcomes, requests, settle
from effectflow.runtime import state as state_mod
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.port import Port
from effectflow.runtime.settle import SettleMixin
from effectflow.runtime.simple_steps import SimpleStepsMixin

#: Largest canonical argument payload recorded for one step.
MAX_PAYLOAD_BYTES = 1_000_000


class StepMachine(SettleMixin, SimpleStepsMixin):
    """One ``ctx.call``: from arguments to a recorded, decided outcome."""

    def __init__(
        self,
        port: Port,
        state: state_mod.RunState,
        step_id: str,
        tool: Tool[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        operation_id: str | None,
        target: str | None,
        observe: str | None = None,
        compensates: records.EffectRecord | None = None,
    ) -> None:
        if isinstance(step_id, Tool):
            raise errors.ContractError(
                f"ctx.call({step_id.name}, {tool!r}, ...): the step id comes first and the tool "
                f"second; write ctx.call({tool!r}, {step_id.name}, ...). Nothing was called.",
                run_id=state.run.run_id,
            )
        if not step_id or not isinstance(step_id, str):
            raise errors.ContractError(
                f"ctx.call needs a non-empty string step id as its first argument, not "
                f"{step_id!r}; nothing was called",
                run_id=state.run.run_id,
            )
        digests.check_id(step_id, path="step id")
        if not isinstance(tool, Tool):
            raise errors.ContractError(
                f"step {step_id}: {tool!r} is not a tool; decorate it with @ef.tool(...) "
                "so the runtime knows its side-effect contract. Nothing was called.",
                run_id=state.run.run_id,
                step_id=step_id,
            )
        self.port = port
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
        self.observe = observe
        self.compensates = compensates
        self.revision = 1

    @classmethod
    def for_recorded(
        cls, port: Port, state: state_mod.RunState, step: records.StepRecord
    ) -> StepMachine | None:
        """A machine for a recorded step, to settle it (lookup) without its call's arguments."""
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            return None
        machine = cls(
            port,
            state,
            step.step_id,
            tool,
            (),
            {},
            operation_id=step.logical_operation_id,
            target=None,
        )
        machine.key = step.idempotency_key or ""
        machine.request_digest = step.request_digest
        return machine

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
        if st.control is not None and self.compensates is None:
            # An operator asked to cancel or compensate: no new step starts.
            raise requests.Stop(st.control)
        if self.port.draining.is_set() and self.compensates is None:
            raise requests.Release()
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
        if (
            existing is not None
            and existing.status is StepStatus.CONFLICT
            and existing.request_digest != self.request_digest
        ):
            # A write that conflicted, now called with a new precondition (the workflow observed
            # again): a new revision of the step, with its own logical operation, key and effect.
            self.revision = existing.step_revision + 1
            existing = None
        if existing is not None:
            changed = self._changed_request(existing)
            if changed is not None:
                if existing.effect_id is None:
                    raise changed  # nothing left the process under the recorded request
                # The code changed under a step that has an effect: settle that effect from its
                # recorded request and key, then let a person decide; never fail and drop it.
                yield from settle_unreached(self.port, st, [existing], changed.message)
            if existing.status is StepStatus.CONFIRMED:
                st.link_previous(self.step_id, st.pending)
                if (existing.error or {}).get("code") == "result_not_recordable":
                    raise self._unrecordable_again(existing)
                return existing.output
            if existing.status in _RAISED and st.redrive_step != self.step_id:
                # The workflow saw this step fail and went on (it handled the failure): a replay
                # raises the same failure, so it takes the same path, rather than calling again.
                # Only a redrive of the run that failed *at* this step calls it again.
                st.link_previous(self.step_id, st.pending)
                raise self._recorded_failure(existing)
        if not self.contract.effect.writes:
            return (yield from self._pure_or_read(existing))
        if self.contract.commit is CommitSemantics.LOCAL_TRANSACTION:
            return (yield from self._local(existing))
        return (yield from self._write(existing))

    def _unrecordable_again(self, existing: records.StepRecord) -> errors.ResultNotRecordable:
        problem = existing.error or {}
        return errors.ResultNotRecordable(
            f"step {self.step_id}: {existing.tool} committed (effect {existing.effect_id}) but its "
            f"result could not be recorded: {problem.get('message')} (recorded; replayed)",
            run_id=self.run_id,
            step_id=self.step_id,
        )

    def _recorded_failure(self, existing: records.StepRecord) -> errors.EffectflowError:
        error = existing.error or {}
        message = (
            f"step {self.step_id} {existing.status.value} earlier"
            + (f": {error.get('message')}" if error.get("message") else "")
            + " (recorded; replayed, not called again)"
        )
        if existing.status is StepStatus.REJECTED:
            if error.get("code") == "approval_declined":
                return errors.StepRejected(
                    f"step {self.step_id} was not approved: {error.get('message')} (recorded; "
                    "it was never called)",
                    run_id=self.run_id,
                    step_id=self.step_id,
                )
            if error.get("type") == "IdempotencyConflict":
                return errors.IdempotencyConflict(
                    message,
                    run_id=self.run_id,
                    step_id=self.step_id,
                    idempotency_key=existing.idempotency_key,
                )
            return errors.StepRejected(message, run_id=self.run_id, step_id=self.step_id)
        return errors.RetryBudgetExhausted(message, run_id=self.run_id, step_id=self.step_id)

    def _changed_request(self, existing: records.StepRecord) -> errors.EffectflowError | None:
        """Why the workflow's call of this step is not the call the ledger recorded, if it is not."""
        if existing.tool.split("@", 1)[0] != self.tool.name:
            return errors.ContractError(
                f"step {self.step_id} was recorded as a call of {existing.tool}, but the workflow "
                f"now calls {self.tool.ref} there; a workflow must reach the same steps on resume",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        if existing.request_digest != self.request_digest:
            return errors.IdempotencyConflict(
                f"step {self.step_id} was recorded with request {existing.request_digest[:19]}..., "
                f"now called with {self.request_digest[:19]}...: the same step cannot carry "
                "another payload (make the workflow deterministic, or use a new step id)",
                run_id=self.run_id,
                step_id=self.step_id,
                idempotency_key=existing.idempotency_key,
            )
        return None

    def _write(self, existing: records.StepRecord | None) -> requests.Machine:
        st = self.state
        sc = self.step_contract
        op_id = (
            self.operation_id
            or (sc.operation_id_for(st.run.input) if sc is not None else None)
            or f"{self.run_id}/{self.step_id}"
        )
        if self.revision > 1:
            op_id = f"{op_id}#r{self.revision}"
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
        if existing is not None and existing.status is StepStatus.PENDING:
            existing = None if existing.effect_id is None else existing
        if existing is None:
            skipped = unreached(st, self.step_id)
            if skipped and self.compensates is None:
                yield from settle_unreached(
                    self.port,
                    st,
                    skipped,
                    f"the workflow now calls step {self.step_id} ({self.tool.ref}), which the run "
                    "never recorded, without having reached the recorded step(s) "
                    + ", ".join(s.step_id for s in skipped)
                    + ": its code changed since they ran (a step renamed, removed or reordered)",
                )
            approval = None
            if self._approval_needed():
                # The same operation already done by another step makes no call: no approval.
                elsewhere = self._bound_elsewhere(op_id)
                if elsewhere is not None:
                    return (yield from self._reuse_operation(elsewhere))
                approval = self._approval()
                if approval is None:
                    yield from self._await_approval(st.steps.get(self.step_id))
            reused = yield from self._record_intent(op_id, approval)
            if reused is not None:
                return reused
            step = st.steps[self.step_id]
            situation = yield from self._call(step)
        else:
            step = existing
            st.link_previous(self.step_id, st.pending)
            self._check_required_state(step)
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
            if action is Action.AWAIT_COMPLETION:
                yield requests.Sleep(self._completion_wait(step))
                situation = yield from self._lookup(step, verdict)
                continue
            if action is Action.REOBSERVE:
                yield from self._reobserve(step, verdict)
            if action is Action.ASK_A_PERSON:
                yield from self._ask_a_person(step, verdict)
            if action is Action.FAIL:
                raise self._fail(step, verdict)
            raise errors.StepFailed(
                f"step {self.step_id}: {verdict.reason} ({verdict.row})",
                run_id=self.run_id,
                step_id=self.step_id,
            )

    def _approval_needed(self) -> bool:
        """Financial writes (by default) and non-automatic or financial compensations need one."""
        if self.compensates is not None:
            original = self.port.registry.tool(self.compensates.tool).contract
            compensation = original.compensation
            return (
                compensation is None
                or not compensation.automatic
                or original.effect is EffectClass.FINANCIAL_WRITE
                or self.contract.effect is EffectClass.FINANCIAL_WRITE
            )
        return self.contract.needs_approval

    def _check_required_state(self, step: records.StepRecord) -> None:
        """The required completion state is fixed at the intent; a changed contract is refused."""
        if step.required_state is None or self.contract.completion is None:
            return
        now_required = self._required_state()
        if now_required != step.required_state:
            raise errors.ContractError(
                f"step {self.step_id} was started requiring completion state "
                f"{step.required_state!r}; the contract now says {now_required!r}. The required "
                "state cannot change for a running step: restore the contract, or settle the step "
                "(rt.resolve) and start a new run",
                run_id=self.run_id,
                step_id=self.step_id,
            )

    def _record_intent(
        self, op_id: str, approval: records.ApprovalRecord | None = None
    ) -> Generator[requests.Request, Any, Any]:
        """Step 1 of the write path: the intent, durable before anything is sent."""
        st = self.state
        store = self.port.store
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
        now = self.port.clock()
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
        step = records.evolve(
            self._step_record(None, StepStatus.INTENT_RECORDED, now, revision=self.revision),
            logical_operation_id=op_id,
            idempotency_key=self.key,
            effect_id=effect_id,
            next_action=NextAction.RECONCILE,
            required_state=self._required_state(),
            approval_id=None if approval is None else approval.approval_id,
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
            approval_id=None if approval is None else approval.approval_id,
            compensation_status=outcomes.compensation_status(self.tool),
            compensates=None if self.compensates is None else self.compensates.effect_id,
            evidence=None,
            resolved_by=None,
            next_action=NextAction.RECONCILE,
            version=1,
            created_at=now,
            updated_at=now,
            effect_id_field=self.contract.effect_id,
        )
        retention = (
            self.contract.idempotency.retention_seconds
            if self.contract.idempotency.supported
            else 86400.0
        )
        batch = st.batch()
        st.link_previous(self.step_id, batch)
        if self.compensates is not None:
            self._mark_original(batch, self.compensates, "compensating", now)
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
            step_revision=self.revision,
            approval_id=None if approval is None else approval.approval_id,
            compensates=None if self.compensates is None else self.compensates.effect_id,
        )
        self.port.faults.hit(FaultPoint.BEFORE_INTENT, self.step_id)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.first_attempt(attempt)
        self.effect = effect
        self.attempt = attempt
        self.port.faults.hit(FaultPoint.AFTER_INTENT, self.step_id)
        return None

    def _bound_elsewhere(self, op_id: str) -> OperationBinding | None:
        """The binding of ``op_id`` to another step for this very request, if there is one."""
        if op_id == f"{self.run_id}/{self.step_id}":
            return None
        binding = self.port.store.get_operation(self.state.run.tenant, op_id)
        if binding is None or binding.request_digest != self.request_digest:
            return None
        if (binding.run_id, binding.step_id) == (self.run_id, self.step_id):
            return None
        return binding

    def _reuse_operation(self, binding: OperationBinding) -> Generator[requests.Request, Any, Any]:
        """The logical operation already belongs to another step (e.g. a re-submitted request)."""
        st = self.state
        other = next(
            (
                s
                for s in self.port.store.steps(binding.run_id)
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
        now = self.port.clock()
        step = records.evolve(
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
            now = self.port.clock()
            attempt = self._new_attempt(records.AttemptKind.CALL, now)
            # From here the call may be in flight: a crash before its outcome is recorded must
            # leave the step in doubt (looked up), never "not committed" (sent again).
            step, effect = self._mark(step, StepStatus.INTENT_RECORDED, NextAction.RECONCILE, now)
            batch = st.batch()
            batch.attempt(attempt)
            batch.step(step)
            batch.effect(effect)
            self.effect = effect
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
        if st.control is not None and self.compensates is None:
            yield from self._stop_before_call(step, attempt)
        if st.lease_lost or self.port.clock() >= st.lease_valid_until:
            # Never start a call on a lease this process cannot prove it still holds: another
            # worker may already be settling this step.
            raise errors.LeaseLost(
                f"run {self.run_id}: the lease may have expired before {self.step_id}'s call; "
                "not calling",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        kwargs = dict(self.kwargs)
        if self.tool.takes_key:
            kwargs[self.contract.idempotency.key_param] = self.key
        if self.tool.takes_deadline:
            # The provider must refuse this call after the lease this process can prove (and
            # after the tool's timeout): then a worker taking the run over knows when the call
            # can no longer land, and its lookup's "not found" becomes proof.
            window = self.contract.timeout or settle.DEFAULT_CALL_WINDOW
            due = min(st.lease_valid_until, self.port.clock() + window)
            kwargs["deadline"] = due
            st.call_deadlines[attempt.attempt_id] = due
        st.sent_at[attempt.attempt_id] = (
            self.port.clock()
        )  # bounds count from here, not from the intent
        result: requests.Result = yield requests.Invoke(
            self.tool, self.args, kwargs, self.contract.timeout
        )
        return (yield from self._record_outcome(step, attempt, result))

    def _record_outcome(
        self,
        step: records.StepRecord,
        attempt: records.AttemptRecord,
        result: requests.Result,
        *,
        late: bool = False,
    ) -> Generator[requests.Request, Any, Situation]:
        """Steps 3-4: the call's answer (or, ``late``, the answer of a call that outlived its
        timeout) recorded durably as the attempt's outcome."""
        st = self.state
        if result.pending is not None:
            st.in_flight[attempt.attempt_id] = result.pending
        self.port.faults.hit(FaultPoint.AFTER_CALL_BEFORE_RECORD, self.step_id)
        now = self.port.clock()
        outcome, situation = outcomes.classify(result)
        if situation is Situation.NOT_COMMITTED and self._earlier_call_in_doubt(attempt):
            # This call provably did nothing, but an earlier one may have committed: still in doubt.
            situation = Situation.IN_DOUBT
        batch = st.batch()
        # The intent is already durable: losing this record to a power cut (not a crash) leaves
        # the step in doubt, settled like a crash between call and record. So, on a ledger opened
        # with durability=intents, it need not wait for its own fsync.
        batch.deferrable = True
        effect = self._effect(step)
        output: Any = None
        response_digest: str | None = None
        problem: dict[str, Any] | None = None
        error = None if result.error is None else outcomes.error_of(result.error)
        if result.pending is not None:
            error = {**(error or {}), "code": "timeout_still_running"}
        if outcome is Outcome.COMMITTED:
            output, response_digest, problem = self._recordable_result(result.value)
            if problem is not None:
                error = problem
        ended = records.evolve(
            attempt,
            ended_at=now,
            outcome=outcome,
            error=error,
            response_digest=response_digest,
        )
        batch.attempt(ended)
        status = outcomes.status_of(situation)
        step = records.evolve(step, status=status, error=error, updated_at=now)
        effect = records.evolve(
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
            if problem is not None:
                # The effect happened: it is confirmed with what can be recorded of it, and the
                # step keeps the problem, so a replay raises what the workflow saw.
                effect = records.evolve(effect, evidence=problem)
                step = records.evolve(step, error=problem)
            if step.status is StepStatus.AWAITING_COMPLETION:
                situation = Situation.BELOW_REQUIRED_STATE
            else:
                self._answer_original(batch, now)
        else:
            next_action = outcomes.next_action_of(situation)
            step = records.evolve(step, next_action=next_action)
            effect = records.evolve(effect, next_action=next_action)
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        detail: dict[str, Any] = {"attempt": ended.number, "outcome": outcome.value}
        if late:
            detail["late"] = True
        if error is not None:
            detail["error"] = error
        if response_digest is not None:
            detail["response_digest"] = response_digest
        if isinstance(output, Mapping) and output.get("replayed") is True:
            detail["replayed"] = True
        if effect.external_effect_id is not None:
            detail["external_effect_id"] = effect.external_effect_id
        if step.completion_state is not None:
            detail["completion_state"] = step.completion_state
        batch.event("outcome", now, step_id=self.step_id, effect_id=effect.effect_id, **detail)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.note_attempt(ended)
        self.port.faults.hit(FaultPoint.AFTER_RECORD, self.step_id)
        if problem is not None:
            raise errors.ResultNotRecordable(
                f"step {self.step_id}: {self.tool.ref} committed (effect {effect.effect_id}"
                + (
                    f", external id {effect.external_effect_id}"
                    if effect.external_effect_id
                    else ""
                )
                + f") but its result cannot be recorded: {problem['message']}. The effect is "
                "recorded as confirmed with a digest of the raw result; make the tool return "
                "JSON-like data",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        return situation

    def _stop_before_call(
        self, step: records.StepRecord, attempt: records.AttemptRecord
    ) -> Generator[requests.Request, Any, None]:
        """A cancel arrived with the intent's commit: nothing was sent, so the step is cancelled."""
        st = self.state
        assert st.control is not None
        now = self.port.clock()
        batch = st.batch()
        ended = records.evolve(
            attempt,
            ended_at=now,
            outcome=Outcome.NOT_COMMITTED,
            error={"code": "cancelled", "message": "the run was cancelled before the call"},
        )
        batch.attempt(ended)
        step, effect = self._mark(step, StepStatus.CANCELLED, NextAction.NONE, now)
        batch.step(step)
        batch.effect(effect)
        batch.event(
            "step_cancelled",
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            reason="cancel requested before the call was sent",
        )
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.note_attempt(ended)
        self.effect = effect
        raise requests.Stop(st.control)


# -- workflow code that changed under a run -------------------------------------------------------


def unreached(state: state_mod.RunState, current: str | None) -> list[records.StepRecord]:
    """Recorded steps with an effect that this pass of the workflow has not reached.

    A deterministic workflow replays its recorded steps in order, so when it starts a new write
    (or ends) while one of them was never reached, its code changed since: that step's effect
    would otherwise drop out of the run's story (and a renamed step would do it again).
    """
    return [
        s
        for s in state.steps.values()
        if s.effect_id is not None
        and s.compensates is None
        and s.step_id != current
        and s.step_id not in state.seen
        and s.status not in _CHANGED_NOTHING
    ]


#: Step statuses whose failure was raised to the workflow (and is raised again on a replay).
_RAISED = frozenset({StepStatus.FAILED, StepStatus.REJECTED})

#: Step statuses that prove the step changed nothing: a workflow that no longer reaches such a step
#: (it re-observed after a conflict, it took another branch after a refusal) loses nothing.
_CHANGED_NOTHING = frozenset(
    {
        StepStatus.PENDING,
        StepStatus.NOT_COMMITTED,
        StepStatus.REJECTED,
        StepStatus.CONFLICT,
        StepStatus.CANCELLED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
    }
)


def settle_unreached(
    port: Port, state: state_mod.RunState, steps: list[records.StepRecord], why: str
) -> Generator[requests.Request, Any, None]:
    """Settle each in-doubt step of ``steps`` from its *recorded* request and key (its lookup:
    the new code's arguments are not the ones that were sent), then pause the run for a person,
    naming the change. Always unwinds with ``requests.Suspend``."""
    # Results this pass of the changed code computed (pure and read steps waiting to ride with the
    # next write) are not kept: the code the run resumes with next may compute others.
    for step_id, pending in list(state.pending.steps.items()):
        if pending.effect_id is None and step_id in state.seen:
            del state.pending.steps[step_id]
    for step in steps:
        if step.status not in records.IN_DOUBT_STATUSES:
            continue
        machine = StepMachine.for_recorded(port, state, step)
        if machine is None or machine.contract.confirm is None:
            continue
        machine._close_orphan_attempts(step)
        verdict = decision.decide(Situation.IN_DOUBT, machine._facts(step))
        if verdict.action is Action.LOOKUP:
            yield from machine._lookup(state.steps[step.step_id], verdict)
    now = port.clock()
    batch = state.batch()
    listed = []
    for step in steps:
        step = state.steps[step.step_id]
        listed.append(step.step_id)
        effect_id = step.effect_id
        if step.status in records.IN_DOUBT_STATUSES and effect_id is not None:
            step = records.evolve(
                step,
                status=StepStatus.NEEDS_ATTENTION,
                next_action=NextAction.ASK_A_PERSON,
                updated_at=now,
            )
            effect = port.store.get_effect(effect_id)
            if effect is not None:
                batch.effect(
                    records.evolve(
                        effect,
                        status=StepStatus.NEEDS_ATTENTION,
                        next_action=NextAction.ASK_A_PERSON,
                        version=effect.version + 1,
                        updated_at=now,
                    )
                )
            state.steps[step.step_id] = step
            batch.step(step)
    reason = (
        f"{why}. The recorded effects are settled from their recorded requests and kept; a "
        "person decides: restore the code the run was started with and resume it, or cancel it"
    )
    batch.run_changes.update(
        status=records.RunStatus.PAUSED,
        next_action=NextAction.ASK_A_PERSON,
        error={"code": "workflow_changed", "message": reason, "step_ids": listed},
        lease_owner=None,
        lease_expires_at=None,
    )
    batch.event("workflow_changed", now, steps=listed, reason=why)
    batch.event("run_paused", now, reason=reason)
    yield requests.Commit(batch)
    raise requests.Suspend(listed[0], reason)
