"""The narrow port through which the code that executes and settles runs reaches its runtime.

The step machine, the settling paths, a person's decisions and the ending of a run need a few of
the runtime's things — the ledger, the registry, the clock, the fault plan, the lease TTL and the
fenced writer — never the ``Runtime`` itself. They get this record, so no module below the facade
(``runtime.py``) imports it, and the import graph of ``effectflow.runtime`` has no cycle
(``tests/unit/test_import_graph.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from effectflow import errors
from effectflow.contracts.registry import Registry
from effectflow.ledger import records
from effectflow.ledger.store import LedgerStore
from effectflow.runtime.faults import FaultPlan
from effectflow.runtime.writer import LedgerWriter


@dataclasses.dataclass(frozen=True)
class Port:
    """What a runtime gives the code that executes and settles its runs."""

    #: The ledger.
    store: LedgerStore
    #: Where tools and workflows are found by name.
    registry: Registry
    #: The clock (epoch seconds).
    clock: Callable[[], float]
    #: Fault points (tests); a no-op plan by default.
    faults: FaultPlan
    #: How long a lease lasts without a write or a heartbeat renewing it (seconds).
    lease_ttl: float
    #: Makes a run's batches durable under its lease (fencing, group commit, outage retries).
    writer: LedgerWriter
    #: The tenant every run and key of this runtime belongs to.
    tenant: str
    #: This process's identity as a lease owner (``host:pid:nonce``).
    owner: str
    #: Set when the process is shutting down: runs stop at their next step and are released.
    draining: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self, run_id: str) -> records.RunRecord:
        """One run of this tenant, as the ledger holds it now.

        Raises:
            errors.RunNotFound: no such run for this tenant.
        """
        run = self.store.get_run(run_id, tenant=self.tenant)
        if run is None:
            raise errors.RunNotFound(f"no run {run_id!r} in tenant {self.tenant!r}", run_id=run_id)
        return run
