"""Compensation policy, as pure functions: which effects a stopped run answers, in what order, with
what approval, and the compensation status an effect starts with (docs/decision-table.md, the
goal-abandoned rows).

A compensation is a new effect, never an "undo"; these functions only decide. The runtime
(``effectflow.runtime.compensation``) records and runs what they decide.
"""

from __future__ import annotations

from collections.abc import Iterable

from effectflow.contracts.tool import EffectClass, ToolContract
from effectflow.contracts.workflow import StepContract
from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, ControlKind
from effectflow.policies import decision
from effectflow.policies.decision import Situation

#: The trigger of a step whose contract names none: only an abandoned goal compensates it.
DEFAULT_TRIGGERS = frozenset({"goal_abandoned"})


def initial_status(contract: ToolContract) -> CompensationStatus:
    """The compensation status a step's effect is recorded with: nothing to answer for a read,
    ``not_required`` for a write whose tool names no compensation, else ``available``."""
    if not contract.effect.writes:
        return CompensationStatus.NOT_APPLICABLE
    if contract.compensation is None:
        return CompensationStatus.NOT_REQUIRED
    return CompensationStatus.AVAILABLE


def trigger_of(kind: ControlKind) -> str:
    """The business condition a control request is: a cancel, or an abandoned goal."""
    return "cancelled" if kind is ControlKind.CANCEL else "goal_abandoned"


def order(steps: Iterable[records.StepRecord]) -> list[records.StepRecord]:
    """The steps whose effects a stopped run answers, newest effect first (by when it was
    confirmed, then by its place in the run): compensations themselves are never answered."""
    return sorted(
        (s for s in steps if s.compensates is None and s.effect_id is not None),
        key=lambda s: (s.confirmed_at or s.updated_at, s.seq),
        reverse=True,
    )


def verdict(
    contract: ToolContract, step_contract: StepContract | None, trigger: str
) -> decision.Decision:
    """The decision table's row for an effect whose goal is abandoned: compensate it when its
    tool names a compensation and its step's triggers include ``trigger``; else keep it."""
    triggers = step_contract.triggers if step_contract is not None else DEFAULT_TRIGGERS
    facts = decision.Facts(
        effect=contract.effect,
        has_compensation=contract.compensation is not None,
        trigger_matches=trigger in triggers,
    )
    return decision.decide(Situation.GOAL_ABANDONED, facts)


def needs_approval(original: ToolContract, compensating: ToolContract) -> bool:
    """Whether a compensation waits for a person's approval: unless its original's contract says
    it runs automatically, and always when money moves (either side is a financial write)."""
    compensation = original.compensation
    return (
        compensation is None
        or not compensation.automatic
        or original.effect is EffectClass.FINANCIAL_WRITE
        or compensating.effect is EffectClass.FINANCIAL_WRITE
    )
