"""A stopped run's inventory and end state (``policies.inventory``), one case per class and per
end state."""

from __future__ import annotations

import pytest

from effectflow.ledger import records
from effectflow.ledger.records import (
    CompensationStatus,
    ControlKind,
    NextAction,
    RunStatus,
    StepStatus,
)
from effectflow.policies import inventory
from effectflow.policies.inventory import Holding

ST = StepStatus
CANCEL, COMPENSATE = ControlKind.CANCEL, ControlKind.COMPENSATE


def _effect(
    status: StepStatus, *, compensates: str | None = None, evidence: dict[str, str] | None = None
) -> records.EffectRecord:
    return records.EffectRecord(
        effect_id="eff",
        tenant="default",
        run_id="r",
        step_id="s",
        tool="t@1",
        tool_call_id="att",
        logical_operation_id="r/s",
        idempotency_key=None,
        request_digest="sha256:0",
        response_digest=None,
        status=status,
        external_system=None,
        external_effect_id=None,
        committed_at=None,
        approval_id=None,
        compensation_status=CompensationStatus.AVAILABLE,
        compensates=compensates,
        evidence=evidence,
        resolved_by=None,
        next_action=NextAction.NONE,
        version=1,
        created_at=0.0,
        updated_at=0.0,
    )


@pytest.mark.parametrize(
    ("effect", "in_flight", "holding"),
    [
        (_effect(ST.CONFIRMED), False, Holding.CONFIRMED),
        (_effect(ST.AWAITING_COMPLETION), False, Holding.CONFIRMED),
        (_effect(ST.INTENT_RECORDED), False, Holding.UNKNOWN),
        (_effect(ST.UNKNOWN), False, Holding.UNKNOWN),
        (_effect(ST.NEEDS_ATTENTION), False, Holding.UNKNOWN),
        (_effect(ST.INTENT_RECORDED), True, Holding.IN_FLIGHT),
        (_effect(ST.CONFIRMED), True, Holding.IN_FLIGHT),
        (_effect(ST.CANCELLED, evidence={"cancelled_by": "stop@1"}), False, Holding.STOPPED),
        (_effect(ST.CANCELLED), False, None),
        (_effect(ST.NOT_COMMITTED), False, None),
        (_effect(ST.REJECTED), False, None),
        (_effect(ST.CONFIRMED, compensates="orig"), False, Holding.COMPENSATED),
        (_effect(ST.CONFIRMED, compensates="orig"), True, Holding.COMPENSATED),
        (_effect(ST.INTENT_RECORDED, compensates="orig"), False, Holding.COMPENSATION_PENDING),
        (_effect(ST.NEEDS_ATTENTION, compensates="orig"), False, Holding.COMPENSATION_PENDING),
        (_effect(ST.CANCELLED, compensates="orig"), False, None),
    ],
)
def test_classify(effect: records.EffectRecord, in_flight: bool, holding: Holding | None) -> None:
    """Each effect lands in exactly one inventory list, or none when it left nothing."""
    assert inventory.classify(effect, in_flight=in_flight) is holding


@pytest.mark.parametrize(
    ("kind", "unknown", "happened", "all_compensated", "needs_person", "status", "next_action"),
    [
        (CANCEL, False, False, False, False, RunStatus.CANCELLED, NextAction.NONE),
        (CANCEL, False, True, False, False, RunStatus.CANCELLED_WITH_EFFECTS, NextAction.NONE),
        (CANCEL, False, True, True, False, RunStatus.CANCELLED_WITH_EFFECTS, NextAction.NONE),
        (
            CANCEL,
            True,
            True,
            False,
            False,
            RunStatus.CANCELLED_PENDING_RECONCILIATION,
            NextAction.RECONCILE,
        ),
        (
            CANCEL,
            False,
            True,
            False,
            True,
            RunStatus.CANCELLED_WITH_EFFECTS,
            NextAction.ASK_A_PERSON,
        ),
        (COMPENSATE, False, False, False, False, RunStatus.CANCELLED, NextAction.NONE),
        (COMPENSATE, False, True, True, False, RunStatus.COMPENSATED, NextAction.NONE),
        (COMPENSATE, False, True, False, False, RunStatus.CANCELLED_WITH_EFFECTS, NextAction.NONE),
        (COMPENSATE, True, True, False, False, RunStatus.PAUSED, NextAction.ASK_A_PERSON),
        (COMPENSATE, False, True, False, True, RunStatus.PAUSED, NextAction.ASK_A_PERSON),
    ],
)
def test_end_state(
    kind: ControlKind,
    unknown: bool,
    happened: bool,
    all_compensated: bool,
    needs_person: bool,
    status: RunStatus,
    next_action: NextAction,
) -> None:
    """A cancel ends cancelled (with effects, or pending reconciliation while some are unknown);
    an abandoned goal pauses for a person while something waits or is unknown, else ends
    compensated, cancelled with effects, or cancelled."""
    assert inventory.end_state(
        kind,
        unknown=unknown,
        happened=happened,
        all_compensated=all_compensated,
        needs_person=needs_person,
    ) == (status, next_action)
