"""The attention queue (``rt.attention``): what waits for a person in a tenant, oldest first.

Every effect in doubt that no live owner is settling, whatever its run's state (ended, paused,
cancelled, interrupted), approvals, failed compensations. An effect in doubt (``intent_recorded``,
``unknown``, ``needs_attention``) is left out only while its run is running under a live lease: its
owner is settling it now (docs/concepts.md#no-effect-out-of-sight).
"""

from __future__ import annotations

import dataclasses

from effectflow.ledger import records
from effectflow.ledger.records import CompensationStatus
from effectflow.runtime import leases as leases_mod
from effectflow.runtime import views
from effectflow.runtime.port import Port


def attention(port: Port, held: leases_mod.Leases, *, limit: int) -> list[views.AttentionItem]:
    """``Runtime.attention`` (documented there); ``held`` says whose leases cover nothing."""
    store, tenant = port.store, port.tenant
    now = port.clock()
    doubtful = store.effects_in_doubt(tenant=tenant, now=now, limit=limit)
    # Unexpired leases whose owner is known gone cover nothing: their effects are listed too.
    for run in store.leased_running_runs(limit=max(limit, 1000)):
        covered = run.tenant == tenant and (run.lease_expires_at or 0) >= now
        if covered and held.owner_gone(run) is not None:
            doubtful += store.effects(
                tenant=tenant,
                run_id=run.run_id,
                statuses=[s.value for s in records.IN_DOUBT_STATUSES],
            )
    waiting = store.list_runs(
        tenant=tenant, statuses=[s.value for s in views.WAITING_RUNS], limit=limit
    )
    failed = [
        e
        for run in waiting
        for e in store.effects(tenant=tenant, run_id=run.run_id, limit=10_000)
        if e.compensation_status == CompensationStatus.COMPENSATION_FAILED
    ]
    runs_of: dict[str, views.RunView] = {}
    for effect in doubtful:
        if effect.run_id not in runs_of:
            owning = store.get_run(effect.run_id, tenant=tenant)
            if owning is not None:
                runs_of[owning.run_id] = _view(port, held, owning)
    steps_of = {run.run_id: store.steps(run.run_id) for run in waiting}
    items = views.attention(waiting, steps_of, doubtful + failed, runs_of_effects=runs_of)[:limit]
    return [_with_arguments(port, item, steps_of) for item in items]


def _with_arguments(
    port: Port, item: views.AttentionItem, steps_of: dict[str, list[records.StepRecord]]
) -> views.AttentionItem:
    """The item with what its step was called with, so a person sees what was sent (or would
    be, for an approval) before deciding."""
    if item.run_id not in steps_of:
        steps_of[item.run_id] = port.store.steps(item.run_id)
    step = next((s for s in steps_of[item.run_id] if s.step_id == item.step_id), None)
    if step is None or step.arguments is None:
        return item
    return dataclasses.replace(item, arguments=step.arguments)


def _view(port: Port, held: leases_mod.Leases, run: records.RunRecord) -> views.RunView:
    """``run`` as people see it: with whether it is interrupted (running, but nobody executes
    it)."""
    interruption = views.interruption(run, now=port.clock(), owner_gone=held.owner_gone(run))
    return views.RunView(run, interruption)
