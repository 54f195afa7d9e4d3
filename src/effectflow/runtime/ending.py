"""How a run ends when its goal is abandoned or it is cancelled (DESIGN §4 last rows, §5).

Two rules shape everything here:

- A compensation is a new effect, never an "undo": it has its own step, key (derived from the effect
  it answers), attempts and audit events, and the original effect stays ``confirmed``. Compensations
  run newest first, each only when its step's business trigger matches, and with an approval when
  the contract or money requires one.
- Nothing here runs because something *technical* failed. A run that fails keeps its effects as facts;
  only ``ef.AbandonGoal``, ``rt.compensate`` (the goal is abandoned) and ``rt.cancel`` (with the
  ``cancelled`` trigger) lead here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.tool import Tool
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, RunStatus, StepStatus
from effectflow.ledger.store import Batch
from effectflow.policies import decision
from effectflow.policies.decision import Action, Situation
from effectflow.runtime import driver, engine, outcomes, requests
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port

#: The control kinds an operator (or the workflow) can put on a run.
CANCEL = "cancel"
COMPENSATE = "compensate"

#: Effect statuses that say the effect exists in the world.
_HAPPENED = (StepStatus.CONFIRMED, StepStatus.AWAITING_COMPLETION)


def compensation_step_id(step_id: str) -> str:
    """The step id of the compensation that answers ``step_id``'s effect."""
    return f"compensate:{step_id}"


def finish(port: Port, state: state_mod.RunState) -> records.RunRecord:
    """Apply the run's control request (cancel or compensate) and give the run its end state.

    Safe to call again after a crash or a pause: every step it takes is recorded, compensations are
    step machines (so an interrupted one is continued with its original key, never repeated), and the
    end state is computed from the ledger's facts.
    """
    control = state.control
    assert control is not None
    kind = control.get("kind", CANCEL)
    if kind == CANCEL:
        _stop_unstarted(port, state)
        _stop_in_progress(port, state)
        _settle_unknowns(port, state)
    trigger = "cancelled" if kind == CANCEL else "goal_abandoned"
    waiting = _compensate(port, state, trigger)
    return _conclude(port, state, kind, waiting)


def inventory(
    port: Port, run: records.RunRecord, *, in_flight: frozenset[str] = frozenset()
) -> records.Inventory:
    """What the run left in the world, from the ledger (DESIGN §5)."""
    steps = port.store.steps(run.run_id)
    effects = port.store.effects(tenant=None, run_id=run.run_id, limit=100_000)
    confirmed, unknown, flying, compensated, pending, stopped = [], [], [], [], [], []
    for effect in effects:
        if effect.compensates is not None:
            if effect.status is StepStatus.CONFIRMED:
                compensated.append(effect.effect_id)
            elif effect.status is not StepStatus.CANCELLED:
                pending.append(effect.effect_id)
            continue
        if effect.effect_id in in_flight:
            flying.append(effect.effect_id)
        elif effect.status in _HAPPENED:
            confirmed.append(effect.effect_id)
        elif effect.status in records.IN_DOUBT_STATUSES:
            unknown.append(effect.effect_id)
        elif effect.status is StepStatus.CANCELLED and effect.evidence:
            stopped.append(effect.effect_id)
    for step in steps:
        if step.compensates is not None and step.effect_id is None:
            pending.append(step.step_id)  # waiting for its approval: no effect yet
    return records.Inventory(
        run_id=run.run_id,
        status=run.status,
        confirmed=confirmed,
        in_flight=flying,
        unknown=unknown,
        compensated=compensated,
        compensation_pending=pending,
        cancelled_steps=[s.step_id for s in steps if s.status is StepStatus.CANCELLED],
        stopped=stopped,
    )


# -- cancel ---------------------------------------------------------------------------------------


def _stop_unstarted(port: Port, state: state_mod.RunState) -> None:
    """Steps that never sent anything (waiting for an approval) will not start: ``cancelled``."""
    now = port.clock()
    batch = state.batch()
    for step in list(state.steps.values()):
        if step.status is StepStatus.PENDING and step.compensates is None:
            cancelled = dataclasses.replace(
                step, status=StepStatus.CANCELLED, next_action=NextAction.NONE, updated_at=now
            )
            state.steps[step.step_id] = cancelled
            batch.step(cancelled)
            batch.event("step_cancelled", now, step_id=step.step_id, reason="run cancelled")
    if not batch.empty:
        port.writer.commit(state, batch)


