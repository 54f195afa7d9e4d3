"""A run's inventory (docs/concepts.md#cancel): what it left in the world, read from the ledger and
classified by ``policies.inventory`` — what ``rt.cancel`` answers, and what a stopped run's end
state is computed from."""

from __future__ import annotations

from effectflow.ledger import records
from effectflow.ledger.records import StepStatus
from effectflow.policies import inventory as inventory_policy
from effectflow.policies.inventory import Holding
from effectflow.runtime.port import Port


def inventory(
    port: Port, run: records.RunRecord, *, in_flight: frozenset[str] = frozenset()
) -> records.Inventory:
    """What the run left in the world, from the ledger; ``in_flight`` are the effects whose calls
    another worker is in the middle of."""
    steps = port.store.steps(run.run_id)
    effects = port.store.effects(tenant=None, run_id=run.run_id, limit=100_000)
    held: dict[Holding, list[str]] = {holding: [] for holding in Holding}
    for effect in effects:
        holding = inventory_policy.classify(effect, in_flight=effect.effect_id in in_flight)
        if holding is not None:
            held[holding].append(effect.effect_id)
    for step in steps:
        if step.compensates is not None and step.effect_id is None:
            # Waiting for its approval: no effect yet.
            held[Holding.COMPENSATION_PENDING].append(step.step_id)
    return records.Inventory(
        run_id=run.run_id,
        status=run.status,
        confirmed=held[Holding.CONFIRMED],
        in_flight=held[Holding.IN_FLIGHT],
        unknown=held[Holding.UNKNOWN],
        compensated=held[Holding.COMPENSATED],
        compensation_pending=held[Holding.COMPENSATION_PENDING],
        cancelled_steps=[s.step_id for s in steps if s.status is StepStatus.CANCELLED],
        stopped=held[Holding.STOPPED],
    )
