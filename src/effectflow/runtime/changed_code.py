"""Workflow code that changed under a run: a recorded step with an effect that the workflow no
longer reaches (renamed, removed, reordered) or now calls with another request.

Its effect must not drop out of the run's story: it is settled from its *recorded* request and key
(its lookup), and the run paused for a person, naming the change, never failed with it dropped.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies.decision import Action
from effectflow.runtime import lookup, machine_io
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port

#: Step statuses that prove the step changed nothing: a workflow that no longer reaches such a step
#: (it re-observed after a conflict, it took another branch after a refusal) loses nothing.
_CHANGED_NOTHING = frozenset(
    {
        StepStatus.PENDING,
        StepStatus.AWAITING_APPROVAL,
        StepStatus.NOT_COMMITTED,
        StepStatus.REJECTED,
        StepStatus.CONFLICT,
        StepStatus.CANCELLED,
        StepStatus.FAILED,
        StepStatus.SKIPPED,
    }
)


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


def settle_unreached(
    port: Port, state: state_mod.RunState, steps: list[records.StepRecord], why: str
) -> Generator[machine_io.Request, Any, None]:
    """Settle each in-doubt step of ``steps`` from its *recorded* request and key (its lookup:
    the new code's arguments are not the ones that were sent), then pause the run for a person,
    naming the change. Always unwinds with ``machine_io.Suspend``."""
    # Results this pass of the changed code computed (pure and read steps waiting to ride with the
    # next write) are not kept: the code the run resumes with next may compute others.
    for step_id, pending in list(state.pending.steps.items()):
        if pending.effect_id is None and step_id in state.seen:
            del state.pending.steps[step_id]
    for step in steps:
        if step.status not in records.IN_DOUBT_STATUSES:
            continue
        found = lookup.look_up_recorded(port, state, step)
        if found is None:
            continue
        call, verdict = found
        if verdict.action is Action.LOOKUP:
            yield from lookup.settle(call, state.steps[step.step_id], verdict)
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
    yield machine_io.Commit(batch)
    raise machine_io.Suspend(listed[0], reason)