def _stop_in_progress(port: Port, state: state_mod.RunState) -> None:
    """Calls the provider still works on (accepted, not complete) are stopped where the tool
    declares a cancel operation; the others are left to land and are classified as they are."""
    for step in list(state.steps.values()):
        if step.status not in (StepStatus.AWAITING_COMPLETION, StepStatus.INTENT_RECORDED):
            continue
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            continue
        if tool.contract.cancel is None or step.effect_id is None:
            continue
        canceller = port.registry.tool(tool.contract.cancel)
        answer, error = _call_cancel_operation(canceller, step)
        now = port.clock()
        effect = port.store.get_effect(step.effect_id)
        assert effect is not None
        batch = state.batch()
        if error is None:
            evidence = {"cancelled_by": canceller.ref, "answer": _jsonable(answer)}
            step = dataclasses.replace(
                step, status=StepStatus.CANCELLED, next_action=NextAction.NONE, updated_at=now
            )
            effect = dataclasses.replace(
                effect,
                status=StepStatus.CANCELLED,
                evidence=evidence,
                next_action=NextAction.NONE,
                version=effect.version + 1,
                updated_at=now,
            )
            batch.step(step)
            batch.effect(effect)
            state.steps[step.step_id] = step
        batch.event(
            "cancel_call",
            now,
            step_id=step.step_id,
            effect_id=step.effect_id,
            cancel_tool=canceller.ref,
            stopped=error is None,
            error=error,
        )
        port.writer.commit(state, batch)


def _call_cancel_operation(
    canceller: Tool[..., Any], step: records.StepRecord
) -> tuple[Any, dict[str, Any] | None]:
    """Ask the provider to stop the step's call (by its key / external id): (answer, error)."""
    kwargs: dict[str, Any] = {}
    params = canceller.signature.parameters
    if "idempotency_key" in params:
        kwargs["idempotency_key"] = step.idempotency_key
    if "external_effect_id" in params:
        kwargs["external_effect_id"] = step.external_effect_id
    result = driver.call_sync(requests.Invoke(canceller, (), kwargs, canceller.contract.timeout))
    if result.error is not None:
        return None, outcomes.error_of(result.error)
    return result.value, None


def cancel_calls_in_flight(port: Port, run: records.RunRecord) -> list[str]:
    """A run another worker executes: ask the provider to stop the calls it is in the middle of,
    where their tools declare a cancel operation. Only the request is recorded here; the worker
    classifies each call when it lands (the provider's answer says whether it took effect).

    Returns the effect ids in flight.
    """
    flying = []
    now = port.clock()
    batch = Batch(run.run_id, lease_token=None)
    for step in port.store.steps(run.run_id):
        if step.status is not StepStatus.INTENT_RECORDED or step.effect_id is None:
            continue
        flying.append(step.effect_id)
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            continue
        if tool.contract.cancel is None:
            continue
        canceller = port.registry.tool(tool.contract.cancel)
        answer, error = _call_cancel_operation(canceller, step)
        batch.event(
            "cancel_call",
            now,
            step_id=step.step_id,
            effect_id=step.effect_id,
            cancel_tool=canceller.ref,
            answer=_jsonable(answer),
            error=error,
            in_flight=True,
        )
    if not batch.empty:
        port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    return flying


def _settle_unknowns(port: Port, state: state_mod.RunState) -> None:
    """Unknown effects are queued for confirmation: one lookup now where a lookup tool exists.

    A cancelled run never *retries* a call: a lookup that finds nothing records ``not_committed``
    and the step stays stopped; one that cannot tell leaves the effect for ``rt.reconcile``.
    """
    for step in list(state.steps.values()):
        if step.status not in records.IN_DOUBT_STATUSES or step.compensates is not None:
            continue
        machine = engine.StepMachine.for_recorded(port, state, step)
        if machine is None or machine.contract.confirm is None:
            continue
        machine._close_orphan_attempts(step)
        verdict = decision.decide(Situation.IN_DOUBT, machine._facts(step))
        try:
            driver.drive(port, state, machine._lookup(step, verdict))
        except errors.ContractError:
            continue


# -- compensation ---------------------------------------------------------------------------------


