"""Cancel (``rt.cancel``, docs/concepts.md#cancel): what has not started does not start, a call the
provider is still working on is stopped where its tool declares a cancel operation, and what may
have happened is looked up once. Confirmed effects are never marked undone.

A cancel reaches a live run at a step boundary: with the next write (``stop_before_call``, when it
arrives with an intent's commit: nothing was sent, so the step is cancelled), or before the next
step starts (``step_machine``). ``stopping`` applies a cancel to a run this process holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.tool import Tool
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.ledger.store import Batch
from effectflow.runtime import classify, driver, lookup, machine_io
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall


def stop_before_call(
    call: StepCall, step: records.StepRecord, attempt: records.AttemptRecord
) -> Generator[machine_io.Request, Any, None]:
    """A cancel arrived with the intent's commit: nothing was sent, so the step is cancelled."""
    st = call.state
    assert st.control is not None
    now = call.port.clock()
    batch = st.batch()
    ended = records.evolve(
        attempt,
        ended_at=now,
        outcome=Outcome.NOT_COMMITTED,
        error={"code": "cancelled", "message": "the run was cancelled before the call"},
    )
    batch.attempt(ended)
    step, effect = call.mark(step, StepStatus.CANCELLED, NextAction.NONE, now)
    batch.step(step)
    batch.effect(effect)
    batch.event(
        "step_cancelled",
        now,
        step_id=call.step_id,
        effect_id=effect.effect_id,
        reason="cancel requested before the call was sent",
    )
    yield machine_io.Commit(batch)
    st.steps[call.step_id] = step
    st.note_attempt(ended)
    call.effect = effect
    raise machine_io.Stop(st.control)


def stop_unstarted(port: Port, state: state_mod.RunState) -> None:
    """Steps that never sent anything (waiting for an approval) will not start: ``cancelled``."""
    now = port.clock()
    batch = state.batch()
    for step in list(state.steps.values()):
        unstarted = step.status in (StepStatus.PENDING, StepStatus.AWAITING_APPROVAL)
        if unstarted and step.compensates is None:
            cancelled = dataclasses.replace(
                step, status=StepStatus.CANCELLED, next_action=NextAction.NONE, updated_at=now
            )
            state.steps[step.step_id] = cancelled
            batch.step(cancelled)
            batch.event("step_cancelled", now, step_id=step.step_id, reason="run cancelled")
    if not batch.empty:
        port.writer.commit(state, batch)


def stop_in_progress(port: Port, state: state_mod.RunState) -> None:
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
    result = driver.call_sync(machine_io.Invoke(canceller, (), kwargs, canceller.contract.timeout))
    if result.error is not None:
        return None, classify.error_of(result.error)
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


def settle_unknowns(port: Port, state: state_mod.RunState) -> None:
    """Unknown effects are queued for confirmation: one lookup now where a lookup tool exists.

    A cancelled run never *retries* a call: a lookup that finds nothing records ``not_committed``
    and the step stays stopped; one that cannot tell leaves the effect for ``rt.reconcile``.
    """
    for step in list(state.steps.values()):
        if step.status not in records.IN_DOUBT_STATUSES or step.compensates is not None:
            continue
        found = lookup.look_up_recorded(port, state, step)
        if found is None:
            continue
        call, verdict = found
        try:
            driver.drive(port, state, lookup.settle(call, step, verdict))
        except errors.ContractError:
            continue


def _jsonable(value: Any) -> Any:
    try:
        return digests.to_jsonable(value)
    except errors.ArgumentError:
        return repr(value)
