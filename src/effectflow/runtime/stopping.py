"""How a run ends when it is asked to stop: a cancel (``rt.cancel``) or an abandoned goal
(``ef.AbandonGoal``, ``rt.compensate``), docs/decision-table.md, the goal-abandoned rows, and
docs/concepts.md#cancel.

Two rules shape everything here:

- A compensation is a new effect, never an "undo" (``compensation``); the original stays
  ``confirmed``.
- Nothing here runs because something *technical* failed. A run that fails keeps its effects as
  facts; only an abandoned goal or a cancel (with the ``cancelled`` trigger) lead here.

``stop_requests`` records the request; this module applies it to a run this process holds.
"""

from __future__ import annotations

from typing import Any

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, ControlKind
from effectflow.policies import compensation as compensation_policy
from effectflow.policies import inventory as inventory_policy
from effectflow.runtime import cancel, compensation
from effectflow.runtime import inventory as inventory_mod
from effectflow.runtime import state as state_mod
from effectflow.runtime.control import Control
from effectflow.runtime.port import Port

#: How many requests recorded one after another while the run is being stopped are applied in
#: turn before this process gives up (each is a person's or the workflow's action; more than this
#: in the seconds a stop takes is somebody's loop).
_NEWER_REQUESTS = 5


def finish(port: Port, state: state_mod.RunState) -> records.RunRecord:
    """Apply the run's control request (cancel or compensate) and give the run its end state.

    Safe to call again after a crash or a pause: every step it takes is recorded, compensations are
    step machines (so an interrupted one is continued with its original key, never repeated), and
    the end state is computed from the ledger's facts.

    A request of another kind recorded while this one is applied (a cancel while a compensate runs:
    the requester saw the run held and left the request for its holder) is applied next, before the
    run is given its end state: the end state is always the last request's.
    """
    for _ in range(_NEWER_REQUESTS):
        control = state.control
        assert control is not None
        kind = control.kind
        if kind is ControlKind.CANCEL:
            cancel.stop_unstarted(port, state)
            cancel.stop_in_progress(port, state)
            cancel.settle_unknowns(port, state)
        waiting = compensation.compensate(port, state, compensation_policy.trigger_of(kind))
        ended = _conclude(port, state, control, waiting)
        if ended is not None:
            return ended
    raise errors.StaleState(
        f"run {state.run.run_id}: its cancel or compensate request changed {_NEWER_REQUESTS} "
        "times while it was being applied; the run keeps its lease until it expires, then "
        "`effectflow recover` (or any worker) applies the last request",
        run_id=state.run.run_id,
    )


def _conclude(
    port: Port, state: state_mod.RunState, control: Control, waiting: str | None
) -> records.RunRecord | None:
    """Record the run's end state, computed from its inventory (``policies.inventory``); None
    when another request was recorded on the run meanwhile (``state.control`` is now that one).

    The end state is written compare-and-swap on the request it was computed for: a request
    recorded after the last write of the one applied here (its requester saw the run held and left
    it for this process) refuses the end state, which would otherwise bury it under the end of
    the request it replaced.
    """
    run = state.run
    kind = control.kind
    if not state.pending.empty:  # what the request's steps left pending: recorded on its own,
        port.writer.commit(state, state.batch())  # so that a refused end state loses nothing
        if state.control != control:
            return None
    inv = inventory_mod.inventory(port, run)
    failed = [
        s.step_id
        for s in state.steps.values()
        if s.compensation_status == CompensationStatus.COMPENSATION_FAILED
    ]
    originals = [
        e
        for e in port.store.effects(tenant=None, run_id=run.run_id, limit=100_000)
        if e.compensates is None and e.status in inventory_policy.HAPPENED
    ]
    status, next_action = inventory_policy.end_state(
        kind,
        unknown=bool(inv.unknown),
        happened=bool(originals),
        all_compensated=bool(originals)
        and all(e.compensation_status == CompensationStatus.COMPENSATED for e in originals),
        needs_person=bool(waiting or failed),
    )
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
    batch.expect_run(control=(control.to_json(),))
    batch.run_changes.update(
        status=status,
        next_action=next_action,
        error=error,
        lease_owner=None,
        lease_expires_at=None,
    )
    if not (status is records.RunStatus.PAUSED and waiting):
        # (A waiting compensation's step already said run_paused.)
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
    try:
        port.writer.commit(state, batch)
    except errors.StaleState:
        newer = Control.of(port.run(run.run_id).control)
        if newer is None or newer == control:
            raise
        state.control = newer
        return None
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
