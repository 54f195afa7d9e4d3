"""A long-lived worker: claims runnable runs from the ledger and executes them concurrently.

Many workers on many machines may share one ledger. Each claims runs with a lease (PostgreSQL:
``FOR UPDATE SKIP LOCKED``), renews the leases by heartbeat while calls take time, and — because
every ledger write of a run carries the lease's fencing token — a worker that lost a lease (it was
paused past its TTL, its network partitioned) can commit nothing for that run. Runs whose lease
expired (their worker died) are runnable again and are claimed like new ones; so are runs whose
owner is a dead process on this worker's own host, at once, without waiting for the lease: the
claim loop asks the ledger which owners hold live leases (at most every ``DEAD_OWNER_SCAN`` s) and
passes those it proves dead (their pid is gone) to ``claim_runnable``.

An idle worker does not busy-poll: it blocks in ``store.wait_for_work``, which PostgreSQL ends with
``LISTEN``/``NOTIFY`` when a run becomes runnable. On SIGTERM a worker stops claiming, lets each run
reach its next step boundary, releases it (everything recorded stays) and exits.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING

from effectflow import errors
from effectflow.ledger import records

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

log = logging.getLogger(__name__)

#: Seconds a worker waits after the ledger refused to answer before it tries again.
RETRY_PAUSE = 1.0

#: Seconds between two checks of which lease owners are dead processes on this host.
DEAD_OWNER_SCAN = 1.0


@dataclasses.dataclass
class WorkerStats:
    """What a worker did."""

    #: Runs claimed.
    claimed: int = 0
    #: Runs that reached an end state or paused here.
    finished: int = 0
    #: Runs given back at a step boundary (shutdown) or left to others (unknown workflow).
    released: int = 0
    #: Runs whose lease another worker took over while this one ran them.
    lost: int = 0
    #: Runs that raised something unexpected (logged).
    crashed: int = 0
    #: End state of each run finished here, by run id.
    statuses: dict[str, str] = dataclasses.field(default_factory=dict)


class Worker:
    """Executes runnable runs of a ledger, ``concurrency`` at a time."""

    def __init__(self, runtime: Runtime, *, concurrency: int = 8, idle_wait: float = 5.0) -> None:
        if concurrency < 1:
            raise errors.ArgumentError("a worker needs concurrency >= 1")
        self.runtime = runtime
        self.concurrency = concurrency
        #: Longest sleep while idle (a NOTIFY or a finished run ends it sooner).
        self.idle_wait = idle_wait
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Lease owners proven dead on this host, and when the ledger was last asked (monotonic).
        self._dead: list[str] = []
        self._scanned_at: float | None = None

    def stop(self) -> None:
        """Stop claiming; runs in progress stop at their next step boundary and are released."""
        self.runtime.draining = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stop.is_set()

    def run(self, *, until_idle: bool = False, max_runs: int | None = None) -> WorkerStats:
        """Claim and execute runs until ``stop`` (or, with ``until_idle``, until none is left).

        ``max_runs`` stops claiming after that many runs (for tests and benchmarks).
        """
        rt = self.runtime
        active: set[concurrent.futures.Future[None]] = set()
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="effectflow-run"
        ) as pool:
            while not self._stop.is_set():
                free = self.concurrency - len(active)
                if max_runs is not None:
                    free = min(free, max_runs - self.stats.claimed)
                claimed: list[records.RunRecord] = []
                if free > 0:
                    try:
                        claimed = rt.store.claim_runnable(
                            owner=rt.owner,
                            ttl=rt.lease_ttl,
                            now=rt.clock(),
                            limit=free,
                            dead_owners=self._dead_owners(),
                        )
                    except Exception:  # the database is restarting, a network blip: try again
                        log.exception("claiming runs failed; retrying in %.1f s", RETRY_PAUSE)
                        self._stop.wait(RETRY_PAUSE)
                        continue
                for run in claimed:
                    self.stats.claimed += 1
                    active.add(pool.submit(self._execute, run))
                if claimed:
                    continue
                if not active:
                    if until_idle or (max_runs is not None and self.stats.claimed >= max_runs):
                        break
                    try:
                        rt.store.wait_for_work(self.idle_wait)
                    except Exception:
                        log.exception("waiting for work failed; retrying in %.1f s", RETRY_PAUSE)
                        self._stop.wait(RETRY_PAUSE)
                    continue
                done, _ = concurrent.futures.wait(
                    active,
                    timeout=self.idle_wait if free <= 0 else min(self.idle_wait, 0.2),
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
                active -= done
            for future in concurrent.futures.as_completed(active):
                future.result()
        return self.stats

    def _dead_owners(self) -> list[str]:
        """Owners of live leases that are dead processes on this host (their runs are claimable
        now); the ledger is asked at most every ``DEAD_OWNER_SCAN`` seconds. A dead owner stays
        dead (a reused pid comes with another owner string), so the list may be kept between."""
        clock = time.monotonic()
        if self._scanned_at is not None and clock - self._scanned_at < DEAD_OWNER_SCAN:
            return self._dead
        rt = self.runtime
        owners = rt.store.lease_owners(now=rt.clock())
        self._dead = [o for o in owners if o != rt.owner and not rt.owner_alive(o)]
        self._scanned_at = clock
        return self._dead

    def _execute(self, run: records.RunRecord) -> None:
        rt = self.runtime
        try:
            workflow = rt.registry.workflow(run.workflow)
        except errors.ContractError:
            # Left leased until the lease expires, so a worker that knows the workflow takes it
            # (releasing it now would have this worker claim it again at once).
            log.warning("run %s: workflow %r is not registered here", run.run_id, run.workflow)
            self._count("released")
            return
        try:
            ended = rt.drive_claimed(run, workflow)
            log.info("run %s (%s): %s", run.run_id, run.workflow, ended.status.value)
        except errors.LeaseLost as exc:
            log.warning("run %s: %s", run.run_id, exc)
            self._count("lost")
            return
        except Exception:
            log.exception(
                "run %s raised; its lease expires and another worker retries it", run.run_id
            )
            self._count("crashed")
            return
        if ended.lease_owner is None and ended.status.value in ("running", "cancelling"):
            self._count("released")
        else:
            with self._lock:
                self.stats.finished += 1
                self.stats.statuses[ended.run_id] = ended.status.value

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)