def _compensate(port: Port, state: state_mod.RunState, trigger: str) -> str | None:
    """Run the compensations the policy calls for, newest effect first.

    Returns the step id that has to wait (approval or a person), or None when nothing waits.
    """
    originals = sorted(
        (s for s in state.steps.values() if s.compensates is None and s.effect_id is not None),
        key=lambda s: (s.confirmed_at or s.updated_at, s.seq),
        reverse=True,
    )
    for step in originals:
        assert step.effect_id is not None
        effect = port.store.get_effect(step.effect_id)
        if effect is None or effect.status not in _HAPPENED:
            continue
        if effect.compensation_status == "compensated":
            continue
        try:
            tool = port.registry.tool(step.tool)
        except errors.ContractError:
            continue
        sc: StepContract | None = state.workflow.steps.get(step.step_id)
        triggers = sc.triggers if sc is not None else frozenset({"goal_abandoned"})
        facts = decision.Facts(
            effect=tool.contract.effect,
            has_compensation=tool.contract.compensation is not None,
            trigger_matches=trigger in triggers,
        )
        verdict = decision.decide(Situation.GOAL_ABANDONED, facts)
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
    if effect.compensation_status == "kept":
        return
    now = port.clock()
    batch = state.batch()
    if effect.compensation_status == "not_required":  # nothing could ever answer it: say so once
        kept = dataclasses.replace(
            effect, compensation_status="kept", version=effect.version + 1, updated_at=now
        )
        batch.effect(kept)
        owner = dataclasses.replace(state.steps[step.step_id], compensation_status="kept")
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
    if existing is not None:  # decided before (then paused or crashed): continue it
        batch = state.batch()
    else:
        batch = state.batch()
        batch.event(
            "compensation_decided",
            port.clock(),
            step_id=step.step_id,
            effect_id=effect.effect_id,
            compensation_step=comp_step_id,
            compensation_tool=comp_tool.ref,
            row=verdict.row,
            reason=verdict.reason,
        )
    state.pending.absorb(batch)
    machine = engine.StepMachine(
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
        driver.drive(port, state, machine.run())
    except requests.Suspend:
        return comp_step_id
    except errors.StepFailed as exc:
        declined = state.steps.get(comp_step_id)
        if declined is not None and (declined.error or {}).get("code") == "approval_declined":
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
        "kept",
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
    status: str,
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
        "compensation_failed",
        NextAction.ASK_A_PERSON,
        "compensation_failed",
        compensation_step=comp_step_id,
        reason=reason,
    )
    return comp_step_id


# -- the end state --------------------------------------------------------------------------------


def _conclude(
    port: Port, state: state_mod.RunState, kind: str, waiting: str | None
) -> records.RunRecord:
    run = state.run
    inv = inventory(port, run)
    failed = [
        s.step_id for s in state.steps.values() if s.compensation_status == "compensation_failed"
    ]
    originals = [
        e
        for e in port.store.effects(tenant=None, run_id=run.run_id, limit=100_000)
        if e.compensates is None and e.status in _HAPPENED
    ]
    all_compensated = bool(originals) and all(
        e.compensation_status == "compensated" for e in originals
    )
    attention = bool(waiting or failed)
    if kind == CANCEL:
        if inv.unknown:
            status = RunStatus.CANCELLED_PENDING_RECONCILIATION
        elif originals:
            status = RunStatus.CANCELLED_WITH_EFFECTS
        else:
            status = RunStatus.CANCELLED
    elif attention or inv.unknown:
        status = RunStatus.PAUSED
    elif all_compensated:
        status = RunStatus.COMPENSATED
    elif originals:
        status = RunStatus.CANCELLED_WITH_EFFECTS
    else:
        status = RunStatus.CANCELLED
    if attention or (inv.unknown and kind != CANCEL):
        next_action = NextAction.ASK_A_PERSON
    elif inv.unknown:
        next_action = NextAction.RECONCILE
    else:
        next_action = NextAction.NONE
    error: dict[str, Any] | None = None
    if waiting or failed or inv.unknown:
        error = {
            "code": "needs_attention" if failed or inv.unknown else "approval_required",
            "message": _why(waiting, failed, inv.unknown),
            "step_id": waiting or (failed[0] if failed else None),
            "unknown_effects": inv.unknown,
        }
    now = port.clock()
    batch = state.batch()
    batch.run_changes.update(
        status=status,
        next_action=next_action,
        error=error,
        lease_owner=None,
        lease_expires_at=None,
    )
    if not (status is RunStatus.PAUSED and waiting):  # the waiting step already said run_paused
        batch.event(
            "run_" + status.value,
            now,
            control=kind,
            confirmed=inv.confirmed,
            unknown=inv.unknown,
            compensated=inv.compensated,
            compensation_pending=inv.compensation_pending,
            cancelled_steps=inv.cancelled_steps,
        )
    port.writer.commit(state, batch)
    return port.run(run.run_id)


def _why(waiting: str | None, failed: list[str], unknown: list[str]) -> str:
    parts = []
    if waiting:
        parts.append(f"compensation {waiting} waits for an approval or a person")
    if failed:
        parts.append(f"compensation of {', '.join(failed)} failed or missed its deadline")
    if unknown:
        parts.append(f"{len(unknown)} effect(s) are unknown and queued for confirmation")
    return "; ".join(parts)


def _jsonable(value: Any) -> Any:
    try:
        return digests.to_jsonable(value)
    except errors.ArgumentError:
        return repr(value)
