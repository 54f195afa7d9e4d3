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
reach its next step boundary, releases it (everything recorded stays) and exits. A run whose step
outlasts the drain timeout is left running on its thread and named in ``WorkerStats.abandoned``: the
process is expected to exit then, and the run's lease expires (or its dead pid is seen) so another
worker takes it over; every write being fenced, nothing it does afterwards can be recorded.

What the health endpoints read (``runtime.health``) is public here: ``last_turn`` (the claim loop's
last turn, monotonic), ``stall_after``, ``looping``, ``stopping`` and ``in_flight``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING

from effectflow import errors, telemetry
from effectflow.ledger import records
from effectflow.ledger import store as store_mod

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

log = logging.getLogger(__name__)

#: Seconds a worker waits after the ledger refused to answer before it tries again.
RETRY_PAUSE = 1.0

#: Seconds between two checks of which lease owners are dead processes on this host.
DEAD_OWNER_SCAN = 1.0

#: Seconds runs in progress get after ``stop`` to reach a step boundary (``Worker.drain_timeout``).
DEFAULT_DRAIN_TIMEOUT = 30.0

#: Longest pause between two turns of the loop while runs are in progress, so that its turns (the
#: liveness probe) and the drain deadline are seen promptly.
_TURN = 0.2


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
    #: Runs still in progress when the drain timeout passed, by id (their threads still run; the
    #: process should exit, and their leases then pass to another worker).
    abandoned: list[str] = dataclasses.field(default_factory=list)


