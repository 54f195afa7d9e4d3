"""Read models for people: a run's timeline and the attention queue.

The CLI (`effectflow show`, `effectflow effects`), the HTTP API and the web console all render these,
so the three never disagree about what happened or what waits for a person.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow.ledger import records
from effectflow.ledger.records import RunStatus, StepStatus


@dataclasses.dataclass(frozen=True)
class StepView:
    """A step with its attempts, its effect and the compensation that answers it, if any."""

    #: The Step Effect Record.
    step: records.StepRecord
    #: Its attempts (calls, lookups, resolutions), in order.
    attempts: list[records.AttemptRecord]
    #: Its External Effect Record (writes only).
    effect: records.EffectRecord | None
    #: The compensation effect that answers this step's effect, when there is one.
    compensation: records.EffectRecord | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "step": self.step.to_dict(),
            "attempts": [a.to_dict() for a in self.attempts],
            "effect": None if self.effect is None else self.effect.to_dict(),
            "compensation": None if self.compensation is None else self.compensation.to_dict(),
        }


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Everything recorded about one run, in order."""

    #: The run.
    run: records.RunRecord
    #: Its steps in the order the run reached them.
    steps: list[StepView]
    #: Its audit events in order.
    events: list[records.AuditEvent]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "run": self.run.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "events": [e.to_dict() for e in self.events],
        }


@dataclasses.dataclass(frozen=True)
class AttentionItem:
    """Something a person must decide: an effect in doubt, an approval, a failed compensation."""

    #: ``unknown_effect``, ``approval`` or ``compensation_failed``.
    kind: str
    #: The run.
    run_id: str
    #: The step.
    step_id: str
    #: The effect concerned, when there is one.
    effect_id: str | None
    #: Why a person is needed.
    reason: str
    #: What the person can do (``resolve``, ``approve``, ``cancel``, ``compensate``).
    actions: tuple[str, ...]
    #: The effect's version, for decisions that must not act on stale state.
    version: int | None
    #: When the item arose (epoch seconds).
    since: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


def timeline(
    run: records.RunRecord,
    steps: list[records.StepRecord],
    attempts: list[records.AttemptRecord],
    effects: list[records.EffectRecord],
    events: list[records.AuditEvent],
) -> Timeline:
    """Assemble a run's timeline from its records."""
    by_step: dict[str, list[records.AttemptRecord]] = {}
    for attempt in attempts:
        by_step.setdefault(attempt.step_id, []).append(attempt)
    by_id = {e.effect_id: e for e in effects}
    answering = {e.compensates: e for e in effects if e.compensates is not None}
    views = []
    for step in steps:
        effect = by_id.get(step.effect_id) if step.effect_id else None
        views.append(
            StepView(
                step=step,
                attempts=by_step.get(step.step_id, []),
                effect=effect,
                compensation=None if effect is None else answering.get(effect.effect_id),
            )
        )
    return Timeline(run=run, steps=views, events=events)


def attention(
    runs: list[records.RunRecord],
    steps_of: dict[str, list[records.StepRecord]],
    effects: list[records.EffectRecord],
) -> list[AttentionItem]:
    """The attention queue: what waits for a person, oldest first."""
    items: list[AttentionItem] = []
    for effect in effects:
        if effect.status in (StepStatus.NEEDS_ATTENTION, StepStatus.UNKNOWN):
            items.append(
                AttentionItem(
                    kind="unknown_effect",
                    run_id=effect.run_id,
                    step_id=effect.step_id,
                    effect_id=effect.effect_id,
                    reason="the effect may or may not have happened: confirm it with evidence "
                    "or declare it not committed",
                    actions=("resolve", "cancel"),
                    version=effect.version,
                    since=effect.updated_at,
                )
            )
        elif effect.compensation_status == "compensation_failed":
            items.append(
                AttentionItem(
                    kind="compensation_failed",
                    run_id=effect.run_id,
                    step_id=effect.step_id,
                    effect_id=effect.effect_id,
                    reason="its compensation failed or missed its deadline; the effect stands",
                    actions=("compensate",),
                    version=effect.version,
                    since=effect.updated_at,
                )
            )
    for run in runs:
        for step in steps_of.get(run.run_id, []):
            if step.status is StepStatus.PENDING and (step.error or {}).get("code") == (
                "approval_required"
            ):
                items.append(
                    AttentionItem(
                        kind="approval",
                        run_id=run.run_id,
                        step_id=step.step_id,
                        effect_id=None,
                        reason=str((step.error or {}).get("message", "needs an approval")),
                        actions=("approve", "cancel"),
                        version=None,
                        since=step.updated_at,
                    )
                )
    items.sort(key=lambda i: i.since)
    return items


#: Run statuses whose runs may have something waiting for a person.
WAITING_RUNS = (
    RunStatus.PAUSED,
    RunStatus.CANCELLED_WITH_EFFECTS,
    RunStatus.CANCELLED_PENDING_RECONCILIATION,
)
