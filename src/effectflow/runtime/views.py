"""Read models for people: a run's timeline and the attention queue.

The CLI (`effectflow show`, `effectflow effects`), the HTTP API and the web console all render these,
so the three never disagree about what happened or what waits for a person.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus, NextAction, RunStatus, StepStatus

#: Run statuses in which a worker executes the run, holding its lease.
EXECUTING = frozenset({RunStatus.RUNNING, RunStatus.CANCELLING})

#: What settles an interrupted run: drive it from its ledger in a live process.
RECOVER = "recover"


@dataclasses.dataclass(frozen=True)
class RunView:
    """A run as people see it: its record, and whether it is interrupted.

    Interrupted is derived, never stored: the row stays ``running`` (or ``cancelling``) until a
    worker or ``effectflow recover`` takes it over, because only a live process may write it.
    """

    #: The Run record.
    run: records.RunRecord
    #: Why nobody executes the run although it is running (its owner died, its lease expired), in
    #: a line that names the action settling it; None while a live owner executes it, or when it
    #: is not running.
    interruption: str | None = None

    @property
    def interrupted(self) -> bool:
        """Whether the run is interrupted (``interruption`` says why)."""
        return self.interruption is not None

    @property
    def next_action(self) -> str:
        """``recover`` for an interrupted run, else the run's own next action."""
        return RECOVER if self.interrupted else self.run.next_action.value

    def to_dict(self) -> dict[str, Any]:
        """The run's JSON (as ``RunRecord.to_dict``) with ``interrupted`` and ``interruption``."""
        return {
            **self.run.to_dict(),
            "interrupted": self.interrupted,
            "interruption": self.interruption,
        }


def interruption(run: records.RunRecord, *, now: float, owner_gone: str | None) -> str | None:
    """Why ``run`` is interrupted, or None.

    A run is interrupted when it is running under a lease that nobody renews: the lease expired, or
    its owner is known to be gone (``owner_gone`` says how the caller knows: a dead pid on this
    host, or this very process stopped executing it). A running run without a lease is not
    interrupted: it waits for a worker (submitted, or released at shutdown).
    """
    if run.status not in EXECUTING or run.lease_owner is None or run.lease_expires_at is None:
        return None
    settle = "`effectflow recover` (or a worker) continues it from its ledger"
    if owner_gone is not None:
        return f"interrupted: its owner {run.lease_owner} is gone ({owner_gone}); {settle}"
    if run.lease_expires_at < now:
        return (
            f"interrupted: its lease expired {now - run.lease_expires_at:.0f} s ago (owner "
            f"{run.lease_owner} stopped renewing it); {settle}"
        )
    return None


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

    #: ``unknown_effect`` (an effect in doubt), ``interrupted_run`` (an effect in doubt whose run
    #: is interrupted: recovering settles it), ``approval``, ``compensation_failed`` or
    #: ``workflow_changed`` (a run paused because its code changed under a recorded step).
    kind: str
    #: The run.
    run_id: str
    #: The step.
    step_id: str
    #: The effect concerned, when there is one.
    effect_id: str | None
    #: Why a person is needed.
    reason: str
    #: What the person can do (``resolve``, ``recover``, ``approve``, ``cancel``, ``compensate``).
    actions: tuple[str, ...]
    #: The effect's version, for decisions that must not act on stale state.
    version: int | None
    #: When the item arose (epoch seconds).
    since: float
    #: What the item's step was called with, as it recorded it (redacted, capped:
    #: docs/arguments.md); None when the step recorded none (before ledger version 11).
    arguments: dict[str, Any] | None = None

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
    *,
    runs_of_effects: Mapping[str, RunView] | None = None,
) -> list[AttentionItem]:
    """The attention queue: what waits for a person, oldest first.

    ``effects`` are the effects in doubt that no live owner is settling, and the effects whose
    compensation failed; ``runs_of_effects`` their runs by id (so each item can say why nobody
    settles it: its run ended, paused or was interrupted). ``runs`` are the runs that may wait for
    an approval, with their steps in ``steps_of``.
    """
    items: list[AttentionItem] = []
    owners = runs_of_effects or {}
    for effect in effects:
        if effect.status in records.IN_DOUBT_STATUSES:
            items.append(_doubt(effect, owners.get(effect.run_id)))
        elif effect.compensation_status == CompensationStatus.COMPENSATION_FAILED:
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
        if (run.error or {}).get("code") == "workflow_changed":
            items.append(
                AttentionItem(
                    kind="workflow_changed",
                    run_id=run.run_id,
                    step_id=str((run.error or {}).get("step_ids", [""])[0]),
                    effect_id=None,
                    reason=str((run.error or {}).get("message", "its workflow code changed")),
                    actions=("resume", "cancel"),
                    version=None,
                    since=run.updated_at,
                )
            )
        for step in steps_of.get(run.run_id, []):
            # (approved, and waiting for the host that holds its arguments: ``guard_args``)
            waits_for_host = step.next_action is NextAction.WAIT
            if step.status is StepStatus.AWAITING_APPROVAL and not waits_for_host:
                items.append(
                    AttentionItem(
                        kind="approval",
                        run_id=run.run_id,
                        step_id=step.step_id,
                        effect_id=None,
                        reason=str((step.error or {}).get("message", "needs an approval")),
                        actions=("approve", "reject", "cancel"),
                        version=None,
                        since=step.updated_at,
                    )
                )
    items.sort(key=lambda i: i.since)
    return items


def _doubt(effect: records.EffectRecord, view: RunView | None) -> AttentionItem:
    """The item of an effect in doubt: why nobody settles it, and what a person can do."""
    if effect.status is StepStatus.INTENT_RECORDED:
        what = "the call was in flight (its intent is recorded, its outcome is not)"
    else:
        what = "the effect may or may not have happened"
    decide = "confirm it with evidence or declare it not committed"
    kind = "unknown_effect"
    actions: tuple[str, ...] = ("resolve", "cancel")
    if view is not None and view.interrupted:
        kind, actions = "interrupted_run", (RECOVER, "resolve")
        reason = (
            f"{what}, and its run is {view.interruption}: recovering settles it through the "
            f"step's lookup or key; or {decide}"
        )
    elif view is not None and view.run.status.terminal:
        actions = ("resolve",)
        reason = f"{what}, and its run ended {view.run.status.value}: {decide}"
    elif view is not None and view.run.status in EXECUTING:
        reason = (
            f"{what}, and its run {view.run.run_id} waits for a worker: recover it, or {decide}"
        )
        actions = (RECOVER, "resolve", "cancel")
    else:
        reason = f"{what}: {decide}"
    return AttentionItem(
        kind=kind,
        run_id=effect.run_id,
        step_id=effect.step_id,
        effect_id=effect.effect_id,
        reason=reason,
        actions=actions,
        version=effect.version,
        since=effect.updated_at,
    )


#: Run statuses whose runs may have something waiting for a person.
WAITING_RUNS = (
    RunStatus.PAUSED,
    RunStatus.CANCELLED_WITH_EFFECTS,
    RunStatus.CANCELLED_PENDING_RECONCILIATION,
)
