"""Keeping the leases of the runs this process executes alive while their calls take time.

A ledger write renews its run's lease once a third of the TTL has passed since the last renewal
(``RENEW_AFTER``), but a single tool call may outlast the lease (a slow provider, a long deploy). A
heartbeat thread renews the leases of every run held here every third of the TTL, and learns of any
lease another worker took over: that run's state is marked lost, so the process stops at its next
write (which the fencing token would refuse anyway).

Sizing the TTL (``DEFAULT_LEASE_TTL``): a worker that dies on another host is noticed only when its
lease expires, so the TTL is the longest a crashed run waits before another worker takes it over (a
dead pid on the same host is noticed at once, without waiting). What a shorter TTL costs is renewal
writes: the heartbeat writes one statement per beat for all the runs a process holds (PostgreSQL;
SQLite one short transaction), three times per TTL; a run's own writes renew its lease only when
the heartbeat has not for a third of the TTL (a stalled heartbeat), so they add no lease writes of
their own to a run that commits often. 30 s with a beat every 10 s is one
small write per process every 10 s, against a takeover within 30 s; a process stalled longer than a
TTL (a stopped VM, a long GC pause, a partition) loses its runs, and its fencing token then refuses
its writes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from effectflow.ledger import records
from effectflow.ledger.records import RunStatus
from effectflow.ledger.store import LedgerStore
from effectflow.runtime import state as state_mod
from effectflow.runtime import views

log = logging.getLogger(__name__)

#: Seconds a lease lasts without a write or a heartbeat renewing it (see the module docstring).
DEFAULT_LEASE_TTL = 30.0

#: The share of the TTL after which a lease is renewed: the heartbeat beats this often, and a
#: write renews its run's lease only once this much of it has passed since the last renewal
#: (``LedgerWriter``; a write in between leaves the run's lease, and its index entry, where they
#: are).
RENEW_AFTER = 1 / 3

#: How many run ids a runtime remembers having stopped executing (``Leases.stopped``).
_STOPPED_MEMORY = 10_000


def host() -> str:
    """This machine's name, the first part of a lease owner (``host:pid:nonce``)."""
    return socket.gethostname()


def owner_alive(owner: str) -> bool:
    """Whether a lease owner (``host:pid:nonce``) may still be alive.

    On this host a dead pid proves the owner crashed, so its runs are recoverable at once instead of
    after the lease expires. On another host only the lease's expiry can tell.
    """
    owner_host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if owner_host != host() or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _pid_is_running(pid)


def _pid_is_running(pid: int) -> bool:
    # A killed child that was not reaped yet is a zombie: it exists but will never write again.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def held_elsewhere(run: records.RunRecord, now: float) -> bool:
    """Whether a live worker (another process, or another thread here) executes the run."""
    return (
        run.status in (RunStatus.RUNNING, RunStatus.CANCELLING)
        and run.lease_owner is not None
        and (run.lease_expires_at or 0) > now
        and owner_alive(run.lease_owner)
    )


class Leases:
    """The runs this runtime holds, and the heartbeat that keeps their leases."""

    def __init__(
        self, store: LedgerStore, *, clock: Callable[[], float], ttl: float, owner: str
    ) -> None:
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._owner = owner
        self._held: dict[str, state_mod.RunState] = {}
        # Runs this runtime executed and stopped executing, oldest first (a bounded memory: a run
        # forgotten here is still recovered once its lease expires).
        self._stopped: dict[str, None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def hold(self, state: state_mod.RunState) -> None:
        """Start renewing ``state``'s lease."""
        with self._lock:
            self._held[state.run.run_id] = state
            self._stopped.pop(state.run.run_id, None)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._beat, name="effectflow-heartbeat", daemon=True
                )
                self._thread.start()

    def drop(self, state: state_mod.RunState) -> None:
        """Stop renewing ``state``'s lease (the run ended, paused, or was released)."""
        with self._lock:
            if self._held.get(state.run.run_id) is state:
                del self._held[state.run.run_id]
                self._stopped[state.run.run_id] = None
                if len(self._stopped) > _STOPPED_MEMORY:
                    del self._stopped[next(iter(self._stopped))]

    def holds(self, run_id: str) -> bool:
        """Whether this process is executing the run now."""
        with self._lock:
            return run_id in self._held

    def stopped(self, run_id: str) -> bool:
        """Whether this runtime executed the run and no longer does (it ended, paused, was
        released, or the runtime gave it up after an error). A run still leased to this runtime's
        owner that it stopped executing has nobody executing it: it is recoverable at once."""
        with self._lock:
            return run_id in self._stopped and run_id not in self._held

    def owner_gone(self, run: records.RunRecord) -> str | None:
        """How we know the owner of ``run``'s lease executes it no more, or None if it may.

        Another process's owner is gone when its pid is dead on this host; this runtime's own owner
        when it stopped executing the run (it gave up after an error) without giving the lease up.
        Only the lease's expiry can tell for an owner on another host.
        """
        owner = run.lease_owner
        if owner is None or run.status not in views.EXECUTING:
            return None
        if owner == self._owner:
            return "this process stopped executing it" if self.stopped(run.run_id) else None
        if not owner_alive(owner):
            pid = owner.split(":")[1]
            return f"process {pid} on this host is not running"
        return None

    def held(self) -> list[state_mod.RunState]:
        """The states of the runs held now."""
        with self._lock:
            return list(self._held.values())

    def beat(self) -> list[str]:
        """Renew every held lease once; returns the run ids found lost (taken over: a run this
        process let go of since the beat began — it ended, paused or was released — is not)."""
        states = self.held()
        if not states:
            return []
        renewed = self._clock()
        lost = set(
            self._store.heartbeat(
                [(s.run.run_id, s.run.lease_token) for s in states],
                ttl=self._ttl,
                now=renewed,
            )
        )
        taken = []
        for state in states:
            run_id = state.run.run_id
            if run_id not in lost:
                # Forward only, as the ledger moved it: a write may have renewed it further since
                # this beat read its clock.
                state.lease_valid_until = max(state.lease_valid_until, renewed + self._ttl)
                continue
            with self._lock:
                if self._held.get(run_id) is not state:
                    continue  # let go meanwhile: the ledger's lease has no owner, nothing taken
            state.lease_lost = True
            taken.append(run_id)
            log.warning("lease of run %s was taken over; this process stops writing it", run_id)
        return taken

    def close(self) -> None:
        """Stop the heartbeat thread."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None:
            thread.join(timeout=5)

    def _beat(self) -> None:
        interval = max(0.05, self._ttl * RENEW_AFTER)
        while not self._wake.wait(interval):
            try:
                self.beat()
            except Exception:  # a transient database error: the next beat tries again
                log.exception("lease heartbeat failed")
