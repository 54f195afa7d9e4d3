"""What a stopped run left in the world, as pure functions: the class of each of its effects in its
inventory, and the end state a cancel or an abandoned goal gives the run (docs/concepts.md#cancel).

The runtime (``effectflow.runtime.inventory``, ``effectflow.runtime.stopping``) reads the ledger
and records what these decide.
"""

from __future__ import annotations

import enum

from effectflow.ledger import records
from effectflow.ledger.records import ControlKind, NextAction, RunStatus, StepStatus

#: Effect statuses that say the effect exists in the world.
HAPPENED = frozenset({StepStatus.CONFIRMED, StepStatus.AWAITING_COMPLETION})


class Holding(enum.StrEnum):
    """Where an effect stands in a run's inventory (each is a list of ``records.Inventory``)."""

    #: It happened: it stays in the world (a compensation, if any, is another effect).
    CONFIRMED = "confirmed"
    #: Its call is in flight at the provider now (another worker holds the run).
    IN_FLIGHT = "in_flight"
    #: It may have happened: queued for confirmation.
    UNKNOWN = "unknown"
    #: A compensation that was confirmed.
    COMPENSATED = "compensated"
    #: A compensation not confirmed yet (waiting, in progress, failed).
    COMPENSATION_PENDING = "compensation_pending"
    #: A call the provider stopped at the cancel (its cancel operation answered).
    STOPPED = "stopped"


def classify(effect: records.EffectRecord, *, in_flight: bool = False) -> Holding | None:
    """The inventory list ``effect`` belongs in; None when it left nothing to list (not committed,
    rejected, cancelled before it was sent, or a compensation cancelled with its run)."""
    if effect.compensates is not None:
        if effect.status is StepStatus.CONFIRMED:
            return Holding.COMPENSATED
        if effect.status is not StepStatus.CANCELLED:
            return Holding.COMPENSATION_PENDING
        return None
    if in_flight:
        return Holding.IN_FLIGHT
    if effect.status in HAPPENED:
        return Holding.CONFIRMED
    if effect.status in records.IN_DOUBT_STATUSES:
        return Holding.UNKNOWN
    if effect.status is StepStatus.CANCELLED and effect.evidence:
        return Holding.STOPPED
    return None


def end_state(
    kind: ControlKind,
    *,
    unknown: bool,
    happened: bool,
    all_compensated: bool,
    needs_person: bool,
) -> tuple[RunStatus, NextAction]:
    """The status and next action a stopped run ends with.

    Args:
        kind: what was asked (a cancel, or an abandoned goal).
        unknown: some of its effects may have happened and are unknown.
        happened: some of its (original) effects happened.
        all_compensated: it has effects and every one of them was compensated.
        needs_person: a compensation waits for an approval or a person, or failed.
    """
    if kind is ControlKind.CANCEL:
        if unknown:
            status = RunStatus.CANCELLED_PENDING_RECONCILIATION
        elif happened:
            status = RunStatus.CANCELLED_WITH_EFFECTS
        else:
            status = RunStatus.CANCELLED
    elif needs_person or unknown:
        status = RunStatus.PAUSED
    elif all_compensated:
        status = RunStatus.COMPENSATED
    elif happened:
        status = RunStatus.CANCELLED_WITH_EFFECTS
    else:
        status = RunStatus.CANCELLED
    if needs_person or (unknown and kind is not ControlKind.CANCEL):
        return status, NextAction.ASK_A_PERSON
    if unknown:
        return status, NextAction.RECONCILE
    return status, NextAction.NONE
