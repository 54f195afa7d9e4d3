"""Preconditions: a write whose precondition failed (``conflict``) is never retried over the new
state; the run re-observes (re-runs the read step its ``precondition=ef.Expect(...)`` came from, as
a new revision) and decides again, or a person decides."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies import decision
from effectflow.runtime import machine_io, resolution
from effectflow.runtime.step_call import StepCall


def reobserve(
    call: StepCall, step: records.StepRecord, verdict: decision.Decision
) -> Generator[machine_io.Request, Any, None]:
    """A precondition failed: re-run the observation step (new revision), never overwrite."""
    st = call.state
    sc = call.step_contract
    observe = call.observe or (sc.observe if sc is not None else None)
    limit = sc.max_reobserve if sc is not None else 3
    observed = st.steps.get(observe) if observe else None
    if observed is None or observed.step_revision > limit:
        why = (
            "no observation step is named (ctx.call(..., observe=...))"
            if observed is None
            else f"it was re-observed {limit} times and still conflicts"
        )
        yield from resolution.ask_a_person(
            call,
            step,
            dataclasses.replace(verdict, reason=f"{verdict.reason}; {why}: a person decides"),
        )
        return
    now = call.port.clock()
    fresh = dataclasses.replace(
        observed,
        step_revision=observed.step_revision + 1,
        status=StepStatus.PENDING,
        output=None,
        confirmed_at=None,
        next_action=NextAction.EXECUTE,
        updated_at=now,
    )
    batch = st.batch()
    batch.step(fresh)
    batch.event(
        "reobserve",
        now,
        step_id=call.step_id,
        effect_id=step.effect_id,
        observe=observe,
        observe_revision=fresh.step_revision,
        row=verdict.row,
        reason=verdict.reason,
    )
    yield machine_io.Commit(batch)
    st.steps[observed.step_id] = fresh
    raise machine_io.Restart(call.step_id, f"re-observe {observe} after a conflict")
