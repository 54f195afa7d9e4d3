"""The compensation policy (``policies.compensation``), one case per rule: which effects a stopped
run answers, in what order, under which trigger, with what approval, and the status it starts at."""

from __future__ import annotations

import pytest

from effectflow.contracts.tool import Compensation, EffectClass, ToolContract
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, ControlKind, NextAction, StepStatus
from effectflow.policies import compensation
from effectflow.policies.decision import Action

WRITE = EffectClass.EXTERNAL_WRITE
MONEY = EffectClass.FINANCIAL_WRITE
UNDO = Compensation("undo@1")
AUTO_UNDO = Compensation("undo@1", automatic=True)


def _contract(effect: EffectClass, undo: Compensation | None = None) -> ToolContract:
    return ToolContract("t", "1", effect, compensation=undo)


def _step(
    step_id: str,
    *,
    seq: int,
    confirmed_at: float | None = None,
    updated_at: float = 0.0,
    effect_id: str | None = "eff",
    compensates: str | None = None,
) -> records.StepRecord:
    return records.StepRecord(
        run_id="r",
        step_id=step_id,
        seq=seq,
        step_revision=1,
        tool="t@1",
        effect_class=WRITE.value,
        logical_operation_id=None,
        idempotency_key=None,
        request_digest="sha256:0",
        status=StepStatus.CONFIRMED,
        completion_state=None,
        external_system=None,
        external_effect_id=None,
        output=None,
        error=None,
        effect_id=effect_id,
        confirmed_at=confirmed_at,
        next_step=None,
        compensation_status=CompensationStatus.AVAILABLE,
        next_action=NextAction.USE_RESULT,
        created_at=0.0,
        updated_at=updated_at,
        compensates=compensates,
    )


@pytest.mark.parametrize(
    ("contract", "status"),
    [
        (_contract(EffectClass.PURE), CompensationStatus.NOT_APPLICABLE),
        (_contract(EffectClass.READ, UNDO), CompensationStatus.NOT_APPLICABLE),
        (_contract(WRITE), CompensationStatus.NOT_REQUIRED),
        (_contract(WRITE, UNDO), CompensationStatus.AVAILABLE),
        (_contract(MONEY, UNDO), CompensationStatus.AVAILABLE),
    ],
)
def test_initial_status(contract: ToolContract, status: CompensationStatus) -> None:
    """An effect starts ``not_applicable`` (a read), ``not_required`` (no compensation named) or
    ``available``; the stored text is the member's value."""
    assert compensation.initial_status(contract) is status
    assert compensation.initial_status(contract) == status.value


@pytest.mark.parametrize(
    ("kind", "trigger"),
    [(ControlKind.CANCEL, "cancelled"), (ControlKind.COMPENSATE, "goal_abandoned")],
)
def test_trigger_of(kind: ControlKind, trigger: str) -> None:
    """A cancel is the ``cancelled`` trigger; a compensate request, an abandoned goal."""
    assert compensation.trigger_of(kind) == trigger


def test_order_is_newest_effect_first_and_skips_compensations_and_reads() -> None:
    """Newest confirmation first, ties by place in the run (later first); compensations and steps
    without an effect are never answered."""
    steps = [
        _step("a", seq=1, confirmed_at=10.0),
        _step("b", seq=2, confirmed_at=30.0),
        _step("c", seq=3, confirmed_at=20.0),
        _step("d", seq=4, confirmed_at=20.0),
        _step("e", seq=5, updated_at=25.0),  # not confirmed (yet): its last change counts
        _step("pure", seq=6, confirmed_at=99.0, effect_id=None),
        _step("compensate:a", seq=7, confirmed_at=98.0, compensates="eff"),
    ]
    assert [s.step_id for s in compensation.order(steps)] == ["b", "e", "d", "c", "a"]


@pytest.mark.parametrize(
    ("contract", "step_contract", "trigger", "action", "row"),
    [
        (
            _contract(WRITE, UNDO),
            None,
            "goal_abandoned",
            Action.COMPENSATE,
            "abandoned_compensable",
        ),
        (_contract(WRITE, UNDO), None, "cancelled", Action.KEEP_EFFECT, "abandoned_irreversible"),
        (
            _contract(WRITE, UNDO),
            StepContract("s", compensation_trigger="cancelled"),
            "cancelled",
            Action.COMPENSATE,
            "abandoned_compensable",
        ),
        (
            _contract(WRITE, UNDO),
            StepContract("s", compensation_trigger="never"),
            "goal_abandoned",
            Action.KEEP_EFFECT,
            "abandoned_irreversible",
        ),
        (_contract(WRITE), None, "goal_abandoned", Action.KEEP_EFFECT, "abandoned_irreversible"),
        (
            _contract(MONEY, UNDO),
            None,
            "goal_abandoned",
            Action.COMPENSATE,
            "abandoned_compensable",
        ),
    ],
)
def test_verdict(
    contract: ToolContract,
    step_contract: StepContract | None,
    trigger: str,
    action: Action,
    row: str,
) -> None:
    """An effect is compensated only when its tool names a compensation and its step's triggers
    (``goal_abandoned`` when the step declares none) include the run's; otherwise it is kept."""
    verdict = compensation.verdict(contract, step_contract, trigger)
    assert (verdict.action, verdict.row) == (action, row)


@pytest.mark.parametrize(
    ("original", "compensating", "needed"),
    [
        (_contract(WRITE, AUTO_UNDO), _contract(WRITE), False),
        (_contract(WRITE, UNDO), _contract(WRITE), True),
        (_contract(WRITE), _contract(WRITE), True),
        (_contract(MONEY, AUTO_UNDO), _contract(WRITE), True),
        (_contract(WRITE, AUTO_UNDO), _contract(MONEY), True),
    ],
)
def test_needs_approval(original: ToolContract, compensating: ToolContract, needed: bool) -> None:
    """A compensation runs without a person only when its original's contract says automatic and
    no money moves on either side."""
    assert compensation.needs_approval(original, compensating) is needed
