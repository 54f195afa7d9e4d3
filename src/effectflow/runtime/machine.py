"""What every step machine shares: the records it builds and the facts it hands the decision table.

Split from ``engine`` so the write path reads top to bottom there, and the settling paths (lookup,
completion polling, approvals, asking a person) live in ``settle``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

from effectflow import digests, errors
from effectflow.contracts.tool import EffectClass, Tool, ToolContract
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.policies import decision
from effectflow.policies.decision import Situation
from effectflow.runtime import outcomes, requests
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port

#: Largest canonical result recorded for one step; a larger one is confirmed by its digest.
MAX_RESULT_BYTES = 1_000_000


class MachineBase:
    """State and helpers of one ``ctx.call`` (or one compensation) on its way to a decided outcome."""

    port: Port
    state: state_mod.RunState
    step_id: str
    tool: Tool[..., Any]
    contract: ToolContract
    step_contract: StepContract | None
    run_id: str
    effect: records.EffectRecord | None
    key: str
    request_digest: str
    #: For a compensation: the effect it answers.
    compensates: records.EffectRecord | None

    if TYPE_CHECKING:  # defined by ``engine.StepMachine``; the settling paths call it too

        def _record_outcome(
            self,
            step: records.StepRecord,
            attempt: records.AttemptRecord,
            result: requests.Result,
            *,
            late: bool = False,
        ) -> Generator[requests.Request, Any, Situation]: ...

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
        effect = records.evolve(
            effect,
            external_effect_id=ext_id,
            committed_at=effect.committed_at or now,
        )
        step = records.evolve(
            step,
            output=output,
            external_effect_id=ext_id,
            completion_state=completion_state,
            error=None,
        )
        if self._below_required(step):
            # Accepted, but the contract requires a later state: the effect exists, the step is not
            # complete until the provider reports the required state (or a person decides).
            step = records.evolve(
                step, status=StepStatus.AWAITING_COMPLETION, next_action=NextAction.WAIT
            )
            effect = records.evolve(
                effect, status=StepStatus.AWAITING_COMPLETION, next_action=NextAction.WAIT
            )
            return step, effect
        step = records.evolve(
            step,
            status=StepStatus.CONFIRMED,
            confirmed_at=now,
            next_action=NextAction.USE_RESULT,
        )
        effect = records.evolve(effect, status=StepStatus.CONFIRMED, next_action=NextAction.NONE)
        return step, effect

    def _below_required(self, step: records.StepRecord) -> bool:
        """Whether the step's recorded completion state is earlier than the one it requires."""
        completion = self.contract.completion
        required = step.required_state
        if completion is None or required is None or step.completion_state is None:
            return False
        states = list(completion.states)
        if step.completion_state not in states or required not in states:
            return False
        return states.index(step.completion_state) < states.index(required)

    def _required_state(self) -> str | None:
        """The completion state this step requires, from its contracts (fixed at the intent)."""
        completion = self.contract.completion
        if completion is None:
            return None
        sc = self.step_contract
        required = sc.required_state if sc is not None and sc.required_state else None
        required = required or completion.required
        if required not in completion.states:
            raise errors.ContractError(
                f"step {self.step_id}: required state {required!r} is not one of "
                f"{self.tool.ref}'s completion states {list(completion.states)}",
                run_id=self.run_id,
                step_id=self.step_id,
            )
        return required

    def _mark(
        self, step: records.StepRecord, status: StepStatus, next_action: NextAction, now: float
    ) -> tuple[records.StepRecord, records.EffectRecord]:
        """The step and its effect moved to ``status`` together (the effect's version bumped)."""
        effect = self._effect(step)
        step = records.evolve(step, status=status, next_action=next_action, updated_at=now)
        effect = records.evolve(
            effect,
            status=status,
            next_action=next_action,
            version=effect.version + 1,
            updated_at=now,
        )
        return step, effect

    def _effect(self, step: records.StepRecord) -> records.EffectRecord:
        cached = self.effect
        if cached is not None and cached.effect_id == step.effect_id:
            return cached
        assert step.effect_id is not None
        found = self.port.store.get_effect(step.effect_id)
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
        """Attempts of ``kind`` in this generation and step revision (budgets count per both)."""
        generation = self.state.run.generation
        step = self.state.steps.get(self.step_id)
        since = step.created_at if step is not None else 0.0
        return sum(
            1
            for a in self.state.attempts(self.step_id)
            if a.kind is kind and a.generation == generation and a.started_at >= since
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
            age = self.port.clock() - step.created_at
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
            deadline_passed=self._completion_deadline_passed(step),
            may_still_land=self._last_lookup_code() == "not_found_may_still_land",
            **kwargs,
        )

    def _last_lookup_code(self) -> str | None:
        """The error code of the step's last lookup (``settle.NOT_FOUND_MAY_STILL_LAND``...)."""
        for attempt in reversed(self.state.attempts(self.step_id)):
            if attempt.kind is records.AttemptKind.LOOKUP:
                return None if attempt.error is None else attempt.error.get("code")
        return None

    def _completion_deadline_passed(self, step: records.StepRecord) -> bool:
        completion = self.contract.completion
        if completion is None or step.status is not StepStatus.AWAITING_COMPLETION:
            return False
        accepted = self._effect(step).committed_at or step.updated_at
        return self.port.clock() >= accepted + completion.deadline_seconds

    def _situation_of(self, step: records.StepRecord) -> Situation:
        status = step.status
        if status in records.IN_DOUBT_STATUSES:
            return Situation.IN_DOUBT
        if any(
            a.kind is records.AttemptKind.CALL and a.outcome is None
            for a in self.state.attempts(self.step_id)
        ):
            # A call whose outcome was never recorded (its process died during it) may have
            # committed, whatever the step said before it was sent.
            return Situation.IN_DOUBT
        if status in (StepStatus.NOT_COMMITTED, StepStatus.FAILED, StepStatus.PENDING):
            return Situation.NOT_COMMITTED
        if status is StepStatus.REJECTED:
            return Situation.REJECTED
        if status is StepStatus.CONFLICT:
            return Situation.CONFLICT
        if status is StepStatus.AWAITING_COMPLETION:
            return Situation.BELOW_REQUIRED_STATE
        raise errors.StepFailed(
            f"step {self.step_id} is {status}; this version cannot continue it",
            run_id=self.run_id,
            step_id=self.step_id,
        )

    def _close_orphan_attempts(self, step: records.StepRecord) -> None:
        """Attempts a crashed process left open are unknown: say so (rides with the next commit)."""
        st = self.state
        now = self.port.clock()
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

    def _step_record(
        self,
        existing: records.StepRecord | None,
        status: StepStatus,
        now: float,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        revision: int = 1,
    ) -> records.StepRecord:
        st = self.state
        if existing is not None:
            return records.evolve(
                existing, status=status, output=output, error=error, updated_at=now
            )
        previous = st.steps.get(self.step_id)
        if previous is not None:  # a new revision of a step keeps its place in the run
            return records.evolve(
                previous,
                step_revision=revision,
                logical_operation_id=None,
                idempotency_key=None,
                request_digest=self.request_digest,
                status=status,
                completion_state=None,
                external_effect_id=None,
                output=output,
                error=error,
                effect_id=None,
                confirmed_at=None,
                next_action=NextAction.EXECUTE,
                created_at=now,
                updated_at=now,
                approval_id=None,
            )
        st.seq += 1
        return records.StepRecord(
            run_id=self.run_id,
            step_id=self.step_id,
            seq=st.seq,
            step_revision=revision,
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
            compensates=None if self.compensates is None else self.compensates.effect_id,
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

    def _recordable_result(self, value: Any) -> tuple[Any, str, dict[str, Any] | None]:
        """A committed call's result as the ledger records it: (output, response digest, problem).

        The call already happened, so a result that cannot be recorded as it is (no JSON form,
        nested past the recursion limit, a lone surrogate, a NUL, which PostgreSQL's jsonb refuses,
        or over ``MAX_RESULT_BYTES``) must not make the effect vanish: the output then holds what
        can be recorded (the contract's effect-id field when it is readable, a digest of the raw
        result) and ``problem`` says what went wrong. Both backends record the same.
        """
        why: str | None = None
        try:
            output = digests.to_jsonable(value, path=f"{self.step_id}.result")
            text = digests.canonical_json(output)
            size = len(text.encode("utf-8"))
            if "\x00" in text:
                why = f"{self.step_id}.result contains a NUL character, which the ledger refuses"
            elif size > MAX_RESULT_BYTES:
                why = f"the result is {size} bytes of JSON, over the {MAX_RESULT_BYTES}-byte limit"
            else:
                return output, "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest(), None
        except errors.ArgumentError as exc:
            why = exc.message
        except RecursionError:
            why = f"{self.step_id}.result is nested deeper than the recursion limit"
        except UnicodeEncodeError as exc:
            why = f"{self.step_id}.result has no UTF-8 form ({exc.reason}, e.g. a lone surrogate)"
        except (ValueError, TypeError, OverflowError) as exc:
            why = f"{self.step_id}.result has no JSON form ({type(exc).__name__}: {exc})"
        raw_digest = _raw_digest(value)
        problem: dict[str, Any] = {
            "code": "result_not_recordable",
            "message": why,
            "raw_type": type(value).__name__,
            "raw_digest": raw_digest,
        }
        placeholder: dict[str, Any] = {"result_not_recordable": why, "raw_digest": raw_digest}
        field = self.contract.effect_id
        if field and isinstance(value, Mapping):
            found = value.get(field)
            if isinstance(found, str | int) and not isinstance(found, bool):
                ext = str(found)
                if "\x00" not in ext and ext.isprintable():
                    placeholder[field] = ext
                    problem["external_effect_id"] = ext
        return placeholder, raw_digest, problem


def _raw_digest(value: Any) -> str:
    """A digest of a result that has no canonical form: of its ``repr`` (surrogates kept)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested beyond the recursion limit>"
    except Exception as exc:  # a result whose __repr__ itself fails
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
