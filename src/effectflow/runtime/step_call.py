"""One ``ctx.call`` (or one compensation) on its way to a decided outcome: who it is (step, tool,
contracts, key, request digest) and the records every path of it builds.

A ``StepCall`` is what the paths of the step machine share, by composition: the write path
(``write_path``, ``calling``, ``outcome``), completion, lookups, approvals, preconditions, cancel and
compensation each take the call and work on it; none of them is a method of a class that inherits
the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.tool import Tool
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, NextAction, Outcome, StepStatus
from effectflow.ledger.store import Batch
from effectflow.policies import compensation as compensation_policy
from effectflow.runtime import classify, machine_io
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port

#: Largest canonical result recorded for one step; a larger one is confirmed by its digest.
MAX_RESULT_BYTES = 1_000_000


class StepCall:
    """One call of a tool by a step of a run, with what is known of it so far."""

    #: The idempotency key (derived at the intent; a recorded step's as recorded).
    key: str
    #: The digest of the canonical arguments.
    request_digest: str
    #: The canonical arguments (a new call's; a recorded step's are not kept).
    payload: dict[str, Any]
    #: What the step records of them (``redaction.recorded``); None for a recorded step's call,
    #: which keeps what it recorded.
    arguments: dict[str, Any] | None = None

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
    ) -> StepCall | None:
        """The call of a recorded step, to settle it (its lookup) without its arguments; None when
        its tool is not registered here."""
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            return None
        call = cls(
            port,
            state,
            step.step_id,
            tool,
            (),
            {},
            operation_id=step.logical_operation_id,
            target=None,
        )
        call.key = step.idempotency_key or ""
        call.request_digest = step.request_digest
        return call

    def calls_in_doubt(self) -> list[records.AttemptRecord]:
        """The step's calls that may have committed, with no proof of "not committed" since."""
        doubtful: list[records.AttemptRecord] = []
        for attempt in self.state.attempts(self.step_id):
            if attempt.kind is records.AttemptKind.CALL:
                if attempt.outcome in (None, Outcome.UNKNOWN):
                    doubtful.append(attempt)
            elif attempt.outcome is Outcome.NOT_COMMITTED:
                doubtful = []  # a lookup or a person proved the calls before it did nothing
        return doubtful

    def mark(
        self, step: records.StepRecord, status: StepStatus, next_action: NextAction, now: float
    ) -> tuple[records.StepRecord, records.EffectRecord]:
        """The step and its effect moved to ``status`` together (the effect's version bumped)."""
        effect = self.effect_of(step)
        step = records.evolve(step, status=status, next_action=next_action, updated_at=now)
        effect = records.evolve(
            effect,
            status=status,
            next_action=next_action,
            version=effect.version + 1,
            updated_at=now,
        )
        return step, effect

    def effect_of(self, step: records.StepRecord) -> records.EffectRecord:
        """The effect record of ``step`` (the one this call holds, else read from the ledger)."""
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

    def new_attempt(self, kind: records.AttemptKind, now: float) -> records.AttemptRecord:
        known = self.state.attempts(self.step_id)
        return records.AttemptRecord(
            attempt_id=machine_io.new_id("att"),
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

    def count(self, kind: records.AttemptKind) -> int:
        """Attempts of ``kind`` in this generation and step revision (budgets count per both)."""
        generation = self.state.run.generation
        step = self.state.steps.get(self.step_id)
        since = step.created_at if step is not None else 0.0
        return sum(
            1
            for a in self.state.attempts(self.step_id)
            if a.kind is kind and a.generation == generation and a.started_at >= since
        )

    def earlier_call_in_doubt(self, current: records.AttemptRecord) -> bool:
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

    def close_orphan_attempts(self, step: records.StepRecord) -> None:
        """Attempts a crashed process left open are unknown: say so (rides with the next commit)."""
        st = self.state
        now = self.port.clock()
        for attempt in st.attempts(self.step_id):
            if attempt.outcome is None:
                closed = classify.lost_in_flight(attempt, now)
                st.pending.attempt(closed)
                st.note_attempt(closed)
                st.pending.event(
                    "recovered_in_doubt",
                    now,
                    step_id=self.step_id,
                    effect_id=step.effect_id,
                    attempt=attempt.number,
                )

    def step_record(
        self,
        existing: records.StepRecord | None,
        status: StepStatus,
        now: float,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        revision: int = 1,
    ) -> records.StepRecord:
        """The step's record in ``status``: ``existing`` moved on, a new revision of a step the
        run recorded, or the step's first record."""
        st = self.state
        if existing is not None:
            return records.evolve(
                existing,
                status=status,
                output=output,
                error=error,
                updated_at=now,
                arguments=existing.arguments if self.arguments is None else self.arguments,
            )
        previous = st.steps.get(self.step_id)
        if previous is not None:  # a new revision of a step keeps its place in the run
            return records.evolve(
                previous,
                step_revision=revision,
                logical_operation_id=None,
                idempotency_key=None,
                request_digest=self.request_digest,
                arguments=self.arguments,
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
            compensation_status=compensation_policy.initial_status(self.contract),
            next_action=NextAction.EXECUTE,
            created_at=now,
            updated_at=now,
            compensates=None if self.compensates is None else self.compensates.effect_id,
            arguments=self.arguments,
        )

    def recordable(self, value: Any) -> Any:
        """``value`` as the ledger records it (a pure, read or local step's result)."""
        try:
            return digests.to_jsonable(value, path=f"{self.step_id}.result")
        except errors.ArgumentError as exc:
            raise errors.ArgumentError(
                f"{exc.message}; tool results are recorded and replayed, so they must be JSON-like",
                run_id=self.run_id,
                step_id=self.step_id,
            ) from None

    def recordable_result(self, value: Any) -> tuple[Any, str, dict[str, Any] | None]:
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

    def answer_original(self, batch: Batch, now: float) -> None:
        """A compensation just confirmed: mark the effect it answers (which stays confirmed)."""
        if self.compensates is not None:
            self.mark_original(batch, CompensationStatus.COMPENSATED, now)

    def mark_original(self, batch: Batch, status: CompensationStatus, now: float) -> None:
        """A compensation's write moves the compensation status of the effect it answers (and of
        that effect's step), in the same batch: ``compensating`` with its intent, ``compensated``
        with its confirmation."""
        original = self.compensates
        assert original is not None
        st = self.state
        effect = self.port.store.get_effect(original.effect_id) or original
        effect = dataclasses.replace(
            effect, compensation_status=status, version=effect.version + 1, updated_at=now
        )
        batch.effect(effect)
        self.compensates = effect
        owner = st.steps.get(effect.step_id)
        if owner is not None:
            owner = dataclasses.replace(owner, compensation_status=status, updated_at=now)
            st.steps[owner.step_id] = owner
            batch.step(owner)


def _raw_digest(value: Any) -> str:
    """A digest of a result that has no canonical form: of its ``repr`` (surrogates kept)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested beyond the recursion limit>"
    except Exception as exc:  # a result whose __repr__ itself fails
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
