"""The reconciler (``rt.reconcile``): which paused runs a lookup (or a key the provider honours)
can settle now, so they are resumed and their unknown effects looked up by the step machine
(``lookup``), in a new generation."""

from __future__ import annotations

from collections.abc import Iterator

from effectflow import errors
from effectflow.ledger import records
from effectflow.ledger.records import RunStatus
from effectflow.runtime.port import Port

#: The run statuses the reconciler looks at: waiting for something to be settled.
SETTLING = (RunStatus.PAUSED, RunStatus.CANCELLED_PENDING_RECONCILIATION)


def runs_to_resume(port: Port, *, limit: int) -> Iterator[str]:
    """The paused runs of this tenant to resume now, one at a time (each is read when the caller
    asks for the next, after it resumed the one before): a run with an in-doubt step that a lookup
    or the provider's key can settle, and a cancelled run whose unknowns were settled meanwhile
    (a late answer, a lookup elsewhere), whose cancel can now conclude. A run whose in-doubt steps
    no lookup can settle is left for a person."""
    for run in port.store.list_runs(tenant=port.tenant, statuses=list(SETTLING), limit=limit):
        doubtful = [
            s for s in port.store.steps(run.run_id) if s.status in records.IN_DOUBT_STATUSES
        ]
        if not doubtful:
            if run.status is RunStatus.CANCELLED_PENDING_RECONCILIATION:
                yield run.run_id
            continue
        if any(_can_settle(port, s) for s in doubtful):
            yield run.run_id


def _can_settle(port: Port, step: records.StepRecord) -> bool:
    try:
        contract = port.registry.tool(step.tool).contract
    except errors.ContractError:
        return False
    return contract.confirm is not None or contract.idempotency.supported
