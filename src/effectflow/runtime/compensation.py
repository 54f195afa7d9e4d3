"""Compensation (docs/decision-table.md, the goal-abandoned rows): when a run's goal is abandoned
(``ef.AbandonGoal``, ``rt.compensate``) or it is cancelled with the ``cancelled`` trigger, each
effect the policy names is answered by a compensation, newest first (``policies.compensation``).

A compensation is a new effect, never an "undo": it has its own step (``compensate:<step>``), key
(derived from the effect it answers), attempts and audit events, and the original effect stays
``confirmed``; the original's compensation status moves with the compensation's writes
(``StepCall.mark_original``). It is a step machine of its own, so an interrupted one is continued
with its original key, never repeated; it waits for an approval when the contract or money
requires one. Nothing here runs because something *technical* failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from effectflow import errors, telemetry
from effectflow.contracts.tool import Tool
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, NextAction, StepStatus
from effectflow.policies import compensation as compensation_policy
from effectflow.policies import decision
from effectflow.policies import inventory as inventory_policy
from effectflow.policies.decision import Action
from effectflow.runtime import approvals, driver, machine_io, step_call, step_machine
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port


def compensation_step_id(step_id: str) -> str:
    """The step id of the compensation that answers ``step_id``'s effect."""
    return f"compensate:{step_id}"


def compensate(port: Port, state: state_mod.RunState, trigger: str) -> str | None:
    """Run the compensations the policy calls for, newest effect first.

    Returns the step id that has to wait (approval or a person), or None when nothing waits.
    """
    for step in compensation_policy.order(state.steps.values()):
        assert step.effect_id is not None
        effect = port.store.get_effect(step.effect_id)
        if effect is None or effect.status not in inventory_policy.HAPPENED:
            continue
        if effect.compensation_status == CompensationStatus.COMPENSATED:
            continue
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            continue
        step_contract = state.workflow.steps.get(step.step_id)
        verdict = compensation_policy.verdict(tool.contract, step_contract, trigger)
        if verdict.action is Action.KEEP_EFFECT:
            _keep(port, state, step, effect, verdict, trigger)
            continue
        waiting = _run_compensation(port, state, step, effect, tool, verdict)
        if waiting is not None:
            return waiting
    return None


def _keep(
    port: Port,
    state: state_mod.RunState,
    step: records.StepRecord,
    effect: records.EffectRecord,
    verdict: decision.Decision,
    trigger: str,
) -> None:
    """An effect with no compensation (or whose trigger does not match) stays a confirmed fact."""
    if effect.compensation_status == CompensationStatus.KEPT:
        return
    now = port.clock()
    batch = state.batch()
    if effect.compensation_status == CompensationStatus.NOT_REQUIRED:
        # Nothing could ever answer it: say so once.
        kept = dataclasses.replace(
            effect,
            compensation_status=CompensationStatus.KEPT,
            version=effect.version + 1,
            updated_at=now,
        )
        batch.effect(kept)
        owner = dataclasses.replace(
            state.steps[step.step_id], compensation_status=CompensationStatus.KEPT
        )
        state.steps[step.step_id] = owner
        batch.step(owner)
    batch.event(
        "effect_kept",
        now,
        step_id=step.step_id,
        effect_id=effect.effect_id,
        row=verdict.row,
        reason=verdict.reason,
        trigger=trigger,
    )
    port.writer.commit(state, batch)


def _run_compensation(
    port: Port,
    state: state_mod.RunState,
    step: records.StepRecord,
    effect: records.EffectRecord,
    tool: Tool[..., Any],
    verdict: decision.Decision,
) -> str | None:
    compensation = tool.contract.compensation
    assert compensation is not None
    comp_step_id = compensation_step_id(step.step_id)
    comp_tool = port.registry.tool(compensation.tool_ref)
    existing = state.steps.get(comp_step_id)
    if existing is not None and existing.status is StepStatus.CONFIRMED:
        return None
    problem = _compensation_problem(port, state, effect, compensation.deadline_seconds, existing)
    if problem is not None:
        return _compensation_failed(port, state, step, effect, comp_step_id, problem)
    try:
        kwargs = _compensation_arguments(comp_tool, compensation.param, effect, step)
    except errors.ContractError as exc:
        return _compensation_failed(port, state, step, effect, comp_step_id, exc.message)
    if existing is None:  # else decided before (then paused or crashed): continue it
        state.pending.event(
            "compensation_decided",
            port.clock(),
            step_id=step.step_id,
            effect_id=effect.effect_id,
            compensation_step=comp_step_id,
            compensation_tool=comp_tool.ref,
            row=verdict.row,
            reason=verdict.reason,
        )
    call = step_call.StepCall(
        port,
        state,
        comp_step_id,
        comp_tool,
        (),
        kwargs,
        operation_id=f"compensate:{effect.effect_id}",
        target=effect.external_effect_id or "",
        compensates=effect,
    )
    try:
        driver.drive(
            port,
            state,
            telemetry.step(call.run_id, comp_step_id, comp_tool.ref, step_machine.run(call)),
        )
    except machine_io.Suspend:
        return comp_step_id
    except errors.StepFailed as exc:
        declined = state.steps.get(comp_step_id)
        if (
            declined is not None
            and (declined.error or {}).get("code") == approvals.APPROVAL_DECLINED
        ):
            _compensation_declined(port, state, step, effect, comp_step_id, declined.error or {})
            return None
        return _compensation_failed(port, state, step, effect, comp_step_id, exc.message)
    return None