class Worker:
    """Executes runnable runs of a ledger, ``concurrency`` at a time."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 8,
        idle_wait: float = 5.0,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        stall_after: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise errors.ArgumentError("a worker needs concurrency >= 1")
        if not drain_timeout >= 0:
            raise errors.ArgumentError("a worker needs drain_timeout >= 0 (seconds)")
        if stall_after is not None and not stall_after > 0:
            raise errors.ArgumentError("a worker needs stall_after > 0 (seconds)")
        self.runtime = runtime
        self.concurrency = concurrency
        #: Longest sleep while idle (a NOTIFY or a finished run ends it sooner).
        self.idle_wait = idle_wait
        #: Seconds runs in progress get after ``stop`` to reach a step boundary; past it ``run``
        #: returns with them in ``stats.abandoned``.
        self.drain_timeout = drain_timeout
        #: Seconds without a turn of the claim loop after which it counts as hung (the liveness
        #: probe fails). A healthy turn lasts at most ``idle_wait`` plus two ledger calls (the
        #: dead-owner scan and the claim), each bounded by the runtime's ``ledger_retry`` (the
        #: store's wait for a connection or a lock), plus ``RETRY_PAUSE`` after a failed one; the
        #: default is that sum, so a ledger outage alone never makes the worker look hung.
        self.stall_after = (
            stall_after
            if stall_after is not None
            else idle_wait + 2 * runtime.ledger_retry + RETRY_PAUSE
        )
        self.stats = WorkerStats()
        self._stop = threading.Event()
        # Reentrant: a signal handler runs on the main thread, perhaps while it holds the lock,
        # and reads ``in_flight``.
        self._lock = threading.RLock()
        # Lease owners proven dead on this host, and when the ledger was last asked (monotonic).
        self._dead: list[str] = []
        self._scanned_at: float | None = None
        self._last_turn = time.monotonic()
        self._looping = False
        self._stopped_at: float | None = None
        # The run each future executes (read by the health thread: under the lock).
        self._running: dict[concurrent.futures.Future[None], str] = {}

    def stop(self) -> None:
        """Stop claiming; runs in progress stop at their next step boundary and are released."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self.runtime.draining = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called (the worker is draining)."""
        return self._stop.is_set()

    @property
    def last_turn(self) -> float:
        """When the claim loop last turned (``time.monotonic()``); the construction time before
        the first turn."""
        return self._last_turn

    @property
    def looping(self) -> bool:
        """Whether ``run`` is in progress (claiming, or draining the runs in progress)."""
        return self._looping

    @property
    def in_flight(self) -> list[str]:
        """The ids of the runs being executed now, sorted."""
        with self._lock:
            return sorted(self._running.values())

    def run(self, *, until_idle: bool = False, max_runs: int | None = None) -> WorkerStats:
        """Claim and execute runs until ``stop`` (or, with ``until_idle``, until none is left).

        ``max_runs`` stops claiming after that many runs (for tests and benchmarks). After
        ``stop``, runs in progress get ``drain_timeout`` seconds; those still running then are
        left to their threads and listed in ``stats.abandoned`` (the caller should exit).
        """
        self._looping = True
        self._turned()
        # Not a ``with`` block: its exit would wait for runs abandoned at the drain deadline.
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="effectflow-run"
        )
        try:
            self._claim_loop(pool, until_idle=until_idle, max_runs=max_runs)
            self._drain()
        finally:
            pool.shutdown(wait=not self.stats.abandoned, cancel_futures=True)
            self._looping = False
        return self.stats

    def _claim_loop(
        self,
        pool: concurrent.futures.ThreadPoolExecutor,
        *,
        until_idle: bool,
        max_runs: int | None,
    ) -> None:
        """Claim runs into ``pool`` until ``stop``, or until idle / ``max_runs`` when asked."""
        rt = self.runtime
        while not self._stop.is_set():
            self._turned()
            active = self._active()
            free = self.concurrency - len(active)
            if max_runs is not None:
                free = min(free, max_runs - self.stats.claimed)
            claimed: list[store_mod.Claimed] = []
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
            for claim in claimed:
                self.stats.claimed += 1
                telemetry.claimed(claim.run.run_id, claim.previous_owner, rt.owner)
                future = pool.submit(self._execute, claim.run)
                with self._lock:
                    self._running[future] = claim.run.run_id
            if claimed:
                continue
            if not active:
                if until_idle or (max_runs is not None and self.stats.claimed >= max_runs):
                    break
                try:
                    self._idle(rt)
                except Exception:
                    log.exception("waiting for work failed; retrying in %.1f s", RETRY_PAUSE)
                    self._stop.wait(RETRY_PAUSE)
                continue
            done, _ = concurrent.futures.wait(
                active,
                timeout=min(self.idle_wait, _TURN),
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
            self._settled(done)

    def _idle(self, rt: Runtime) -> None:
        """Wait for work, up to ``idle_wait``: until the ledger says there may be some, or
        ``stop``. The wait is cut into slices of ``_TURN`` so a SIGTERM to an idle worker is seen
        at once (PostgreSQL's ``LISTEN`` would otherwise hold it for the whole ``idle_wait``)."""
        end = time.monotonic() + self.idle_wait
        while not self._stop.is_set():
            self._turned()
            left = end - time.monotonic()
            if left <= 0 or rt.store.wait_for_work(min(left, _TURN)):
                return

    def _drain(self) -> None:
        """Wait for the runs in progress; after ``stop``, until ``drain_timeout`` at most."""
        while active := self._active():
            self._turned()
            wait = _TURN
            if self._stopped_at is not None:
                left = self._stopped_at + self.drain_timeout - time.monotonic()
                if left <= 0:
                    self.stats.abandoned = self.in_flight
                    log.error(
                        "drain timeout (%.1f s) passed with %d run(s) in progress: %s; their "
                        "leases pass to another worker (every write they try is refused)",
                        self.drain_timeout,
                        len(self.stats.abandoned),
                        ", ".join(self.stats.abandoned),
                    )
                    return
                wait = min(wait, left)
            done, _ = concurrent.futures.wait(
                active, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED
            )
            self._settled(done)

    def _turned(self) -> None:
        self._last_turn = time.monotonic()

    def _active(self) -> set[concurrent.futures.Future[None]]:
        with self._lock:
            return set(self._running)

    def _settled(self, done: set[concurrent.futures.Future[None]]) -> None:
        """Forget finished runs; an error ``_execute`` let through (none should) is raised here."""
        with self._lock:
            for future in done:
                del self._running[future]
        for future in done:
            future.result()

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
