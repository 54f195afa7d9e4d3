"""Completion: a write the provider accepted is complete only in the state its contract requires.

An accepted effect exists; until the provider reports the required completion state (polled through
the contract's lookup, ``Action.AWAIT_COMPLETION``) its step is ``awaiting_completion``, and past the
contract's deadline a person decides. The required state is fixed at the intent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies import retry
from effectflow.runtime.step_call import StepCall


def confirm(
    call: StepCall,
    step: records.StepRecord,
    effect: records.EffectRecord,
    output: Any,
    now: float,
    *,
    state: str | None = None,
) -> tuple[records.StepRecord, records.EffectRecord]:
    ext_id = effect.external_effect_id
    if call.contract.effect_id and isinstance(output, Mapping):
        found = output.get(call.contract.effect_id)
        if found is not None:
            ext_id = str(found)
    completion = call.contract.completion
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
    if below_required(call, step):
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


def below_required(call: StepCall, step: records.StepRecord) -> bool:
    """Whether the step's recorded completion state is earlier than the one it requires."""
    completion = call.contract.completion
    required = step.required_state
    if completion is None or required is None or step.completion_state is None:
        return False
    states = list(completion.states)
    if step.completion_state not in states or required not in states:
        return False
    return states.index(step.completion_state) < states.index(required)


def required_state(call: StepCall) -> str | None:
    """The completion state this step requires, from its contracts (fixed at the intent)."""
    completion = call.contract.completion
    if completion is None:
        return None
    sc = call.step_contract
    required = sc.required_state if sc is not None and sc.required_state else None
    required = required or completion.required
    if required not in completion.states:
        raise errors.ContractError(
            f"step {call.step_id}: required state {required!r} is not one of "
            f"{call.tool.ref}'s completion states {list(completion.states)}",
            run_id=call.run_id,
            step_id=call.step_id,
        )
    return required


def deadline_passed(call: StepCall, step: records.StepRecord) -> bool:
    completion = call.contract.completion
    if completion is None or step.status is not StepStatus.AWAITING_COMPLETION:
        return False
    accepted = call.effect_of(step).committed_at or step.updated_at
    return call.port.clock() >= accepted + completion.deadline_seconds


def check_required_state(call: StepCall, step: records.StepRecord) -> None:
    """The required completion state is fixed at the intent; a changed contract is refused."""
    if step.required_state is None or call.contract.completion is None:
        return
    now_required = required_state(call)
    if now_required != step.required_state:
        raise errors.ContractError(
            f"step {call.step_id} was started requiring completion state "
            f"{step.required_state!r}; the contract now says {now_required!r}. The required "
            "state cannot change for a running step: restore the contract, or settle the step "
            "(rt.resolve) and start a new run",
            run_id=call.run_id,
            step_id=call.step_id,
        )


def wait(call: StepCall, step: records.StepRecord) -> float:
    """How long to wait before the next completion poll: backoff, but never past the deadline."""
    completion = call.contract.completion
    assert completion is not None
    polls = call.count(records.AttemptKind.LOOKUP)
    wait = retry.backoff(call.contract.retry, max(polls, 1), call.state.rng)
    accepted = call.effect_of(step).committed_at or step.updated_at
    remaining = accepted + completion.deadline_seconds - call.port.clock()
    return max(0.0, min(wait, remaining))