def _compensation_declined(
    port: Port,
    state: state_mod.RunState,
    step: records.StepRecord,
    effect: records.EffectRecord,
    comp_step_id: str,
    error: dict[str, Any],
) -> None:
    """A person declined the compensation (``rt.reject``): the effect stands, kept by that
    decision — nothing failed, and nobody is asked again."""
    _mark_compensation(
        port,
        state,
        step,
        effect,
        CompensationStatus.KEPT,
        NextAction.NONE,
        "compensation_declined",
        compensation_step=comp_step_id,
        actor=str(error.get("by") or "operator"),
        reason=error.get("reason"),
    )


def _mark_compensation(
    port: Port,
    state: state_mod.RunState,
    step: records.StepRecord,
    effect: records.EffectRecord,
    status: CompensationStatus,
    next_action: NextAction,
    event: str,
    **detail: Any,
) -> None:
    """Record where an effect's compensation stands, on the effect and its step, with its event."""
    now = port.clock()
    batch = state.batch()
    fresh = port.store.get_effect(effect.effect_id) or effect
    batch.effect(
        dataclasses.replace(
            fresh,
            compensation_status=status,
            next_action=next_action,
            version=fresh.version + 1,
            updated_at=now,
        )
    )
    owner = state.steps[step.step_id]
    owner = dataclasses.replace(
        owner,
        compensation_status=status,
        # A person must act: the step says so too; a kept effect's step goes on using its result.
        next_action=next_action if next_action is NextAction.ASK_A_PERSON else owner.next_action,
        updated_at=now,
    )
    state.steps[step.step_id] = owner
    batch.step(owner)
    batch.event(event, now, step_id=step.step_id, effect_id=effect.effect_id, **detail)
    port.writer.commit(state, batch)


def _compensation_problem(
    port: Port,
    state: state_mod.RunState,
    effect: records.EffectRecord,
    deadline: float | None,
    existing: records.StepRecord | None,
) -> str | None:
    if effect.external_effect_id is None:
        return (
            f"effect {effect.effect_id} has no recorded external effect id, so a compensation "
            "cannot name what it answers"
        )
    started = existing is not None and existing.effect_id is not None
    if (
        deadline is not None
        and not started
        and effect.committed_at is not None
        and port.clock() > effect.committed_at + deadline
    ):
        return f"the compensation deadline ({deadline:.0f} s after the effect) has passed"
    return None


def _compensation_arguments(
    comp_tool: Tool[..., Any],
    param: str | None,
    effect: records.EffectRecord,
    step: records.StepRecord,
) -> dict[str, Any]:
    """The compensation targets the original by its recorded external id, bound from the ledger;
    other required parameters are taken from the original's recorded result by name."""
    skip = {comp_tool.contract.idempotency.key_param, "precondition", "tx"}
    params = [
        p
        for p in comp_tool.signature.parameters.values()
        if p.name not in skip and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if not params:
        raise errors.ContractError(
            f"compensation tool {comp_tool.ref} takes no parameter to receive the external effect "
            "id of what it compensates"
        )
    target = param or params[0].name
    kwargs: dict[str, Any] = {target: effect.external_effect_id}
    output = step.output if isinstance(step.output, Mapping) else {}
    for p in params:
        if p.name in kwargs:
            continue
        if p.name in output:
            kwargs[p.name] = output[p.name]
        elif p.default is p.empty:
            raise errors.ContractError(
                f"compensation tool {comp_tool.ref} needs {p.name!r}, which is neither the "
                "compensated effect's id nor a field of its recorded result"
            )
    return kwargs


def _compensation_failed(
    port: Port,
    state: state_mod.RunState,
    step: records.StepRecord,
    effect: records.EffectRecord,
    comp_step_id: str,
    reason: str,
) -> str:
    """A failed or impossible compensation goes to a person; the original stays confirmed."""
    _mark_compensation(
        port,
        state,
        step,
        effect,
        CompensationStatus.COMPENSATION_FAILED,
        NextAction.ASK_A_PERSON,
        "compensation_failed",
        compensation_step=comp_step_id,
        reason=reason,
    )
    return comp_step_id
