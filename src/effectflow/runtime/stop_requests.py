"""An operator's request to stop a run: ``rt.cancel`` and ``rt.compensate``.

The request is recorded on the run compare-and-swap, so of two concurrent requests (two cancels, a
cancel and a compensate) exactly one is recorded. A run no live worker holds is taken by the same
write and the request is applied here at once; a run another live worker holds gets the request,
and stops at its next step boundary (it learns of it with its next write).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import ControlKind, RunStatus
from effectflow.ledger.store import Batch
from effectflow.runtime import cancel as cancel_mod
from effectflow.runtime import inventory as inventory_mod
from effectflow.runtime import leases
from effectflow.runtime.control import Control
from effectflow.runtime.executor import Executor
from effectflow.runtime.port import Port

#: How many times a cancel or compensate is decided again when the run's lease or status moved
#: under it (a worker claimed or paused it) before its request could be recorded.
_CONTROL_RACES = 3


def cancel(
    port: Port, executor: Executor, run_id: str, *, reason: str | None, by: str
) -> records.Inventory:
    """``Runtime.cancel`` (documented there)."""
    run = port.run(run_id)
    for _ in range(_CONTROL_RACES):
        recorded = Control.of(run.control)
        cancelled = (
            recorded is not None
            and recorded.kind is ControlKind.CANCEL
            and run.status is not RunStatus.CANCELLED_PENDING_RECONCILIATION
        )
        # A cancel already recorded answers this one: a worker is applying it (it holds the
        # run), or it was applied; only a run whose cancelling worker died is taken over.
        if run.status.terminal or (
            cancelled
            and (leases.held_elsewhere(run, port.clock()) or run.status is not RunStatus.RUNNING)
        ):
            return inventory_mod.inventory(port, run)
        control = Control(ControlKind.CANCEL, reason, by, port.clock())
        held = leases.held_elsewhere(run, port.clock())
        workflow = None if held else port.registry.workflow(run.workflow)
        try:
            taken = _record(port, run, control, RunStatus.CANCELLING, take=not held)
        except errors.StaleState as exc:
            run, answered = _raced(port, run, exc, control)
            if answered:  # another cancel was recorded first: it is this one's answer
                return inventory_mod.inventory(port, run)
            continue
        if workflow is None:
            flying = frozenset(cancel_mod.cancel_calls_in_flight(port, run))
            return inventory_mod.inventory(port, port.run(run_id), in_flight=flying)
        return inventory_mod.inventory(port, executor.apply_control(taken, workflow, control))
    raise _kept_moving(run_id, ControlKind.CANCEL)


def compensate(
    port: Port, executor: Executor, run_id: str, *, reason: str, by: str
) -> records.RunRecord:
    """``Runtime.compensate`` (documented there)."""
    if not reason:
        raise errors.ArgumentError("compensate needs a reason: the business condition")
    run = port.run(run_id)
    for _ in range(_CONTROL_RACES):
        recorded = Control.of(run.control)
        compensating = recorded is not None and recorded.kind is ControlKind.COMPENSATE
        if run.status is RunStatus.COMPENSATED or (
            compensating and leases.held_elsewhere(run, port.clock())
        ):
            return run  # done, or a worker is applying the compensate already recorded
        control = Control(ControlKind.COMPENSATE, reason, by, port.clock())
        held = leases.held_elsewhere(run, port.clock())
        workflow = None if held else port.registry.workflow(run.workflow)
        # A run taken to be compensated here is running while its compensations do, as a
        # cancel's is cancelling: a request seen meanwhile (a cancel) is left to this process, not
        # taken from it, and a crash before the end state is recovered like any running run.
        status = None if held else RunStatus.RUNNING
        try:
            taken = _record(port, run, control, status, take=not held)
        except errors.StaleState as exc:
            run, answered = _raced(port, run, exc, control)
            if answered:  # another compensate was recorded first: it answers this one
                return run
            continue
        if workflow is None:
            return port.run(run_id)
        return executor.apply_control(taken, workflow, control)
    raise _kept_moving(run_id, ControlKind.COMPENSATE)


def _record(
    port: Port,
    run: records.RunRecord,
    control: Control,
    status: RunStatus | None,
    *,
    take: bool,
) -> records.RunRecord:
    """Record an operator's control request on ``run`` as it was read (compare-and-swap).

    The batch is refused (``StaleState``) unless the run still has the control, status and
    lease it was read with. With ``take`` the same write takes the run's lease for this process,
    which then applies the control (no worker holds the run); without, it is left for the worker
    holding the run, which reads it with its next write.

    Returns the run as recorded.
    """
    now = port.clock()
    batch = Batch(run.run_id, lease_token=None)
    batch.expect_run(
        control=(run.control,),
        status=run.status,
        lease_token=run.lease_token,
        lease_owner=(run.lease_owner,),
    )
    changes: dict[str, Any] = {"control": control.to_json()}
    if status is not None:
        changes["status"] = status
    if take:
        changes.update(
            error=None,
            lease_owner=port.owner,
            lease_token=run.lease_token + 1,
            lease_expires_at=now + port.lease_ttl,
        )
    batch.run_changes.update(changes)
    batch.event(f"{control.kind.value}_requested", now, actor=control.by, reason=control.reason)
    port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    return dataclasses.replace(run, **changes, updated_at=now)


def _raced(
    port: Port, seen: records.RunRecord, refused: errors.StaleState, control: Control
) -> tuple[records.RunRecord, bool]:
    """After the store refused a control request: the run as it is now, and whether a request
    of the same kind was recorded meanwhile (it answers this one). When only the run's lease or
    status moved, the caller decides again on the fresh run.

    Raises:
        errors.StaleState: a request of another kind was recorded first; this one is refused.
    """
    fresh = port.run(seen.run_id)
    if fresh.control == seen.control:
        return fresh, False
    won = Control.of(fresh.control)
    if won is not None and won.kind is control.kind:
        return fresh, True
    raise errors.StaleState(
        f"run {seen.run_id}: a {won.kind.value if won else None} request by "
        f"{won.by if won else None} was recorded while this {control.kind.value} was being "
        "decided; nothing was recorded. Look at the run as it is now and decide again",
        run_id=seen.run_id,
    ) from refused


def _kept_moving(run_id: str, kind: ControlKind) -> errors.StaleState:
    return errors.StaleState(
        f"run {run_id} changed each time the {kind.value} was about to be recorded; nothing was "
        "recorded: try again",
        run_id=run_id,
    )
